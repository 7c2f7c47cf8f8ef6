"""The vLLM ``custom_class`` proposer: grammarspec's drafters for every running request, in one call.

vLLM (0.32, V1 model runner) builds the class with the ``VllmConfig`` inside
the model runner's ``__init__`` and calls, after each step's bookkeeping::

    propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)

``sampled_token_ids[i]``: the tokens appended to batch row ``i`` this step
(accepted draft tokens + the target's own token; empty for a row still in
prefill); ``num_tokens_no_spec[i]``: its context length;
``token_ids_cpu[i, :n]``: its context (prompt + output).  It returns one
draft (a list of token ids, possibly empty) per row.

What vLLM does not hand over -- which request a row holds, its prompt and
its structured-output parameters -- is read from the model runner that
built the proposer (found on the call stack at construction: its
``input_batch.req_ids`` and ``requests[req_id]``).  With the runner, state
is keyed by request id and the request's schema gives the drafters a grammar
view (jump-forward, schema sources); without it (another vLLM layout), rows
are keyed by batch index and told apart by their first tokens, and drafts
come from the JSON document and the prompt alone.

Per request: a fresh ``"auto"`` composite (jump-forward + schema n-gram +
prompt lookup + drafts from earlier requests' outputs: one
:class:`~proposers.suffix_index.SuffixIndex` shared by every request this
drafter serves, scoped by schema, of ``GRAMMARSPEC_DRAFT_MEMORY_MB``
megabytes, :data:`DRAFT_MEMORY_MB` when unset, 0 to turn it off), an own grammar matcher advanced over every
committed token up to the request's stop token (dropped if it ever disagrees with what vLLM committed), and
the last draft.
Each step first tells the drafters how much of their last draft vLLM
accepted (the new tokens compared with that draft), then drafts again.
A state is dropped at the step its request ends (stop token, grammar
complete, ``max_tokens``), else (a stop string, an abort) at the first call
after the request left the runner.

How much of each draft goes to vLLM: the batch drafting policy of the loop
(:func:`grammarspec.policy.allocation.plan_drafts`), over every running
request at once, each request with its own
:class:`grammarspec.policy.adaptive.AdaptiveController`: its drafts are
calibrated on what vLLM accepted, the first token the policy cut off is
judged against vLLM's own token there, and after drafts cut to nothing its
drafters rest for 1, 2, 4, ... steps (at a batch where drafting does not
pay, proposing is host work the engine waits for; text the grammar forces
wakes them).  The pass cost is learned online
(:class:`proposers.cost.PassCost`) from the time between two ``propose``
calls (one engine step, our drafting excluded) against the rows that step
verified (one per running request plus the drafts we returned); a step that
also computed a prompt (a request in prefill, or one seen for the first time)
teaches nothing, since its time is mostly the prompt's.  So a request
gets draft tokens only where they pay at the engine's current batch, and
none elsewhere; jump-forward's forced text is always sent.

Exactness is vLLM's: every draft is verified by vLLM's target pass and
rejection sampler and cut at the first token vLLM's own grammar rejects.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from grammars import GrammarError, compile_grammar, grammar_spec
from grammars.base import Matcher
from grammarspec.policy.adaptive import AdaptiveController
from grammarspec.policy.allocation import plan_drafts
from proposers.base import EMPTY_DRAFT, Draft, GrammarView, Proposer, Request
from proposers.cost import PassCost
from proposers.presets import resolve_assistant
from proposers.suffix_index import SuffixIndex

__all__ = ["GrammarspecProposer", "RequestInfo", "request_info", "find_model_runner"]

_log = logging.getLogger("grammarspec.vllm")

#: Rows keyed by batch index (no runner): this many leading tokens tell two requests apart.
_HEAD = 32


@dataclass(frozen=True)
class RequestInfo:
    """What the proposer knows about one request (plain values)."""

    prompt_ids: tuple[int, ...] | None = None
    schema: dict[str, Any] | None = None  # a JSON Schema request
    spec: Any = None  # grammars.GrammarSpec, or None: no grammar view
    max_tokens: int | None = None
    stop_ids: tuple[int, ...] = ()  # token ids that end the request besides end-of-sequence


@dataclass
class _State:
    """Per-request drafting state."""

    proposer: Proposer
    view: GrammarView | None
    matcher: Matcher | None
    prompt_length: int
    synced: int  # context tokens already seen (and fed to the matcher)
    head: tuple[int, ...]  # first tokens of the context (identity when keyed by batch index)
    stops: frozenset[int]  # token ids that end the request (end-of-sequence and its stop token ids)
    controller: AdaptiveController  # the drafting policy's part for this request: ask, rest, calibration
    max_tokens: int | None = None
    draft: Draft = field(default=EMPTY_DRAFT)  # what vLLM was sent last step
    offered: Draft = field(default=EMPTY_DRAFT)  # that draft before the policy cut it
    decided: bool = False  # whether the request has had a drafting step (vLLM verifies one after each)


def find_model_runner(max_depth: int = 16) -> Any:
    """The vLLM model runner whose ``__init__`` is building the caller (``None`` if there is none).

    Walks the call stack for a ``self`` whose class derives from vLLM's ``GPUModelRunner``
    (the CPU runner does).  Does not change state.
    """
    frame: FrameType | None = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if candidate is not None and any(c.__name__ == "GPUModelRunner" for c in type(candidate).__mro__):
            return candidate
        frame = frame.f_back
    return None


def request_info(state: Any, any_whitespace: bool) -> RequestInfo:
    """The prompt, schema and grammar spec of a vLLM ``CachedRequestState`` (duck-typed).

    ``any_whitespace``: whether vLLM's grammar allows flexible whitespace (its
    ``disable_any_whitespace`` off); our grammar must match it.  A constraint
    grammarspec cannot express (``choice``, ``structural_tag``, a Lark grammar)
    gives ``spec=None``: drafting goes on without a grammar view.  Does not change state.
    """
    prompt = getattr(state, "prompt_token_ids", None)
    params = getattr(state, "sampling_params", None)
    outputs = getattr(params, "structured_outputs", None)
    max_tokens = getattr(params, "max_tokens", None)
    stop_ids = tuple(int(t) for t in getattr(params, "stop_token_ids", None) or ())
    info: dict[str, Any] = {
        "prompt_ids": tuple(prompt) if prompt is not None else None,
        "max_tokens": max_tokens,
        "stop_ids": stop_ids,
    }
    if outputs is None:
        return RequestInfo(**info)
    flexible = any_whitespace and not getattr(outputs, "disable_any_whitespace", False)
    schema = outputs.json
    try:
        if schema is not None:
            schema = json.loads(schema) if isinstance(schema, str) else schema
            return RequestInfo(**info, schema=schema, spec=grammar_spec(schema=schema, any_whitespace=flexible))
        if outputs.json_object:
            return RequestInfo(**info, spec=grammar_spec(json_object=True, any_whitespace=flexible))
        if outputs.regex is not None:
            return RequestInfo(**info, spec=grammar_spec(regex=outputs.regex))
    except (GrammarError, ValueError, TypeError):  # vLLM accepted it; we just draft without a grammar
        pass
    return RequestInfo(**info)


#: Megabytes of the index of earlier outputs when ``GRAMMARSPEC_DRAFT_MEMORY_MB`` is unset (the server's
#: ``--draft-memory-mb`` default); ``GRAMMARSPEC_DRAFT_MEMORY_MB=0`` turns it off.
DRAFT_MEMORY_MB = 256


def draft_index_from_env() -> SuffixIndex | None:
    """The shared index of earlier outputs ``GRAMMARSPEC_DRAFT_MEMORY_MB`` asks for (``None`` for 0).

    Raises ``ValueError`` naming the variable when it is not a number of megabytes >= 0.
    """
    raw = os.environ.get("GRAMMARSPEC_DRAFT_MEMORY_MB", str(DRAFT_MEMORY_MB))
    try:
        megabytes = float(raw)
    except ValueError:
        megabytes = -1.0
    if not megabytes >= 0:
        raise ValueError(f"GRAMMARSPEC_DRAFT_MEMORY_MB={raw!r}: give megabytes >= 0 (0 turns the index off)")
    return SuffixIndex(int(megabytes * (1 << 20))) if megabytes > 0 else None


class GrammarspecProposer:
    """vLLM ``custom_class`` drafter running grammarspec's ``"auto"`` proposers per request.

    Built by vLLM with the ``VllmConfig`` (``runner`` is found on the call stack; tests pass one).
    ``propose`` changes the per-request states; nothing else does.
    """

    def __init__(self, vllm_config: Any, runner: Any = None, tokenizer: Any = None) -> None:
        spec_config = vllm_config.speculative_config
        if spec_config is None or not spec_config.num_speculative_tokens:
            raise ValueError("GrammarspecProposer needs speculative_config with num_speculative_tokens >= 1")
        model_config = vllm_config.model_config
        self.k = int(spec_config.num_speculative_tokens)
        self.max_model_len = int(model_config.max_model_len)
        self.vocab_size = int(model_config.get_vocab_size())
        outputs_config = getattr(vllm_config, "structured_outputs_config", None)
        self.any_whitespace = not bool(getattr(outputs_config, "disable_any_whitespace", False))
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_config.tokenizer)
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token_id
        runner = runner if runner is not None else find_model_runner()
        self._runner = weakref.ref(runner) if runner is not None else None
        self.states: dict[Any, _State] = {}
        #: Earlier requests' outputs, shared by every request's drafters (None: off).
        self.draft_index = draft_index_from_env()
        #: Builds one request's drafters (a fresh object per request; tests swap it).
        self.make_proposer: Any = lambda: resolve_assistant("auto", suffix_index=self.draft_index)
        self.drafts = 0  # drafts returned (non-empty), for logs and tests
        self.grammar_drops = 0  # requests whose grammar disagreed with vLLM's output
        self.errors = 0  # drafting failures (logged; that row got no draft)
        #: The engine step's cost against the rows it verified, learned online (the policy's cost model).
        self.cost_model = PassCost(prior_weight=8.0)
        self.admitted = 0  # draft tokens sent to vLLM, over all calls
        self._returned = 0.0  # when the last propose call returned (perf_counter)
        self._rows = 0  # rows the engine verifies after the last call: one per request plus its draft

    @property
    def runner(self) -> Any:
        return self._runner() if self._runner is not None else None

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No model to load (vLLM calls this on every drafter)."""

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: Any,
        token_ids_cpu: Any,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """One draft per batch row (``[]``: none).  Updates the per-request states.

        ``num_tokens_no_spec``: ``[max_num_reqs]`` int32 array; ``token_ids_cpu``:
        ``[max_num_reqs, max_model_len]`` int32 array (vLLM's input batch).
        """
        started = time.perf_counter()
        prefilled = False  # whether the step since our last call also computed a prompt (its time is not the rows')
        runner = self.runner
        batch = getattr(runner, "input_batch", None)
        req_ids = list(batch.req_ids) if batch is not None else None
        requests = getattr(runner, "requests", None)
        out: list[list[int]] = []
        keys: list[Any] = []
        seen: set[Any] = set()
        for i, sampled in enumerate(sampled_token_ids):
            key = req_ids[i] if req_ids is not None and i < len(req_ids) else i
            seen.add(key)
            keys.append(key)
            n = int(num_tokens_no_spec[i])
            if not sampled or n >= self.max_model_len:
                prefilled = prefilled or not sampled  # a prompt chunk with nothing sampled yet
                out.append([])
                continue
            prefilled = prefilled or key not in self.states  # first seen: its prompt ended in that step
            cached = requests.get(key) if requests is not None and req_ids is not None else None
            try:
                out.append(self._step(key, token_ids_cpu[i, :n].tolist(), sampled, cached))
            except Exception:  # noqa: BLE001 - a drafting bug must not stop the engine: no draft is always exact
                self.errors += 1
                self.states.pop(key, None)
                _log.exception("grammarspec drafter failed for request %s; drafting nothing for this step", key)
                out.append([])
        self._forget(seen, requests if req_ids is not None else None)
        if self._rows and self._returned and not prefilled:  # the engine step since our last call: self._rows rows
            self.cost_model.update(self._rows, started - self._returned)
        out = self._allocate(out, keys)
        self._rows = sum(1 + len(draft) for draft in out)
        self._returned = time.perf_counter()
        return out

    def _allocate(self, out: list[list[int]], keys: list[Any]) -> list[list[int]]:
        """Cut every row's draft to what pays at this batch: the loop's own policy
        (:func:`grammarspec.policy.allocation.plan_drafts`, a packed pass), on each request's controller.

        Changes each state's remembered draft to the part sent, and tells its controller.
        """
        states = [self.states.get(key) if tokens else None for tokens, key in zip(out, keys)]
        drafts = [state.draft if state is not None else EMPTY_DRAFT for state in states]
        controllers = [state.controller if state is not None else None for state in states]
        lengths = plan_drafts(drafts, controllers, len(out), self.cost_model.cost)
        result = []
        for key, state, draft, n in zip(keys, states, drafts, lengths):
            if state is not None:
                state.draft = draft.truncate(n)
                state.controller.allocated(n, len(draft))
            elif key in self.states:  # no draft this step (resting, or the proposer found none)
                self.states[key].controller.allocated(0, 0)
            result.append(list(draft.tokens[:n]))
            self.admitted += n
        return result

    def _step(self, key: Any, context: list[int], sampled: Sequence[int], cached: Any) -> list[int]:
        """Learn from the last step of one request, then draft for it (``[]``: none).  Changes its state."""
        state = self._state(key, context, len(sampled), cached)
        context = self._sync(state, context, sampled)
        if self._finished(state, context):  # ends with this step: vLLM will not ask again
            del self.states[key]
            return []
        return self._draft(state, context)

    # --- per-request state ----------------------------------------------------------------

    def _state(self, key: Any, context: list[int], num_sampled: int, cached: Any) -> _State:
        """The state of the request in this row, made (and started) on first sight."""
        state = self.states.get(key)
        head = tuple(context[:_HEAD])
        if state is not None and (state.head != head[: len(state.head)] or len(context) < state.synced):
            state = None  # the row holds another request now (keyed by batch index)
        if state is not None:
            return state
        info = request_info(cached, self.any_whitespace) if cached is not None else RequestInfo()
        prompt = info.prompt_ids if info.prompt_ids is not None else tuple(context[: len(context) - num_sampled])
        matcher = None
        if info.spec is not None:
            try:
                compiled = compile_grammar(
                    info.spec, self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=(self.eos,)
                )
                matcher = compiled.matcher(max_rollback=self.k + 1)
            except GrammarError:
                matcher = None
        proposer = self.make_proposer()
        proposer.start(Request(prompt_ids=prompt, tokenizer=self.tokenizer, schema=info.schema))
        state = _State(
            proposer=proposer,
            view=GrammarView(matcher) if matcher is not None else None,
            matcher=matcher,
            prompt_length=len(prompt),
            synced=len(prompt),
            head=head,
            stops=frozenset((self.eos, *info.stop_ids)),
            controller=AdaptiveController(k_min=self.k, k_max=self.k),
            max_tokens=info.max_tokens,
        )
        self.states[key] = state
        return state

    def _sync(self, state: _State, context: list[int], sampled: Sequence[int]) -> list[int]:
        """Tell the drafters what vLLM accepted of their last draft; advance the matcher.  Returns the context
        as the request has it: cut after its first stop token.

        When a draft's last token is a stop token and vLLM accepts it, vLLM still appends a token of its own
        after it (its rejection sampler's bonus token) to the runner's context, then ends the request at the
        stop token: that last token is no output.  It reaches neither the drafters (nor the index of earlier
        outputs) nor the matcher, which is terminated by then.
        """
        new = context[state.synced :]
        end = next((i + 1 for i, token in enumerate(new) if token in state.stops), len(new))
        draft, accepted = state.draft, 0
        if draft:
            matched = 0
            for token, guess in zip(new, draft.tokens):
                if token != guess:
                    break
                matched += 1
            # vLLM appended the accepted draft prefix and one token of its own.
            accepted = min(matched, max(len(sampled) - 1, 0)) if len(new) == len(sampled) else matched
            accepted = min(accepted, end)
            state.proposer.commit(draft, accepted, new[:end])
        elif new:
            state.proposer.commit(EMPTY_DRAFT, 0, new[:end])
        if state.decided and new:  # the step vLLM verified: the policy learns, the first token cut off judged too
            next_token = new[accepted] if accepted < end else None
            state.controller.record(draft, accepted, state.offered, next_token)
        state.draft = state.offered = EMPTY_DRAFT
        if state.matcher is not None:
            for token in new[:end]:
                if not state.matcher.accept(token):
                    state.matcher, state.view = None, None  # our grammar disagrees with vLLM's: draft without
                    self.grammar_drops += 1
                    break
        state.synced += end
        return context[: state.synced]

    def _finished(self, state: _State, context: list[int]) -> bool:
        """Whether the request ended with its last token (stop token, grammar complete, max_tokens).

        A request stopped otherwise (a stop string, an abort) is dropped when it leaves the runner.
        """
        if context and context[-1] in state.stops:
            return True
        if state.matcher is not None and state.matcher.is_terminated():
            return True
        return state.max_tokens is not None and len(context) - state.prompt_length >= state.max_tokens

    def _draft(self, state: _State, context: list[int]) -> list[int]:
        """The next draft for one request (``[]``: none, also while the request rests its drafters after drafts
        the policy cut to nothing, unless its grammar forces text).  Remembers it."""
        state.decided = True
        controller = state.controller
        if controller.resting and state.matcher is not None and state.matcher.forced_text():
            controller.wake()
        k = min(controller.ask(), self.max_model_len - len(context) - 1)
        if state.max_tokens is not None:
            k = min(k, state.max_tokens - (len(context) - state.prompt_length) - 1)  # the target adds one
        if k <= 0:
            return []
        draft = state.proposer.propose(context, state.view, k).truncate(k)
        stop = next((i for i, token in enumerate(draft.tokens) if token in state.stops), None)
        if stop is not None:  # the request ends at a stop token: nothing after it is output
            draft = draft.truncate(stop + 1)
        if draft.probs is not None:  # vLLM's custom class has no way to pass draft distributions
            draft = EMPTY_DRAFT
        state.draft = state.offered = draft
        if draft:
            self.drafts += 1
        return list(draft.tokens)

    def _forget(self, seen: set[Any], requests: Any) -> None:
        """Drop the states of requests that ended (left the runner, or the batch when there is no runner)."""
        for key in list(self.states):
            alive = key in requests if requests is not None else key in seen
            if not alive:
                del self.states[key]
