"""Compile a :class:`GrammarSpec` for a tokenizer, with a thread-safe cache.

Two bounded LRU caches, both keyed by a fingerprint of the tokenizer (its
class, ``name_or_path``, size and a hash of its serialised vocabulary), the
logits width, the stop tokens and the backend:

* per tokenizer: the backend's tokenizer-level state (one xgrammar
  ``GrammarCompiler``; one outlines-core ``Vocabulary``; one ``llguidance.LLTokenizer``);
* per grammar: the :class:`CompiledGrammar` (so a repeated call returns the
  same object and never recompiles).

When several threads ask for the same missing entry, one compiles and the
others wait for its result.  Errors are not cached.

``backend="auto"`` chooses per grammar (:mod:`grammars.select`); every result
says which backend compiled it, why, and what it leaves unenforced, and the
schema features it does not enforce are warned about (or refused with
``strict=True``) on every call.
"""

from __future__ import annotations

import hashlib
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

from .base import CompiledGrammar, GrammarError, GrammarWarning, Matcher
from .spec import GrammarSpec

__all__ = ["compile_grammar", "clear_grammar_cache", "BACKENDS", "BACKEND_CHOICES", "SelectedGrammar"]

#: The grammar backends (the first is the default).
BACKENDS = ("xgrammar", "outlines", "llguidance")
#: What ``backend=`` accepts: a backend, or ``"auto"`` (see :mod:`grammars.select`).
BACKEND_CHOICES = BACKENDS + ("auto",)
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
        assert slot is not None
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
_fingerprints: weakref.WeakKeyDictionary[Any, tuple[int, tuple[Hashable, int, int | None]]] = (
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
    ``compile_timeout``: seconds one backend may take to compile; past it,
    a :class:`GrammarError` (the compile goes on in the background and its
    result is cached).  Default: no limit.

    The result's ``backend``, ``backend_reason`` and ``unenforced`` say which
    backend compiled it, why, and which schema features it does not enforce.
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

    def compile_with(backend_name: str) -> CompiledGrammar:
        return _deadline(
            lambda: _compile_one(backend_name, spec, tokenizer, tok_key, vocab_size, stops),
            compile_timeout, backend_name,
        )  # fmt: skip

    if name == "auto":
        from .select import choose

        choice = choose(spec, compile_with)
        result: CompiledGrammar = SelectedGrammar(choice.compiled, choice.reason, choice.unenforced)
    else:
        result = compile_with(name)
    _report_unenforced(result, strict)
    return result


def _compile_one(
    name: str, spec: GrammarSpec, tokenizer: Any, tok_key: Hashable, vocab_size: int, stops: tuple[int, ...]
) -> CompiledGrammar:
    module = _backend_module(name)
    prepared_key = (name, tok_key, vocab_size, stops)

    def build() -> CompiledGrammar:
        from .capabilities import unenforced

        prepared = _prepared.get(prepared_key, lambda: module.prepare(tokenizer, vocab_size, stops))
        compiled = module.compile_spec(prepared, spec, vocab_size, stops)
        if spec.kind == "json_schema":
            compiled.unenforced = tuple(unenforced(spec.schema, name))
        return compiled

    return _grammars.get(prepared_key + (spec,), build)


def _deadline(build: Callable[[], CompiledGrammar], timeout: float | None, backend: str) -> CompiledGrammar:
    """``build()``, or a :class:`GrammarError` when it takes longer than ``timeout`` seconds.

    The build runs in a daemon thread (the backends compile in native code
    that releases the GIL); past the deadline it is left to finish and fill
    the cache.
    """
    if timeout is None:
        return build()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = build()
        except BaseException as e:  # handed to the caller
            box["error"] = e

    worker = threading.Thread(target=run, name=f"grammarspec-compile-{backend}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise GrammarError(
            f"{backend} did not compile the grammar within compile_timeout={timeout:g} s; try another "
            "backend (grammar_backend='auto' picks one), raise compile_timeout, or simplify the schema"
        )
    if "error" in box:
        raise box["error"]
    return box["value"]


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
