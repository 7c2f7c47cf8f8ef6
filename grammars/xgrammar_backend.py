"""The xgrammar backend (the default).

With default options a JSON Schema compiles to exactly
``GrammarCompiler.compile_json_schema(schema, any_whitespace=False,
separators=(",", ":"))`` -- the grammar plain xgrammar decoding uses with
compact JSON -- so outputs are comparable token for token.
``any_whitespace=True`` gives xgrammar's flexible-whitespace grammar.

Quirks absorbed here:

* ``accept_token`` on a terminated matcher returns ``False`` but logs a
  warning; the adapter answers ``False`` without asking.
* ``fill_next_token_bitmask`` on a terminated matcher raises ``RuntimeError``;
  the adapter raises :class:`GrammarError` instead.
* xgrammar's own rollback is unbounded; the adapter enforces the same
  ``max_rollback`` window as every other backend.
* compile errors (``RuntimeError`` from C++) become :class:`GrammarError`
  naming the backend and what to do.
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ._bitmask import check_bitmask, clear_padding
from ._window import RollbackWindow, WindowedMatcher
from .base import CompiledGrammar, GrammarError, Matcher
from .emptiness import forced_text_bounded
from .features import Capabilities
from .spec import GrammarSpec
from .xgrammar_source import readable_source

if TYPE_CHECKING:
    import xgrammar as xgr

__all__ = [
    "name",
    "aliases",
    "capabilities",
    "XGrammarCompiled",
    "XGrammarMatcher",
    "XGrammarTokenizer",
    "prepare",
    "compile_spec",
    "serialize",
    "deserialize",
    "prepared_nbytes",
    "COMPACT_SEPARATORS",
]

#: What ``backend=`` calls this backend, and other spellings it accepts.
name = "xgrammar"
aliases: tuple[str, ...] = ()

#: What xgrammar compiles and enforces (see :mod:`grammars.capabilities`).  patternProperties: ``{"ab": "x"}`` is
#: rejected, and so is the valid ``{"ab": 1}`` (stricter than the schema); unevaluatedProperties: false is what
#: strict mode does anyway.
capabilities = Capabilities.declare(
    kinds="json_schema any_json regex ebnf",
    enforced="minimum maximum exclusiveMinimum exclusiveMaximum multipleOf minProperties maxProperties propertyNames "
    "allOf patternProperties unevaluatedProperties unevaluatedItems",
    ignored="multipleOf:number pattern:lookaround maxLength+pattern minLength+pattern allOf:multi oneOf:overlap "
    "$ref+siblings anyOf+siblings enum+siblings uniqueItems contains not if then else dependentRequired "
    "dependentSchemas dependencies minContains maxContains $dynamicRef $dynamicAnchor",
    formats="date time date-time duration email hostname ipv4 ipv6 uri uri-reference uri-template uuid json-pointer",
    other_formats="ignored",
    auto_rank=2,  # the fastest masks, but it lets some keywords through (accepts 22 of 652 invalid examples)
)

#: ``json.dumps(obj, separators=COMPACT_SEPARATORS)`` is the compact JSON the default grammar allows.
COMPACT_SEPARATORS = (",", ":")


#: Estimated bytes of the tokenizer-level state per vocabulary entry (4.4 MB measured for SmolLM2's 49,152).
_PREPARED_BYTES_PER_TOKEN = 96


@dataclass(frozen=True)
class XGrammarTokenizer:
    """The tokenizer-level state: xgrammar's ``TokenizerInfo`` and a ``GrammarCompiler`` over it."""

    info: xgr.TokenizerInfo
    compiler: xgr.GrammarCompiler
    vocab_size: int


def prepared_nbytes(prepared: XGrammarTokenizer) -> int:
    """Estimated resident bytes of the tokenizer-level state.  Pure."""
    return prepared.vocab_size * _PREPARED_BYTES_PER_TOKEN


def prepare(tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]) -> XGrammarTokenizer:
    """xgrammar's ``TokenizerInfo`` and one ``GrammarCompiler`` for a tokenizer, logits width and stop tokens.

    xgrammar's own compile cache is disabled: :func:`grammars.compile_grammar`
    keeps a bounded cache of compiled grammars instead.
    """
    import xgrammar as xgr

    try:
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids))
    except Exception as e:  # xgrammar raises ValueError/RuntimeError/TypeError on odd tokenizers
        raise GrammarError(
            f"xgrammar could not read the tokenizer {type(tokenizer).__name__} ({_clean(e)}); "
            "pass a Hugging Face tokenizer, or try backend='outlines'"
        ) from None
    compiler = xgr.GrammarCompiler(info, max_threads=max(1, min(8, os.cpu_count() or 1)), cache_enabled=False)
    return XGrammarTokenizer(info, compiler, vocab_size)


def compile_spec(
    prepared: XGrammarTokenizer, spec: GrammarSpec, vocab_size: int, stop_token_ids: Sequence[int]
) -> XGrammarCompiled:
    """Compile ``spec`` with the prepared compiler; raises :class:`GrammarError` when xgrammar cannot."""
    compiler = prepared.compiler
    try:
        source = readable_source(spec)
    except ValueError as e:
        raise GrammarError(f"xgrammar cannot compile the {spec.kind.replace('_', ' ')}: {e}") from None
    try:
        if spec.is_json:
            if spec.any_whitespace:
                compiled = compiler.compile_json_schema(source, any_whitespace=True)
            else:
                compiled = compiler.compile_json_schema(source, any_whitespace=False, separators=COMPACT_SEPARATORS)
        elif spec.kind == "regex":
            compiled = compiler.compile_regex(source)
        else:
            compiled = compiler.compile_grammar(spec.source, root_rule_name="root")
    except Exception as e:  # C++ errors surface as RuntimeError (sometimes ValueError)
        raise GrammarError(_compile_error_message(spec, e, compiler)) from None
    return XGrammarCompiled(compiled, vocab_size, stop_token_ids)


def serialize(compiled: XGrammarCompiled) -> bytes:
    """The compiled grammar as bytes (xgrammar's JSON, token-mask cache included), for a worker process.  Pure."""
    return compiled.compiled.serialize_json().encode()


def deserialize(
    prepared: XGrammarTokenizer, data: bytes, vocab_size: int, stop_token_ids: Sequence[int]
) -> XGrammarCompiled:
    """The grammar :func:`serialize` wrote, over this process's ``TokenizerInfo``."""
    import xgrammar as xgr

    return XGrammarCompiled(
        xgr.CompiledGrammar.deserialize_json(data.decode(), prepared.info), vocab_size, stop_token_ids
    )


def _clean(error: BaseException) -> str:
    """xgrammar's message without the C++ log prefix and assertion boilerplate."""
    text = str(error).strip()
    text = re.sub(r"\[\d\d:\d\d:\d\d\] \S+?:\d+: ", "", text)
    text = re.sub(r"Check failed: \(.*?\) is false: ", "", text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _compile_error_message(spec: GrammarSpec, error: BaseException, compiler: xgr.GrammarCompiler) -> str:
    reason = _clean(error)
    if spec.kind == "regex":
        return (
            f"xgrammar cannot compile the regex: {reason}{_near_position(spec.source, reason)}. "
            "Rewrite that part of the regex."
        )
    if spec.kind == "ebnf":
        return f"xgrammar cannot compile the EBNF grammar: {reason}. Fix the grammar (GBNF syntax, start rule 'root')."
    from .keywords import unsatisfiable

    why_not = unsatisfiable(spec.schema)
    if why_not is not None:  # no backend can help
        return f"xgrammar cannot compile the JSON schema: {reason}. The schema accepts no value ({why_not}); fix the schema."
    part = ""
    if "regex" in reason.lower():
        bad = _bad_patterns(spec.schema, compiler)
        if bad:
            part = f" (offending pattern{'s' if len(bad) > 1 else ''}: {', '.join(bad)})"
    return f"xgrammar cannot compile the JSON schema: {reason}{part}. Simplify or remove that part of the schema."


def _near_position(source: str, reason: str) -> str:
    match = re.search(r"position (\d+)", reason)
    if not match:
        return ""
    pos = int(match.group(1))
    return f" (near {source[max(0, pos - 8) : pos + 8]!r})"


def _bad_patterns(schema: Any, compiler: xgr.GrammarCompiler) -> list[str]:
    """The ``pattern`` values in ``schema`` that xgrammar's regex compiler rejects."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            pattern = node.get("pattern")
            if isinstance(pattern, str):
                try:
                    compiler.compile_regex(pattern.removeprefix("^").removesuffix("$"))
                except Exception:
                    found.append(repr(pattern))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return found


class XGrammarCompiled(CompiledGrammar):
    """An xgrammar ``CompiledGrammar`` with its logits width and stop tokens.  Immutable."""

    backend = name

    def __init__(self, compiled: xgr.CompiledGrammar, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        super().__init__(vocab_size, stop_token_ids)
        self.compiled = compiled
        #: estimated resident bytes (xgrammar's own count)
        self.nbytes = int(compiled.memory_size_bytes) + 4096
        #: whether xgrammar's forced-text search stays cheap on this grammar (see grammars.emptiness)
        self.jump_forward = forced_text_bounded(str(compiled.grammar))

    def matcher(self, max_rollback: int = 64) -> XGrammarMatcher:
        import xgrammar as xgr

        matcher = XGrammarMatcher(
            xgr.GrammarMatcher(self.compiled), self.vocab_size, self.stop_token_ids, RollbackWindow(max_rollback)
        )
        matcher.jump_forward = self.jump_forward
        return matcher


class XGrammarMatcher(WindowedMatcher):
    """Per-request state over an ``xgrammar.GrammarMatcher``."""

    #: False: :meth:`forced_text` is "" (a grammar on which xgrammar's forced-text search may run away)
    jump_forward = True

    def __init__(
        self,
        matcher: xgr.GrammarMatcher,
        vocab_size: int,
        stop_token_ids: tuple[int, ...],
        window: RollbackWindow,
    ) -> None:
        self._matcher = matcher
        self._window = window
        self.vocab_size = vocab_size
        self.stop_token_ids = stop_token_ids
        self.max_rollback = window.max_rollback

    def accept(self, token: int) -> bool:
        """Advance by ``token`` if legal; changes state only when it returns ``True``."""
        token = operator.index(token)
        if not 0 <= token < self.vocab_size or self._matcher.is_terminated():
            return False
        if self._matcher.accept_token(token):
            self._window.push()
            return True
        return False

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens.  Changes state."""
        self._window.pop(n, name)
        if n:
            self._matcher.rollback(n)

    def fill_mask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        """Write the legal next tokens into ``bitmask[row]``.  Does not change state."""
        if self._matcher.is_terminated():
            raise GrammarError(
                "the xgrammar matcher is terminated (a stop token was accepted) and has no next "
                "token; stop generating, or roll back the stop token first"
            )
        mask_row = check_bitmask(bitmask, row, self.vocab_size)
        self._matcher.fill_next_token_bitmask(bitmask, row)
        clear_padding(mask_row, self.vocab_size)

    @classmethod
    def fill_masks(cls, matchers: Sequence[Matcher], bitmask: torch.Tensor, rows: Sequence[int]) -> None:
        """Fill every matcher's row in one ``xgrammar.BatchGrammarMatcher`` call.  Does not change state."""
        inner = []
        for matcher, row in zip(matchers, rows, strict=True):
            if not isinstance(matcher, XGrammarMatcher) or matcher._matcher.is_terminated():
                matcher.fill_mask(bitmask, row)  # raises the terminated matcher's error, or fills another kind
                continue
            check_bitmask(bitmask, row, matcher.vocab_size)
            inner.append((matcher, row))
        if not inner:
            return
        _batch_matcher().batch_fill_next_token_bitmask([m._matcher for m, _ in inner], bitmask, [r for _, r in inner])
        for matcher, row in inner:
            clear_padding(bitmask[row], matcher.vocab_size)

    def forced_text(self) -> str:
        """xgrammar's jump-forward string ("" if none, or if the search may run away).  Does not change state."""
        if self._matcher.is_terminated() or not self.jump_forward:
            return ""
        return self._matcher.find_jump_forward_string()

    def is_terminated(self) -> bool:
        """Whether a stop token was accepted.  Does not change state."""
        return self._matcher.is_terminated()

    def reset(self) -> None:
        """Return to the initial state.  Changes state."""
        self._matcher.reset()
        self._window.clear()

    def fork(self) -> XGrammarMatcher:
        """An independent copy in the current state, with the same rollback window."""
        forked = XGrammarMatcher(self._matcher.fork(), self.vocab_size, self.stop_token_ids, self._window.copy())
        forked.jump_forward = self.jump_forward
        return forked


_BATCH: list[xgr.BatchGrammarMatcher] = []


def _batch_matcher() -> xgr.BatchGrammarMatcher:
    """The process's one ``BatchGrammarMatcher`` (its thread pool is made once)."""
    if not _BATCH:
        import xgrammar as xgr

        _BATCH.append(xgr.BatchGrammarMatcher())
    return _BATCH[0]
