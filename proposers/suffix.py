"""Cross-request drafts: continue the context the way earlier outputs of the same kind continued it.

:class:`SuffixProposer` reads and feeds a shared :class:`~proposers.suffix_index.SuffixIndex`:
every token its request commits goes into the index (under the request's
scope, :func:`~proposers.suffix_index.scope_of`), and every draft is a walk of
the index from the current context.  Several requests -- a server's, the rows
of one ``generate`` call, a conversation's turns -- share one index, so the
second request of a kind drafts from the first.  A row also finds its own
earlier tokens there (as prompt lookup would).

Drafts are cut at the first token the grammar rejects and verified exactly
like any other; the composite keeps a record per source and kind (the order
of the n-gram that matched: ``"o8"``, ``"o4"``, ``"o2"``), so a source that
does not pay is not drafted.  As a :class:`~proposers.base.TreeDrafter` it
drafts a tree where earlier outputs branched (:meth:`SuffixIndex.paths`), and
:class:`~proposers.tree.TreeProposer` takes its branches as alternatives.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import EMPTY_DRAFT, Draft, DraftTree, GrammarView, Request
from .suffix_index import Output, SuffixIndex, scope_of

__all__ = ["SuffixProposer"]


class SuffixProposer:
    """Drafts from, and writes to, a :class:`SuffixIndex` shared with other requests.

    ``index``: the shared index; ``scope``: the scope to draft in (``None``:
    the request's, from its schema); ``width``/``size``: the most branches and
    nodes of a tree (:meth:`propose_tree`).
    """

    def __init__(
        self, index: SuffixIndex, *, scope: str | None = None, name: str = "suffix", width: int = 3, size: int = 24
    ) -> None:
        self.index = index
        self.name = name
        self.width = width
        self.size = size
        self._scope_given = scope
        self.scope = scope or "text"
        self._out: Output | None = None
        self._prompt: tuple[int, ...] = ()

    def start(self, request: Request) -> None:
        """A new request: its scope, and a new output in the index once it commits tokens."""
        self.scope = self._scope_given or scope_of(request.schema)
        self._prompt = tuple(request.prompt_ids[-self.index.orders[0] :])
        self._out = None

    def propose(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft:
        """The index's walk from ``context``, cut at the first illegal token.  Does not change state."""
        if k <= 0:
            return EMPTY_DRAFT
        tokens, probs, order = self.index.walk(self.scope, context, k)
        if grammar is not None:
            tokens = tokens[: grammar.validate(tokens)]
        if not tokens:
            return EMPTY_DRAFT
        return Draft(  # confidence: each token's odds after its n-gram (the policy calibrates them)
            tokens=tuple(tokens),
            sources=(self.name,) * len(tokens),
            kind=f"o{order}",
            confidence=tuple(probs[: len(tokens)]),
        )

    def commit(self, draft: Draft, num_accepted: int, committed: Sequence[int]) -> None:
        """Write the committed tokens into the index (under this request's scope).  Changes the index."""
        if not committed or self.index.max_bytes == 0:
            return
        if self._out is None:
            self._out = self.index.open(self.scope, self._prompt)
        self._out = self.index.extend(self._out, committed)

    # -- trees ---------------------------------------------------------------------------------

    def propose_tree(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft | DraftTree:
        """The walk and the branches earlier outputs took off it, each cut by the grammar.  Does not change state.

        A chain :class:`Draft` when nothing branches.
        """
        paths = self.alternatives(context, grammar, k, self.width, first=True)
        if len(paths) < 2:
            return self.propose(context, grammar, k)
        tree = DraftTree.from_paths(paths, sources=[self.name] * len(paths), size=self.size, kind="tree")
        return tree if not tree.is_chain else tree.as_draft()

    def commit_tree(self, tree: DraftTree, committed: Sequence[int]) -> None:
        """The tree step committed ``committed``: into the index.  Changes the index."""
        self.commit(EMPTY_DRAFT, 0, committed)

    def alternatives(
        self, context: Sequence[int], grammar: GrammarView | None, k: int, width: int, *, first: bool = False
    ) -> list[list[int]]:
        """The index's continuations of ``context`` (the walk's first when ``first``, else only its branches),
        each cut at its first illegal token, distinct and non-empty.  Pure."""
        paths = self.index.paths(self.scope, context, k, width + (0 if first else 1))
        if not first:
            paths = paths[1:]
        out: list[list[int]] = []
        for path in paths:
            if grammar is not None:
                path = path[: grammar.validate(path)]
            if path and path not in out:
                out.append(path)
        return out
