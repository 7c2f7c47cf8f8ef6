"""Compile a :class:`GrammarSpec` for a tokenizer: cached, within a deadline, on any registered backend.

:func:`compile_grammar` checks its arguments, fingerprints the tokenizer
(its class, ``name_or_path``, size and a hash of its serialised vocabulary)
and compiles on the backend asked for (:mod:`grammars.registry`), or the one
``backend="auto"`` picks per grammar (:mod:`grammars.select`).  The parts it
leans on each have a module:

* :mod:`grammars.compile_cache`: the bounded caches of compiled grammars,
  tokenizer-level states and compile errors (nothing is compiled twice);
* :mod:`grammars.deadline`: ``compile_timeout``, shared by everything one
  call compiles, and how each backend's work is stopped at it;
* :mod:`grammars.suggest`: after a refusal, the other backends that compile
  *and* decode the grammar, having tried them; warnings about schema
  features the chosen backend does not enforce.

Every result says which backend compiled it, why, and what it leaves
unenforced.
"""

from __future__ import annotations

import hashlib
import threading
import time
import weakref
from collections.abc import Hashable, Sequence
from typing import Any

from . import deadline
from .base import CompiledGrammar, GrammarError, Matcher
from .compile_cache import (
    CacheLimits,
    CompileRefused,
    after_work,
    cache_info,
    clear_grammar_cache,
    compile_errors,
    compiled_grammars,
    set_cache_limits,
    tokenizer_states,
)
from .deadline import Budget, CompileTimeout, NotTried
from .emptiness import check_finite
from .registry import BACKEND_CHOICES, BACKENDS, DEFAULT, canonical, get
from .satisfiable import check_satisfiable
from .spec import GrammarSpec
from .suggest import NO_VALUE, alternatives, report_unenforced

__all__ = [
    "compile_grammar",
    "clear_grammar_cache",
    "set_cache_limits",
    "cache_info",
    "CacheLimits",
    "BACKENDS",
    "BACKEND_CHOICES",
    "SelectedGrammar",
    "CompileTimeout",
]

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
    backend: str = DEFAULT,
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
    ``backend``: a registered backend (:data:`BACKENDS`: ``"xgrammar"``, the
    default, ``"outlines"``, ``"llguidance"``) or ``"auto"`` (per schema, the
    backend that enforces every keyword it uses: :mod:`grammars.select`).
    ``strict``: a schema keyword the backend does not enforce is a
    :class:`GrammarError` instead of a :class:`GrammarWarning`.
    ``compile_timeout``: seconds this call may spend compiling, over every
    backend it tries (after a refusal, the other backends it tries in order
    to suggest one; ``"auto"``'s fallbacks), each getting what the ones
    before left; the tokenizer-level state, built once per tokenizer, does
    not count.  Past it, a :class:`CompileTimeout` (a :class:`GrammarError`)
    and the compile is stopped; backends not tried for lack of time are
    named in the message: see :mod:`grammars.deadline`.  Default: no limit.

    The result's ``backend``, ``backend_reason`` and ``unenforced`` say which
    backend compiled it, why, and which schema features it does not enforce.
    Raises :class:`GrammarError` for an unknown backend, bad arguments or a
    grammar the backend cannot compile (naming the other backends that
    compile and decode it, after trying them) -- never falls back to unconstrained decoding.  The
    result is immutable and may be shared between threads.
    """
    if not isinstance(spec, GrammarSpec):
        raise GrammarError(
            f"compile_grammar needs a GrammarSpec, got {type(spec).__name__}; build one with "
            "grammars.grammar_spec(schema=...)"
        )
    after_work(0.0)  # dropped grammars freed since the last call (see compile_cache._release)
    name = canonical(backend)
    if compile_timeout is not None and (
        isinstance(compile_timeout, bool) or not isinstance(compile_timeout, (int, float)) or compile_timeout <= 0
    ):
        raise GrammarError(f"compile_timeout must be a positive number of seconds, got {compile_timeout!r}")
    tok_key, tok_size, eos = _fingerprint(tokenizer)
    vocab_size = _vocab_size(vocab_size, tok_size)
    stops = _stop_ids(stop_token_ids, eos, vocab_size)
    check_satisfiable(spec)  # no value at all (allOf of string and integer, ...): refused on every backend alike
    check_finite(spec)  # no finite text (a $ref cycle with no way out): refused before any backend compiles

    budget = Budget(compile_timeout)

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
        except CompileRefused as e:
            if NO_VALUE in str(e):  # no backend can help
                raise
            raise GrammarError(f"{e} {alternatives(name, spec, compile_with, budget, str(e))}") from None
    report_unenforced(result, strict)
    return result


def _compile_one(
    name: str,
    spec: GrammarSpec,
    tokenizer: Any,
    tok_key: Hashable,
    vocab_size: int,
    stops: tuple[int, ...],
    budget: Budget,
    limit: float | None = None,
) -> CompiledGrammar:
    """The cached grammar of ``spec`` on backend ``name``, compiled when missing within what ``budget`` has left.

    ``limit``: at most this many seconds (also without a deadline).  A
    missing grammar is not compiled once the budget is spent
    (:class:`~grammars.deadline.NotTried`, not remembered).
    """
    backend = get(name)
    prepared_key = (name, tok_key, vocab_size, stops)
    key = prepared_key + (spec,)

    def build() -> CompiledGrammar:
        from .capabilities import unenforced

        timeout = budget.left(limit)
        compile_errors.check(key, timeout)  # compiled before, and refused or ran past this deadline
        if timeout is not None and timeout <= 0:
            raise NotTried(
                f"{name} was not tried: compile_timeout={budget.total:g} s was spent on the backends before it; "
                "raise compile_timeout"
            )
        started = time.monotonic()
        prepared = tokenizer_states.get(prepared_key, lambda: backend.prepare(tokenizer, vocab_size, stops))
        budget.spend(started - time.monotonic())  # the tokenizer-level state does not count
        if timeout is None:
            deadline.warn_if_slow(name, spec)
        try:
            compiled = deadline.compile_within(backend, prepared, spec, vocab_size, stops, timeout, total=budget.total)
        except CompileTimeout as e:
            compile_errors.add(key, str(e), timeout)
            raise
        except GrammarError as e:
            compile_errors.add(key, str(e))
            raise CompileRefused(str(e)) from None
        if spec.kind == "json_schema":
            compiled.unenforced = tuple(unenforced(spec.schema, name))
        return compiled

    return compiled_grammars.get(key, build)


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
