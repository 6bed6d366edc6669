"""The reconciler: resolves expired claims against provider lookups."""

from .lookups import HttpLookup
from .operator import Operator
from .reconciler import Decision, Reconciler, decide

__all__ = ["Decision", "HttpLookup", "Operator", "Reconciler", "decide"]
