"""The reconciler: resolves expired claims against provider lookups; operator actions."""
