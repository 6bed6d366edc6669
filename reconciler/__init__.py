"""The reconciler: resolves expired claims against provider lookups.

The names below are imported on first use (PEP 562): the operator verbs need the
``Operator`` without the HTTP client the lookups bring.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dedupe.lazy import lazy_exports

if TYPE_CHECKING:
    from .lookups import HttpLookup as HttpLookup
    from .operator import Operator as Operator
    from .reconciler import Decision as Decision
    from .reconciler import Reconciler as Reconciler
    from .reconciler import decide as decide

_WHERE = {
    "Decision": "reconciler",
    "HttpLookup": "lookups",
    "Operator": "operator",
    "Reconciler": "reconciler",
    "decide": "reconciler",
}
__all__ = sorted(_WHERE)


__getattr__ = lazy_exports(__name__, _WHERE)
