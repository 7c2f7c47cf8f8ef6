"""Compile a :class:`GrammarSpec` for a tokenizer, with bounded thread-safe caches and a real deadline.

Two LRU caches, both keyed by a fingerprint of the tokenizer (its class,
``name_or_path``, size and a hash of its serialised vocabulary), the logits
width, the stop tokens and the backend, and both bounded by entry count *and*
by an estimate of their bytes (:func:`set_cache_limits`, :func:`cache_info`):

* per tokenizer: the backend's tokenizer-level state (one xgrammar
  ``TokenizerInfo`` + ``GrammarCompiler``; one outlines-core ``Vocabulary``;
  one ``llguidance.LLTokenizer``): default 8 entries, 256 MiB;
* per grammar: the :class:`CompiledGrammar` (a repeated call returns the same
  object and never recompiles): default 64 entries, 512 MiB.

``GRAMMARSPEC_GRAMMAR_CACHE_MB`` and ``GRAMMARSPEC_TOKENIZER_CACHE_MB`` set the
byte bounds at import.  A grammar larger than the whole bound is returned but
not kept (and evicts nothing).  After a slow build or evictions the freed
heap pages go back to the OS (glibc's ``malloc_trim``): without it glibc
keeps them, and resident memory steps up with each large compile.  Compile errors are remembered (a bounded table of messages), so a
schema a backend refuses is not compiled again, and a compile that ran past
``compile_timeout=T`` is not retried with a deadline of ``T`` or less.

When several threads ask for the same missing entry, one compiles and the
others wait for its result.

**Deadlines** (``compile_timeout=T``) bound one call: ``T`` seconds are shared by everything the call
compiles -- the backend asked for, the other backends tried to suggest one after a refusal, and
``backend="auto"``'s fallbacks -- each compile getting the time the ones before it left (at most
:data:`SUGGESTION_TIMEOUT` for a suggestion).  Once ``T`` is spent, nothing more is compiled (cached
grammars and remembered errors still answer), and the message says which backends were not tried.  Within a
compile the work is stopped per backend:

* xgrammar and outlines-core compile in a forked worker process (it inherits
  the tokenizer-level state, so it starts in milliseconds) that sends the
  serialised grammar back; past the deadline the worker is killed, so no CPU
  or memory is spent on that grammar afterwards and no thread or process is
  left running.  Without a deadline they compile in-process (no fork).
* llguidance compiles in-process under its own resource limits
  (``LLParserLimits``: lexer fuel, grammar size), which bound the work; a
  compile that still ends past the deadline is refused like a timeout.

``backend="auto"`` chooses per grammar (:mod:`grammars.select`); every result
says which backend compiled it, why, and what it leaves unenforced, and the
schema features it does not enforce are warned about (or refused with
``strict=True``) on every call.  A backend that cannot compile a grammar says
which other backends do compile it -- having tried them.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import os
import select
import signal
import threading
import time
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .base import CompiledGrammar, GrammarError, GrammarWarning, Matcher
from .spec import GrammarSpec

__all__ = [
    "compile_grammar", "clear_grammar_cache", "set_cache_limits", "cache_info", "CacheLimits", "BACKENDS",
    "BACKEND_CHOICES", "SelectedGrammar", "CompileTimeout",
]  # fmt: skip

#: The grammar backends (the first is the default).
BACKENDS = ("xgrammar", "outlines", "llguidance")
#: What ``backend=`` accepts: a backend, or ``"auto"`` (see :mod:`grammars.select`).
BACKEND_CHOICES = BACKENDS + ("auto",)
_ALIASES = {"outlines-core": "outlines", "outlines_core": "outlines"}

_MIB = 2**20
#: Default bounds: how many compiled grammars / tokenizer-level states are kept, and their estimated bytes.
GRAMMAR_CACHE_SIZE = 64
TOKENIZER_CACHE_SIZE = 8
GRAMMAR_CACHE_BYTES = 512 * _MIB
TOKENIZER_CACHE_BYTES = 256 * _MIB
#: How many compile errors are remembered (messages only; a few hundred bytes each).
FAILURE_CACHE_SIZE = 512
#: How long a backend may take to compile when it is tried in order to suggest it (a failed compile's advice);
#: with ``compile_timeout`` set, at most what the call has left of it.
SUGGESTION_TIMEOUT = 30.0
#: From how many values an ``enum`` makes xgrammar slow to compile (about 1.5 s at 20,000, 62 s at 100,000).
LARGE_ENUM = 10_000

T = TypeVar("T")


@dataclass(frozen=True)
class CacheLimits:
    """The bounds of the two caches: entry counts and estimated bytes."""

    grammar_count: int
    grammar_bytes: int
    tokenizer_count: int
    tokenizer_bytes: int


class CompileTimeout(GrammarError):
    """A backend did not compile the grammar within ``compile_timeout`` (its work was stopped)."""


class _CompileFailed(GrammarError):
    """A backend refused the grammar (the message says why)."""


class _NotTried(CompileTimeout):
    """A backend was not tried: the call's ``compile_timeout`` was spent before it (nothing is remembered)."""


class _Budget:
    """The compile time one :func:`compile_grammar` call has left (``compile_timeout``), over every backend it tries.

    Spent by each compile as it runs (wall time); building a tokenizer-level
    state is given back (it is not the grammar's work, and it is built once
    per tokenizer).  ``total=None``: no deadline.  One call's own: not shared.
    """

    def __init__(self, total: float | None) -> None:
        self.total = total
        self.spent = 0.0

    def left(self, limit: float | None = None) -> float | None:
        """Seconds left (``None``: no deadline), at most ``limit``."""
        if self.total is None:
            return limit
        left = max(0.0, self.total - self.spent)
        return left if limit is None else min(left, limit)

    def spend(self, seconds: float) -> None:
        self.spent += seconds


class _LRU(Generic[T]):
    """A thread-safe LRU bounded by count and by estimated bytes; misses are built once (other threads wait)."""

    def __init__(self, maxsize: int, max_bytes: int, sizer: Callable[[Hashable, T], int]) -> None:
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self._sizer = sizer
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, _Slot[T]] = OrderedDict()
        self.nbytes = 0  # estimated bytes of the finished entries

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        with self._lock:
            slot = self._entries.get(key)
            owner = slot is None
            if owner:
                slot = self._entries[key] = _Slot()
            self._entries.move_to_end(key)
        assert slot is not None
        if not owner:
            return slot.wait()
        started = time.monotonic()
        try:
            value = build()
            size = max(0, int(self._sizer(key, value)))
        except BaseException as e:
            slot.error = e
            with self._lock:
                if self._entries.get(key) is slot:
                    del self._entries[key]
            slot.done.set()
            _after_work(time.monotonic() - started)
            raise
        slot.value = value
        dropped: list[_Slot[T]] = []
        with self._lock:
            if self._entries.get(key) is slot:  # not cleared meanwhile
                if size > self.max_bytes:  # larger than the whole bound: returned, not kept, and evicts nothing
                    del self._entries[key]
                    slot.nbytes = size
                    dropped.append(slot)
                else:
                    slot.nbytes = size
                    self.nbytes += size
                    dropped = self._evict()
        slot.done.set()
        _after_work(time.monotonic() - started)
        _release(dropped)
        return value

    def _evict(self) -> list[_Slot[T]]:
        """Drop the least recently used finished entries until both bounds hold; the dropped slots.  Holds the lock."""
        dropped = []
        for key in list(self._entries):
            if len(self._entries) <= self.maxsize and self.nbytes <= self.max_bytes:
                break
            slot = self._entries[key]
            if slot.nbytes is None:  # still being built
                continue
            del self._entries[key]
            self.nbytes -= slot.nbytes
            dropped.append(slot)
        return dropped

    def resize(self, maxsize: int, max_bytes: int) -> None:
        with self._lock:
            self.maxsize, self.max_bytes = maxsize, max_bytes
            dropped = self._evict()
        _release(dropped)

    def values(self) -> list[T]:
        with self._lock:
            return [s.value for s in self._entries.values() if s.nbytes is not None and s.value is not None]

    def clear(self) -> None:
        with self._lock:
            self._entries = OrderedDict((k, s) for k, s in self._entries.items() if s.nbytes is None)
            self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)


class _Slot(Generic[T]):
    __slots__ = ("done", "value", "error", "nbytes")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None
        self.nbytes: int | None = None  # set once the value is in the cache

    def wait(self) -> T:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


class _Failures:
    """Compile errors by grammar key: a refusal (message) or the longest deadline a compile ran past."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, tuple[str, float | None]] = OrderedDict()

    def check(self, key: Hashable, timeout: float | None) -> None:
        """Raise the remembered error for ``key`` if compiling again would end the same way."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        if entry is None:
            return
        message, ran_past = entry
        if ran_past is None:
            raise _CompileFailed(message)
        if timeout is not None and timeout <= ran_past:
            raise CompileTimeout(message)

    def add(self, key: Hashable, message: str, ran_past: float | None = None) -> None:
        with self._lock:
            self._entries[key] = (message, ran_past)
            self._entries.move_to_end(key)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def _grammar_bytes(key: Hashable, compiled: CompiledGrammar) -> int:
    return int(getattr(compiled, "nbytes", 0))


def _prepared_bytes(key: Hashable, prepared: Any) -> int:
    name = key[0] if isinstance(key, tuple) else ""
    return int(_backend_module(str(name)).prepared_nbytes(prepared))


def _env_mib(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise GrammarError(f"${name} must be a number of MiB (0 or more), got {text!r}; unset it for the default")
    return int(value * _MIB)


_grammars: _LRU[CompiledGrammar] = _LRU(
    GRAMMAR_CACHE_SIZE, _env_mib("GRAMMARSPEC_GRAMMAR_CACHE_MB", GRAMMAR_CACHE_BYTES), _grammar_bytes
)
_prepared: _LRU[Any] = _LRU(
    TOKENIZER_CACHE_SIZE, _env_mib("GRAMMARSPEC_TOKENIZER_CACHE_MB", TOKENIZER_CACHE_BYTES), _prepared_bytes
)
_failures = _Failures(FAILURE_CACHE_SIZE)
_fingerprints: weakref.WeakKeyDictionary[Any, tuple[int, tuple[Hashable, int, int | None]]] = (
    weakref.WeakKeyDictionary()
)
_fingerprint_lock = threading.Lock()
_fork_lock = threading.Lock()


def set_cache_limits(
    *,
    grammar_mb: float | None = None,
    grammar_count: int | None = None,
    tokenizer_mb: float | None = None,
    tokenizer_count: int | None = None,
) -> CacheLimits:
    """Change the bounds of the grammar and tokenizer caches (``None`` keeps one); returns the previous bounds.

    Defaults: 64 compiled grammars and 512 MiB, 8 tokenizer-level states and
    256 MiB (``$GRAMMARSPEC_GRAMMAR_CACHE_MB`` / ``$GRAMMARSPEC_TOKENIZER_CACHE_MB``
    change the byte bounds at import).  Bytes are estimates (see
    :func:`cache_info`).  Entries beyond the new bounds are dropped at once.
    ``0`` keeps nothing.  Changes global state.
    """
    previous = limits()

    def check(name: str, value: Any, scale: int) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise GrammarError(f"set_cache_limits({name}=...) must be a number, 0 or more; got {value!r}")
        return int(value * scale)

    grammar = (check("grammar_count", grammar_count, 1), check("grammar_mb", grammar_mb, _MIB))
    tokenizer = (check("tokenizer_count", tokenizer_count, 1), check("tokenizer_mb", tokenizer_mb, _MIB))
    _grammars.resize(
        previous.grammar_count if grammar[0] is None else grammar[0],
        previous.grammar_bytes if grammar[1] is None else grammar[1],
    )
    _prepared.resize(
        previous.tokenizer_count if tokenizer[0] is None else tokenizer[0],
        previous.tokenizer_bytes if tokenizer[1] is None else tokenizer[1],
    )
    return previous


def limits() -> CacheLimits:
    """The current cache bounds.  Does not change state."""
    return CacheLimits(_grammars.maxsize, _grammars.max_bytes, _prepared.maxsize, _prepared.max_bytes)


def cache_info() -> dict[str, int]:
    """Entries and estimated bytes held by the caches, and the remembered compile errors.  Does not change state.

    Estimates: xgrammar's own ``memory_size_bytes``; an outlines-core index
    at three times its serialised size (resident memory measured at 2 to 3.8
    times); an llguidance grammar from its text (its lexer grows later, as
    masks are computed, within ``LLParserLimits.max_lexer_states``); a
    tokenizer-level state per vocabulary entry (measured on SmolLM2's 49k).
    """
    return {
        "grammars": len(_grammars), "grammar_bytes": _grammars.nbytes,
        "tokenizers": len(_prepared), "tokenizer_bytes": _prepared.nbytes,
        "failures": len(_failures),
    }  # fmt: skip


def compile_grammar(
    spec: GrammarSpec,
    tokenizer: Any,
    *,
    vocab_size: int | None = None,
    stop_token_ids: int | Sequence[int] | None = None,
    backend: str = "xgrammar",
    strict: bool = False,
    compile_timeout: float | None = None,
) -> CompiledGrammar:
    """The compiled grammar of ``spec`` for ``tokenizer`` (cached).

    ``vocab_size``: the model's logits width (``model.config.vocab_size`` can
    exceed ``len(tokenizer)``); default: the tokenizer's own size.  Masks
    have ``ceil(vocab_size / 32)`` words per row; ids past the tokenizer are
    never legal.
    ``stop_token_ids``: tokens that end generation once the grammar is
    complete; default: ``tokenizer.eos_token_id``.
    ``backend``: ``"xgrammar"`` (default), ``"outlines"``, ``"llguidance"`` or
    ``"auto"`` (per schema, the backend that enforces every keyword it uses:
    :mod:`grammars.select`).
    ``strict``: a schema keyword the backend does not enforce is a
    :class:`GrammarError` instead of a :class:`GrammarWarning`.
    ``compile_timeout``: seconds this call may spend compiling, over every
    backend it tries (after a refusal, the other backends it tries in order
    to suggest one; ``"auto"``'s fallbacks), each getting what the ones
    before left; the tokenizer-level state, built once per tokenizer, does
    not count.  Past it, a :class:`CompileTimeout` (a :class:`GrammarError`)
    and the compile is stopped; backends not tried for lack of time are
    named in the message: see the module docstring.  Default: no limit.

    The result's ``backend``, ``backend_reason`` and ``unenforced`` say which
    backend compiled it, why, and which schema features it does not enforce.
    Raises :class:`GrammarError` for an unknown backend, bad arguments or a
    grammar the backend cannot compile (naming the other backends that do,
    after trying them) -- never falls back to unconstrained decoding.  The
    result is immutable and may be shared between threads.
    """
    if not isinstance(spec, GrammarSpec):
        raise GrammarError(
            f"compile_grammar needs a GrammarSpec, got {type(spec).__name__}; build one with "
            "grammars.grammar_spec(schema=...)"
        )
    _after_work(0.0)  # dropped grammars freed since the last call (see _release)
    name = _ALIASES.get(backend, backend) if isinstance(backend, str) else backend
    if name not in BACKEND_CHOICES:
        raise GrammarError(
            f"unknown grammar backend {backend!r}; choose one of {', '.join(map(repr, BACKEND_CHOICES))}"
        )
    if compile_timeout is not None and (
        isinstance(compile_timeout, bool) or not isinstance(compile_timeout, (int, float)) or compile_timeout <= 0
    ):
        raise GrammarError(f"compile_timeout must be a positive number of seconds, got {compile_timeout!r}")
    tok_key, tok_size, eos = _fingerprint(tokenizer)
    vocab_size = _vocab_size(vocab_size, tok_size)
    stops = _stop_ids(stop_token_ids, eos, vocab_size)

    budget = _Budget(compile_timeout)

    def compile_with(backend_name: str, limit: float | None = None) -> CompiledGrammar:
        started = time.monotonic()
        try:
            return _compile_one(backend_name, spec, tokenizer, tok_key, vocab_size, stops, budget, limit)
        finally:
            budget.spend(time.monotonic() - started)

    if name == "auto":
        from .select import choose

        choice = choose(spec, compile_with)
        result: CompiledGrammar = SelectedGrammar(choice.compiled, choice.reason, choice.unenforced)
    else:
        try:
            result = compile_with(name)
        except _CompileFailed as e:
            if _NO_VALUE in str(e):  # no backend can help
                raise
            raise GrammarError(f"{e} {_alternatives(name, spec, compile_with, budget)}") from None
    _report_unenforced(result, strict)
    return result


#: What every backend's message says when the schema admits no value (then no other backend is suggested).
_NO_VALUE = "accepts no value"


def _alternatives(failed: str, spec: GrammarSpec, compile_with: Callable[..., CompiledGrammar], budget: _Budget) -> str:
    """Which other backends compile ``spec``, found by compiling it on each (cached, so switching is free).

    Each gets what the call has left of its ``compile_timeout`` (at most
    :data:`SUGGESTION_TIMEOUT`); once that is spent the rest are not tried,
    and the advice says so.
    """
    from .capabilities import unenforced
    from .select import PREFERENCE

    compiles: list[str] = []
    notes: list[str] = []
    tried: list[str] = []
    untried: list[str] = []
    for other in PREFERENCE:
        if other == failed:
            continue
        limit = budget.left(SUGGESTION_TIMEOUT)
        try:
            compile_with(other, SUGGESTION_TIMEOUT)
        except _NotTried:
            untried.append(other)
            continue
        except CompileTimeout:
            tried.append(other)
            notes.append(f"{other} did not finish within {limit:.3g} s")
            continue
        except GrammarError:
            tried.append(other)
            continue
        tried.append(other)
        gaps = unenforced(spec.schema, other) if spec.kind == "json_schema" else []
        compiles.append(f"backend='{other}'" + (f" (it does not enforce {', '.join(gaps)})" if gaps else ""))
    if untried:
        notes.append(
            f"{', '.join(untried)} not tried: compile_timeout={budget.total:g} s was spent; raise it to find out "
            f"whether {'it compiles' if len(untried) == 1 else 'they compile'} this grammar"
        )
    detail = f" ({'; '.join(notes)})" if notes else ""
    if not compiles:
        if not tried:
            return f"No other backend was tried{detail}."
        return f"No other backend compiles it either (tried {', '.join(tried)}){detail}."
    return f"Try {' or '.join(compiles)}: tried, {'it compiles' if len(compiles) == 1 else 'they compile'} this grammar{detail}."


def _compile_one(
    name: str, spec: GrammarSpec, tokenizer: Any, tok_key: Hashable, vocab_size: int, stops: tuple[int, ...],
    budget: _Budget, limit: float | None = None,
) -> CompiledGrammar:  # fmt: skip
    """The cached grammar of ``spec`` on backend ``name``, compiled when missing within what ``budget`` has left.

    ``limit``: at most this many seconds (also without a deadline).  A
    missing grammar is not compiled once the budget is spent
    (:class:`_NotTried`, not remembered).
    """
    module = _backend_module(name)
    prepared_key = (name, tok_key, vocab_size, stops)
    key = prepared_key + (spec,)

    def build() -> CompiledGrammar:
        from .capabilities import unenforced

        timeout = budget.left(limit)
        _failures.check(key, timeout)  # compiled before, and refused or ran past this deadline
        if timeout is not None and timeout <= 0:
            raise _NotTried(
                f"{name} was not tried: compile_timeout={budget.total:g} s was spent on the backends before it; "
                "raise compile_timeout"
            )
        started = time.monotonic()
        prepared = _prepared.get(prepared_key, lambda: module.prepare(tokenizer, vocab_size, stops))
        budget.spend(started - time.monotonic())  # the tokenizer-level state does not count
        if timeout is None:
            _warn_if_slow(name, spec)
        try:
            compiled = _run(module, name, prepared, spec, vocab_size, stops, timeout, total=budget.total)
        except CompileTimeout as e:
            _failures.add(key, str(e), timeout)
            raise
        except GrammarError as e:
            _failures.add(key, str(e))
            raise _CompileFailed(str(e)) from None
        if spec.kind == "json_schema":
            compiled.unenforced = tuple(unenforced(spec.schema, name))
        return compiled

    return _grammars.get(key, build)


def _run(
    module: Any, name: str, prepared: Any, spec: GrammarSpec, vocab_size: int, stops: tuple[int, ...],
    timeout: float | None, total: float | None = None,
) -> CompiledGrammar:  # fmt: skip
    """Compile ``spec`` on one backend within ``timeout`` seconds (see the module docstring for how).

    ``total``: the call's whole ``compile_timeout``, when ``timeout`` is what is left of it (for the message).
    """
    if timeout is None:
        return module.compile_spec(prepared, spec, vocab_size, stops)
    if not hasattr(module, "serialize") or not hasattr(os, "fork"):  # llguidance: bounded by its own limits
        started = time.monotonic()
        compiled = module.compile_spec(prepared, spec, vocab_size, stops)
        if time.monotonic() - started > timeout:
            raise CompileTimeout(_timeout_message(name, spec, timeout, "it finished late and was dropped", total))
        return compiled
    payload = _in_worker(lambda: module.serialize(module.compile_spec(prepared, spec, vocab_size, stops)),
                         timeout, name, spec, total)  # fmt: skip
    compiled = module.deserialize(prepared, payload, vocab_size, stops)
    if int(getattr(compiled, "nbytes", 0)) < len(payload):
        # A grammar read back from its serialised form holds about that many bytes: xgrammar's deserialised
        # grammars measured 0.9 to 1x their JSON (218 MB for 112 corpus schemas, SmolLM2), where its
        # memory_size_bytes said 31 MB -- an estimate that low made the byte bound no bound.
        compiled.nbytes = len(payload) + 4096
    return compiled


def _in_worker(
    work: Callable[[], bytes], timeout: float, name: str, spec: GrammarSpec, total: float | None = None
) -> bytes:
    """``work()`` in a forked child process; its bytes, or :class:`CompileTimeout` after killing it at the deadline.

    The child inherits the parent's memory (the tokenizer-level state is
    already built) and writes one tagged message to a pipe: ``R`` + result,
    ``G`` + a GrammarError's message, ``E`` + any other error.  The child is
    always reaped: no process outlives this call.
    """
    read_end, write_end = os.pipe()
    with _fork_lock:  # one fork at a time
        pid = os.fork()
    if pid == 0:  # the child: compile, report, exit without running the parent's clean-up
        status = 0
        try:
            os.close(read_end)
            try:
                message = b"R" + work()
            except GrammarError as e:
                message = b"G" + str(e).encode()
            except BaseException as e:  # reported to the parent
                message = b"E" + f"{type(e).__name__}: {e}".encode()
            view = memoryview(message)
            while view:
                view = view[os.write(write_end, view) :]
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    reaped = False
    try:
        while True:
            left = deadline - time.monotonic()
            ready = select.select([read_end], [], [], max(0.0, left))[0] if left > 0 else []
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                reaped = True
                raise CompileTimeout(_timeout_message(name, spec, timeout, "its worker process was killed", total))
            chunk = os.read(read_end, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        _, status = os.waitpid(pid, 0)
        reaped = True
    finally:
        os.close(read_end)
        if not reaped:  # interrupted (KeyboardInterrupt, ...): stop the child too
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    data = b"".join(chunks)
    chunks.clear()
    if not data:
        how = (
            f"signal {-os.waitstatus_to_exitcode(status)}"
            if os.WIFSIGNALED(status)
            else f"status {os.waitstatus_to_exitcode(status)}"
        )
        raise GrammarError(
            f"the {name} compile worker process ended without a result ({how}; out of memory?); "
            "simplify the schema, or compile without compile_timeout to see the backend's own error"
        )
    tag, body = data[:1], data[1:]
    if tag == b"R":
        return body
    if tag == b"G":
        raise GrammarError(body.decode(errors="replace"))
    raise GrammarError(f"{name} failed while compiling the grammar: {body.decode(errors='replace')}")


def _timeout_message(name: str, spec: GrammarSpec, timeout: float, how: str, total: float | None = None) -> str:
    """Why ``name`` stopped; ``total``: the call's ``compile_timeout`` when ``timeout`` was only what it had left."""
    hint = ""
    values = _largest_enum(spec.schema) if spec.is_json else 0
    if name == "xgrammar" and values >= LARGE_ENUM:
        hint = (
            f" This schema has an enum of {values:,} values, and xgrammar's compile time grows fast with it "
            "(about 1.5 s at 20,000 values, 62 s at 100,000)."
        )
    within = f"compile_timeout={timeout:g} s"
    if total is not None and timeout < total:
        within = (
            f"the {timeout:.3g} s left of compile_timeout={total:g} s (the backends tried before it spent the rest)"
        )
    return (
        f"{name} did not compile the grammar within {within} ({how}; it uses no more CPU "
        f"or memory).{hint} Raise compile_timeout, or simplify the schema."
    )


def _warn_if_slow(name: str, spec: GrammarSpec) -> None:
    """Warn before a compile that is known to take long without a deadline (xgrammar on a large enum)."""
    if name != "xgrammar" or not spec.is_json:
        return
    values = _largest_enum(spec.schema)
    if values >= LARGE_ENUM:
        warnings.warn(
            f"this schema has an enum of {values:,} values; xgrammar's compile time grows fast with it "
            "(about 1.5 s at 20,000 values, 62 s at 100,000), and nothing bounds it: pass compile_timeout=SECONDS "
            "to stop the compile past a deadline",
            GrammarWarning,
            stacklevel=5,
        )


def _largest_enum(schema: Any) -> int:
    """The number of values of the largest ``enum`` in ``schema``.  Pure."""
    from .spec import schema_nodes

    return max((len(n["enum"]) for n in schema_nodes(schema) if isinstance(n.get("enum"), list)), default=0)


def _report_unenforced(compiled: CompiledGrammar, strict: bool) -> None:
    """Warn (or with ``strict``, raise) about schema features ``compiled`` does not enforce."""
    if not compiled.unenforced:
        return
    from .select import advice

    features = compiled.unenforced
    message = (
        f"the {compiled.backend} grammar does not enforce {', '.join(features)} in this schema, so an output "
        f"may break {'them' if len(features) > 1 else 'it'}; {advice(features, compiled.backend)}"
    )
    if strict:
        raise GrammarError(message + ". (strict=True refuses such schemas; pass strict=False to generate anyway.)")
    warnings.warn(message, GrammarWarning, stacklevel=3)


class SelectedGrammar(CompiledGrammar):
    """The grammar ``backend="auto"`` chose, with the reason.  Immutable; delegates to the chosen one."""

    def __init__(self, compiled: CompiledGrammar, reason: str, unenforced: tuple[str, ...]) -> None:
        self.chosen = compiled
        self.backend = compiled.backend
        self.vocab_size = compiled.vocab_size
        self.stop_token_ids = compiled.stop_token_ids
        self.backend_reason = "auto: " + reason
        self.unenforced = unenforced

    def matcher(self, max_rollback: int = 64) -> Matcher:
        return self.chosen.matcher(max_rollback=max_rollback)


def clear_grammar_cache() -> None:
    """Forget every cached compiled grammar, tokenizer-level state and remembered compile error.

    The memory is handed back to the operating system (garbage collection,
    then glibc's ``malloc_trim``) once no other reference holds the grammars:
    a :class:`CompiledGrammar` or :class:`Matcher` still in use keeps its own.
    Changes global state.
    """
    global _freed_since_trim
    _grammars.clear()
    _prepared.clear()
    _failures.clear()
    gc.collect()
    _freed_since_trim = 0
    _trim_heap()


#: A cache miss whose build took this long (seconds), or dropped entries of this many estimated bytes freed since
#: the last trim, hand freed heap pages back to the OS (:func:`_trim_heap`).  A compile's transient buffers (a
#: worker's serialised grammar; xgrammar's JSON, 8 MB for a grammar of 0.5 MB) and an evicted grammar are freed,
#: but glibc keeps the pages: without this the 1,000-call soak's RSS stepped up by 450 MB after its warm-up.  A
#: trim costs 0.1 to 7 ms on that heap; a build that slow costs more.
TRIM_AFTER_SECONDS = 0.005
TRIM_AFTER_BYTES = 1 * _MIB
_freed_since_trim = 0  # estimated bytes of dropped entries freed since the last trim


def _note_freed(nbytes: int) -> None:
    global _freed_since_trim
    _freed_since_trim += nbytes  # unlocked: a race only moves one trim


def _after_work(seconds: float) -> None:
    """Trim the heap after a slow build, or once enough dropped bytes were freed (see ``TRIM_AFTER_SECONDS``)."""
    global _freed_since_trim
    if seconds >= TRIM_AFTER_SECONDS or _freed_since_trim >= TRIM_AFTER_BYTES:
        _freed_since_trim = 0
        _trim_heap()


def _release(dropped: list[_Slot[Any]]) -> None:
    """Let go of entries a cache dropped, and trim the heap once they are freed.

    Most are freed here; one a caller still holds (a matcher over it, or a
    grammar larger than the bound, returned but not kept) is counted when it
    is freed, and trimmed at the next :func:`compile_grammar`.
    """
    while dropped:
        slot = dropped.pop()
        try:
            weakref.finalize(slot.value, _note_freed, slot.nbytes or 0)
        except TypeError:  # not weak-referenceable: count it as freed now
            _note_freed(slot.nbytes or 0)
        del slot  # the value goes now, unless someone else holds it
    _after_work(0.0)


_malloc_trim: Any = None


def _trim_heap() -> None:
    """Return freed heap pages to the OS (glibc's ``malloc_trim``; elsewhere a no-op)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(None).malloc_trim
            _malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


def _backend_module(name: str) -> Any:
    """The backend's module, imported on first use."""
    if name == "xgrammar":
        from . import xgrammar_backend

        return xgrammar_backend
    if name == "llguidance":
        from . import llguidance_backend

        return llguidance_backend
    from . import outlines_backend

    return outlines_backend


def _fingerprint(tokenizer: Any) -> tuple[Hashable, int, int | None]:
    """``(key, vocabulary size, eos id)`` of a tokenizer.

    Computed once per tokenizer object (and again if its length changes, e.g.
    after ``add_tokens``).
    """
    length = len(tokenizer)
    with _fingerprint_lock:
        try:
            cached = _fingerprints.get(tokenizer)
        except TypeError:  # not weak-referenceable or not hashable
            cached = None
    if cached is not None and cached[0] == length:
        return cached[1]
    try:
        vocab = tokenizer.get_vocab()
    except AttributeError:
        raise GrammarError(
            f"the tokenizer ({type(tokenizer).__name__}) has no get_vocab(); pass a Hugging Face tokenizer"
        ) from None
    if not vocab:
        raise GrammarError("the tokenizer has an empty vocabulary; pass the model's Hugging Face tokenizer")
    size = max(len(vocab), max(vocab.values()) + 1)
    digest = hashlib.blake2b(digest_size=16)
    backend_tokenizer = getattr(tokenizer, "backend_tokenizer", None)
    if backend_tokenizer is not None:  # covers vocabulary, decoder and added tokens
        digest.update(backend_tokenizer.to_str().encode())
    else:
        digest.update(repr(sorted(vocab.items())).encode())
    digest.update(repr(sorted(getattr(tokenizer, "all_special_ids", []))).encode())
    key = (type(tokenizer).__name__, getattr(tokenizer, "name_or_path", ""), size, digest.hexdigest())
    eos = getattr(tokenizer, "eos_token_id", None)
    result = (key, size, eos if isinstance(eos, int) else None)
    with _fingerprint_lock:
        try:
            _fingerprints[tokenizer] = (length, result)
        except TypeError:
            pass
    return result


def _vocab_size(vocab_size: Any, tokenizer_size: int) -> int:
    if vocab_size is None:
        return tokenizer_size
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= 0:
        raise GrammarError(f"vocab_size must be a positive int (the model's logits width), got {vocab_size!r}")
    return vocab_size


def _stop_ids(stop_token_ids: Any, eos: int | None, vocab_size: int) -> tuple[int, ...]:
    if stop_token_ids is None:
        if eos is None:
            raise GrammarError(
                "the tokenizer has no eos_token_id, so the grammar does not know how generation ends; "
                "pass stop_token_ids=[...]"
            )
        stop_token_ids = [eos]
    elif isinstance(stop_token_ids, int):
        stop_token_ids = [stop_token_ids]
    try:
        stops = tuple(dict.fromkeys(int(t) for t in stop_token_ids))
    except (TypeError, ValueError):
        raise GrammarError(f"stop_token_ids must be token ids (ints), got {stop_token_ids!r}") from None
    if not stops:
        raise GrammarError("stop_token_ids is empty; pass at least one id (usually the EOS token)")
    bad = [t for t in stops if not 0 <= t < vocab_size]
    if bad:
        raise GrammarError(f"stop_token_ids {bad} are outside the vocabulary [0, {vocab_size})")
    return stops
