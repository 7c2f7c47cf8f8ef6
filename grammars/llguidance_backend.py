"""The llguidance backend (guidance-ai's Earley parser over a lazily built lexer).

A JSON Schema compiles with ``LLMatcher.grammar_from_json_schema`` (compact
JSON, ``","``/``":"`` separators, by default; flexible whitespace with
``any_whitespace=True``), a regex with ``grammar_from_regex`` and an EBNF
grammar (xgrammar's GBNF dialect, root rule ``root``) through llguidance's own
GBNF-to-Lark converter.  llguidance refuses the JSON-Schema keywords it does
not implement (``not``, ``uniqueItems``, ``if``/``then``, ...) instead of
ignoring them, so what it compiles it enforces (see
:mod:`grammars.capabilities`).

The tokenizer is handed over as the same token bytes the outlines adapter
reads (:func:`grammars.outlines_backend.token_bytes`, pinned against xgrammar
by the contract tests), so all three backends see one vocabulary.  Its
tokenize callback returns tokens that spell exactly the text it is given
(llguidance lets the mask allow only the first of them where the grammar
forces bytes), as the tokenizer splits the text inside a longer one: a
SentencePiece tokenizer's dummy prefix ``▁`` is not part of it.

Quirks absorbed here:

* ``LLMatcher.consume_token`` with an illegal token puts the matcher into a
  permanent error state; the adapter checks with the non-mutating
  ``validate_tokens`` first and answers ``False``.
* Consuming EOS once the grammar cannot be extended adds no token to
  llguidance's history, so ``rollback(1)`` would undo the token before it.
  Stop tokens are therefore kept out of llguidance, as in the outlines
  adapter: ``accept(stop)`` marks the matcher terminated when llguidance says
  the stop token is legal, and rolling back over it un-terminates.
* llguidance's rollback is unbounded; the adapter enforces the same
  ``max_rollback`` window as every other backend.
* Grammar errors come back as a message (``validate_grammar_with_warnings``),
  never as an exception; the adapter turns them into :class:`GrammarError`.
* A grammar that allows no text (llguidance compiles some) puts the matcher
  into an error state at its first mask, which then allows only EOS -- a
  token ``accept`` refuses.  Compiling computes that first mask on a copy and
  refuses such a grammar; a mask that ends in llguidance's error state later
  raises :class:`GrammarError` instead of being handed out.
"""

from __future__ import annotations

import copy
import json
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ._bitmask import check_bitmask, clear_padding
from ._window import RollbackWindow, StopMarkingMatcher
from .base import CompiledGrammar, GrammarError, allocate_bitmask
from .features import Capabilities
from .spec import GrammarSpec, schema_nodes

if TYPE_CHECKING:
    import llguidance

__all__ = [
    "name",
    "aliases",
    "capabilities",
    "LLGuidanceCompiled",
    "LLGuidanceMatcher",
    "LLGuidanceTokenizer",
    "prepare",
    "compile_spec",
    "prepared_nbytes",
    "serialize",
    "deserialize",
]

#: What ``backend=`` calls this backend, and other spellings it accepts.
name = "llguidance"
aliases: tuple[str, ...] = ()

#: What llguidance compiles and enforces (see :mod:`grammars.capabilities`).
capabilities = Capabilities.declare(
    kinds="json_schema any_json regex ebnf",
    enforced="minimum maximum exclusiveMinimum exclusiveMaximum multipleOf minProperties maxProperties "
    "multipleOf:number maxLength+pattern minLength+pattern allOf allOf:multi $ref+siblings anyOf+siblings "
    "enum+siblings patternProperties",
    refused="propertyNames pattern:lookaround oneOf:overlap uniqueItems contains not if then else dependentRequired "
    "dependentSchemas dependencies unevaluatedProperties unevaluatedItems minContains maxContains $dynamicRef "
    "$dynamicAnchor",
    formats="date time date-time duration email hostname ipv4 ipv6 uri uuid",
    other_formats="refused",
    auto_rank=1,  # it refuses what it does not implement, so what it compiles it enforces
)

#: Compile options for compact JSON (``json.dumps(x, separators=(",", ":"))``).
COMPACT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
FLEXIBLE = {"whitespace_flexible": True}
#: Estimated bytes of the tokenizer-level state per vocabulary entry (11.9 MB measured for SmolLM2's 49,152).
_PREPARED_BYTES_PER_TOKEN = 256
#: Estimated bytes of a compiled grammar: a base plus this much per character of grammar text.
_GRAMMAR_BASE_BYTES = 256 * 1024
_GRAMMAR_BYTES_PER_CHAR = 64


@dataclass(frozen=True)
class LLGuidanceTokenizer:
    """The tokenizer-level state: an ``llguidance.LLTokenizer`` and the logits width."""

    tokenizer: llguidance.LLTokenizer
    vocab_size: int
    stop_token_ids: tuple[int, ...]


class _Wrapped:
    """What ``llguidance.TokenizerWrapper`` reads from a tokenizer: token bytes, EOS, special ids, encode."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        from .outlines_backend import token_bytes

        pieces = token_bytes(tokenizer, vocab_size)
        names = {i: s for s, i in tokenizer.get_vocab().items()}
        size = len(tokenizer)
        # Special ids keep their name (llguidance marks them special and never allows them as text);
        # ids past the tokenizer are empty and never legal.
        self.special_token_ids = [i for i, p in enumerate(pieces) if p is None and i < size]
        self.tokens = [
            p if p is not None else (names.get(i, f"<[{i}]>").encode() if i < size else b"")
            for i, p in enumerate(pieces)
        ]
        self.eos_token_id = int(stop_token_ids[0])
        self.bos_token_id = getattr(tokenizer, "bos_token_id", None)
        self._tokenizer = tokenizer
        self._pieces = pieces
        self._by_bytes: dict[bytes, int] | None = None  # the greedy fallback's table, built when first needed

    def __call__(self, text: str) -> list[int]:
        """Tokens that spell exactly ``text``, split as the tokenizer splits it inside a longer text.

        llguidance tokenizes the bytes a grammar forces with this and lets the
        mask allow only the first of those tokens, so they must spell the
        bytes and nothing else.  A SentencePiece tokenizer encoding a text on
        its own adds its dummy prefix (``{"`` encodes as ``▁{"``, a token that
        starts with a space the grammar never allows), so the text is read
        after an anchor whose tokens are cut off (:func:`_after_anchor`), as it
        is split in the model's context.  Where neither reading spells the
        text, the longest token at each position (up to the first byte no
        token spells).  Takes ``str`` only (``TypeError`` for ``bytes``: the
        wrapper then passes text).
        """
        if not isinstance(text, str):
            raise TypeError("pass text (str)")
        target = text.encode("utf-8")
        plain = list(self._tokenizer.encode(text, add_special_tokens=False))
        if self._spelled(plain) == target:
            return plain
        anchored = self._tokenizer.encode(_ANCHOR + text, add_special_tokens=False)
        found = _after_anchor(self._pieces, anchored, target)
        return found if found is not None else self._greedy(target)

    def _spelled(self, ids: Sequence[int]) -> bytes | None:
        """The bytes ``ids`` spell; ``None`` when one is special or out of range."""
        out = []
        for i in ids:
            piece = self._pieces[i] if 0 <= i < len(self._pieces) else None
            if piece is None:
                return None
            out.append(piece)
        return b"".join(out)

    def _greedy(self, target: bytes) -> list[int]:
        """The longest token at each position of ``target``, up to the first byte no token spells."""
        if self._by_bytes is None:
            table: dict[bytes, int] = {}
            for i, piece in enumerate(self._pieces):
                if piece:
                    table.setdefault(piece, i)
            self._by_bytes = table
        longest = max(map(len, self._by_bytes), default=0)
        out: list[int] = []
        at = 0
        while at < len(target):
            for n in range(min(longest, len(target) - at), 0, -1):
                token = self._by_bytes.get(target[at : at + n])
                if token is not None:
                    out.append(token)
                    at += n
                    break
            else:
                break
        return out


#: What :meth:`_Wrapped.__call__` encodes before a text so a SentencePiece tokenizer splits it as in context: a
#: newline, which such a vocabulary spells with a byte-fallback or a lone token that merges with nothing after it.
_ANCHOR = "\n"


def _after_anchor(pieces: Sequence[bytes | None], encoded: Sequence[int], target: bytes) -> list[int] | None:
    """The tokens of ``encoded`` after a token boundary where exactly ``target`` is left; ``None`` if there is none.

    >>> _after_anchor([b" ", b"\\n", b'{"', b"x"], [0, 1, 2, 3], b'{"x')
    [2, 3]
    >>> _after_anchor([b"\\n{", b'"x'], [0, 1], b'{"x') is None
    True
    """
    lengths = []
    for token in encoded:
        piece = pieces[token] if 0 <= token < len(pieces) else None
        if piece is None:
            return None
        lengths.append(len(piece))
    cut, position = len(encoded), 0
    while cut > 0 and position < len(target):
        cut -= 1
        position += lengths[cut]
    if position != len(target) or b"".join(pieces[t] or b"" for t in encoded[cut:]) != target:
        return None
    return list(encoded[cut:])


def prepared_nbytes(prepared: LLGuidanceTokenizer) -> int:
    """Estimated resident bytes of the tokenizer-level state.  Pure."""
    return prepared.vocab_size * _PREPARED_BYTES_PER_TOKEN


def prepare(tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]) -> LLGuidanceTokenizer:
    """One ``llguidance.LLTokenizer`` for a tokenizer, logits width and stop tokens (about 0.6 s for 49k tokens)."""
    import llguidance

    stops = tuple(int(t) for t in stop_token_ids)
    try:
        wrapped = llguidance.TokenizerWrapper(_Wrapped(tokenizer, vocab_size, stops))
        lltok = llguidance.LLTokenizer(wrapped, n_vocab=vocab_size, eos_token=list(stops))
    except Exception as e:
        raise GrammarError(
            f"llguidance could not read the tokenizer {type(tokenizer).__name__} ({e}); "
            "pass a Hugging Face tokenizer, or try backend='xgrammar'"
        ) from None
    return LLGuidanceTokenizer(lltok, vocab_size, stops)


def grammar_text(spec: GrammarSpec) -> str:
    """The llguidance grammar for ``spec`` (not yet checked).  Pure."""
    import llguidance

    if spec.is_json:
        return llguidance.LLMatcher.grammar_from_json_schema(
            closed_shapes(spec),
            overrides=dict(FLEXIBLE if spec.any_whitespace else COMPACT),  # type: ignore[arg-type]  # JsonCompileOptions keys
        )
    if spec.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.source)
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        lark = any_to_lark(spec.source)
    except Exception as e:
        raise GrammarError(
            f"llguidance cannot compile the EBNF grammar: {_first_line(e)}. Fix the grammar "
            "(GBNF syntax, start rule 'root')."
        ) from None
    return llguidance.LLMatcher.grammar_from_lark(lark)


_OPEN_OBJECT = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_OPEN_ARRAY = ("items", "additionalItems", "unevaluatedItems")


def closed_shapes(spec: GrammarSpec) -> str:
    """The schema text for llguidance, with objects and tuples closed as xgrammar and outlines-core close them.

    xgrammar (strict mode) and outlines-core allow no property beyond
    ``properties`` and no item beyond ``prefixItems`` unless the schema says
    otherwise; llguidance follows JSON Schema and allows both.  To give the
    same outputs on every backend, ``additionalProperties: false`` /
    ``items: false`` is added where the schema leaves them open.  Only makes
    the grammar stricter (every output still validates).  Pure.

    >>> closed_shapes(GrammarSpec("json_schema", '{"properties": {"a": {}}}'))
    '{"properties": {"a": {}}, "additionalProperties": false}'
    """
    schema = copy.deepcopy(spec.schema)
    edited = False
    for node in schema_nodes(schema):
        if "properties" in node and not any(k in node for k in _OPEN_OBJECT):
            node["additionalProperties"] = False
            edited = True
        if "prefixItems" in node and not any(k in node for k in _OPEN_ARRAY):
            node["items"] = False
            edited = True
    return json.dumps(schema) if edited else spec.source


def compile_spec(
    prepared: LLGuidanceTokenizer, spec: GrammarSpec, vocab_size: int, stop_token_ids: Sequence[int]
) -> LLGuidanceCompiled:
    """Compile ``spec``; raises :class:`GrammarError` when llguidance cannot."""
    import llguidance

    grammar = grammar_text(spec)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, prepared.tokenizer)
    if is_error:
        raise GrammarError(_compile_error_message(spec, messages[0] if messages else "unknown error"))
    template = llguidance.LLMatcher(prepared.tokenizer, grammar, log_level=0)
    if template.is_error():
        raise GrammarError(_compile_error_message(spec, template.get_error()))
    _check_first_mask(template, spec, prepared.vocab_size)
    compiled = LLGuidanceCompiled(template, prepared, tuple(messages))
    compiled.nbytes = _GRAMMAR_BASE_BYTES + _GRAMMAR_BYTES_PER_CHAR * len(grammar)
    return compiled


def _check_first_mask(template: llguidance.LLMatcher, spec: GrammarSpec, vocab_size: int) -> None:
    """Refuse a grammar in which llguidance finds no first token (its mask would allow only EOS, which it then
    refuses: the grammar describes no text).  Computes one mask on a copy; ``template`` is unchanged."""
    from llguidance.numpy import fill_next_token_bitmask

    probe = template.deep_copy()
    fill_next_token_bitmask(probe, allocate_bitmask(1, vocab_size).numpy(), 0)
    if probe.is_error() and not probe.is_accepting():
        what = {"regex": "the regex", "ebnf": "the EBNF grammar"}.get(spec.kind, "the JSON schema")
        raise GrammarError(
            f"llguidance compiles {what}, but its grammar allows no first token ({_first_line(probe.get_error())}): "
            "part of it describes no text, such as a $ref that only leads back to itself. Fix that part."
        )


def _first_line(error: BaseException | str) -> str:
    """llguidance's message on one line; a regex error keeps its ``error: ...`` line (the reason)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    reason = next((line for line in lines if line.startswith("error:")), None)
    text = " ".join(lines[:1] + ([reason] if reason and reason not in lines[:1] else []))
    return text[:500] or type(error).__name__


def _compile_error_message(spec: GrammarSpec, reason: str) -> str:
    reason = _first_line(reason)
    what = {"regex": "the regex", "ebnf": "the EBNF grammar"}.get(spec.kind, "the JSON schema")
    if "Unsatisfiable" in reason:  # no backend can help: the schema admits no value
        return f"llguidance cannot compile {what}: {reason}. The schema accepts no value; fix the schema."
    if spec.kind == "ebnf":
        return f"llguidance cannot compile {what}: {reason}. Fix the grammar (GBNF syntax, start rule 'root')."
    return f"llguidance cannot compile {what}: {reason}. Simplify or remove that part."


class LLGuidanceCompiled(CompiledGrammar):
    """A checked llguidance grammar: a template ``LLMatcher`` in the initial state.  Immutable."""

    backend = name

    def __init__(
        self, template: llguidance.LLMatcher, prepared: LLGuidanceTokenizer, warnings: tuple[str, ...]
    ) -> None:
        super().__init__(prepared.vocab_size, prepared.stop_token_ids)
        self._template = template
        self.prepared = prepared
        #: llguidance's own warnings about the grammar (usually empty)
        self.warnings = warnings
        #: estimated resident bytes at compile time (the lexer grows as masks are computed, within
        #: ``LLParserLimits.max_lexer_states``)
        self.nbytes = _GRAMMAR_BASE_BYTES

    def matcher(self, max_rollback: int = 64) -> LLGuidanceMatcher:
        window = RollbackWindow(max_rollback)  # checks max_rollback
        return LLGuidanceMatcher(self._template.deep_copy(), self, window)


class LLGuidanceMatcher(StopMarkingMatcher):
    """Per-request state over an ``llguidance.LLMatcher``."""

    backend = name

    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        compiled: LLGuidanceCompiled,
        window: RollbackWindow,
        terminated: bool = False,
    ) -> None:
        super().__init__(compiled, window, terminated)
        self._matcher = matcher
        self._compiled = compiled
        self._scratch: torch.Tensor | None = None  # a one-row mask for _legal_text_token

    def _can_stop(self) -> bool:
        return bool(self._matcher.is_accepting())  # stop tokens are kept out of llguidance (the module docstring)

    def _advance(self, token: int) -> bool:
        if not self._legal_text_token(token):
            return False
        if not self._matcher.consume_token(token):
            raise GrammarError(f"llguidance failed on a validated token {token}: {self._matcher.get_error()}")
        return True

    def _undo(self, tokens: int, in_backend: int) -> None:
        if in_backend and not self._matcher.rollback(in_backend):
            raise GrammarError(f"llguidance could not roll back {in_backend} tokens: {self._matcher.get_error()}")

    def _restart(self) -> None:
        self._matcher.reset()

    def _legal_text_token(self, token: int) -> bool:
        """Whether the (non-stop) ``token`` is legal now, exactly as the mask says.  Does not change state.

        ``validate_tokens`` accepts any tokenisation of the text; where the
        grammar forces bytes, llguidance's mask allows only the canonical
        token for them, so there the mask decides (the contract: a mask bit
        is set exactly when accept takes the token).
        """
        if self._matcher.validate_tokens([token]) != 1:
            return False
        if not self._matcher.compute_ff_bytes():
            return True
        if self._scratch is None:
            self._scratch = allocate_bitmask(1, self.vocab_size)
        self.fill_mask(self._scratch, 0)
        return bool((int(self._scratch[0, token // 32]) >> (token % 32)) & 1)

    def validate(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` are legal in sequence.  Does not change state.

        llguidance's ``validate_tokens`` gives an upper bound in one call (it
        ignores the forced-bytes rule of :meth:`_legal_text_token`); the
        tokens up to it are then checked one by one on llguidance's own
        history and rolled back, which leaves the rollback window untouched.
        """
        if self._terminated:
            return 0
        text: list[int] = []  # the tokens before the first stop token or id out of range
        stop_next = False
        for token in tokens:
            token = operator.index(token)
            if not 0 <= token < self.vocab_size:
                break
            if token in self._stops:
                stop_next = True  # nothing is legal after a stop token
                break
            text.append(token)
        bound = self._matcher.validate_tokens(text) if text else 0
        n = 0
        try:
            for token in text[:bound]:
                if not self._legal_text_token(token):
                    break
                if not self._matcher.consume_token(token):
                    raise GrammarError(f"llguidance failed on a validated token: {self._matcher.get_error()}")
                n += 1
            # a stop token is legal when the grammar is complete (llguidance's own count of a stop
            # token depends on whether the grammar can still be extended)
            complete = stop_next and n == len(text) and self._matcher.is_accepting()
        finally:
            if n:
                self._matcher.rollback(n)
        return n + int(complete)

    def fill_mask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        """Write the legal next tokens into ``bitmask[row]``.  Does not change state.

        Uses llguidance's numpy fill on a zero-copy view of the tensor
        (``llguidance.torch`` would import ``torch.compile`` machinery, ~5 s).
        """
        from llguidance.numpy import fill_next_token_bitmask

        self._check_open()
        mask_row = check_bitmask(bitmask, row, self.vocab_size)
        fill_next_token_bitmask(self._matcher, bitmask.numpy(), row)
        clear_padding(mask_row, self.vocab_size)
        if self._matcher.is_error():  # llguidance's mask then allows only EOS, which accept() refuses
            raise GrammarError(
                f"llguidance stopped with an error ({_first_line(self._matcher.get_error())}); "
                "try grammar_backend='xgrammar', or simplify the grammar"
            )

    def forced_text(self) -> str:
        """The bytes the grammar forces next (``compute_ff_bytes``), whole characters only.  Does not change state.

        The same text the other backends give (the contract pins it); see
        :meth:`forced_tokens` for llguidance's canonical forced tokens.
        """
        if self._terminated:
            return ""
        return _whole_characters(self._matcher.compute_ff_bytes())

    def forced_tokens(self) -> list[int]:
        """llguidance's fast-forward tokens (``compute_ff_tokens``).  Does not change state.

        Canonical: llguidance holds back a last token that could merge with
        what follows, so these can be committed without a verify pass.
        """
        if self._terminated:
            return []
        return list(self._matcher.compute_ff_tokens())

    def fork(self) -> LLGuidanceMatcher:
        """An independent copy in the current state, with the same rollback window."""
        return LLGuidanceMatcher(self._matcher.deep_copy(), self._compiled, self._window.copy(), self._terminated)


def _whole_characters(data: bytes) -> str:
    """``data`` as text, cut before the first byte that does not complete a character."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        return data[: e.start].decode("utf-8")


#: llguidance cannot hand a compiled grammar to another process: it compiles in-process under its own
#: ``LLParserLimits`` (see :mod:`grammars.deadline`).
serialize = None
deserialize = None
