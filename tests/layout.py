"""The import graph of effectq's three packages, read from the source (no module is run).

``python -m tests.layout`` prints every module with the effectq modules it imports (at
module level, inside functions, and under ``if TYPE_CHECKING:``: a type-only import is a
dependency a reader follows and a circle mypy resolves, even if it never runs), then the
floors below and any cycle or upward import. ``tests/unit/test_layout.py`` asserts there are
none.

Floors, lowest first; a module may import its own floor and the floors below it:

    dedupe        identity and the ledger (no Dramatiq)
    reconciler    expired claims, lookups, operator actions
    workers/core  the worker path: settings, registry, leases, broker/, metrics/, runtime,
                  tool, entry, supervisor
    workers/svc   producer services: producer, campaigns/, guard, examples
    workers/face  the faces and their one door: verbs, cli, api/, agents/, __main__
    workers/dev   the local harness (sandbox, embedded Redis, local stack, demo): imported
                  by no floor but the CLI's `demo` and `sandbox` verbs
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dedupe", "reconciler", "workers")
FLOORS = ("dedupe", "reconciler", "workers/core", "workers/svc", "workers/face", "workers/dev")
_SVC = {"workers.producer", "workers.campaigns", "workers.guard", "workers.examples"}
_FACE = {"workers.verbs", "workers.__main__", "workers"}
#: The one sanctioned way into the local harness from outside it: the CLI's `demo` and
#: `sandbox` verbs.
DEV_DOORS = {"workers.cli.run"}


def floor(module: str) -> str:
    top = module.split(".")[0]
    if top != "workers":
        return top
    if module.startswith("workers.dev"):
        return "workers/dev"
    if module in _SVC or module.startswith("workers.campaigns."):
        return "workers/svc"
    if module in _FACE or module.startswith(
        ("workers.verbs.", "workers.api", "workers.agents", "workers.cli")
    ):
        return "workers/face"
    return "workers/core"


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [base]
            # `from . import x` names a submodule where one exists.
            names += [f"{base}.{alias.name}" for alias in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {module: imports_of(module, path, known) for module, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def _is_parent_package(importer: str, imported: str) -> bool:
    # Importing `workers.broker.redis` runs `workers/broker/__init__.py` and `workers/__init__`:
    # a submodule reaching its own package is not an edge of the layering.
    return importer.startswith(imported + ".")


def violations(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in sorted(edges.items()):
        for target in sorted(targets):
            if _is_parent_package(module, target):
                continue
            mine, theirs = floor(module), floor(target)
            if theirs == "workers/dev" and mine != "workers/dev":
                if module not in DEV_DOORS:
                    bad.append(f"{module} -> {target}: the local harness, from outside it")
            elif mine != "workers/dev" and FLOORS.index(theirs) > FLOORS.index(mine):
                bad.append(f"{module} ({mine}) -> {target} ({theirs}): upward")
    return bad


def main() -> int:
    edges = graph()
    for module in sorted(edges):
        print(f"{module} [{floor(module)}] -> {', '.join(sorted(edges[module])) or '-'}")
    found = cycles({m: {t for t in ts if not _is_parent_package(m, t)} for m, ts in edges.items()})
    bad = violations(edges)
    print(f"\n{len(edges)} modules; cycles: {found or 'none'}; upward imports: {bad or 'none'}")
    return 1 if found or bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
