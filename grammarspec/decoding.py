"""The speculative decoding loop.

One step (numbers match the comments in :func:`decode`)::

    1. propose   -- the proposer offers up to k tokens (+ their draft distributions)
    2. mask      -- the matcher walks the draft: one bitmask per position, the draft
                    is cut at its first grammar-illegal token, the matcher is restored
    3. verify    -- ONE target forward over the pending tokens plus the draft
    4. accept    -- same processing for every row (mask, processors, temperature,
                    top-k, top-p), then exact rejection sampling (or greedy match)
    5. commit    -- advance the matcher by the committed tokens, crop the target KV
                    cache to the committed length; rejected positions leave no trace
    6. adapt     -- proposers and the controller learn how much was accepted
    (+) forced   -- while the grammar allows exactly one token, commit it without
                    sampling; it reaches the target in the next forward pass

With no proposer (or speculation switched off) every step is a plain constrained
decoding step, and the output distribution is the same either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from grammars.base import Matcher, allocate_bitmask
from proposers.base import EMPTY_DRAFT, Draft, GrammarView, Proposer
from proposers.tree import DraftTree  # [tree16]

from .cache import crop_cache, forward_with_cache, new_cache, require_croppable
from .rejection import greedy_verify, rejection_sample
from .sampling import LogitsProcessorFn, SamplingParams, probabilities, process_logits, unpack_bitmask
from .stats import GenerationStats
from .tree_verify import verify_tree  # [tree16]

if TYPE_CHECKING:
    from .adaptive import AdaptiveController

__all__ = ["DecodeConfig", "DecodeState", "decode", "logits_width"]


@dataclass(frozen=True)
class DecodeConfig:
    """Plain values that steer one generation."""

    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    eos_token_ids: tuple[int, ...] = ()
    min_new_tokens: int = 0
    stop_strings: tuple[str, ...] = ()


@dataclass
class DecodeState:
    """What the loop holds between steps (handed to ``on_step`` hooks)."""

    tokens: list[int]  # prompt + committed tokens
    prompt_length: int
    cache: Any  # the target's KV cache
    cached: int = 0  # leading tokens whose keys/values are in the cache
    finish_reason: str | None = None

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_length :]


def decode(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    config: DecodeConfig,
    *,
    matcher: Matcher | None = None,
    proposer: Proposer | None = None,
    controller: AdaptiveController | None = None,
    tokenizer: Any = None,
    generator: torch.Generator | None = None,
    processors: Sequence[LogitsProcessorFn] = (),
    on_commit: Callable[[list[int]], None] | None = None,
    on_step: Callable[[DecodeState], None] | None = None,
) -> tuple[list[int], GenerationStats]:
    """Generate after ``prompt_ids``; returns ``(new_tokens, stats)``.

    ``matcher`` constrains the output (``None``: unconstrained); it must be
    fresh and is advanced in lockstep with the target's KV cache.
    ``proposer`` drafts (``None``: plain decoding).  ``on_commit`` receives
    each run of committed tokens (streamers); ``on_step`` sees the state after
    every step (tests use it to check rollback).
    """
    if not prompt_ids:
        raise ValueError("the prompt is empty: pass at least one token (e.g. the BOS token or a chat template)")
    if config.stop_strings and tokenizer is None:
        raise ValueError("stop_strings need the tokenizer: pass tokenizer=...")
    params = config.sampling
    state = DecodeState(tokens=list(prompt_ids), prompt_length=len(prompt_ids), cache=new_cache(model))
    if proposer is not None:
        require_croppable(state.cache, "target model")
    stats = GenerationStats()
    vocab = logits_width(model)
    view = GrammarView(matcher) if matcher is not None else None
    k_max = controller.k_max if controller is not None else 0
    masks = allocate_bitmask(k_max + 1, vocab) if matcher is not None else None
    eos = frozenset(config.eos_token_ids)
    started = time.perf_counter()
    if config.max_new_tokens <= 0:
        state.finish_reason = "length"

    def commit(new: Sequence[int], forced: bool = False) -> None:
        """Append tokens one by one until a stop condition; advance the matcher."""
        emitted: list[int] = []
        for token in new:
            if matcher is not None and not matcher.accept(token):
                raise RuntimeError(f"internal error: committed token {token} is illegal for the grammar")
            state.tokens.append(token)
            emitted.append(token)
            state.finish_reason = _stop_reason(state, token, matcher, eos, config, tokenizer)
            if state.finish_reason:
                break
        stats.new_tokens += len(emitted)
        if forced:
            stats.forced_tokens += len(emitted)
        if on_commit is not None and emitted:
            on_commit(emitted)

    while state.finish_reason is None:
        budget = config.max_new_tokens - len(state.generated)

        # (+) Forced: a grammar that allows exactly one token needs no sampling.
        t0 = time.perf_counter()
        forced = _forced_token(matcher, masks, vocab) if matcher is not None else None
        stats.grammar_seconds += time.perf_counter() - t0
        if forced is not None:
            commit([forced], forced=True)
            continue

        # 1. Propose up to k tokens (k leaves room for the token the target adds).
        t0 = time.perf_counter()
        k = min(controller.k if controller is not None and controller.speculate else 0, budget - 1)
        draft = EMPTY_DRAFT
        # --- [tree16] token trees (batch 1): a proposer with ``propose_tree`` may return a DraftTree,
        # verified in one pass by tree_verify.verify_tree (steps 2-5 for trees); a chain falls through.
        if proposer is not None and k > 0 and hasattr(proposer, "propose_tree"):
            drafted = proposer.propose_tree(state.tokens, view, k)
            if isinstance(drafted, DraftTree):
                _tree_step(model, state, drafted, config, matcher, eos, processors, generator, proposer, controller,
                           stats, commit, t0, started)  # fmt: skip
                if on_step is not None:
                    on_step(state)
                continue
            draft = drafted.truncate(k)
        # --- [/tree16]
        elif proposer is not None and k > 0:
            draft = proposer.propose(state.tokens, view, k).truncate(k)
        t_draft = time.perf_counter() - t0

        # 2. Masks for every draft position; cut the draft at its first illegal token.
        t0 = time.perf_counter()
        draft, rows = _walk_draft(matcher, masks, draft, eos)
        t_grammar = time.perf_counter() - t0

        # 3. One target forward over pending + draft tokens.
        t0 = time.perf_counter()
        pending = state.tokens[state.cached :]
        logits = forward_with_cache(model, pending + list(draft.tokens), state.cache, len(draft) + 1)[:rows]  # [rows, V]

        # 4. Same processing for every row, then exact verification.
        scores = process_logits(
            logits,
            params,
            masks[:rows] if masks is not None else None,
            processors,
            [_prefix(state.tokens, draft, i) for i in range(rows)] if processors else (),
        )
        _suppress_eos(scores, eos, len(state.generated), config.min_new_tokens)
        draft_tokens = torch.tensor(draft.tokens, dtype=torch.long)
        if params.greedy:
            num_accepted, next_token = greedy_verify(scores, draft_tokens)
        else:
            num_accepted, next_token = rejection_sample(
                probabilities(scores), draft_tokens, draft.probs, generator
            )
        t_verify = time.perf_counter() - t0

        # 5. Commit: the cache keeps the context plus the accepted draft tokens.
        t0 = time.perf_counter()
        state.cached = len(state.tokens) + num_accepted
        crop_cache(state.cache, state.cached)
        accepted = list(draft.tokens[:num_accepted])
        commit(accepted + ([next_token] if next_token is not None else []))
        t_grammar += time.perf_counter() - t0

        # 6. Adapt: proposers and the controller learn what was accepted.
        stats.target_forwards += 1
        if stats.target_forwards == 1:
            stats.first_step_seconds, stats.first_step_tokens = time.perf_counter() - started, stats.new_tokens
        stats.steps.append((len(draft), num_accepted))
        stats.draft_seconds += t_draft
        stats.verify_seconds += t_verify
        stats.grammar_seconds += t_grammar
        if len(draft):
            stats.count(draft.sources or ("draft",) * len(draft), num_accepted)
            proposer.feedback(draft, num_accepted)  # type: ignore[union-attr]
        if controller is not None and stats.target_forwards > 1:  # the prefill pass is no decoding step
            if len(draft):
                controller.record_speculative_step(len(draft), num_accepted, t_draft + t_verify + t_grammar)
            else:
                controller.record_plain_step(t_draft + t_verify + t_grammar)
        if on_step is not None:
            on_step(state)

    stats.total_seconds = time.perf_counter() - started
    stats.finish_reason = state.finish_reason or "length"
    if controller is not None:
        stats.final_k, stats.speculating = controller.k, controller.speculate
    return state.generated, stats


# --- [tree16] the tree step; its logic lives in grammarspec/tree_verify.py
def _tree_step(
    model: torch.nn.Module,
    state: DecodeState,
    tree: DraftTree,
    config: DecodeConfig,
    matcher: Matcher | None,
    eos: frozenset[int],
    processors: Sequence[LogitsProcessorFn],
    generator: torch.Generator | None,
    proposer: Any,
    controller: AdaptiveController | None,
    stats: GenerationStats,
    commit: Callable[[Sequence[int]], None],
    step_started: float,
    started: float,
) -> None:
    """Verify ``tree`` in one target pass, commit the accepted path and the target's token, adapt.  Changes state."""
    t0 = time.perf_counter()
    t_draft = t0 - step_started
    masks = allocate_bitmask(len(tree) + 1, logits_width(model)) if matcher is not None else None
    step = verify_tree(
        model, state.cache, state.tokens, state.cached, tree, config.sampling, matcher=matcher, masks=masks, eos=eos,
        processors=processors, min_new_left=config.min_new_tokens - len(state.generated), generator=generator,
    )  # fmt: skip
    t_verify = time.perf_counter() - t0
    state.cached = len(state.tokens) + len(step.accepted)
    committed = list(step.accepted) + ([step.next_token] if step.next_token is not None else [])
    commit(committed)
    proposer.commit_tree(step.tree, committed)
    stats.target_forwards += 1
    if stats.target_forwards == 1:
        stats.first_step_seconds, stats.first_step_tokens = time.perf_counter() - started, stats.new_tokens
    longest = max(step.tree.depths(), default=-1) + 1
    stats.steps.append((longest, len(step.accepted)))
    stats.draft_seconds += t_draft
    stats.verify_seconds += t_verify
    if len(step.tree):
        sources = step.tree.sources or ("draft",) * len(step.tree)
        accepted_nodes = _path_nodes(step.tree, step.accepted)
        order = accepted_nodes + [i for i in range(len(step.tree)) if i not in accepted_nodes]
        stats.count(tuple(sources[i] for i in order), len(accepted_nodes))
    if controller is not None and stats.target_forwards > 1:
        if longest > 0:
            controller.record_speculative_step(longest, len(step.accepted), t_draft + t_verify)
        else:
            controller.record_plain_step(t_draft + t_verify)


def _path_nodes(tree: DraftTree, tokens: Sequence[int]) -> list[int]:
    """The nodes of ``tree`` that spell ``tokens`` from the root."""
    out, node = [], -1
    for token in tokens:
        node = tree.children(node)[token]
        out.append(node)
    return out
# --- [/tree16]


def logits_width(model: torch.nn.Module) -> int:
    """Width of the model's logits (may exceed len(tokenizer): padded vocabularies)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "out_features", None):
        return int(head.out_features)
    return int(model.config.vocab_size)


def _walk_draft(
    matcher: Matcher | None, masks: torch.Tensor | None, draft: Draft, eos: frozenset[int]
) -> tuple[Draft, int]:
    """Fill one mask per draft position and cut the draft where it stops being legal.

    Returns the (possibly shorter) draft and the number of target rows needed:
    ``len(draft) + 1``, or ``len(draft)`` when the draft's last token ends
    generation (then no bonus token may follow).  The matcher ends as it began.
    """
    if matcher is None:  # unconstrained: only cut after an EOS token
        for i, token in enumerate(draft.tokens):
            if token in eos:
                return draft.truncate(i + 1), i + 1
        return draft, len(draft) + 1
    assert masks is not None
    walked = 0
    rows = len(draft) + 1
    for i in range(len(draft) + 1):
        matcher.fill_mask(masks, i)
        if i == len(draft):
            break
        if not matcher.accept(draft.tokens[i]):
            draft, rows = draft.truncate(i), i + 1
            break
        walked += 1
        if matcher.is_terminated():  # the draft ends the document: no bonus row
            draft, rows = draft.truncate(i + 1), i + 1
            break
    if walked:
        matcher.rollback(walked)
    return draft, rows


def _forced_token(matcher: Matcher, masks: torch.Tensor | None, vocab: int) -> int | None:
    """The only legal next token, if the grammar allows exactly one."""
    assert masks is not None
    matcher.fill_mask(masks, 0)
    allowed = unpack_bitmask(masks[:1], vocab)[0]
    if int(allowed.sum()) != 1:
        return None
    return int(allowed.nonzero()[0])


def _prefix(tokens: list[int], draft: Draft, i: int) -> torch.LongTensor:
    return torch.tensor([tokens + list(draft.tokens[:i])], dtype=torch.long)


def _suppress_eos(scores: torch.Tensor, eos: frozenset[int], generated: int, min_new: int) -> None:
    """min_new_tokens: forbid EOS at rows before the minimum, unless EOS is all the row allows."""
    if not eos or generated >= min_new:
        return
    ids = torch.tensor(sorted(eos), dtype=torch.long)
    ids = ids[ids < scores.shape[-1]]
    for row in range(min(scores.shape[0], min_new - generated)):
        blocked = scores[row].clone()
        blocked[ids] = float("-inf")
        if not bool(torch.isneginf(blocked).all()):
            scores[row] = blocked


def _stop_reason(
    state: DecodeState,
    token: int,
    matcher: Matcher | None,
    eos: frozenset[int],
    config: DecodeConfig,
    tokenizer: Any,
) -> str | None:
    if matcher is not None and matcher.is_terminated():
        return "stop"
    if token in eos:
        return "eos" if matcher is None else "stop"
    if config.stop_strings and _ends_with_stop_string(state.generated, config.stop_strings, tokenizer):
        return "stop_string"
    if len(state.generated) >= config.max_new_tokens:
        return "length"
    return None


def _ends_with_stop_string(generated: list[int], stop_strings: tuple[str, ...], tokenizer: Any) -> bool:
    """Whether a stop string is completed by the last generated token."""
    window = max(len(s) for s in stop_strings) + 1  # every token holds at least one character
    tail = generated[-window:]
    text = tokenizer.decode(tail, skip_special_tokens=False)
    before = tokenizer.decode(tail[:-1], skip_special_tokens=False)
    return any(s in text and s not in before for s in stop_strings)
