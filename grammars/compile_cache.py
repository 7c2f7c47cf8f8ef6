"""The bounded caches :func:`grammars.compile_grammar` keeps, and handing freed memory back to the OS.

Two LRU caches, both keyed by a fingerprint of the tokenizer (its class,
``name_or_path``, size and a hash of its serialised vocabulary), the logits
width, the stop tokens and the backend, and both bounded by entry count *and*
by an estimate of their bytes (:func:`set_cache_limits`, :func:`cache_info`):

* per tokenizer (:data:`tokenizer_states`): the backend's tokenizer-level state (one
  xgrammar ``TokenizerInfo`` + ``GrammarCompiler``; one outlines-core
  ``Vocabulary``; one ``llguidance.LLTokenizer``): default 8 entries, 256 MiB;
* per grammar (:data:`compiled_grammars`): the :class:`CompiledGrammar` (a repeated
  call returns the same object and never recompiles): default 64 entries,
  512 MiB.

``GRAMMARSPEC_GRAMMAR_CACHE_MB`` and ``GRAMMARSPEC_TOKENIZER_CACHE_MB`` set the
byte bounds at import.  A grammar larger than the whole bound is returned but
not kept (and evicts nothing).  When several threads ask for the same missing
entry, one builds it and the others wait for its result.

Compile errors are remembered (:data:`compile_errors`, a bounded table of
messages), so a schema a backend refuses is not compiled again, and a compile
that ran past ``compile_timeout=T`` is not retried with a deadline of ``T`` or
less.

After a slow build or evictions the freed heap pages go back to the OS
(glibc's ``malloc_trim``): without it glibc keeps them, and resident memory
steps up with each large compile.
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .base import CompiledGrammar, GrammarError
from .deadline import CompileTimeout
from .lru import LRU
from .registry import get

__all__ = [
    "CacheLimits",
    "CompileRefused",
    "compiled_grammars",
    "tokenizer_states",
    "compile_errors",
    "set_cache_limits",
    "limits",
    "cache_info",
    "clear_grammar_cache",
    "after_work",
]

_MIB = 2**20
#: Default bounds: how many compiled grammars / tokenizer-level states are kept, and their estimated bytes.
GRAMMAR_CACHE_SIZE = 64
TOKENIZER_CACHE_SIZE = 8
GRAMMAR_CACHE_BYTES = 512 * _MIB
TOKENIZER_CACHE_BYTES = 256 * _MIB
#: How many compile errors are remembered (messages only; a few hundred bytes each).
FAILURE_CACHE_SIZE = 512

T = TypeVar("T")


class CompileRefused(GrammarError):
    """A backend refused the grammar (the message says why), now or remembered from before."""


@dataclass(frozen=True)
class CacheLimits:
    """The bounds of the two caches: entry counts and estimated bytes."""

    grammar_count: int
    grammar_bytes: int
    tokenizer_count: int
    tokenizer_bytes: int


class _LRU(Generic[T]):
    """A thread-safe LRU bounded by count and by estimated bytes; misses are built once (other threads wait).

    Its own structure rather than :class:`~grammars.lru.LRU`: an entry being
    built holds its place in the order (the threads that ask for it wait on
    it) yet is never evicted, its bytes not being known yet; and a bound of 0
    keeps nothing, where :class:`~grammars.lru.LRU` holds at least one entry.
    """

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
            after_work(time.monotonic() - started)
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
        after_work(time.monotonic() - started)
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
        self._entries: LRU[Hashable, tuple[str, float | None]] = LRU(maxsize)

    def check(self, key: Hashable, timeout: float | None) -> None:
        """Raise the remembered error for ``key`` if compiling again would end the same way."""
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:
            return
        message, ran_past = entry
        if ran_past is None:
            raise CompileRefused(message)
        if timeout is not None and timeout <= ran_past:
            raise CompileTimeout(message)

    def add(self, key: Hashable, message: str, ran_past: float | None = None) -> None:
        with self._lock:
            self._entries.put(key, (message, ran_past))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def _grammar_bytes(key: Hashable, compiled: CompiledGrammar) -> int:
    return int(getattr(compiled, "nbytes", 0))


def _prepared_bytes(key: Hashable, state: Any) -> int:
    name = key[0] if isinstance(key, tuple) else ""
    return int(get(str(name)).prepared_nbytes(state))


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


#: Compiled grammars, by (backend, tokenizer key, logits width, stop tokens, spec).
compiled_grammars: _LRU[CompiledGrammar] = _LRU(
    GRAMMAR_CACHE_SIZE, _env_mib("GRAMMARSPEC_GRAMMAR_CACHE_MB", GRAMMAR_CACHE_BYTES), _grammar_bytes
)
#: Tokenizer-level states, by (backend, tokenizer key, logits width, stop tokens).
tokenizer_states: _LRU[Any] = _LRU(
    TOKENIZER_CACHE_SIZE, _env_mib("GRAMMARSPEC_TOKENIZER_CACHE_MB", TOKENIZER_CACHE_BYTES), _prepared_bytes
)
#: Compile errors, by the grammar cache's key.
compile_errors = _Failures(FAILURE_CACHE_SIZE)


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
    compiled_grammars.resize(
        previous.grammar_count if grammar[0] is None else grammar[0],
        previous.grammar_bytes if grammar[1] is None else grammar[1],
    )
    tokenizer_states.resize(
        previous.tokenizer_count if tokenizer[0] is None else tokenizer[0],
        previous.tokenizer_bytes if tokenizer[1] is None else tokenizer[1],
    )
    return previous


def limits() -> CacheLimits:
    """The current cache bounds.  Does not change state."""
    return CacheLimits(
        compiled_grammars.maxsize, compiled_grammars.max_bytes, tokenizer_states.maxsize, tokenizer_states.max_bytes
    )


def cache_info() -> dict[str, int]:
    """Entries and estimated bytes held by the caches, and the remembered compile errors.  Does not change state.

    Estimates: xgrammar's own ``memory_size_bytes``; an outlines-core index
    at three times its serialised size (resident memory measured at 2 to 3.8
    times); an llguidance grammar from its text (its lexer grows later, as
    masks are computed, within ``LLParserLimits.max_lexer_states``); a
    tokenizer-level state per vocabulary entry (measured on SmolLM2's 49k).
    """
    return {
        "grammars": len(compiled_grammars),
        "grammar_bytes": compiled_grammars.nbytes,
        "tokenizers": len(tokenizer_states),
        "tokenizer_bytes": tokenizer_states.nbytes,
        "failures": len(compile_errors),
    }


def clear_grammar_cache() -> None:
    """Forget every cached compiled grammar, tokenizer-level state and remembered compile error.

    The memory is handed back to the operating system (garbage collection,
    then glibc's ``malloc_trim``) once no other reference holds the grammars:
    a :class:`CompiledGrammar` or :class:`Matcher` still in use keeps its own.
    Changes global state.
    """
    global _freed_since_trim
    compiled_grammars.clear()
    tokenizer_states.clear()
    compile_errors.clear()
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


def after_work(seconds: float) -> None:
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
    after_work(0.0)


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
