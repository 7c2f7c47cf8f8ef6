"""The values the decoding loop holds: its settings, the requests, each row's state, one step's part.

Plain holders, no logic: :mod:`grammarspec.engine.decoding` runs the loop over them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from grammars.base import Matcher
from grammarspec.engine.sampling import SamplingParams
from grammarspec.stats import GenerationStats
from proposers.base import EMPTY_DRAFT, Draft, Proposer, TreeDrafter
from proposers.tree import EMPTY_TREE, DraftTree

if TYPE_CHECKING:
    from grammarspec.engine.isolation import RowFailure
    from grammarspec.engine.step_trace import StepTrace
    from grammarspec.policy.adaptive import AdaptiveController
    from grammarspec.policy.cost import PassCheck, PassCostSource
    from grammarspec.policy.step_cost import StepCostLearner

__all__ = ["DecodeConfig", "DecodeState", "Processing", "Row", "RowRequest", "RowSettings", "StepResources", "Step"]

#: Row processing: (logits [n, V] float32 already masked, prefixes) -> scores [n, V].
Processing = Callable[[torch.Tensor, Sequence[Sequence[int]]], torch.Tensor]


@dataclass(frozen=True)
class RowSettings:
    """How one row chooses its tokens and where it stops, whatever the other rows of the batch hold.

    ``greedy``: the row takes the argmax of its processed scores (else it draws
    from them; temperature, top-p and the rest live in the row's processing);
    ``max_new_tokens``: the most tokens it generates (no draft reaches past
    them); ``stop_strings``: text that ends it once generated.
    """

    max_new_tokens: int
    greedy: bool = True
    stop_strings: tuple[str, ...] = ()


@dataclass(frozen=True)
class DecodeConfig:
    """Plain values that steer one generation: what every row shares, and the settings of a row that brings none."""

    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    eos_token_ids: tuple[int, ...] = ()
    min_new_tokens: int = 0
    stop_strings: tuple[str, ...] = ()
    #: keep the processed scores / raw logits of every committed token (forced tokens then take a target pass)
    record_scores: bool = False

    @property
    def row_settings(self) -> RowSettings:
        """The settings of a row whose request brings none of its own."""
        return RowSettings(self.max_new_tokens, self.sampling.greedy, self.stop_strings)


@dataclass
class RowRequest:
    """One request of a batch: its prompt, grammar state, drafter, controller, processing and settings.

    :func:`grammarspec.engine.row_requests.row_request` builds them for ``generate`` and the server alike.
    """

    prompt_ids: Sequence[int]
    matcher: Matcher | None = None
    proposer: Proposer | None = None
    controller: AdaptiveController | None = None
    processing: Processing | None = None  # default: the config's sampling settings
    settings: RowSettings | None = None  # default: the config's (DecodeConfig.row_settings)


@dataclass
class Row:
    """What the loop holds for one request between steps (also what ``on_step`` hooks see)."""

    index: int  # position in the caller's batch
    tokens: list[int]  # prompt + committed tokens
    prompt_length: int
    matcher: Matcher | None
    proposer: Proposer | None
    controller: AdaptiveController | None
    processing: Processing
    settings: RowSettings
    stats: GenerationStats = field(default_factory=GenerationStats)
    cached: int = 0  # leading tokens whose keys/values are in the target cache
    finish_reason: str | None = None  # "error": its own work raised (``failure``; grammarspec/engine/isolation.py)
    failure: RowFailure | None = None
    scores: list[torch.Tensor] = field(default_factory=list)  # processed scores of committed tokens (record_scores)
    logits: list[torch.Tensor] = field(default_factory=list)  # raw logits of committed tokens (record_scores)
    state_mask: torch.Tensor | None = (
        None  # [1, ceil(V/32)] int32 host row: the mask of the current state (forced check)
    )
    state_mask_ready: bool = False  # whether ``state_mask`` holds the current state's mask (the walk then reuses it)
    untold: list[int] = field(default_factory=list)  # committed tokens the proposer has not heard (commit.tell)

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    @functools.cached_property
    def tree_drafter(self) -> TreeDrafter | None:
        """The proposer, if it drafts trees (its declared capability, checked once: a Protocol check is slow)."""
        return self.proposer if self.proposer is not None and isinstance(self.proposer, TreeDrafter) else None

    @property
    def pending(self) -> list[int]:
        """Committed tokens the target has not seen yet (the last token, forced tokens)."""
        return self.tokens[self.cached :]


@dataclass
class DecodeState:
    """What a batch-1 ``on_step`` hook of :func:`decode` sees after every step."""

    tokens: list[int]  # prompt + committed tokens
    prompt_length: int
    cache: Any  # the target's KV cache
    cached: int  # leading tokens whose keys/values are in the cache

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_length :]


@dataclass
class Step:
    """One row's part of a step: its draft tree, its rows in the stacked logits, what it cost.

    ``tree``: what the target verifies (after the walk, grammar-pruned); a chain
    draft is the one-branch tree and ``draft`` keeps it with its distributions.
    ``is_tree``: the tree came from ``propose_tree`` (the proposer hears ``commit_tree``).
    ``start``: the row of the tree's root in the stacked logits; ``ends[i]``: node ``i`` ends generation.
    ``offered``: the chain the proposer offered, before the policy cut it to ``draft``.
    """

    draft: Draft = EMPTY_DRAFT
    offered: Draft = EMPTY_DRAFT
    tree: DraftTree = EMPTY_TREE
    is_tree: bool = False
    start: int = 0
    ends: list[bool] = field(default_factory=list)
    draft_seconds: float = 0.0
    grammar_seconds: float = 0.0


@dataclass
class StepResources:
    """The resources every step of one :func:`decode_batch` call uses: settings, tokenizer, generator, the host
    mask buffer, the callbacks, the pass cost, the trace and the step cost learner (a plain holder)."""

    config: DecodeConfig
    tokenizer: Any
    generator: torch.Generator | None
    eos: frozenset[int]
    masks: torch.Tensor  # [rows of the widest step, ceil(V/32)] int32, on the host (grows for trees)
    started: float
    step_cost: Callable[[int], float] | None
    pass_cost: PassCostSource  # the target's pass cost, as the loop's caller resolved it (grammarspec.policy.cost)
    on_commit: Callable[[int, list[int]], None] | None
    on_step: Callable[[list[Row], Any], None] | None
    trees: bool = False  # whether tree passes can run (BatchKV.supports_trees)
    trace: StepTrace | None = None  # records each step's rows, drafts, forward and phase times (off: None)
    cost_learner: StepCostLearner | None = None  # learns the policy's step cost from the steps run (off: None)
    clock: Callable[[], float] = time.perf_counter  # what the steps are timed by (Phases), seconds
    profile_check: PassCheck | None = None  # checks the pass cost against a lone row's passes (off: None)
