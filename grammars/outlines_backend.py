"""The outlines-core backend.

A JSON Schema becomes a regex (``outlines_core.json_schema.build_regex_from_schema``;
compact JSON by default, flexible whitespace on request), the regex an
``Index`` over the tokenizer's vocabulary, and each request a ``Guide``.
EBNF grammars are not supported (use xgrammar).

The vocabulary is built as outlines does from a Hugging Face tokenizer: every
token id maps to the bytes it stands for -- GPT-2 style byte-level tokens are
mapped back through the byte-to-unicode table, SentencePiece byte-fallback
pieces ``<0xNN>`` become that byte and ``▁`` becomes a space.  Special tokens
(``<|im_start|>`` and friends) are left out, so they are never legal inside
the output; stop tokens are handled by the adapter.

Quirks absorbed here:

* outlines-core cannot advance on EOS.  ``accept(stop)`` in a final state
  marks the matcher terminated without touching the guide; rolling back over
  it un-terminates.  Stop tokens other than the vocabulary's single EOS id
  get their mask bits from the adapter.
* ``Guide.advance`` raises on an illegal token; the adapter returns ``False``
  (the guide's state is unchanged).
* ``Guide`` has no copy: :meth:`OutlinesMatcher.fork` replays the accepted
  tokens on a fresh guide (about half a microsecond per token).
* A string with ``minLength``/``maxLength`` *and* a ``pattern`` (or a format
  outlines-core knows) becomes "any string of that length" in outlines-core:
  the pattern is dropped.  :func:`shape_over_length` drops the length instead,
  as xgrammar does, so that both backends keep the stronger constraint.
  ``Completion.valid`` still checks the length.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import torch

from ._bitmask import check_bitmask, clear_padding
from ._window import RollbackWindow, StopMarkingMatcher
from .base import CompiledGrammar, GrammarError
from .features import Capabilities
from .spec import GrammarSpec, schema_nodes

if TYPE_CHECKING:
    import outlines_core

__all__ = [
    "name",
    "aliases",
    "capabilities",
    "OutlinesCompiled",
    "OutlinesMatcher",
    "OutlinesVocabulary",
    "prepare",
    "compile_spec",
    "token_bytes",
    "serialize",
    "deserialize",
    "prepared_nbytes",
    "shape_over_length",
    "length_yields_to_shape",
    "FORMATS",
]

#: What ``backend=`` calls this backend, and other spellings it accepts.
name = "outlines"
aliases: tuple[str, ...] = ("outlines-core", "outlines_core")
#: Whitespace allowed between JSON tokens with ``any_whitespace=True``.
FLEXIBLE_WHITESPACE = r"[\n\t\r ]*"
#: :meth:`OutlinesMatcher.forced_text` stops looking at states with more legal tokens, or deeper.
_FORCED_SCAN_LIMIT = 4096
_FORCED_MAX_STATES = 64
#: ``format`` values outlines-core turns into a regex (0.2.14).
FORMATS = frozenset({"date", "time", "date-time", "email", "uri", "uuid"})
_LENGTH_KEYWORDS = ("minLength", "maxLength")

#: What outlines-core compiles and enforces (see :mod:`grammars.capabilities`).  multipleOf on a number: 0.3 and 1.5
#: are both rejected for multipleOf 0.5 (stricter than the schema).
capabilities = Capabilities.declare(
    kinds="json_schema any_json regex",
    enforced="multipleOf:number allOf anyOf+siblings unevaluatedProperties unevaluatedItems",
    ignored="minimum maximum exclusiveMinimum exclusiveMaximum multipleOf minProperties maxProperties propertyNames "
    "maxLength+pattern minLength+pattern oneOf:overlap $ref+siblings enum+siblings uniqueItems contains not if "
    "then else dependentRequired dependentSchemas dependencies patternProperties minContains maxContains",
    refused="pattern:lookaround allOf:multi $dynamicRef $dynamicAnchor",
    formats=" ".join(sorted(FORMATS)),
    other_formats="refused",
    auto_rank=3,  # enforces least, and compiles slowly
)


@dataclass(frozen=True)
class OutlinesVocabulary:
    """The tokenizer-level state: an outlines-core ``Vocabulary`` and each id's bytes."""

    vocabulary: outlines_core.Vocabulary
    #: ``token_bytes[id]``: what the token stands for; ``None`` when it is never legal text.
    token_bytes: tuple[bytes | None, ...]
    vocab_size: int
    stop_token_ids: tuple[int, ...]


#: Estimated bytes of the tokenizer-level state per vocabulary entry (6.9 MB measured for SmolLM2's 49,152).
_PREPARED_BYTES_PER_TOKEN = 144
#: An index's resident memory over its serialised size (2 to 3.8 measured on the corpus sample).
_INDEX_BYTES_PER_SERIALISED_BYTE = 3


def prepared_nbytes(prepared: OutlinesVocabulary) -> int:
    """Estimated resident bytes of the tokenizer-level state.  Pure."""
    return prepared.vocab_size * _PREPARED_BYTES_PER_TOKEN


def prepare(tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]) -> OutlinesVocabulary:
    """Build the outlines-core vocabulary of ``tokenizer`` for a logits width and stop tokens.

    The first stop token is the vocabulary's EOS; every stop token is left
    out of the text vocabulary.
    """
    from outlines_core import Vocabulary

    stops = tuple(int(t) for t in stop_token_ids)
    pieces = token_bytes(tokenizer, vocab_size)
    by_text: dict[bytes, list[int]] = {}
    for token_id, text in enumerate(pieces):
        if text and token_id not in stops:
            by_text.setdefault(text, []).append(token_id)
    try:
        vocabulary = Vocabulary(stops[0], by_text)
    except Exception as e:
        raise GrammarError(
            f"outlines-core could not build a vocabulary from the tokenizer ({e}); pass a Hugging Face tokenizer"
        ) from None
    return OutlinesVocabulary(vocabulary, tuple(pieces), vocab_size, stops)


def token_bytes(tokenizer: Any, vocab_size: int) -> list[bytes | None]:
    """The bytes each token id ``< vocab_size`` stands for (``None``: special or unused id).

    Pure function of the tokenizer.  Decoding follows the tokenizer's decoder
    (byte-level, byte-fallback/metaspace or raw), as outlines and xgrammar do.
    """
    vocab: dict[str, int] = tokenizer.get_vocab()
    style = _decoding_style(tokenizer, vocab)
    added = {token.content for token in getattr(tokenizer, "added_tokens_decoder", {}).values()}
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    special |= {i for i, token in getattr(tokenizer, "added_tokens_decoder", {}).items() if token.special}
    unicode_to_byte = _unicode_to_byte()
    pieces: list[bytes | None] = [None] * vocab_size
    for token, token_id in vocab.items():
        if token_id >= vocab_size or token_id in special:
            continue
        if token in added:  # added tokens are stored as plain text
            pieces[token_id] = token.encode()
        elif style == "byte_level" and all(c in unicode_to_byte for c in token):
            pieces[token_id] = bytes(unicode_to_byte[c] for c in token)
        elif style == "byte_fallback" and _BYTE_PIECE.match(token):
            pieces[token_id] = bytes([int(token[3:5], 16)])
        elif style == "byte_fallback":
            pieces[token_id] = token.replace("\u2581", " ").encode()
        else:
            pieces[token_id] = token.encode()
    return pieces


_BYTE_PIECE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


def _decoding_style(tokenizer: Any, vocab: dict[str, int]) -> str:
    """``"byte_level"``, ``"byte_fallback"`` or ``"raw"``, from the decoder, else from the vocabulary."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder_types: set[str] = set()
    if backend is not None:
        decoder = json.loads(backend.to_str()).get("decoder") or {}
        stack = [decoder]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                decoder_types.add(str(node.get("type")))
                stack.extend(node.get("decoders") or [])
    if "ByteLevel" in decoder_types:
        return "byte_level"
    if decoder_types & {"ByteFallback", "Metaspace"}:
        return "byte_fallback"
    if decoder_types - {"None"}:
        return "raw"
    # No decoder (e.g. a tokenizer rebuilt from a SentencePiece file): look at the vocabulary itself.
    if sum(f"<0x{b:02X}>" in vocab for b in range(256)) >= 128:
        return "byte_fallback"
    byte_chars = _unicode_to_byte()
    if sum(c in vocab for c in byte_chars) >= 128 and sum(
        all(c in byte_chars for c in token) for token in vocab
    ) >= 0.99 * len(vocab):
        return "byte_level"
    return "raw"


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted (printable stand-in character -> byte)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return {char: b for b, char in table.items()}


def compile_spec(
    vocab: OutlinesVocabulary, spec: GrammarSpec, vocab_size: int, stop_token_ids: Sequence[int]
) -> OutlinesCompiled:
    """Compile ``spec`` over ``vocab``; raises :class:`GrammarError` when outlines-core cannot."""
    from outlines_core import Index
    from outlines_core.json_schema import build_regex_from_schema

    if spec.kind == "ebnf":
        raise GrammarError("outlines-core does not support EBNF grammars; express the grammar as a regex (regex=...).")
    if spec.is_json:
        whitespace = FLEXIBLE_WHITESPACE if spec.any_whitespace else ""
        try:
            regex = build_regex_from_schema(shape_over_length(spec), whitespace_pattern=whitespace)
        except Exception as e:
            from .keywords import unsatisfiable

            why_not = unsatisfiable(spec.schema)
            if why_not is not None:  # no backend can help
                raise GrammarError(
                    f"outlines-core cannot convert the JSON schema: {_first_line(e)}. The schema accepts no value "
                    f"({why_not}); fix the schema."
                ) from None
            raise GrammarError(
                f"outlines-core cannot convert the JSON schema: {_first_line(e)}. Simplify or remove that part "
                "of the schema."
            ) from None
    else:
        regex = spec.source
    try:
        index = Index(regex, vocab.vocabulary)
    except Exception as e:
        what = "the regex" if spec.kind == "regex" else "the regex built from the JSON schema"
        raise GrammarError(
            f"outlines-core cannot compile {what}: {_first_line(e)}. Simplify that part of the grammar."
        ) from None
    return OutlinesCompiled(index, vocab)


def serialize(compiled: OutlinesCompiled) -> bytes:
    """The index as bytes (outlines-core's own binary form, through pickle), for a worker process.  Pure."""
    return pickle.dumps(compiled.index, protocol=pickle.HIGHEST_PROTOCOL)


def deserialize(
    prepared: OutlinesVocabulary, data: bytes, vocab_size: int, stop_token_ids: Sequence[int]
) -> OutlinesCompiled:
    """The grammar :func:`serialize` wrote, over this process's vocabulary."""
    return OutlinesCompiled(pickle.loads(data), prepared, serialised_size=len(data))


def shape_over_length(spec: GrammarSpec) -> str:
    """The schema text for outlines-core, with length bounds dropped where a shape is given.

    outlines-core turns a string schema with ``minLength``/``maxLength`` into
    a length-bounded string and ignores its ``pattern`` or ``format``; a
    pattern says far more about a valid value than its length, so the length
    bounds are dropped there instead (xgrammar makes the same choice).  Only
    schema objects are edited: ``enum``/``const`` values and property names
    that happen to be called ``pattern`` are left alone.  Pure.

    >>> spec = GrammarSpec("json_schema", '{"type": "string", "pattern": "^a+$", "maxLength": 3}')
    >>> shape_over_length(spec)
    '{"type": "string", "pattern": "^a+$"}'
    """
    schema = copy.deepcopy(spec.schema)
    edited = False
    for node in schema_nodes(schema):
        if length_yields_to_shape(node) and any(k in node for k in _LENGTH_KEYWORDS):
            for keyword in _LENGTH_KEYWORDS:
                node.pop(keyword, None)
            edited = True
    return json.dumps(schema) if edited else spec.source


def length_yields_to_shape(node: dict[str, Any]) -> bool:
    """Whether :func:`shape_over_length` drops ``node``'s length bounds: it has a pattern or a known format."""
    return isinstance(node.get("pattern"), str) or node.get("format") in FORMATS


def _first_line(error: BaseException) -> str:
    text = " ".join(str(error).split("\n")[:2]).strip()
    return text[:500] or type(error).__name__


class OutlinesCompiled(CompiledGrammar):
    """An outlines-core ``Index`` with its vocabulary.  Immutable."""

    backend = name

    def __init__(
        self, index: outlines_core.Index, vocab: OutlinesVocabulary, serialised_size: int | None = None
    ) -> None:
        super().__init__(vocab.vocab_size, vocab.stop_token_ids)
        self.index = index
        self.vocab = vocab
        self._serialised_size = serialised_size

    @property
    def nbytes(self) -> int:
        """Estimated resident bytes of the index (from its serialised size, measured once).  Does not change state."""
        if self._serialised_size is None:
            self._serialised_size = len(serialize(self))
        return self._serialised_size * _INDEX_BYTES_PER_SERIALISED_BYTE + 4096

    def matcher(self, max_rollback: int = 64) -> OutlinesMatcher:
        window = RollbackWindow(max_rollback)  # checks max_rollback
        return OutlinesMatcher(self, window)


class OutlinesMatcher(StopMarkingMatcher):
    """Per-request state over an outlines-core ``Guide``."""

    backend = name

    def __init__(self, compiled: OutlinesCompiled, window: RollbackWindow, history: Sequence[int] = ()) -> None:
        from outlines_core import Guide

        super().__init__(compiled, window)
        self._compiled = compiled
        # The guide keeps twice the window, so that validate() can restore the window afterwards
        # (see WindowedMatcher); it is never rolled back further than the window allows.
        self._guide = Guide(compiled.index, max_rollback=2 * window.max_rollback + 1)
        self._history: list[int] = []  # every accepted token, for fork()
        for token in history:
            if token in self._stops:
                self._terminated = True
            else:
                self._guide.advance(token, return_tokens=False)
            self._history.append(token)

    def _can_stop(self) -> bool:
        return bool(self._guide.is_finished())

    def _advance(self, token: int) -> bool:
        try:
            self._guide.advance(token, return_tokens=False)
        except ValueError:  # no transition: the guide's state is unchanged
            return False
        return True

    def _accepted(self, token: int) -> None:
        self._history.append(token)

    def _undo(self, tokens: int, in_backend: int) -> None:
        del self._history[-tokens:]
        if in_backend:
            self._guide.rollback_state(in_backend)

    def _restart(self) -> None:
        self._guide.reset()
        self._history.clear()

    def fill_mask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        """Write the legal next tokens into ``bitmask[row]``.  Does not change state."""
        self._check_open()
        mask_row = check_bitmask(bitmask, row, self.vocab_size)
        self._guide.write_mask_into(mask_row.data_ptr(), mask_row.numel(), mask_row.element_size())
        if self._guide.is_finished():  # the guide sets the EOS bit only; add the other stop tokens
            for token in self.stop_token_ids[1:]:
                word, bit = divmod(token, 32)
                mask_row[word] |= (1 << bit) - (1 << 32 if bit == 31 else 0)
        clear_padding(mask_row, self.vocab_size)

    def forced_text(self) -> str:
        """Text every legal continuation starts with ("" if none).  Does not change state.

        Computed on the index (see :func:`_forced_bytes`); best effort, never
        wrong, and only whole UTF-8 characters.
        """
        if self._terminated:
            return ""
        state = self._guide.get_state()
        return _whole_characters(_forced_bytes(self._compiled.index, self._compiled.vocab.token_bytes, state))

    def fork(self) -> OutlinesMatcher:
        """An independent copy in the current state, with the same rollback window."""
        return OutlinesMatcher(self._compiled, self._window.copy(), self._history)


def _forced_bytes(index: Any, pieces: Sequence[bytes | None], start: int) -> bytes:
    """Bytes that every legal continuation from state ``start`` begins with.

    forced(s) = "" if s is final (a stop token may come next), else the
    longest common prefix over legal tokens t of ``bytes(t) + forced(next(s, t))``.
    Shortcut: if two legal tokens differ right after the common prefix P of
    their bytes, forced(s) is exactly P.  Best effort, never wrong: states
    with more than ``_FORCED_SCAN_LIMIT`` legal tokens, states on a cycle and
    states beyond a budget of ``_FORCED_MAX_STATES`` count as forcing nothing,
    which can only shorten the answer.

    Example (toy vocabulary with ``{``, ``{"``, ``"``, ``"a``, ``"a"``, ``":``, ...;
    a schema whose first required key is ``a``): from the start the branches
    are ``{"`` + forced(...) and ``{`` + forced(...); both continue with
    ``"a":``, so the result is ``{"a":`` and more.
    """
    memo: dict[int, bytes] = {}
    budget = [_FORCED_MAX_STATES]

    def forced(state: int | None) -> bytes:
        if state is None or index.is_final_state(state):
            return b""
        if state in memo:
            return memo[state]
        memo[state] = b""  # on a cycle, or out of budget: nothing certain
        if budget[0] <= 0:
            return b""
        budget[0] -= 1
        allowed = index.get_allowed_tokens(state)
        if not allowed or len(allowed) > _FORCED_SCAN_LIMIT:
            return b""
        texts = [pieces[t] or b"" for t in allowed]
        prefix = os.path.commonprefix(texts) or b""
        longer = [text for text in texts if len(text) > len(prefix)]
        if len(longer) > 1 and len(os.path.commonprefix(longer)) == len(prefix):
            result = prefix  # two legal tokens differ right after the prefix
        else:
            result = (
                os.path.commonprefix([text + forced(index.get_next_state(state, t)) for t, text in zip(allowed, texts)])
                or b""
            )
        memo[state] = result
        return result

    return forced(start)


def _whole_characters(data: bytes) -> str:
    """``data`` as text, cut before the first byte that does not complete a character.

    Forced bytes that start inside a character (the previous token split it)
    give "", and an incomplete trailing character is dropped.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        return data[: e.start].decode("utf-8")
