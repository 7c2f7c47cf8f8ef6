"""Compile a :class:`GrammarSpec` for a tokenizer, with a thread-safe cache.

Two bounded LRU caches, both keyed by a fingerprint of the tokenizer (its
class, ``name_or_path``, size and a hash of its serialised vocabulary), the
logits width, the stop tokens and the backend:

* per tokenizer: the backend's tokenizer-level state (one xgrammar
  ``GrammarCompiler``; one outlines-core ``Vocabulary``);
* per grammar: the :class:`CompiledGrammar` (so a repeated call returns the
  same object and never recompiles).

When several threads ask for the same missing entry, one compiles and the
others wait for its result.  Errors are not cached.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

from .base import CompiledGrammar, GrammarError
from .spec import GrammarSpec

__all__ = ["compile_grammar", "clear_grammar_cache", "BACKENDS"]

#: Backend names accepted by :func:`compile_grammar` (the first is the default).
BACKENDS = ("xgrammar", "outlines", "llguidance")
_ALIASES = {"outlines-core": "outlines", "outlines_core": "outlines"}

#: How many compiled grammars / tokenizer-level states are kept.
GRAMMAR_CACHE_SIZE = 32
TOKENIZER_CACHE_SIZE = 8

T = TypeVar("T")


class _LRU(Generic[T]):
    """A bounded, thread-safe LRU whose misses are built once (other threads wait)."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, _Slot[T]] = OrderedDict()

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        with self._lock:
            slot = self._entries.get(key)
            owner = slot is None
            if owner:
                slot = self._entries[key] = _Slot()
            self._entries.move_to_end(key)
        if not owner:
            return slot.wait()
        try:
            slot.value = build()
        except BaseException as e:
            slot.error = e
            with self._lock:
                if self._entries.get(key) is slot:
                    del self._entries[key]
            raise
        finally:
            slot.done.set()
        with self._lock:
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
        return slot.value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


class _Slot(Generic[T]):
    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None

    def wait(self) -> T:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


_grammars: _LRU[CompiledGrammar] = _LRU(GRAMMAR_CACHE_SIZE)
_prepared: _LRU[Any] = _LRU(TOKENIZER_CACHE_SIZE)
_fingerprints: "weakref.WeakKeyDictionary[Any, tuple[int, tuple[Hashable, int, int | None]]]" = (
    weakref.WeakKeyDictionary()
)
_fingerprint_lock = threading.Lock()


def compile_grammar(
    spec: GrammarSpec,
    tokenizer: Any,
    *,
    vocab_size: int | None = None,
    stop_token_ids: int | Sequence[int] | None = None,
    backend: str = "xgrammar",
) -> CompiledGrammar:
    """The compiled grammar of ``spec`` for ``tokenizer`` (cached).

    ``vocab_size``: the model's logits width (``model.config.vocab_size`` can
    exceed ``len(tokenizer)``); default: the tokenizer's own size.  Masks
    have ``ceil(vocab_size / 32)`` words per row; ids past the tokenizer are
    never legal.
    ``stop_token_ids``: tokens that end generation once the grammar is
    complete; default: ``tokenizer.eos_token_id``.
    ``backend``: ``"xgrammar"`` (default) or ``"outlines"``.

    Raises :class:`GrammarError` for an unknown backend, bad arguments or a
    grammar the backend cannot compile -- never falls back to unconstrained
    decoding.  The result is immutable and may be shared between threads.
    """
    if not isinstance(spec, GrammarSpec):
        raise GrammarError(
            f"compile_grammar needs a GrammarSpec, got {type(spec).__name__}; build one with "
            "grammars.grammar_spec(schema=...)"
        )
    name = _ALIASES.get(backend, backend) if isinstance(backend, str) else backend
    if name not in BACKENDS:
        raise GrammarError(f"unknown grammar backend {backend!r}; choose one of {', '.join(map(repr, BACKENDS))}")
    tok_key, tok_size, eos = _fingerprint(tokenizer)
    vocab_size = _vocab_size(vocab_size, tok_size)
    stops = _stop_ids(stop_token_ids, eos, vocab_size)
    module = _backend_module(name)
    prepared_key = (name, tok_key, vocab_size, stops)

    def build() -> CompiledGrammar:
        prepared = _prepared.get(prepared_key, lambda: module.prepare(tokenizer, vocab_size, stops))
        return module.compile_spec(prepared, spec, vocab_size, stops)

    return _grammars.get(prepared_key + (spec,), build)


def clear_grammar_cache() -> None:
    """Forget every cached compiled grammar and tokenizer-level state."""
    _grammars.clear()
    _prepared.clear()


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
