"""The local harness: the sandbox provider, an embedded redis-server, a whole deployment as
local processes, and the demo (extra ``[demo]``). For local runs, tests and benchmarks
only: no worker, reconciler or API process imports it (``tests/unit/test_layout.py``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

__all__ = ["Started"]


class Started(ABC):
    """What the harness starts — a server, a whole deployment — as a context manager:
    started on entry, stopped on exit whatever happened inside."""

    @abstractmethod
    def start(self) -> Started: ...

    @abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
