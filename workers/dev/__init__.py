"""The local harness: the sandbox provider, an embedded redis-server, a whole deployment as
local processes, and the demo (extra ``[demo]``). For local runs, tests and benchmarks
only: no worker, reconciler or API process imports it (``tests/unit/test_layout.py``)."""
