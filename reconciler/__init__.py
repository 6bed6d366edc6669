"""The reconciler: resolves expired claims against provider lookups."""

from .lookups import HttpLookup
from .reconciler import Decision, Reconciler, decide

__all__ = ["Decision", "HttpLookup", "Reconciler", "decide"]
