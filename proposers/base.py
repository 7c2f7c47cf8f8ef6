"""The protocol every drafter speaks.

A proposer looks at the committed context and a read-only view of the grammar
and returns a :class:`Draft`: up to ``k`` tokens, plus -- only for sampled
drafts -- the distributions they were sampled from.  After every loop step it is
told what happened (:meth:`Proposer.commit`): how many of its tokens the target
accepted and which tokens were appended to the context.

Proposers never change the output distribution: every draft is truncated at
its first grammar-illegal token and then verified by exact rejection sampling
against the target.  A deterministic draft (``probs is None``) is a point mass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from grammars.base import Matcher

    from .cost import PassCost
    from .text import SplitPreferences

__all__ = [
    "Draft",
    "Request",
    "GrammarView",
    "Proposer",
    "EMPTY_DRAFT",
    "DraftTree",
    "EMPTY_TREE",
    "TreeDrafter",
    "ProposerGroup",
    "ModelDrafter",
    "ForcedSpanDrafter",
    "TextDrafter",
    "CostModelled",
    "SplitLearner",
    "members",
    "split_owner",
]


@dataclass(frozen=True)
class Draft:
    """Proposed tokens.

    ``tokens``: the draft, at most ``k`` long.
    ``probs``: ``[len(tokens), vocab]`` -- the (processed, masked) distribution
    each token was sampled from, or ``None`` for a deterministic draft.  In a
    mixed draft a deterministic position carries a one-hot row, which is the
    same thing as a point mass.
    ``sources``: the name of the proposer behind each token (for statistics).
    ``kind``: what sort of guess the draft starts with, in the proposer's own
    words (the schema-aware drafter names the source of its first token:
    ``"history"``, ``"prompt"``, ``"schema_guess"``...).  Guesses of different
    kinds succeed at very different rates, so the composite keeps a separate
    record per proposer and kind (:class:`proposers.track.Calibration`).
    ``confidence``: the proposer's own estimate, per token, that the target
    accepts it given that the tokens before it were accepted (``None``: no
    estimate).  Only the drafting policy reads it (:mod:`grammarspec.policy.allocation`
    calibrates it online); it never changes what is accepted.
    """

    tokens: tuple[int, ...] = ()
    probs: torch.Tensor | None = None
    sources: tuple[str, ...] = ()
    kind: str = ""
    confidence: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.sources and len(self.sources) != len(self.tokens):
            raise ValueError("Draft.sources must name one proposer per token")
        if self.probs is not None and self.probs.shape[0] != len(self.tokens):
            raise ValueError(f"Draft.probs has {self.probs.shape[0]} rows for {len(self.tokens)} tokens")
        if self.confidence is not None and len(self.confidence) != len(self.tokens):
            raise ValueError(f"Draft.confidence has {len(self.confidence)} values for {len(self.tokens)} tokens")

    def __len__(self) -> int:
        return len(self.tokens)

    def truncate(self, n: int) -> Draft:
        """The first ``n`` tokens of this draft (and their rows/sources)."""
        if n >= len(self.tokens):
            return self
        return Draft(
            tokens=self.tokens[:n],
            probs=None if self.probs is None else self.probs[:n],
            sources=self.sources[:n],
            kind=self.kind,
            confidence=None if self.confidence is None else self.confidence[:n],
        )


EMPTY_DRAFT = Draft()


@dataclass(frozen=True)
class Request:
    """What a proposer may know about the generation it drafts for.

    Plain values only.  ``schema`` is the JSON Schema when the grammar came
    from one (tools are turned into a schema too), else ``None``.  (How a
    draft model samples is the runtime's business: it builds that drafter
    with the row's processing, see :mod:`grammarspec.drafting.draft_model`.)
    ``documents``: JSON texts the conversation's earlier turns produced (tool
    calls, JSON answers; oldest first), for drafters that copy from them.
    """

    prompt_ids: tuple[int, ...]
    tokenizer: PreTrainedTokenizerBase | None
    schema: dict[str, Any] | None = None
    documents: tuple[str, ...] = ()


class GrammarView:
    """Read-only access to the request's grammar state for proposers.

    Every method leaves the live matcher exactly as it was.  ``fork`` returns
    an independent matcher a proposer may advance freely (a draft model walks
    its own samples with one).
    """

    def __init__(self, matcher: Matcher) -> None:
        self._matcher = matcher

    @property
    def vocab_size(self) -> int:
        return self._matcher.vocab_size

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self._matcher.stop_token_ids

    def validate(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` are legal.  Does not change state."""
        return self._matcher.validate(tokens)

    def forced_text(self) -> str:
        """Text the grammar forces next ("" if none).  Does not change state."""
        return self._matcher.forced_text()

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()

    def allowed_tokens(self) -> torch.Tensor:
        """Legal next token ids (1-D int64).  Does not change state."""
        return self._matcher.allowed_tokens()

    def fork(self) -> Matcher:
        """An independent matcher in the current state, free to advance."""
        return self._matcher.fork()


@runtime_checkable
class Proposer(Protocol):
    """A drafter.  Stateful per request; not shared between threads."""

    name: str

    def start(self, request: Request) -> None:
        """Begin a new generation (reset all per-request state)."""

    def propose(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft:
        """Up to ``k`` tokens to follow ``context`` (prompt + committed tokens).

        ``grammar`` is ``None`` for unconstrained generation.  Must not change
        the grammar state.  Return :data:`EMPTY_DRAFT` when there is nothing
        worth proposing.
        """

    def commit(self, draft: Draft, num_accepted: int, committed: Sequence[int]) -> None:
        """Tokens were appended to the context: learn what was accepted.  Changes the proposer's state.

        Called once for each step that verified a draft of this proposer:
        ``draft`` is what it proposed, possibly cut by the grammar, the budget
        or the batch's allocation, ``num_accepted`` how many of those tokens
        the target accepted, and ``committed`` the accepted prefix plus the
        target's own token.  Tokens committed in steps that verified no draft
        of its own (forced tokens, drafts cut to nothing, steps it was not
        asked) come with :data:`EMPTY_DRAFT` and ``0``, possibly several
        steps' worth in one call (the decoding loop tells them at once), but
        always before it is next asked to propose and by the time the
        generation ends.  Every committed token is told exactly once, in
        order: the next context is the previous one plus everything committed
        since.
        """


@dataclass(frozen=True)
class DraftTree:
    """A frozen token tree in depth-first order; see :mod:`proposers.tree`.

    ``tokens[i]`` is node ``i``'s token, ``parents[i]`` its parent node
    (``-1``: a child of the committed context, i.e. a first draft token).
    ``sources[i]`` names the proposer behind node ``i`` (statistics).
    """

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    sources: tuple[str, ...] = ()
    kind: str = ""

    def __post_init__(self) -> None:
        if len(self.parents) != len(self.tokens):
            raise ValueError(f"DraftTree has {len(self.tokens)} tokens but {len(self.parents)} parents")
        if self.sources and len(self.sources) != len(self.tokens):
            raise ValueError("DraftTree.sources must name one proposer per node")
        seen: set[tuple[int, int]] = set()
        for i, (parent, token) in enumerate(zip(self.parents, self.tokens)):
            if not -1 <= parent < i:
                raise ValueError(f"node {i} has parent {parent}: a parent must come before its child (or be -1)")
            if (parent, token) in seen:
                raise ValueError(f"node {i} repeats token {token} under parent {parent}: siblings must differ")
            seen.add((parent, token))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        """Whether the tree has one branch (``parents == (-1, 0, 1, ...)``)."""
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def depths(self) -> list[int]:
        """Depth of each node (0: a first draft token)."""
        out: list[int] = []
        for p in self.parents:
            out.append(0 if p < 0 else out[p] + 1)
        return out

    def path(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node`` (``[]`` for ``-1``)."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def children(self, node: int) -> dict[int, int]:
        """Token -> child node index, for ``node`` (``-1``: the context)."""
        return {t: i for i, (p, t) in enumerate(zip(self.parents, self.tokens)) if p == node}

    def width(self) -> int:
        """Number of leaves (branches)."""
        parents = set(self.parents)
        return sum(1 for i in range(len(self)) if i not in parents)

    def truncate(self, size: int) -> DraftTree:
        """The first ``size`` nodes (a tree again: parents come first)."""
        if size >= len(self):
            return self
        return DraftTree(self.tokens[:size], self.parents[:size], self.sources[:size], self.kind)

    def keep(self, kept: Sequence[bool]) -> DraftTree:
        """The nodes with ``kept[i]`` whose ancestors are all kept, re-indexed."""
        index: dict[int, int] = {-1: -1}
        tokens: list[int] = []
        parents: list[int] = []
        sources: list[str] = []
        for i, (p, t) in enumerate(zip(self.parents, self.tokens)):
            if kept[i] and p in index:
                index[i] = len(tokens)
                tokens.append(t)
                parents.append(index[p])
                if self.sources:
                    sources.append(self.sources[i])
        return DraftTree(tuple(tokens), tuple(parents), tuple(sources), self.kind)

    def as_draft(self) -> Draft:
        """The tree as a chain :class:`Draft`; raises ``ValueError`` if it branches."""
        if not self.is_chain:
            raise ValueError("this DraftTree branches; verify it with grammarspec.engine.tree_layout")
        return Draft(tokens=self.tokens, sources=self.sources, kind=self.kind)

    @staticmethod
    def from_draft(draft: Draft) -> DraftTree:
        """A chain tree from a deterministic :class:`Draft` (``probs`` must be ``None``)."""
        if draft.probs is not None:
            raise ValueError("a sampled draft (probs given) cannot become a DraftTree; verify it as a chain")
        n = len(draft)
        return DraftTree(draft.tokens, tuple(range(-1, n - 1)), draft.sources, draft.kind)

    @staticmethod
    def from_paths(
        paths: Sequence[Sequence[int]], sources: Sequence[str] = (), size: int | None = None, kind: str = ""
    ) -> DraftTree:
        """A trie of ``paths`` (common prefixes shared), the first path first; at most ``size`` nodes.

        ``sources[j]`` names path ``j``'s proposer.  Depth-first order: each
        path's new nodes follow the nodes it shares, so the primary (first)
        path is whole before any alternative, and cutting to ``size`` drops
        alternatives first.

        >>> t = DraftTree.from_paths([[5, 6, 7], [5, 8]])
        >>> t.tokens, t.parents
        ((5, 6, 7, 8), (-1, 0, 1, 0))
        """
        # Build the trie, then lay it out depth-first with the first path's children first.
        children: dict[int, list[tuple[int, int]]] = {-1: []}  # node -> [(token, node)]
        tokens: list[int] = []
        owner: list[str] = []
        for j, path in enumerate(paths):
            node = -1
            for token in path:
                found = next((c for t, c in children[node] if t == int(token)), None)
                if found is None:
                    found = len(tokens)
                    tokens.append(int(token))
                    owner.append(sources[j] if j < len(sources) else "")
                    children[node].append((int(token), found))
                    children[found] = []
                node = found
        out_tokens: list[int] = []
        out_parents: list[int] = []
        out_sources: list[str] = []
        stack: list[tuple[int, int]] = [(c, -1) for _, c in reversed(children[-1])]
        while stack and (size is None or len(out_tokens) < size):
            node, parent = stack.pop()
            me = len(out_tokens)
            out_tokens.append(tokens[node])
            out_parents.append(parent)
            out_sources.append(owner[node])
            stack.extend((c, me) for _, c in reversed(children[node]))
        return DraftTree(tuple(out_tokens), tuple(out_parents), tuple(out_sources) if sources else (), kind)


EMPTY_TREE = DraftTree()


# -- optional capabilities: typed extensions of the protocol (the loop tests them with isinstance) --------


@runtime_checkable
class TreeDrafter(Proposer, Protocol):
    """A proposer that may draft a token tree (:class:`DraftTree`) instead of a chain."""

    def propose_tree(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft | DraftTree:
        """A tree at most ``k`` deep, or a chain :class:`Draft` (sampled drafts always stay chains).

        May change the proposer's state only as :meth:`Proposer.propose` does; never the grammar.
        """

    def commit_tree(self, tree: DraftTree, committed: Sequence[int]) -> None:
        """The step verified ``tree`` (after grammar pruning) and appended ``committed``.  Changes state.

        Called instead of :meth:`Proposer.commit` after a step whose draft came from
        :meth:`propose_tree` as a tree.
        """


@runtime_checkable
class ProposerGroup(Protocol):
    """A proposer made of other proposers (the composite, a tree around a chain proposer)."""

    @property
    def proposers(self) -> list[Proposer]:
        """The members that draft (leaves first-level; a member may itself be a group)."""


@runtime_checkable
class ForcedSpanDrafter(Proposer, Protocol):
    """A proposer that can draft exactly what the grammar forces next (the composite puts it first)."""

    def forced(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft:
        """The whole forced span after ``context`` (at most ``k`` tokens), or :data:`EMPTY_DRAFT`.

        Does not change state: the composite continues after it and splits the seam itself.
        """


@runtime_checkable
class TextDrafter(Proposer, Protocol):
    """A proposer that drafts text: with a true ``needs_tokenizer`` it cannot run without ``Request.tokenizer``."""

    needs_tokenizer: bool


@runtime_checkable
class ModelDrafter(Proposer, Protocol):
    """A proposer that runs a draft model (expensive: the composite asks it only as a fallback)."""

    runs_model: bool


@runtime_checkable
class CostModelled(Protocol):
    """A proposer that sizes its own choices by the target's pass cost (:class:`proposers.cost.PassCost`).

    The Hugging Face loop hands it the target's cost model before the
    request's first step (:meth:`use_cost_model`: the curve profiled once per
    model, device, dtype and thread count, :func:`grammarspec.drafting.cost_model.batch_cost_model`),
    and never teaches it measured times, so its choices do not follow the
    wall clock.  A model given at construction is kept.
    """

    cost_model: PassCost

    def use_cost_model(self, cost: PassCost) -> None:
        """Size choices by ``cost`` from now on, unless built with a model of its own.  Changes state."""


@runtime_checkable
class SplitLearner(Protocol):
    """A proposer that learns how the target splits text into tokens (tree builders read it; a server carries
    it from request to request)."""

    splits: SplitPreferences


def members(proposer: Proposer) -> list[Proposer]:
    """Every proposer inside ``proposer``, itself included, depth first.  Does not change state."""
    out: list[Proposer] = [proposer]
    if isinstance(proposer, ProposerGroup):
        for member in proposer.proposers:
            out += [m for m in members(member) if all(m is not seen for seen in out)]
    return out


def split_owner(proposer: Proposer | None) -> SplitPreferences | None:
    """The splits the outermost :class:`SplitLearner` in ``proposer`` learns (a composite's, which it teaches
    and its members share), or ``None`` where nothing drafting learns them.  Does not change state."""
    for member in members(proposer) if proposer is not None else []:
        if isinstance(member, SplitLearner):
            return member.splits
    return None
