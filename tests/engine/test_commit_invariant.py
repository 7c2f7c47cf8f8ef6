"""The commit invariant, checked on the source: a row's state moves in the commit path or in a listed mover.

The scan reads the decoding loop (every module of ``grammarspec/engine/``) and
the draft model (:mod:`grammarspec.drafting.draft_model`, whose cache follows
the committed tokens) with :mod:`ast`, and finds every place that moves a
row's state:

* a store to a row's ``tokens``, ``cached``, ``finish_reason`` / ``failure``,
  ``untold`` (what the proposer has not heard), ``matcher``, ``proposer`` or
  to a ``kv`` (the batch cache) -- ``row.tokens.append(...)`` and the other
  list mutators too;
* a call that moves a matcher (``accept``, ``rollback``, ``reset``), a proposer
  (``start``, ``bind``, ``propose``, ``propose_tree``, ``commit``,
  ``commit_tree``, ``use_cost_model``), the batch cache (``forward``, ``keep``,
  ``select``, ``add_rows``, ``reserve``) or a controller (``wake``,
  ``allocated``, ``record``, ``rest_from``), by the receiver's name
  (``row.matcher``, ``matcher``, ``kv``, ``batch.kv``, ``controller``, ...),
  and by the method's name alone where no other object of the loop has it;
* the draft model's cache: ``crop_cache``, ``forward_with_cache`` and its
  ``_cache`` / ``_cached`` / ``_base`` (outside ``__init__``).

``GenerationStats`` (``stats.finish_reason``) is the row's record, not its state.
Every function of :mod:`grammarspec.engine.commit` is the commit path, and so
is a proposer's own ``commit`` / ``commit_tree`` (only the commit path calls
them: a call anywhere else is a mover).  Every other place must be in
:data:`grammarspec.engine.commit.OTHER_MOVERS`, moving exactly what its entry
says, and every entry must still move something.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

from grammarspec.engine.commit import OTHER_MOVERS

ROOT = Path(__file__).resolve().parents[2]

#: The loop's modules and the draft model: every place a row's state can move.
SCANNED = sorted((ROOT / "grammarspec" / "engine").glob("*.py")) + [ROOT / "grammarspec/drafting/draft_model.py"]

#: The commit path: its module, and a proposer's side of it (a method of that name).
COMMIT_MODULE = "grammarspec.engine.commit"
COMMIT_METHODS = frozenset({"commit", "commit_tree"})

#: A store to ``<row>.<attribute>`` moves this kind of state.
ROW_ATTRIBUTES = {
    "tokens": "tokens",
    "cached": "cached",
    "finish_reason": "finish_reason",
    "failure": "finish_reason",
    "untold": "proposer",
    "matcher": "matcher",
    "proposer": "proposer",
    "kv": "kv",
}
#: Receivers whose attributes are no row's state: the row's statistics record.
RECORDS = frozenset({"stats"})
#: The draft model's cache (``self.<attribute>``).
DRAFT_CACHE_ATTRIBUTES = frozenset({"_cache", "_cached", "_base"})
DRAFT_CACHE_CALLS = frozenset({"crop_cache", "forward_with_cache"})
LIST_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear"})

#: What each kind of receiver (by its last name) moves with which methods.
MUTATORS = {
    "matcher": frozenset({"accept", "rollback", "reset"}),
    "proposer": frozenset({"start", "bind", "propose", "propose_tree", "commit", "commit_tree", "use_cost_model"}),
    "kv": frozenset({"forward", "keep", "select", "add_rows", "reserve"}),
    "controller": frozenset({"wake", "allocated", "record", "rest_from"}),
}
RECEIVERS = {
    "matcher": "matcher",
    "proposer": "proposer",
    "tree_drafter": "proposer",
    "member": "proposer",
    "kv": "kv",
    "controller": "controller",
}
#: Method names no other object of the loop has: a call moves that kind whatever the receiver is called.
UNAMBIGUOUS = {
    "accept": "matcher",
    "rollback": "matcher",
    "propose_tree": "proposer",
    "commit_tree": "proposer",
    "use_cost_model": "proposer",
    "add_rows": "kv",
    "wake": "controller",
    "allocated": "controller",
    "rest_from": "controller",
}


def _last_name(node: ast.expr) -> str | None:
    """``row.matcher`` -> ``matcher``; ``kv`` -> ``kv``; ``joining[0]`` -> ``joining``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


class _Scanner(ast.NodeVisitor):
    """Collects ``qualified function name -> kinds of state it moves`` for one module."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.scope: list[str] = []
        self.found: dict[str, set[str]] = defaultdict(set)

    def _where(self) -> str:
        return f"{self.module}:{'.'.join(self.scope) or '<module>'}"

    def _moves(self, kind: str) -> None:
        if self.scope and self.scope[-1] == "__init__":  # construction: the object's first state
            return
        self.found[self._where()].add(kind)

    def _scoped(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _scoped

    def _store(self, target: ast.expr) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._store(element)
            return
        if isinstance(target, ast.Starred):
            self._store(target.value)
            return
        if isinstance(target, ast.Subscript):  # row.tokens[i] = ...: the list itself moves
            target = target.value
        if not isinstance(target, ast.Attribute):
            return
        root = _root_name(target.value)
        if root == "self":
            if target.attr in DRAFT_CACHE_ATTRIBUTES:
                self._moves("draft_cache")
        elif root not in RECORDS and target.attr in ROW_ATTRIBUTES:
            self._moves(ROW_ATTRIBUTES[target.attr])

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._store(target)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._store(node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._store(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._store(target)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        function = node.func
        if isinstance(function, ast.Name) and function.id in DRAFT_CACHE_CALLS:
            self._moves("draft_cache")
        elif isinstance(function, ast.Attribute):
            method, receiver = function.attr, function.value
            if method in DRAFT_CACHE_CALLS or (_root_name(receiver) == "self" and method in ("_sync", "_forward")):
                self._moves("draft_cache")
            elif method in LIST_MUTATORS and isinstance(receiver, ast.Attribute) and receiver.attr in ROW_ATTRIBUTES:
                if _root_name(receiver.value) not in RECORDS | {"self"}:
                    self._moves(ROW_ATTRIBUTES[receiver.attr])
            else:
                kind = RECEIVERS.get(_last_name(receiver) or "")
                if kind is not None and method in MUTATORS[kind]:
                    self._moves(kind)
                elif method in UNAMBIGUOUS:
                    self._moves(UNAMBIGUOUS[method])
        self.generic_visit(node)


def scan_source(source: str, module: str) -> dict[str, set[str]]:
    """``where -> kinds`` of every place in ``source`` (module ``module``) that moves a row's state."""
    scanner = _Scanner(module)
    scanner.visit(ast.parse(source))
    return dict(scanner.found)


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _on_commit_path(where: str) -> bool:
    module, _, name = where.partition(":")
    return module == COMMIT_MODULE or ("." in name and name.rsplit(".", 1)[-1] in COMMIT_METHODS)


def movers(sources: dict[Path, str] | None = None) -> dict[str, set[str]]:
    """Every place outside the commit path that moves a row's state, with what it moves (``sources``: the text
    to read instead of a scanned file's)."""
    found: dict[str, set[str]] = {}
    for path in SCANNED:
        text = (sources or {}).get(path) or path.read_text()
        for where, kinds in scan_source(text, _module_name(path)).items():
            if not _on_commit_path(where):
                found[where] = kinds
    return found


def problems(found: dict[str, set[str]]) -> list[str]:
    """What breaks the invariant: a mover not listed, a listed one that moves other state, one that is gone."""
    listed = {mover.where: set(mover.moves) for mover in OTHER_MOVERS}
    out = [
        f"{where} moves {sorted(kinds)}: neither in commit nor in OTHER_MOVERS"
        for where, kinds in found.items()
        if where not in listed
    ]
    out += [
        f"{where} moves {sorted(kinds)}, OTHER_MOVERS says {sorted(listed[where])}"
        for where, kinds in found.items()
        if where in listed and kinds != listed[where]
    ]
    out += [f"{where} is in OTHER_MOVERS but moves nothing" for where in listed if where not in found]
    return out


def test_every_mover_outside_commit_is_listed_with_what_it_moves():
    """A new place that moves a row's state, a listed one that moves something else, or a listed one that is gone
    fails here: route it through ``commit`` or name it in ``OTHER_MOVERS`` with what it moves and why."""
    found = problems(movers())
    assert not found, "\n".join(found)


def test_every_listed_mover_says_why_once():
    assert len({mover.where for mover in OTHER_MOVERS}) == len(OTHER_MOVERS), "a mover is listed twice"
    assert all(mover.why.strip() and mover.moves for mover in OTHER_MOVERS)


def test_a_new_mover_or_a_gone_one_fails_the_check():
    """The check is not blind: a helper added to the step that appends to a row's tokens is named, and so is a
    listed mover whose moving line is removed."""
    step = ROOT / "grammarspec" / "engine" / "step.py"
    text = step.read_text()
    sneaky = text + "\n\ndef _sneaky(row):\n    row.tokens.append(0)\n"
    assert problems(movers({step: sneaky})) == [
        "grammarspec.engine.step:_sneaky moves ['tokens']: neither in commit nor in OTHER_MOVERS"
    ]
    assert "controller.wake()" in text
    woken = text.replace("controller.wake()", "pass")
    assert problems(movers({step: woken})) == ["grammarspec.engine.step:_ask is in OTHER_MOVERS but moves nothing"]


def test_the_commit_path_itself_moves_every_kind_of_committed_state():
    """The scan sees the commit path move tokens, matcher, proposer, cached count, cache and finish_reason."""
    path = ROOT / "grammarspec" / "engine" / "commit.py"
    kinds = set().union(*scan_source(path.read_text(), COMMIT_MODULE).values())
    assert {"tokens", "matcher", "proposer", "cached", "kv", "finish_reason"} <= kinds


@pytest.mark.parametrize(
    ("source", "kinds"),
    [
        ("def f(row):\n    row.tokens.append(3)", {"tokens"}),
        ("def f(row):\n    row.tokens += [3]", {"tokens"}),
        ("def f(rows):\n    rows[0].cached = 4", {"cached"}),
        ("def f(row):\n    row.finish_reason = 'cancelled'", {"finish_reason"}),
        ("def f(row):\n    untold, row.untold = row.untold, []", {"proposer"}),
        ("def f(row):\n    row.matcher.rollback(2)", {"matcher"}),
        ("def f(row):\n    m = row.matcher\n    m.accept(5)", {"matcher"}),
        ("def f(row, kv):\n    kv.keep([[0]])", {"kv"}),
        ("def f(batch):\n    batch.kv.select([0])", {"kv"}),
        ("def f(row, k):\n    row.proposer.propose(row.tokens, None, k)", {"proposer"}),
        ("def f(row):\n    row.controller.wake()", {"controller"}),
        ("class P:\n    def f(self):\n        crop_cache(self._cache, 3, 'draft')", {"draft_cache"}),
    ],
)
def test_the_scan_finds_each_kind_of_mover(source, kinds):
    assert set().union(*scan_source(source, "grammarspec.engine.new").values()) == kinds


@pytest.mark.parametrize(
    "source",
    [
        "def f(row):\n    stats = row.stats\n    stats.finish_reason = 'length'",  # the record, not the state
        "def f(tree, kept):\n    return tree.keep(kept)",  # a draft tree's pure keep
        "def f(row):\n    row.state_mask_ready = False",  # a cache of the mask, not state
        "class P:\n    def __init__(self):\n        self._cache = None",  # construction
    ],
)
def test_the_scan_leaves_what_moves_no_row_state(source):
    assert scan_source(source, "grammarspec.engine.new") == {}
