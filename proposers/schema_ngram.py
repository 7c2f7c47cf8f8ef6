"""The schema-aware n-gram drafter: predictable JSON from the document, the prompt and the schema.

A JSON answer is full of text a cheap guesser can predict: keys, punctuation,
enum values, values copied from the prompt, the same keys in every array
item.  This proposer tracks where generation stands in the document (the
container stack, the key being filled, the schema node of the next value;
see :mod:`proposers.json_cursor`) and drafts from three sources:

* **history** -- what followed the same position earlier in this document
  (positions compare by path with array indices erased, so the second item of
  an array copies the first: after ``},{"`` comes the same key as before);
* **prompt** -- spans of the prompt that fit the current value: once a string
  value has started, the prompt text that continues what was typed, up to a
  likely end and the closing quote; at a value's start, the text after the
  last copied span or after a label naming the key;
* **schema** -- the next declared property name, ``const``, ``enum``,
  ``default`` and ``examples`` values, and the structure the schema implies.

A draft is planned in rounds: pick the best legal candidate segment for the
current position, advance a copy of the cursor over it, repeat until ``k``
tokens.  Candidates are ranked by how often their source's tokens were
accepted in this request (learned through :meth:`SchemaNgramProposer.feedback`)
and checked with the grammar (``GrammarView.validate``); the text becomes
tokens in the tokenizer's canonical split (:mod:`proposers.text`).

Text here is bytes of JSON text: string contents stay JSON-escaped, so the
prompt is searched in its escaped form (``json.dumps(prompt)[1:-1]``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .base import EMPTY_DRAFT, Draft, GrammarView, Request
from .json_cursor import (
    AFTER, COLON, DONE, ERROR, KEY, KEY_MODES, OBJ_FIRST, SCALAR, STRING, VALUE_MODES,
    Cursor, advance, normalize, signature, value_nodes, value_path,
)  # fmt: skip
from .schema_nav import SchemaIndex, escape_key
from .text import continuation_tokens, token_text

__all__ = [
    "SchemaNgramProposer",
    "escape_text",
    "span_end",
    "find_typed",
    "number_spans",
    "label_variants",
    "skip_separators",
]

#: How far (bytes) a copied span may run before it is cut at a word boundary.
MAX_SPAN = 160
#: Source priors: the token-acceptance rate assumed before any feedback.
SOURCE_PRIORS = {
    "history": 0.8,  # keys and punctuation seen at the same path
    "schema": 0.8,  # next declared key, const, unique enum completion, forced structure
    "prompt": 0.7,  # continuation of a value already typed, found in the prompt
    "prompt_guess": 0.4,  # a value's start guessed from the prompt
    "history_value": 0.35,  # the value found at the same path earlier
    "schema_guess": 0.3,  # an enum/default/example value or a literal, guessed
}
_PRIOR_WEIGHT = 8.0  # pseudo-tokens behind each prior
_MAX_ROUNDS = 12
_STRONG_END = re.compile(rb"\\[nrt\"]|[,;:.!?)\]](?= |\\[nrt]|$)| [(@=|/]| [-\xe2]")
_NUMBER = re.compile(rb"(?<![\w.\-])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.\-])-?\d+(?:\.\d+)?(?![\w])")
_SEPARATORS = frozenset(b" ,;:.-@$=()|*#>+~")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


# ---------------------------------------------------------------------------
# Pure helpers over escaped prompt text
# ---------------------------------------------------------------------------


def escape_text(text: str) -> bytes:
    """``text`` as it appears inside a JSON string (escaped, UTF-8).

    ``escape_text('a "b"\\nc') == b'a \\\\"b\\\\"\\\\nc'`` (``\\n`` becomes backslash-n).
    """
    return json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8")


def span_end(text: bytes, start: int, limit: int = MAX_SPAN) -> tuple[int, bool]:
    """Where a value copied from ``text`` at ``start`` most likely ends.

    Returns ``(end, closed)``: ``closed`` is ``True`` when ``end`` is a natural
    end -- before an escaped newline, tab or quote, before ``, ; : . ! ? ) ]``
    followed by a space or a line end, or before `` (``, `` @``, `` =``,
    `` |``, `` /``, `` -``/`` –``.  Otherwise the span is cut at the last word
    boundary within ``limit`` bytes and ``closed`` is ``False``.

    Worked example (escaped text)::

        b'Inkwell Print Co., 88 Quarry Lane\\\\nBest'   start 0
        -> (17, True): 'Inkwell Print Co.' ends before ', '
        b'Tri-fold menus, 11x17: 250'   start 16
        -> (21, True): '11x17' ends before ': '
    """
    m = _STRONG_END.search(text, start, min(len(text), start + limit + 2))
    if m is not None and m.start() - start <= limit:
        return m.start(), True
    stop = min(len(text), start + limit)
    if stop == len(text):
        return stop, True
    cut = text.rfind(b" ", start, stop)
    return (cut if cut > start else stop), False


def find_typed(text: bytes, typed: bytes, after: int) -> int:
    """Where a value whose first bytes are ``typed`` most likely sits in ``text``.

    The first occurrence at or after ``after`` (values are copied in reading
    order), else the last one before it; ``-1`` if none.

    Worked example::

        find_typed(b'a Bob, then Bo Diddley', b'Bo', 3)  -> 12
        find_typed(b'a Bob, then Bo Diddley', b'Bob', 3) -> 2
    """
    if not typed:
        return -1
    pos = text.find(typed, after)
    if pos >= 0:
        return pos
    return text.rfind(typed, 0, after + len(typed) - 1 if after else len(text))


def number_spans(text: bytes) -> list[tuple[int, int, bytes]]:
    """Numbers in ``text`` as ``(start, end, json_text)``; thousands separators dropped.

    Worked example::

        number_spans(b'Total: $1,200.50 on 2024-09-03, qty 3')
        -> [(8, 16, b'1200.50'), (20, 24, b'2024'), (36, 37, b'3')]

    (the ``-09`` of a date is not read as a negative number).
    """
    return [(m.start(), m.end(), m.group().replace(b",", b"")) for m in _NUMBER.finditer(text)]


def label_variants(key: str) -> list[bytes]:
    """Lower-case ways a document may name the field ``key``.

    ``label_variants('due_date') == [b'due date', b'due_date']``;
    ``label_variants('firstName') == [b'first name', b'firstname']``.
    """
    spaced = _CAMEL.sub(" ", key).replace("_", " ").replace("-", " ").strip().lower()
    out = [spaced.encode("utf-8")]
    if key.lower() != spaced:
        out.append(key.lower().encode("utf-8"))
    return [v for v in out if len(v) >= 3]


def skip_separators(text: bytes, pos: int, limit: int = 24) -> int:
    """Skip spaces, escaped line breaks and list/label punctuation from ``pos``.

    ``skip_separators(b': 250 @ $1.20', 0) == 2``;
    ``skip_separators(b'\\\\n- Business', 0) == 4``.
    """
    end = min(len(text), pos + limit)
    while pos < end:
        if text[pos] in _SEPARATORS:
            pos += 1
        elif text[pos] == 0x5C and pos + 1 < len(text) and text[pos + 1] in b"nrt":
            pos += 2
        else:
            break
    return pos


# ---------------------------------------------------------------------------
# The document generated so far
# ---------------------------------------------------------------------------


class _Document:
    """The generated JSON text with a cursor per token and a record of what happened where.

    ``points``: decision-point signature -> offsets where it occurred.
    ``prompt_cursor``: escaped-prompt offset after the latest value found in
    the prompt (values are copied in reading order).  Truncation by tokens
    undoes everything recorded after the cut.
    """

    def __init__(self, schema: SchemaIndex, prompt: bytes, numbers: list[tuple[int, int, bytes]]) -> None:
        self.schema = schema
        self.prompt = prompt
        self.numbers = numbers
        self.text = bytearray()
        self.tokens: list[int] = []
        self.cursors: list[Cursor] = [Cursor()]
        self.points: dict[tuple, list[int]] = {}
        self._log: list[tuple[int, tuple]] = []  # (offset, signature) in order
        self._copies: list[tuple[int, int]] = [(0, 0)]  # (doc offset, prompt cursor)

    @property
    def cursor(self) -> Cursor:
        return self.cursors[-1]

    @property
    def prompt_cursor(self) -> int:
        return self._copies[-1][1]

    def sync(self, generated: Sequence[int], token_bytes: list[bytes], skip: frozenset[int]) -> None:
        """Make the document hold exactly ``generated`` (rolls back and feeds as needed)."""
        have = len(self.tokens)
        same = 0
        if list(generated[:have]) == self.tokens:
            same = have
        else:
            limit = min(have, len(generated))
            while same < limit and self.tokens[same] == generated[same]:
                same += 1
        if same < have:
            self._truncate(same)
        for token in generated[same:]:
            token = int(token)
            data = b"" if token in skip or not 0 <= token < len(token_bytes) else token_bytes[token]
            start = len(self.text)
            self.text += data
            self.cursors.append(advance(self.cursor, data, self.schema, self._event) if data else self.cursor)
            self.tokens.append(token)
            assert self.cursor.offset == start + len(data) or self.cursor.mode == ERROR

    def _truncate(self, n_tokens: int) -> None:
        del self.tokens[n_tokens:]
        del self.cursors[n_tokens + 1 :]
        offset = self.cursor.offset if self.cursor.mode != ERROR else self._error_offset(n_tokens)
        del self.text[offset:]
        while self._log and self._log[-1][0] > offset:
            _, sig = self._log.pop()
            self.points[sig].pop()
        while len(self._copies) > 1 and self._copies[-1][0] > offset:
            self._copies.pop()

    def _error_offset(self, n_tokens: int) -> int:
        """Text length after ``n_tokens`` when the cursor stopped tracking (not JSON)."""
        for i in range(n_tokens, -1, -1):
            if self.cursors[i].mode != ERROR:
                return self.cursors[i].offset + 0
        return 0

    def _event(self, kind: str, cursor: Cursor, start: int = 0, end: int = 0) -> None:
        if kind == "point":
            sig = signature(cursor)
            if sig is not None:
                self.points.setdefault(sig, []).append(cursor.offset)
                self._log.append((cursor.offset, sig))
            return
        # A value ended: move the prompt cursor past it if it came from the prompt.
        value = bytes(self.text[start:end]) if end <= len(self.text) else b""
        found = self._find_in_prompt(value)
        if found >= 0:
            self._copies.append((end, found))

    def _find_in_prompt(self, value: bytes) -> int:
        """Escaped-prompt offset just after ``value`` (a string or number), or -1."""
        if len(value) >= 3 and value[:1] == b'"' and value[-1:] == b'"':
            content = value[1:-1]
            pos = find_typed(self.prompt, content, self.prompt_cursor)
            return pos + len(content) if pos >= 0 else -1
        if value[:1] in b"-0123456789" and value:
            after = [e for s, e, v in self.numbers if v == value and s >= self.prompt_cursor]
            if after:
                return after[0]
        return -1

    def earlier(self, sig: tuple, before: int) -> list[int]:
        """Offsets of ``sig`` before offset ``before``, most recent first."""
        return [o for o in reversed(self.points.get(sig, ())) if o < before]


# ---------------------------------------------------------------------------
# Candidates
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Candidate:
    source: str
    data: bytes  # JSON text to append
    weight: float = 1.0  # rank within the source (1 = best)
    prompt_end: int = -1  # prompt cursor after this candidate (-1: unchanged)
    closes_string: bool = False  # data = string content + '"' (may be cut at the grammar's limit)


def _anchor_signature(c: Cursor) -> tuple | None:
    """The signature of the decision point the current token started at."""
    if c.mode == KEY:
        return signature(c._replace(mode=OBJ_FIRST))
    if c.mode in (STRING, SCALAR):
        return signature(c._replace(mode=next(iter(VALUE_MODES))))
    return signature(c)


def _follow(c: Cursor, data: bytes, schema: SchemaIndex) -> int:
    """How much of ``data`` to copy from an earlier position: up to the next scalar value slot."""
    for i, b in enumerate(data):
        if i and c.mode in VALUE_MODES and b not in b"{[ ":
            return i
        c = advance(c, bytes((b,)), schema)
        if c.mode in (ERROR, DONE):
            return i + 1 if c.mode == DONE else i
    return len(data)


class SchemaNgramProposer:
    """Drafts JSON from this document's history, the prompt and the schema.

    ``max_candidates``: how many candidates per round are tried against the
    grammar.  Deterministic drafts (``probs=None``).
    """

    def __init__(self, *, name: str = "schema_ngram", max_candidates: int = 6) -> None:
        self.name = name
        self.max_candidates = max_candidates
        self.stats: dict[str, list[float]] = {}
        self._tokenizer = None
        self._doc: _Document | None = None
        self._prompt_len = 0
        self._last: tuple[tuple[int, ...], tuple[str, ...]] = ((), ())

    # -- protocol -------------------------------------------------------------

    def start(self, request: Request) -> None:
        """Reset for a new generation: read the prompt and index the schema."""
        helper = token_text(request.tokenizer)
        self._tokenizer = request.tokenizer
        self._helper = helper
        prompt = helper.bytes_of(request.prompt_ids).decode("utf-8", errors="replace")
        escaped = escape_text(prompt)
        self._prompt_lower = escaped.lower()
        self._doc = _Document(SchemaIndex(request.schema), escaped, number_spans(escaped))
        self._prompt_len = len(request.prompt_ids)
        self.stats = {source: [0.0, 0.0] for source in SOURCE_PRIORS}
        self._last = ((), ())

    def propose(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft:
        """Up to ``k`` tokens of predicted JSON.  Does not change the grammar state."""
        doc = self._doc
        if doc is None or k <= 0 or len(context) < self._prompt_len:
            return EMPTY_DRAFT
        doc.sync(context[self._prompt_len :], self._helper.vocab_bytes, self._helper.special_ids)
        if doc.cursor.mode in (DONE, ERROR):
            return EMPTY_DRAFT
        tokens, sources = self._plan(context, grammar, k)
        if not tokens:
            return EMPTY_DRAFT
        self._last = (tuple(tokens), tuple(sources))
        return Draft(tokens=tuple(tokens), sources=(self.name,) * len(tokens))

    def feedback(self, draft: Draft, num_accepted: int) -> None:
        """Credit each source with its proposed and accepted tokens."""
        tokens, sources = self._last
        if not draft.tokens or tokens[: len(draft.tokens)] != draft.tokens:
            return
        for i, source in enumerate(sources[: len(draft.tokens)]):
            entry = self.stats.setdefault(source, [0.0, 0.0])
            entry[0] += 1
            entry[1] += i < num_accepted
        self._last = ((), ())

    def score(self, source: str) -> float:
        """Expected acceptance of ``source``'s tokens (prior + this request's feedback)."""
        proposed, accepted = self.stats.get(source, (0.0, 0.0))
        prior = SOURCE_PRIORS.get(source, 0.3)
        return (prior * _PRIOR_WEIGHT + accepted) / (_PRIOR_WEIGHT + proposed)

    # -- planning -------------------------------------------------------------

    def _plan(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> tuple[list[int], list[str]]:
        """Choose segments round by round; returns the tokens and each token's source."""
        doc = self._doc
        assert doc is not None
        cursor, text, segments = doc.cursor, b"", []  # segments: (source, end byte in text)
        prompt_cursor = doc.prompt_cursor
        tokens: list[int] = []
        for _ in range(_MAX_ROUNDS):
            ranked = sorted(
                self._candidates(cursor, text, prompt_cursor),
                key=lambda cand: -self.score(cand.source) * cand.weight,
            )[: self.max_candidates]
            chosen, partial = None, None
            for cand in ranked:
                found = self._check(context, grammar, k, text, cand, len(tokens))
                if found is None:
                    continue
                cand, cand_tokens, complete = found
                if complete:
                    chosen = (cand, cand_tokens)
                    break
                if partial is None or len(cand_tokens) > len(partial[1]):
                    partial = (cand, cand_tokens)
            if chosen is None and partial is None:
                break
            cand, tokens = chosen if chosen is not None else partial  # type: ignore[misc]
            text += cand.data
            segments.append((cand.source, len(text)))
            if cand.prompt_end >= 0:
                prompt_cursor = cand.prompt_end
            if chosen is None or len(tokens) >= k:
                break
            cursor = advance(cursor, cand.data, doc.schema)
            if cursor.mode in (DONE, ERROR):
                break
        tokens = tokens[:k]
        return tokens, self._token_sources(tokens, segments)

    def _check(
        self, context: Sequence[int], grammar: GrammarView | None, k: int, text: bytes, cand: _Candidate, have: int
    ) -> tuple[_Candidate, list[int], bool] | None:
        """Tokenise ``text + cand``; ``(cand, legal tokens, whether all were legal)`` or ``None``."""
        tokens = self._tokens(context, text + cand.data)
        if not tokens:
            return None
        limit = min(len(tokens), k)
        legal = grammar.validate(tokens[:limit]) if grammar is not None else limit
        if legal == limit:
            return cand, tokens[:limit], True
        if cand.closes_string and legal > have:
            # The grammar ended the string earlier (pattern, format, maxLength):
            # close it where the legal part ends.
            legal_bytes = len(self._helper.bytes_of(tokens[:legal])) - len(text)
            content = len(cand.data) - 1
            for cut in (legal_bytes, legal_bytes - 1):
                if 0 < cut < content:
                    shorter = _Candidate(cand.source, cand.data[:cut] + b'"', cand.weight, -1, True)
                    retry = self._tokens(context, text + shorter.data)
                    n = min(len(retry), k)
                    if retry and grammar is not None and grammar.validate(retry[:n]) == n:
                        return shorter, retry[:n], True
        if legal > have:
            return cand, tokens[:legal], False
        return None

    def _tokens(self, context: Sequence[int], data: bytes) -> list[int]:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return []
        return continuation_tokens(self._tokenizer, context, text)

    def _token_sources(self, tokens: list[int], segments: list[tuple[str, int]]) -> list[str]:
        """The source of each token: the segment holding its first byte."""
        out, pos, seg = [], 0, 0
        table = self._helper.vocab_bytes
        for token in tokens:
            while seg < len(segments) - 1 and pos >= segments[seg][1]:
                seg += 1
            out.append(segments[seg][0] if segments else self.name)
            pos += len(table[token]) if 0 <= token < len(table) else 0
        return out

    # -- candidate segments ------------------------------------------------------

    def _candidates(self, c: Cursor, planned: bytes, prompt_cursor: int) -> list[_Candidate]:
        doc = self._doc
        assert doc is not None
        out = self._from_history(c, planned)
        if c.mode in KEY_MODES or c.mode == KEY:
            out += self._keys(c)
        elif c.mode == COLON:
            out.append(_Candidate("schema", b":"))
        elif c.mode == AFTER:
            out += self._separators(c)
        elif c.mode in VALUE_MODES or c.mode in (STRING, SCALAR):
            out += self._values(c, prompt_cursor)
        # One candidate per distinct text, best rank first.
        seen: dict[bytes, _Candidate] = {}
        for cand in out:
            if cand.data and cand.data not in seen:
                seen[cand.data] = cand
        return list(seen.values())

    def _from_history(self, c: Cursor, planned: bytes) -> list[_Candidate]:
        """What followed the same decision point earlier in the document."""
        doc = self._doc
        assert doc is not None
        sig = _anchor_signature(c)
        if sig is None:
            return []
        full = bytes(doc.text) + planned
        typed = full[c.anchor : c.offset]
        out: list[_Candidate] = []
        for offset in doc.earlier(sig, c.anchor):
            if doc.text[offset : offset + len(typed)] != typed:
                continue
            rest = bytes(doc.text[offset + len(typed) : offset + len(typed) + MAX_SPAN])
            n = _follow(c, rest, doc.schema)
            if n == 0:
                continue
            in_value = c.mode in (STRING, SCALAR) or (c.mode in VALUE_MODES and rest[:1] not in (b"{", b"["))
            out.append(_Candidate("history_value" if in_value else "history", rest[:n], 1.0 - 0.1 * len(out)))
            if len(out) == 2:
                break
        return out

    def _keys(self, c: Cursor) -> list[_Candidate]:
        """The next declared property names (and '}' when nothing is required)."""
        doc = self._doc
        assert doc is not None
        top = c.stack[-1]
        names = doc.schema.property_names(top.nodes)
        if not names:
            return []
        last = max((names.index(k) for k in top.keys if k in names), default=-1)
        remaining = [n for n in names[last + 1 :] if n not in top.keys]
        typed = c.tok if c.mode == KEY else None
        required = doc.schema.required(top.nodes)
        out = []
        for i, name in enumerate(remaining):
            if typed is not None and not name.startswith(typed):
                continue
            data = (b"" if typed is not None else b'"') + name[len(typed or b"") :] + b'":'
            out.append(_Candidate("schema", data, 1.0 if i == 0 else 0.5 / i))
            if name in required:
                break  # a required key cannot be skipped: later ones cannot come first
        if c.mode == OBJ_FIRST and not required & set(names):
            out.append(_Candidate("schema_guess", b"}", 0.5))
        return out

    def _separators(self, c: Cursor) -> list[_Candidate]:
        """',' or the closing bracket after a value."""
        doc = self._doc
        assert doc is not None
        top = c.stack[-1]
        schema = doc.schema
        if top.kind == 0x7B:
            names = schema.property_names(top.nodes)
            if not names:
                return [_Candidate("schema_guess", b",", 0.6), _Candidate("schema_guess", b"}", 0.5)]
            last = max((names.index(k) for k in top.keys if k in names), default=-1)
            remaining = [n for n in names[last + 1 :] if n not in top.keys]
            if not remaining:
                return [_Candidate("schema", b"}")]
            if set(remaining) & schema.required(top.nodes):
                return [_Candidate("schema", b",")]
            return [_Candidate("schema_guess", b"}", 0.6), _Candidate("schema_guess", b",", 0.5)]
        low, high = schema.array_bounds(top.nodes) if top.nodes else (0, None)
        if high is not None and top.count >= high:
            return [_Candidate("schema", b"]")]
        if top.count < low:
            return [_Candidate("schema", b",")]
        return [_Candidate("schema_guess", b",", 0.6), _Candidate("schema_guess", b"]", 0.4)]

    def _values(self, c: Cursor, prompt_cursor: int) -> list[_Candidate]:
        """Candidates for the value expected or being typed at ``c``."""
        doc = self._doc
        assert doc is not None
        nodes = value_nodes(c, doc.schema)
        types = doc.schema.types(nodes)
        if c.mode == STRING:
            typed = b'"' + c.tok
        elif c.mode == SCALAR:
            typed = c.tok
        else:
            typed = b""
        out: list[_Candidate] = []
        out += self._schema_values(nodes, types, typed, prompt_cursor)
        if c.mode == STRING and c.tok:
            out += self._prompt_continuation(c.tok, prompt_cursor)
        elif c.mode == SCALAR and c.tok[:1] in b"-0123456789":
            out += self._prompt_number(c.tok, prompt_cursor)
        elif not c.tok and c.mode != SCALAR:
            key = value_path(c)[-1] if c.stack else None
            label = key.decode("utf-8", "replace") if isinstance(key, bytes) else None
            if not types or "string" in types:
                out += self._prompt_string_start(label, prompt_cursor, opened=c.mode == STRING)
            if (not types or "number" in types) and c.mode != STRING:
                out += self._prompt_number_start(label, prompt_cursor, "integer" in types and "number" not in types)
        if c.mode in VALUE_MODES and len(types) == 1:
            opener = {"string": b'"', "object": b"{", "array": b"["}.get(next(iter(types)))
            if opener is not None:
                out.append(_Candidate("schema", opener, 0.05))
        return out

    def _schema_values(self, nodes, types: set[str], typed: bytes, prompt_cursor: int) -> list[_Candidate]:
        doc = self._doc
        assert doc is not None
        texts = [(kind, t) for kind, t in doc.schema.value_texts(nodes) if t.startswith(typed) and t != typed]
        for literal in (b"true", b"false", b"null"):
            wanted = "boolean" if literal != b"null" else "null"
            if wanted in types and literal.startswith(typed) and literal != typed:
                texts.append(("literal", literal))
        if not texts:
            return []
        fixed = doc.schema.fixed_values(nodes)
        certain = len(texts) == 1 and fixed is not None
        out = []
        prompt = self._prompt_lower
        for i, (kind, text) in enumerate(texts):
            rest = text[len(typed) :]
            if certain or kind == "const":
                out.append(_Candidate("schema", rest))
                continue
            # Rank guesses by where the value is mentioned in the prompt (reading order).
            weight = 0.5 / (1 + i)
            content = text[1:-1].lower() if text[:1] == b'"' else text
            if len(content) >= 2:
                pos = prompt.find(content, prompt_cursor)
                if pos >= 0:
                    weight = 1.0 / (1 + (pos - prompt_cursor) / 2000)
                elif prompt.find(content) >= 0:
                    weight = 0.6
            out.append(_Candidate("schema_guess", rest, weight))
        return out

    def _prompt_continuation(self, typed: bytes, prompt_cursor: int) -> list[_Candidate]:
        """The rest of a string value whose first bytes are ``typed``, from the prompt."""
        prompt = self._doc.prompt  # type: ignore[union-attr]
        pos = find_typed(prompt, typed, prompt_cursor)
        used = typed
        if pos < 0:
            # Typed text that is not in the prompt: continue from its last words.
            for i in range(len(typed) - 3, 0, -1):
                if typed[i - 1 : i] == b" ":
                    pos = find_typed(prompt, typed[i:], prompt_cursor)
                    if pos >= 0:
                        used = typed[i:]
                        break
        if pos < 0:
            return []
        start = pos + len(used)
        end, closed = span_end(prompt, start)
        data = prompt[start:end] + (b'"' if closed else b"")
        return [_Candidate("prompt", data, 1.0, end, closed)] if data else []

    def _prompt_string_start(self, label: str | None, prompt_cursor: int, opened: bool) -> list[_Candidate]:
        """Guesses for a string value's start: after a label naming the key, after the last copy."""
        prompt = self._doc.prompt  # type: ignore[union-attr]
        quote = b"" if opened else b'"'
        starts: list[tuple[int, float]] = []
        for pos in self._label_positions(label, prompt_cursor):
            starts.append((pos, 1.0))
        if prompt_cursor > 0:
            starts.append((skip_separators(prompt, prompt_cursor), 0.9))
        out = []
        for start, weight in starts:
            end, closed = span_end(prompt, start)
            if end > start:
                data = quote + prompt[start:end] + (b'"' if closed else b"")
                out.append(_Candidate("prompt_guess", data, weight, end, closed))
        return out

    def _prompt_number(self, typed: bytes, prompt_cursor: int) -> list[_Candidate]:
        """The rest of a number whose first characters are ``typed``, from the prompt."""
        numbers = self._doc.numbers  # type: ignore[union-attr]
        fits = [(s, e, v) for s, e, v in numbers if v.startswith(typed) and v != typed]
        if not fits:
            return []
        after = [n for n in fits if n[0] >= prompt_cursor]
        s, e, v = after[0] if after else fits[-1]
        return [_Candidate("prompt", v[len(typed) :], 1.0, e)]

    def _prompt_number_start(self, label: str | None, prompt_cursor: int, integer: bool) -> list[_Candidate]:
        """Guesses for a number value: the first number after a label, or after the last copy."""
        numbers = self._doc.numbers  # type: ignore[union-attr]
        out = []
        origins = [(p, 1.0) for p in self._label_positions(label, prompt_cursor)]
        if prompt_cursor > 0:
            origins.append((prompt_cursor, 0.9))
        for origin, weight in origins:
            for s, e, v in numbers:
                if s >= origin and s - origin <= 120:
                    if not (integer and b"." in v):
                        out.append(_Candidate("prompt_guess", v, weight, e))
                    break
        return out

    def _label_positions(self, label: str | None, prompt_cursor: int) -> list[int]:
        """Where a value named by ``label`` starts in the prompt (after the label text)."""
        if not label:
            return []
        prompt = self._prompt_lower
        found: list[int] = []
        for variant in label_variants(label):
            pos = prompt.find(variant)
            while pos >= 0 and len(found) < 3:
                end = pos + len(variant)
                if (pos == 0 or not prompt[pos - 1 : pos].isalnum()) and not prompt[end : end + 1].isalnum():
                    found.append(skip_separators(prompt, end))
                pos = prompt.find(variant, end)
        found.sort(key=lambda p: (p < prompt_cursor, abs(p - prompt_cursor)))
        return found[:2]


# Keep the escape helper importable under its schema name too.
escape_key = escape_key
