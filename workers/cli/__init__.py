"""The ``effectq`` command line (DESIGN §8).

``--json`` prints one JSON document on stdout. Exit status 0 on success; otherwise
non-zero with a one-line reason on stderr, never a traceback and never the refused value:
2 bad input, 3 conflict, 4 blocked, 5 timeout, 6 not found, 7 ledger or broker
unavailable, 8 refused by the state table (1: the demo found an invariant broken, or a
bug, named by its exception type).

Start-up is kept short (``effectq --help``, an operator polling ``inspect``): the package
imports typer and nothing of effectq's; each verb imports what it runs when it runs. Its
modules: ``_app`` (the application, the error boundary, output), ``params`` (parameter
types and the wiring every verb shares), ``run`` (the long-running verbs), ``effects`` (one
effect at a time), ``incidents`` (dead letters, audit, re-check), ``controls`` (pause,
resume, limits), ``campaigns``, ``agents``
(``effectq mcp``).
"""

# The verbs register themselves on `app` as they are imported, in the order `--help` lists
# them.
# isort: off
from . import run, effects, incidents, controls, campaigns, agents, ledger  # noqa: F401

# isort: on
from ._app import RECONCILER_METRICS_PORT, app
from .run import reconciler_liveness, reconciler_metrics_port

__all__ = ["RECONCILER_METRICS_PORT", "app", "reconciler_liveness", "reconciler_metrics_port"]
