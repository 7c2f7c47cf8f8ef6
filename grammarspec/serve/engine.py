"""The engine: one thread owns the model and runs one decode loop for every open request.

HTTP handlers :meth:`Engine.prepare` a request (render the messages with the
chat template as :class:`~grammarspec.Conversation` does (:func:`~grammarspec.conversation.prompt_ids`),
gather its constraint in a :class:`~grammarspec.constraint.Constraint` and compile
it (:func:`grammars.compile_grammar`, whose cache keeps each compiled grammar),
build each row with :func:`grammarspec.engine.row_requests.row_request`, as ``generate`` does; any problem is a
:class:`~grammarspec.serve.protocol.RequestError` before the loop sees it),
then :meth:`Engine.submit` it.  The engine thread runs
:func:`grammarspec.engine.decoding.decode_batch` with itself as the feed: new rows join
as places free up, each with the KV of its longest cached prefix
(:class:`~grammarspec.serve.prefix.PrefixCache`), and every ended row's KV goes
back into that cache.

What the drafters learned carries into a conversation's next request: each
cache entry keeps, beside the KV, a copy of its row's survival records (the
:class:`~grammarspec.policy.allocation.Calibration` that sizes drafts), and a row that
joins with a cache hit starts from a copy of the hit entry's records (never
the stored object: rows decoding at once never share one; the records live
and die with their entry).  The earlier assistant messages' JSON
(:func:`~grammarspec.tool_calls.earlier_documents`) goes to the proposer as
``Request.documents``.  A row without a cache hit starts from the records
of the last finished row of its kind of traffic (:func:`traffic_kind`: tool
calls, a schema, free text), so drafting starts from this server's evidence,
not from a prior, and its drafts of text start split the way that row saw
the target split text (:meth:`~proposers.text.SplitPreferences.recall`).
Every row of ``assistant="auto"`` also drafts from what earlier requests of
its kind wrote (one :class:`~proposers.suffix_index.SuffixIndex` for the
server, ``draft_memory_bytes`` at most, oldest outputs evicted first; scoped
by the traffic kind and a hash of the schema or tool set, :func:`draft_scope`),
and writes its own tokens there as it commits them (a request with a ``seed`` does neither, so the seed
reproduces its answer).
The policy prices each step by what this server's steps have taken
(:class:`~grammarspec.policy.step_cost.StepCostLearner`, kept across loops;
``step_cost="profile"``: the fixed profile).  Drafting policy only:
outputs are unchanged.

Each request's settings are its rows' own (:class:`~grammarspec.engine.rows.RowSettings`):
greedy or sampled, temperature and top_p in the row's processing, ``max_tokens``
and ``stop`` where the loop ends the row (no draft reaches past ``max_tokens``).
The client's text ends before the stop string (:func:`~grammarspec.engine.stopping.before_stop`).
A request that disconnects cancels its rows.  A request whose own work fails
(its grammar matcher, its drafter, reporting its answer) gets a 500 -- an error
event when streamed -- and its other choices stop; the rows decoding beside it
go on untouched (:mod:`grammarspec.engine.isolation`).  Only a failure of what the rows
share (the model's forward, the batch cache) fails every request in the loop.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from grammars import CompiledGrammar, GrammarError, GrammarSpec, compile_grammar, set_cache_limits
from grammars.registry import DEFAULT as DEFAULT_BACKEND
from grammarspec.api import grammar_stats
from grammarspec.constraint import Constraint
from grammarspec.conversation import prompt_ids
from grammarspec.drafting.cost_model import ProfiledCost
from grammarspec.engine.decoding import DecodeConfig, Row, RowRequest, decode_batch, logits_width
from grammarspec.engine.row_requests import DEFAULT_MAX_DRAFT, row_request
from grammarspec.engine.step import checked_prompt_chunk
from grammarspec.engine.step_trace import StepTrace
from grammarspec.engine.stopping import before_stop
from grammarspec.inputs import eos_ids
from grammarspec.kv.batch import BatchKV
from grammarspec.model.openmp import release_thread_pool
from grammarspec.policy.allocation import Calibration
from grammarspec.policy.step_cost import STEP_COSTS, StepCostLearner
from grammarspec.serve.prefix import PrefixCache, row_cache
from grammarspec.serve.protocol import ChatRequest, RequestError
from grammarspec.serve.text_stream import TextStream
from grammarspec.serve.tool_stream import ToolCallStream
from grammarspec.settings import resolve_config
from grammarspec.tool_calls import (
    ToolCallError,
    check_tools,
    earlier_documents,
    parse_cut_reply,
    parse_tool_reply,
    tool_format_for,
)
from proposers.base import members, split_owner
from proposers.suffix import SuffixProposer
from proposers.suffix_index import SuffixIndex, scope_of
from proposers.text import SplitMemory

__all__ = ["Choice", "Engine", "Job", "prompt_ids", "traffic_kind", "draft_scope", "COMPILE_TIMEOUT"]

#: Seconds one request's grammar may take to compile (every backend it tries): past it the request is a 400.
COMPILE_TIMEOUT = 60.0


def traffic_kind(spec: Any, offered: Any) -> str:
    """The kind of traffic a request is, for the drafting records it starts from.  Pure.

    ``"tools"`` (``offered``, the tools its reply may call, is not empty: a
    tool call may follow), ``"schema"`` (a JSON schema, a JSON object or a
    grammar) or ``"text"`` (free text): their drafts survive at very
    different rates.
    """
    if offered:
        return "tools"
    return "schema" if spec is not None else "text"


def draft_scope(spec: Any, offered: Any) -> str:
    """Where a request's drafts from earlier outputs come from and go: its :func:`traffic_kind` and a canonical
    hash of its schema (a tool set is one), so only requests with the same schema or tools share drafts.  Pure."""
    return f"{traffic_kind(spec, offered)}/{scope_of(spec.schema if spec is not None else None)}"


#: Default bytes of the server's index of earlier outputs (``grammarspec serve --draft-memory-mb``).
DRAFT_MEMORY_BYTES = 256 << 20


@dataclass(frozen=True)
class TrafficRecord:
    """Where a new request of one kind of traffic (schema, tools, free text) starts drafting: the survival
    records, the rest (:attr:`AdaptiveController.rest`) and the target's splits of drafted text
    (:class:`~proposers.text.SplitMemory`; ``None`` without a composite drafter) its kind's last finished row
    ended with."""

    calibration: Calibration
    rest: int
    splits: SplitMemory | None = None


@dataclass
class Choice:
    """One row of a job (``n`` choices per request): its tokens, its text, how it ended."""

    job: Job
    index: int
    prompt: list[int]
    row_request: RowRequest
    compiled: Any
    spec: Any
    kind: str = "text"  # the traffic kind its drafting records are kept under (traffic_kind)
    tokens: list[int] = field(default_factory=list)
    text: str = ""  # what the client sees: the text before any stop string
    stopped: bool = False  # a stop string was generated (the text ends before it)
    row: Row | None = None
    sent: int = 0  # characters of text already streamed
    calls: ToolCallStream = field(default_factory=ToolCallStream)  # tool-call deltas sent, and the calls' ids
    decoded: TextStream | None = None  # the text of ``tokens`` as they come (whole once the choice ends)


@dataclass
class Job:
    """One HTTP request: its choices and where the engine reports to (``emit`` runs on the engine thread)."""

    request: ChatRequest
    prompt: list[int]
    max_tokens: int
    offered: list[dict[str, Any]] | None  # the tools its reply may call (None: no call)
    tool_format: str
    emit: Callable[[tuple[str, Any]], None]
    choices: list[Choice] = field(default_factory=list)
    reused_tokens: int = 0
    cancelled: bool = False
    failed: bool = False  # one of its rows failed in its own work: the client got the error
    done: int = 0
    id: str = field(default_factory=lambda: "chatcmpl-" + uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))
    started: float = field(default_factory=time.perf_counter)
    first_token_seconds: float | None = None


class Engine:
    """Owns the model; serves jobs with one continuous-batching decode loop on its own thread."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        max_batch_size: int = 8,
        prefix_cache_bytes: int = 1 << 30,
        max_tokens: int = 1024,
        grammar_backend: str = DEFAULT_BACKEND,
        grammar_cache_size: int | None = None,
        tool_format: str = "auto",
        compile_timeout: float | None = COMPILE_TIMEOUT,
        trace_steps: bool = False,
        prompt_chunk: int | None = None,
        step_cost: str = "learned",
        draft_memory_bytes: int = DRAFT_MEMORY_BYTES,
    ) -> None:
        if step_cost not in STEP_COSTS:
            raise ValueError(f"step_cost {step_cost!r} is not one of {', '.join(STEP_COSTS)}: pass one of them")
        #: the target's profiled pass cost, measured at first need (the loop's, and the learner's prior)
        self.pass_cost = ProfiledCost(model)
        #: what the drafting policy prices steps by: this server's measured steps (``learned``), else the profile
        self.cost_learner = StepCostLearner(self.pass_cost.cost) if step_cost == "learned" else None
        #: the most prompt tokens a step reads for joining requests (None: from the pass cost; decode_batch)
        self.prompt_chunk = checked_prompt_chunk(prompt_chunk)
        self.model, self.tokenizer = model, tokenizer
        #: every step's rows, drafts, forward and phase times (``trace_steps``; read with ``trace.take()``)
        self.trace = StepTrace() if trace_steps else None
        self.compile_timeout = compile_timeout  # a request's grammar compile is stopped past it (a 400)
        hf: Any = model  # a Hugging Face model (or a toy speaking its protocol)
        self.max_batch_size, self.max_tokens, self.grammar_backend = max_batch_size, max_tokens, grammar_backend
        self.context = getattr(model.config, "max_position_embeddings", None)
        self.tool_format = tool_format_for(tokenizer, tool_format)
        self.vocab = logits_width(model)
        self.eos = eos_ids(hf.generation_config, tokenizer)
        self.prefix = PrefixCache(model, prefix_cache_bytes)
        #: earlier outputs every request of a kind drafts from (None: off, ``draft_memory_bytes=0``)
        self.drafts = SuffixIndex(draft_memory_bytes) if draft_memory_bytes > 0 else None
        if grammar_cache_size is not None:  # the process's one grammar cache (grammars.compile_cache)
            set_cache_limits(grammar_count=grammar_cache_size)
        self._incoming: queue.Queue[Job | None] = queue.Queue()
        self._pending: list[Choice] = []
        self._rows: dict[int, Choice] = {}  # row index of the running decode_batch call -> choice
        #: traffic kind -> where a new request of that kind starts drafting
        self._recent: dict[str, TrafficRecord] = {}
        self._next = 0
        self.generator = torch.Generator(device=self._device())
        self.generator.manual_seed(0)
        self.counters = {
            "requests": 0,
            "rows": 0,
            "cancelled": 0,
            "failed": 0,
            "loops": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "target_forwards": 0,
            "prompt_passes": 0,
        }
        self.healthy = True
        self._thread = threading.Thread(target=self._run, name="grammarspec-engine", daemon=True)
        self._stop = False
        # The model was loaded (and perhaps warmed) on this thread: its OpenMP workers would outnumber the CPUs
        # beside the engine thread's and make every parallel region wake them from sleep (grammarspec/model/openmp.py).
        release_thread_pool()
        self._thread.start()

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    # --- preparing a request (the HTTP side; errors are 400s) -------------------------------------

    def compile(self, spec: GrammarSpec, backend: str | None = None) -> CompiledGrammar:
        """``spec`` compiled for this server's tokenizer and logits (on ``backend``, else the server's), within its
        ``compile_timeout``; :func:`grammars.compile_grammar` keeps it in the process's one grammar cache."""
        return compile_grammar(
            spec,
            self.tokenizer,
            vocab_size=self.vocab,
            stop_token_ids=self.eos,
            backend=backend or self.grammar_backend,
            compile_timeout=self.compile_timeout,
        )

    def _constraint(self, request: ChatRequest) -> tuple[Constraint, list[dict[str, Any]] | None]:
        """The request's constraint with its ``tool_choice`` applied, and the tools its reply may call.

        ``parallel_tool_calls`` counts only beside tools (OpenAI ignores it
        without them; :func:`grammars.grammar_spec` refuses it).  The tools a reply
        may call: those the constraint's call schema names (a required or
        named call in the JSON format), else every tool unless
        ``tool_choice="none"``.
        """
        constraint = Constraint(
            schema=request.schema,
            tools=request.tools,
            tool_choice=request.tool_choice,
            parallel_tool_calls=request.parallel_tool_calls and request.tools is not None,
            json_object=request.json_object,
            tool_format=self.tool_format,
        ).resolve()
        calls = request.tools if request.tool_choice != "none" else None
        return constraint, ([dict(t) for t in constraint.tools] if constraint.tools else calls)

    def prepare(self, request: ChatRequest, emit: Callable[[tuple[str, Any]], None]) -> Job:
        """A job ready to submit.  Raises :class:`RequestError` for what cannot be served."""
        try:
            check_tools(request.tools)
            constraint, offered = self._constraint(request)
            ids = prompt_ids(self.tokenizer, request.messages, request.tools, self.tool_format, request.tool_choice)
        except ToolCallError as e:
            raise RequestError(str(e), param="tools", code="invalid_value") from None
        except Exception as e:  # a template that cannot render these messages
            raise RequestError(
                f"the chat template cannot render these messages: {e}", param="messages", code="invalid_value"
            ) from None
        if not ids:
            raise RequestError("the rendered prompt is empty", param="messages", code="invalid_value")
        room = (self.context - len(ids)) if self.context else self.max_tokens
        if room < 1:
            raise RequestError(
                f"the prompt is {len(ids)} tokens, the model's context is {self.context}",
                param="messages",
                code="context_length_exceeded",
            )
        max_tokens = request.max_tokens or min(self.max_tokens, room)
        if max_tokens > min(self.max_tokens, room):
            raise RequestError(
                f"max_tokens={max_tokens} is more than this server allows for this prompt "
                f"({min(self.max_tokens, room)}: --max-tokens {self.max_tokens}, context "
                f"{self.context}, prompt {len(ids)})",
                param="max_tokens",
                code="invalid_value",
            )
        try:
            (spec,) = constraint.specs(1)
            compiled = self.compile(spec, request.grammar_backend) if spec is not None else None
        except (GrammarError, ValueError, TypeError) as e:
            param = "tools" if offered else "response_format"
            raise RequestError(f"the constraint does not compile: {e}", param=param, code="invalid_schema") from None
        job = Job(request, ids, max_tokens, offered, self.tool_format, emit)
        do_sample = not request.greedy
        overrides: dict[str, Any] = {"do_sample": do_sample, "max_new_tokens": max_tokens}
        if do_sample:
            overrides.update(temperature=request.temperature, top_p=request.top_p, top_k=0)
        try:
            config, _unknown, _ = resolve_config(self.model, None, overrides)
        except ValueError as e:
            raise RequestError(str(e), code="invalid_value") from None
        documents = earlier_documents(request.messages)
        for index in range(request.n):
            row = row_request(
                self.model,
                ids,
                config,
                max_new_tokens=max_tokens,
                eos=self.eos,
                stop_strings=request.stop,
                compiled=compiled,
                schema=spec.schema if spec is not None else None,
                tokenizer=self.tokenizer,
                assistant=None if request.assistant == "none" else request.assistant,
                generator=self.generator,
                max_draft_tokens=request.max_draft_tokens or DEFAULT_MAX_DRAFT,
                documents=documents,
                # a seeded request drafts without earlier outputs: which drafts a row gets moves where its random
                # draws fall, so its seed reproduces its answer only if its drafts do not depend on other traffic
                suffix_index=self.drafts if request.seed is None else None,
            )
            for member in members(row.proposer) if row.proposer is not None else []:
                if isinstance(member, SuffixProposer):  # kind and schema (or tool set): only its like share drafts
                    member.scope = draft_scope(spec, offered)
            kind = traffic_kind(spec, offered)
            job.choices.append(
                Choice(job, index, ids, row, compiled, spec, kind=kind, decoded=TextStream(self.tokenizer))
            )
        return job

    def submit(self, job: Job) -> None:
        """Hand a prepared job to the loop (thread-safe)."""
        if not self.healthy:
            raise RequestError("the engine has stopped", status=503, kind="server_error", code="engine_stopped")
        self.counters["requests"] += 1
        self._incoming.put(job)

    def cancel(self, job: Job) -> None:
        """Stop a job's rows at the next step (a disconnect).  Thread-safe."""
        job.cancelled = True

    def close(self) -> None:
        self._stop = True
        self._incoming.put(None)
        self._thread.join(timeout=30)

    # --- the engine thread: decode_batch with this engine as its feed ----------------------------

    def _run(self) -> None:
        config = DecodeConfig(max_new_tokens=self.max_tokens, eos_token_ids=self.eos)  # each row has its own settings
        pad = self.eos[0] if self.eos else 0
        while not self._stop:
            job = self._incoming.get()
            if job is None:
                break
            self._take(job)
            self._rows, self._next = {}, 0
            self.counters["loops"] += 1
            try:
                decode_batch(
                    self.model,
                    [],
                    config,
                    tokenizer=self.tokenizer,
                    generator=self.generator,
                    pad_token_id=pad,
                    max_batch_size=self.max_batch_size,
                    feed=self,
                    on_commit=self._on_commit,
                    trace=self.trace,
                    prompt_chunk=self.prompt_chunk,
                    cost_learner=self.cost_learner,
                    pass_cost=self.pass_cost,
                )
            except Exception as e:  # what the rows share failed (the forward, the cache): every row in it fails
                traceback.print_exc()
                failed = {id(c.job): c.job for c in list(self._rows.values()) + self._pending}
                self._pending = []
                for failed_job in failed.values():
                    self.counters["failed"] += 1
                    failed_job.emit(("error", f"internal error in the decode loop: {type(e).__name__}: {e}"))

    def _take(self, job: Job) -> None:
        if job.cancelled:
            return
        self._pending += job.choices

    # Feed protocol (grammarspec.engine.decoding.Feed) -------------------------------------------------

    def more(self, free: int) -> list[tuple[RowRequest, Any]]:
        while True:
            try:
                job = self._incoming.get_nowait()
            except queue.Empty:
                break
            if job is None:
                self._stop = True
                break
            self._take(job)
        given: list[tuple[RowRequest, Any]] = []
        self._pending = [c for c in self._pending if not c.job.cancelled]
        while self._pending and len(given) < free:
            choice = self._pending.pop(0)
            if choice.job.request.seed is not None and not self._rows_live():
                self.generator.manual_seed(choice.job.request.seed + choice.index)  # alone: reproducible
            cache, length, extra = self.prefix.lookup(choice.prompt)
            controller = choice.row_request.controller
            if controller is not None:  # a copy: never shared by two rows
                recent = self._recent.get(choice.kind)
                start = extra if isinstance(extra, Calibration) else recent.calibration if recent else None
                if start is not None:
                    controller.calibration = copy.deepcopy(start)
                controller.rest_from(recent.rest if recent else 1)
                splits = split_owner(choice.row_request.proposer)
                if splits is not None and recent is not None and recent.splits is not None:
                    splits.recall(recent.splits)
            if choice.index == 0:
                choice.job.reused_tokens = length
            self._rows[self._next] = choice
            self._next += 1
            self.counters["rows"] += 1
            given.append((choice.row_request, cache))
        return given

    def _rows_live(self) -> bool:
        return bool(self._rows)

    def cancelled(self, index: int) -> bool:
        return self._rows[index].job.cancelled

    def joined(self, row: Row, kv: BatchKV, slot: int) -> None:
        self._keep(self._rows[row.index], row, kv, slot)

    def finished(self, row: Row, kv: BatchKV | None, slot: int) -> None:
        choice = self._rows.pop(
            row.index
        )  # the loop asks no more about it; a busy loop never returns, so forget it now
        choice.row = row
        if row.failure is not None:
            self._fail(choice.job, f"{row.failure}", row.failure.error)
            return
        try:
            self._report_choice(choice, row, kv, slot)
        except Exception as e:  # reporting this row failed (its text, its validation): its request fails alone
            self._fail(choice.job, f"reporting its answer raised {type(e).__name__}: {e}", e)

    def _fail(self, job: Job, what: str, error: Exception) -> None:
        """The job failed in its own work: its client gets the error (once), its other choices stop."""
        if job.failed:
            return
        job.failed = job.cancelled = True
        self.counters["failed"] += 1
        traceback.print_exception(error)
        job.emit(
            (
                "error",
                f"this request failed inside the server ({what}); other requests were not affected. It is a server "
                "bug, not a fault of the request: please report it with the request (other settings, such as "
                '"assistant": "none" or another schema, may avoid it)',
            )
        )

    def _report_choice(self, choice: Choice, row: Row, kv: BatchKV | None, slot: int) -> None:
        """Keep the ended row's KV and drafting records, and send its answer."""
        if row.finish_reason == "cancelled":
            self.counters["cancelled"] += 1
        controller = choice.row_request.controller
        if controller is not None and row.stats.target_forwards:
            splits = split_owner(choice.row_request.proposer)
            memory = splits.memory() if splits is not None else None
            self._recent[choice.kind] = TrafficRecord(copy.deepcopy(controller.calibration), controller.rest, memory)
        if kv is not None:
            self._keep(choice, row, kv, slot)
        elif choice.row_request.controller is not None:  # no KV to store: its records join its prompt's entry
            records = copy.deepcopy(choice.row_request.controller.calibration)
            self.prefix.annotate(row.tokens, records, min_length=max(len(choice.prompt) - 1, 1))
        self._finish_choice(choice)

    def _keep(self, choice: Choice, row: Row, kv: BatchKV, slot: int) -> None:
        """Store the row's cached prompt + answer in the prefix cache."""
        length = row.cached
        if length > 0 and self.prefix.budget > 0:
            controller = choice.row_request.controller
            records = copy.deepcopy(controller.calibration) if controller is not None else None  # a snapshot
            self.prefix.store(row.tokens[:length], row_cache(kv, slot, length), extra=records)

    def _on_commit(self, index: int, tokens: list[int]) -> None:
        choice = self._rows[index]
        job = choice.job
        if job.first_token_seconds is None:
            job.first_token_seconds = time.perf_counter() - job.started
        choice.tokens += tokens
        assert choice.decoded is not None
        choice.text, choice.stopped = before_stop(choice.decoded.add(tokens), job.request.stop)
        if job.request.stream:
            self._stream_delta(choice)

    def _stream_delta(self, choice: Choice) -> None:
        """Emit the choice's new text (held back while it may still be a tool call or a stop string's start)."""
        job = choice.job
        text = choice.text
        if job.offered and job.tool_format == "json" and text.lstrip()[:1] in ("{", "[", ""):
            deltas = choice.calls.feed(text)  # a call: its name, then its arguments as they grow
            if deltas:
                job.emit(("tool_calls", (choice.index, deltas)))
            return
        hold = max((len(s) - 1 for s in job.request.stop), default=0) if not choice.stopped else 0
        end = len(text) - hold
        if text.endswith("\ufffd"):
            end = min(end, len(text) - 1)
        if end > choice.sent:
            job.emit(("delta", (choice.index, text[choice.sent : end])))
            choice.sent = end

    def _finish_choice(self, choice: Choice) -> None:
        job, row = choice.job, choice.row
        assert row is not None
        # The answer decoded whole, once: the text ``generate`` gives for these tokens (what was streamed is its
        # start; an incomplete last character, say, was held back).
        text = self.tokenizer.decode(choice.tokens, skip_special_tokens=True)
        choice.text, choice.stopped = before_stop(text, job.request.stop)
        stats = row.stats
        if choice.stopped:  # the client's text ends before a stop string, whatever else ended the row
            reason, stats.finish_reason = "stop", "stop_string"
        elif row.finish_reason in ("stop", "eos", "stop_string"):
            reason = "stop"
        elif row.finish_reason == "cancelled":
            reason = "cancelled"
        else:
            reason = "length"
        if choice.compiled is not None:  # a stop string cut the JSON short: valid false, as a max_tokens cut
            grammar_stats(stats, choice.compiled, choice.spec, choice.text)
        message: dict[str, Any] = {"role": "assistant", "content": choice.text}
        offered = job.offered
        complete = reason == "stop" and not choice.stopped
        if complete and offered:
            try:
                message = parse_tool_reply(choice.text, offered, job.tool_format, choice.calls.call_ids(64))
            except ToolCallError:
                message = {"role": "assistant", "content": choice.text}
        elif offered and reason != "cancelled":  # cut short: a call whose name is complete stays a call
            message = parse_cut_reply(choice.text, offered, job.tool_format, choice.calls.call_ids(64))
        finish = "tool_calls" if message.get("tool_calls") and complete else reason
        self.counters["completion_tokens"] += len(choice.tokens)
        self.counters["target_forwards"] += stats.target_forwards
        self.counters["prompt_passes"] += stats.prompt_passes
        job.done += 1
        if job.done == len(job.choices):
            self.counters["prompt_tokens"] += len(job.prompt)
        job.emit(("choice", (choice, message, finish)))
