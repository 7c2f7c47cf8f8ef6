"""Drafts as token trees: several guesses verified in one target pass.

(The tree value type, :class:`DraftTree`, lives in :mod:`proposers.base` beside
:class:`~proposers.base.Draft`, so the protocol names it without importing the
builders; the three sources of branches and the :class:`TreeProposer` that
combines them are one job -- building a tree -- and are tested together; the
loop's side is :mod:`grammarspec.engine.tree_layout`.)

A chain draft bets on one continuation.  Where the guess forks -- the target
splits the same text two ways (``'":"'`` or ``'":'`` + ``'"'``), several schema
candidates are plausible (which earlier item repeats, which enum value comes)
-- a :class:`DraftTree` carries every branch, and one target pass under a tree
attention mask (:mod:`grammarspec.engine.tree_layout`) scores them all.

The value type::

    tokens   (t0, t1, t2, t3)        node tokens, depth-first order
    parents  (-1,  0,  1,  0)        parent node of each node (-1: the committed context)

    context -> t0 -> t1 -> t2
                 \\-> t3

is the tree above: paths ``[t0, t1, t2]`` and ``[t0, t3]``.  A chain is the
one-branch case (``parents == (-1, 0, 1, ...)``).  Siblings hold distinct
tokens (verification descends into the child whose token the target chose).
Every prefix of the node list is a tree again (a parent comes before its
children), which is how a tree is cut to a size.

Builders (pure; nothing here runs a model or changes a grammar):

* :meth:`DraftTree.from_paths` -- a trie of token paths (the primary guess first);
* :func:`split_paths` -- the same text in both learned splits
  (:class:`proposers.text.SplitPreferences` remembers what the target wrote
  instead of a canonical token, and the canonical token itself);
* :class:`TreeProposer` -- wraps a chain proposer (``auto``) and adds the
  alternatives: the other splits of its draft, the schema n-gram's other
  top candidates for the next value, and where earlier outputs branched
  (:meth:`proposers.suffix.SuffixProposer.alternatives`).

Deterministic drafts only (no draft distributions): verification draws the
target's own token at each node and descends if it is a child, which is
ordinary sampling, so any tree is exact.  Sampled draft-model drafts stay chains.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .base import (
    EMPTY_DRAFT,
    EMPTY_TREE,
    Draft,
    DraftTree,
    GrammarView,
    Proposer,
    ProposerGroup,
    Request,
    members,
    split_owner,
)
from .text import SplitPreferences, continuation_tokens

if TYPE_CHECKING:
    from .schema_ngram import SchemaNgramProposer
    from .suffix import SuffixProposer

__all__ = ["EMPTY_TREE", "DraftTree", "TreeProposer", "split_paths"]


def split_paths(
    splits: SplitPreferences, context: Sequence[int], tokens: Sequence[int], width: int = 2, max_branch_points: int = 3
) -> list[list[int]]:
    """Up to ``width`` token lists spelling the same bytes as ``tokens``, ``tokens`` first.

    At each of the first ``max_branch_points`` positions where the target was
    seen to write something else than the token there (or the token there is
    one it was seen to replace), the other split is taken once and the rest
    is split canonically again -- the branch a chain would have bet against.
    Pure (reads ``splits``' memory, changes nothing).

    Worked example (SmolLM2): ``tokens`` = ``['x', '",', '"', 'b', '":']``
    after a request where the target wrote ``'",'`` for ``'","'``: the
    alternative is the canonical ``['x', '","', 'b', '":']``.
    """
    tokens = [int(t) for t in tokens]
    out = [tokens]
    helper = splits.helper
    replaced_by: dict[int, set[int]] = {}  # a written token -> the canonical tokens it stood for
    for (_, canonical), written in splits.by_context.items():
        replaced_by.setdefault(written, set()).add(canonical)
    for canonical, written in splits.by_token.items():
        replaced_by.setdefault(written, set()).add(canonical)
    points = 0
    for i, token in enumerate(tokens):
        if len(out) >= width or points >= max_branch_points:
            break
        previous = tokens[i - 1] if i else (int(context[-1]) if len(context) else -1)
        options = [splits.by_context.get((previous, token)), splits.by_token.get(token)]
        options += sorted(replaced_by.get(token, ()))  # the canonical token a learned split stood for
        rest = helper.bytes_of(tokens[i:])
        tried = False
        for choice in options:
            if choice is None or choice == token:
                continue
            spelled = helper.bytes_of([choice])
            if not spelled or not rest.startswith(spelled):
                continue
            tried = True
            try:
                tail_text = rest[len(spelled) :].decode("utf-8")
            except UnicodeDecodeError:
                continue
            prefix = tokens[:i] + [choice]
            tail = continuation_tokens(splits.tokenizer, list(context) + prefix, tail_text) if tail_text else []
            if tail_text and not tail:
                continue
            alt = prefix + tail
            if alt not in out:
                out.append(alt)
            if len(out) >= width:
                break
        points += tried
    return out


#: Cost of a target pass over ``rows`` rows, in plain 1-row steps: SmolLM2-135M on this CPU at an 850-token
#: context (``scripts/replay_bench.py --time-rows``, 1 thread, paired medians of 9 on a shared machine;
#: docs/bench/trees.md).  Tree and chain passes of the same size cost the same within the noise.
MEASURED_PASS_COST = {1: 1.0, 2: 1.656, 4: 1.589, 8: 1.847, 16: 2.303, 24: 2.624, 32: 3.179, 48: 4.105, 64: 4.834}


def interpolated_cost(table: dict[int, float]) -> Callable[[int], float]:
    """``rows -> plain steps`` from a measured table: linear between points, flat beyond the last.

    >>> interpolated_cost({1: 1.0, 4: 1.5, 16: 2.1})(10)
    1.8
    """
    points = sorted(table.items())

    def cost(rows: int) -> float:
        if rows <= points[0][0]:
            return points[0][1]
        for (r0, c0), (r1, c1) in itertools.pairwise(points):
            if rows <= r1:
                return round(c0 + (c1 - c0) * (rows - r0) / (r1 - r0), 6)
        return points[-1][1]

    return cost


class TreeSizer:
    """How many alternative nodes a tree may add to a chain draft of ``L`` tokens, per request.  Pure Python.

    Rule, from measured yield and cost::

        extra(L) = argmax over n in {0, 1, 2, 4, 8, ...} (n <= size - L) of
                   yield * n * token_value - (cost(L + 1 + n) - cost(L + 1))

    ``yield``: tokens committed from alternative nodes per alternative node
    verified in this request (a prior of ``prior_yield`` worth ``prior_nodes``
    nodes); ``token_value``: plain steps one committed token is worth here,
    the request's average pass cost per committed token (starts at 0.5);
    ``cost``: rows -> plain steps (:data:`MEASURED_PASS_COST`).  ``extra``
    returns 0 -- a chain -- when no alternative is expected to pay for its
    rows.  :meth:`update` changes state; :meth:`extra` does not.
    """

    def __init__(
        self,
        size: int = 32,
        cost: Callable[[int], float] | None = None,
        *,
        prior_yield: float = 0.15,
        prior_nodes: float = 20.0,
    ) -> None:
        self.size = size
        self.cost = cost or interpolated_cost(MEASURED_PASS_COST)
        self.alt_nodes, self.alt_tokens = prior_nodes, prior_yield * prior_nodes
        self.spent, self.committed = 1.0, 2.0  # plain steps and tokens so far (prior: 0.5 step per token)

    @property
    def yield_rate(self) -> float:
        return self.alt_tokens / self.alt_nodes

    def extra(self, chain: int) -> int:
        """The alternative nodes worth adding to a chain of ``chain`` tokens.  Does not change state."""
        value = self.yield_rate * self.spent / self.committed
        base = self.cost(chain + 1)
        best, best_gain = 0, 0.0
        n = 1
        while chain + n <= self.size:
            gain = value * n - (self.cost(chain + 1 + n) - base)
            if gain > best_gain:
                best, best_gain = n, gain
            n *= 2
        return best

    def update(self, alt_nodes: int, alt_tokens: int, rows: int, committed: int) -> None:
        """One verified step: ``alt_nodes`` off the first path, ``alt_tokens`` committed from them.  Changes state."""
        self.alt_nodes += alt_nodes
        self.alt_tokens += alt_tokens
        self.spent += self.cost(rows)
        self.committed += committed


class TreeProposer:
    """A chain proposer plus alternatives, as a :class:`DraftTree` (batch 1).

    ``inner``: the chain proposer (a :class:`proposers.compose.CompositeProposer`
    or any proposer); its draft is the tree's first path.  ``width``: most
    branches; ``size``: most nodes; ``branch``: most tokens an alternative
    keeps past the point where it leaves the first path (``None``: all);
    ``sizer``: a :class:`TreeSizer` that picks the node budget per step from
    this request's measured yield (``None``: always ``size``).  Alternatives: the draft's other learned
    splits (:func:`split_paths`, with the composite's or schema n-gram's
    :class:`SplitPreferences`), and other schema n-gram candidates for the
    next value (:meth:`proposers.schema_ngram.SchemaNgramProposer.alternatives`).

    ``propose_tree`` changes the inner proposer's state as ``propose`` does;
    :meth:`commit_tree` reports what was committed: the inner proposer is
    told how much of ITS draft (the first path) the committed tokens matched.
    ``propose`` (the chain protocol) returns the inner draft unchanged.
    """

    def __init__(
        self,
        inner: Proposer,
        *,
        width: int = 2,
        size: int = 16,
        branch: int | None = None,
        sizer: TreeSizer | None = None,
        name: str | None = None,
    ) -> None:
        if width < 1 or size < 1 or (branch is not None and branch < 1):
            raise ValueError(
                f"TreeProposer needs width >= 1, size >= 1 and branch >= 1 (or None), got width={width}, "
                f"size={size}, branch={branch}"
            )
        self.inner = inner
        self.width = width
        self.size = size
        self.branch = branch
        self.sizer = sizer
        self._sizer_template = sizer
        self.name = name or f"tree({inner.name})"
        self._primary: Draft = EMPTY_DRAFT

    @classmethod
    def from_shape(cls, inner: Proposer, shape: str) -> TreeProposer:
        """``"WxS"``, ``"WxSxB"``, with a trailing ``s`` for a :class:`TreeSizer`: ``"4x32s"``, ``"4x32x4s"``.

        ``W`` branches, ``S`` nodes, ``B`` tokens per alternative past its fork.
        Raises ``ValueError`` naming the expected form.
        """
        sized = shape.endswith("s")
        try:
            parts = [int(x) for x in shape.removesuffix("s").split("x")]
        except ValueError:
            parts = []
        if len(parts) not in (2, 3):
            raise ValueError(f"tree shape {shape!r}: expected WIDTHxSIZE or WIDTHxSIZExBRANCH, e.g. 4x32 or 4x32x4s")
        branch = parts[2] if len(parts) == 3 else None
        return cls(inner, width=parts[0], size=parts[1], branch=branch, sizer=TreeSizer(parts[1]) if sized else None)

    # -- chain protocol (delegated) --------------------------------------------

    def start(self, request: Request) -> None:
        """Start the inner proposer for a new request."""
        self.inner.start(request)
        self._primary = EMPTY_DRAFT
        if self._sizer_template is not None:  # a fresh record per request
            t = self._sizer_template
            self.sizer = TreeSizer(t.size, t.cost)

    def propose(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft:
        """The inner proposer's chain draft (changes its state as its ``propose`` does)."""
        return self.inner.propose(context, grammar, k)

    def commit(self, draft: Draft, num_accepted: int, committed: Sequence[int]) -> None:
        """A step verified as a chain (or a forced step), passed to the inner proposer.  Changes state."""
        self.inner.commit(draft, num_accepted, committed)
        self._primary = EMPTY_DRAFT
        if self.sizer is not None and draft.tokens:
            self.sizer.update(0, 0, len(draft) + 1, num_accepted + 1)

    # -- trees -------------------------------------------------------------------

    @property
    def proposers(self) -> list[Proposer]:
        """The inner proposer's members (so presets and the API see what drafts)."""
        return list(self.inner.proposers) if isinstance(self.inner, ProposerGroup) else [self.inner]

    def propose_tree(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft | DraftTree:
        """The inner draft and its alternatives, at most ``k`` deep and ``self.size`` nodes.

        Returns a :class:`DraftTree` when there is an alternative, else the
        inner chain :class:`Draft` itself (sampled drafts always: they stay
        chains), which the loop verifies as a chain.  Changes the inner
        proposer's state (as its ``propose``); not the grammar.
        """
        draft = self.inner.propose(context, grammar, k).truncate(k)
        self._primary = draft
        if draft.probs is not None or self.width < 2:
            return draft
        size = self.size
        if self.sizer is not None:
            size = min(size, len(draft) + self.sizer.extra(len(draft)))
            if size <= len(draft):
                return draft
        paths: list[list[int]] = [list(draft.tokens)] if draft else []
        for path, _ in self._alternatives(context, grammar, k, draft):
            if len(paths) >= self.width:
                break
            path = path[:k]
            if self.branch is not None and paths:  # keep `branch` tokens past where it leaves the first path
                shared = 0
                while shared < min(len(path), len(paths[0])) and path[shared] == paths[0][shared]:
                    shared += 1
                path = path[: shared + self.branch]
            if path and path not in paths:
                paths.append(path)
        if len(paths) < 2:
            return draft
        name = self.inner.name
        tree = DraftTree.from_paths(paths, sources=[name] * len(paths), size=size, kind=draft.kind)
        return tree if not tree.is_chain else draft.truncate(len(tree))

    def commit_tree(self, tree: DraftTree, committed: Sequence[int]) -> None:
        """Tell the inner proposer how much of its draft ``committed`` matched.  Changes its state.

        ``tree``: the tree the target saw (after grammar pruning); the inner
        draft counts as shown as far as it survived in it (as a chain cut by the grammar).
        """
        primary = self._primary
        self._primary = EMPTY_DRAFT
        if not primary:  # nothing of the inner proposer's in the tree: it still hears what was committed
            self.inner.commit(EMPTY_DRAFT, 0, committed)
            return
        shown, node = 0, -1
        while shown < len(primary):
            node = tree.children(node).get(primary.tokens[shown], -2)
            if node == -2:
                break
            shown += 1
        n = 0
        while n < shown and n < len(committed) and primary.tokens[n] == committed[n]:
            n += 1
        self.inner.commit(primary.truncate(shown) if shown else EMPTY_DRAFT, n, committed)
        if self.sizer is not None:
            path, node = 0, -1  # draft tokens committed: the path the target took
            while path < len(committed):
                node = tree.children(node).get(committed[path], -2)
                if node == -2:
                    break
                path += 1
            self.sizer.update(len(tree) - shown, max(0, path - n), len(tree) + 1, len(committed))

    def _alternatives(
        self, context: Sequence[int], grammar: GrammarView | None, k: int, draft: Draft
    ) -> list[tuple[list[int], str]]:
        """Other paths, best first: the draft's other splits, the whole forced span, other candidates."""
        out: list[tuple[list[int], str]] = []
        splits = split_owner(self.inner)
        if draft and splits is not None:
            out += [(p, "split") for p in split_paths(splits, context, draft.tokens, width=self.width)[1:]]
        suffix = _suffix(self.inner)  # earlier outputs: where they went another way than the index's walk
        if suffix is not None:
            out += [(path, "suffix") for path in suffix.alternatives(context, grammar, k, self.width)]
        if grammar is None:
            return out
        # Jump-forward: a forced span whose ambiguous last token was held back (it may merge with
        # the text after it), and the span in the target's other split.
        forced = grammar.forced_text()
        tokenizer = getattr(splits, "tokenizer", None)
        if forced and tokenizer is not None:
            whole = continuation_tokens(tokenizer, context, forced)[:k]
            if len(whole) > len(draft) and list(draft.tokens) == whole[: len(draft)]:
                out.append((whole, "jump_forward"))
        # Schema n-gram: its other top candidates after the draft's forced lead.
        ngram = _schema_ngram(self.inner)
        if ngram is not None:
            lead = 0
            while lead < len(draft) and draft.sources and draft.sources[lead] == "jump_forward":
                lead += 1
            view = grammar
            if lead:
                matcher = grammar.fork()
                if not all(matcher.accept(t) for t in draft.tokens[:lead]) or matcher.is_terminated():
                    return out
                view = GrammarView(matcher)
            prefix = list(draft.tokens[:lead])
            for path in ngram.alternatives(list(context) + prefix, view, k - lead, self.width):
                out.append((prefix + path, "candidate"))
        return out


def _suffix(proposer: Proposer) -> SuffixProposer | None:
    from .suffix import SuffixProposer

    return next((m for m in members(proposer) if isinstance(m, SuffixProposer)), None)


def _schema_ngram(proposer: Proposer) -> SchemaNgramProposer | None:
    from .schema_ngram import SchemaNgramProposer

    return next((m for m in members(proposer) if isinstance(m, SchemaNgramProposer)), None)
