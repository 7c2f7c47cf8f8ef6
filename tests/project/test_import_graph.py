"""The packages' import graph has no circles, and its rooms import one way.

The graph is built from the source with `ast`, without importing anything: every
`import` and `from ... import` statement counts, wherever it sits (module level,
inside a function, under `if TYPE_CHECKING:`), and relative imports are resolved
against the importing module. `from pkg import name` counts as an edge to
`pkg.name` when that is a module, else to `pkg`. An edge to a package's
`__init__` is kept only when the package itself is imported (`import pkg`,
`from pkg import name` where `name` is not a submodule), so a package that
re-exports its modules does not put every submodule in one circle with it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("grammarspec", "grammars", "proposers")

# Each circle the project knowingly keeps, with why. A circle not listed here fails
# the test; so does a listed one that is gone (then drop it from the list). None is kept.
ALLOWED_CIRCLES: dict[frozenset[str], str] = {}

#: What measures, stores and checks the target's pass cost (model runs, a clock, the disk). The loop is handed
#: the cost by its caller (grammarspec.policy.cost) and imports none of them.
MEASURING = frozenset(
    {
        "grammarspec.drafting.cost_model",
        "grammarspec.drafting.pass_profile",
        "grammarspec.drafting.profile_check",
        "grammarspec.drafting.profile_store",
    }
)


def module_files() -> dict[str, Path]:
    """Every module of the packages, by dotted name (a package is its `__init__`)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_package(name: str, files: dict[str, Path]) -> bool:
    return name in files and files[name].name == "__init__.py"


def _resolve_base(module: str, node: ast.ImportFrom, files: dict[str, Path]) -> str:
    if not node.level:
        return node.module or ""
    # A package's own name is its first anchor for a relative import; a module's is its package.
    anchor = module.split(".")
    if not _is_package(module, files):
        anchor = anchor[:-1]
    if node.level > 1:
        anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def _targets(module: str, tree: ast.AST, files: dict[str, Path]) -> Iterable[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_base(module, node, files)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                yield submodule if submodule in files else base


def import_graph(files: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the package modules it imports (anywhere in its body)."""
    files = module_files() if files is None else files
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: set[str] = set()
        for target in _targets(module, tree, files):
            # `import a.b.c` names a module that may not exist under that exact name
            # (an attribute import); walk up to the nearest module we know.
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != module:
                edges.add(target)
        graph[module] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def _describe(found: Iterable[frozenset[str]]) -> str:
    return "\n".join("  {" + ", ".join(sorted(c)) + "}" for c in sorted(found, key=sorted))


def test_the_only_import_circles_are_the_allowed_ones() -> None:
    found = set(circles(import_graph()))
    allowed = set(ALLOWED_CIRCLES)
    new = found - allowed
    gone = allowed - found
    assert not new, "new import circle(s); move what both sides share into a leaf module:\n" + _describe(new)
    assert not gone, "allowed circle(s) no longer exist; drop them from ALLOWED_CIRCLES:\n" + _describe(gone)


def test_the_graph_sees_local_relative_and_type_checking_imports(tmp_path: Path) -> None:
    """A circle closed only by a function-local, relative or TYPE_CHECKING import is found."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from .a import A\n")
    (package / "a.py").write_text("A = 1\ndef f():\n    from pkg.b import B\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub import c\nB = 2\n"
    )
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "c.py").write_text("from .. import a\n")
    (package / "lone.py").write_text("import pkg.a\n")
    files = {
        "pkg": package / "__init__.py",
        "pkg.a": package / "a.py",
        "pkg.b": package / "b.py",
        "pkg.sub": package / "sub" / "__init__.py",
        "pkg.sub.c": package / "sub" / "c.py",
        "pkg.lone": package / "lone.py",
    }
    graph = import_graph(files)
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.b"] == {"pkg.sub.c"}
    assert graph["pkg.sub.c"] == {"pkg.a"}
    assert graph["pkg"] == {"pkg.a"}
    assert circles(graph) == [frozenset({"pkg.a", "pkg.b", "pkg.sub.c"})]


def test_policy_is_pure_and_the_loop_never_imports_what_measures_the_cost() -> None:
    """policy/ imports nothing of the package outside itself (no profiler, no disk, no loop); engine/ imports nothing
    that measures the pass cost; proposers/ imports nothing of grammarspec (grammarspec builds on it)."""
    graph = import_graph()
    wrong = []
    for module, edges in sorted(graph.items()):
        if module.startswith("grammarspec.policy."):
            wrong += [
                (module, t) for t in edges if t.startswith("grammarspec") and not t.startswith("grammarspec.policy")
            ]
        if module.startswith("grammarspec.engine."):
            wrong += [(module, t) for t in edges if t in MEASURING]
        if module == "proposers" or module.startswith("proposers."):
            wrong += [(module, t) for t in edges if t == "grammarspec" or t.startswith("grammarspec.")]
    assert not wrong, "imports against the rooms' direction:\n" + "\n".join(f"  {a} -> {b}" for a, b in wrong)
    assert any(module.startswith("grammarspec.policy.") for module in graph)  # the rule looked at something
