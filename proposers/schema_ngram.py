"""The schema-aware n-gram drafter: predictable JSON from the document, the prompt and the schema.

A JSON answer is full of text a cheap guesser can predict: keys, punctuation,
enum values, values copied from the prompt, the same keys in every array
item.  This proposer tracks where generation stands in the document (the
container stack, the key being filled, the schema node of the next value;
see :mod:`proposers.json_cursor`) and drafts from three kinds of source:

* **history** -- what followed the same position earlier in this document.
  Positions compare by path with array indices erased, so the second item of
  an array copies the first: after ``},{"`` comes the key that came after
  ``[{"``.  ``history`` covers keys and punctuation; ``history_value`` a
  value seen at the same path (weighted by how often values repeat there);
  ``sibling`` the value of the nearest earlier member of the same object and
  type (``"strength":10,"dexterity":10``).
* **prompt** -- spans of the prompt that fit the current value (see
  :mod:`proposers.prompt_spans`).  ``prompt``: once a string or number has
  started, the prompt text that continues it, up to a likely end and the
  closing quote (``document``: the same from an earlier value of this
  document).  At a value's start: ``prompt_label`` (after a label naming
  the key, ``Due date: ...``), ``prompt_next`` (after the latest copied
  value), ``prompt_near`` (a number just before it on the same line).
* **schema** -- the next declared property names, ``const``, a unique
  ``enum`` completion and the structure the schema implies (``schema``);
  ``enum``/``default``/``examples`` values and literals as guesses
  (``schema_guess``, ranked by where the prompt mentions them).

A draft is planned in rounds: rank the candidate segments for the current
position, keep the first the grammar accepts (``GrammarView.validate``),
advance a copy of the cursor over it, repeat until more than ``k`` tokens.
Candidates rank by their source's token acceptance in this request (a prior
plus what :meth:`SchemaNgramProposer.feedback` reports) times their rank
within the source.  Text becomes tokens in the tokenizer's canonical split,
re-split where the target was seen to split the same text otherwise
(:mod:`proposers.text`).

All text here is bytes of JSON text: string contents stay JSON-escaped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .base import EMPTY_DRAFT, Draft, GrammarView, Request
from .json_cursor import (
    AFTER, COLON, DONE, ERROR, KEY, KEY_MODES, OBJ_FIRST, SCALAR, STRING, VALUE, VALUE_MODES,
    Cursor, Path, advance, end_scalar, normalize, signature, value_nodes, value_path,
)  # fmt: skip
from .prompt_spans import (
    MAX_SPAN, delimiters, escape_text, find_near, label_values, near_cost, number_spans, skip_separators, span_end,
)  # fmt: skip
from .schema_nav import Nodes, SchemaIndex
from .text import SplitPreferences, continuation_tokens, token_text

__all__ = ["SchemaNgramProposer", "SOURCE_PRIORS", "follow_length", "prompt_start"]

#: Token-acceptance rate assumed for each source before any feedback.
SOURCE_PRIORS = {
    "history": 0.8,
    "schema": 0.8,
    "prompt": 0.7,
    "document": 0.5,
    "prompt_label": 0.45,
    "prompt_next": 0.4,
    "history_value": 0.35,
    "sibling": 0.3,
    "prompt_near": 0.3,
    "schema_guess": 0.3,
}
_PRIOR_WEIGHT = 8.0  # pseudo-tokens behind each prior
_MAX_ROUNDS = 16
_NEAR_WINDOW = 60  # bytes: how far from the cursor a guessed number may start


def follow_length(cursor: Cursor, data: bytes, schema: SchemaIndex | None = None) -> int:
    """How much of ``data`` (text that followed an earlier, analogous position) to copy.

    Copies through keys, punctuation and opening brackets and stops at the
    next scalar value slot, where value sources take over; also stops where
    ``data`` stops being JSON or the document ends.

    Worked example (the cursor is after ``[{"a":1},{``; data is what followed
    ``[{``)::

        follow_length(cursor, b'"a":1},{"a":2}]')  -> 4    copies '"a":'
    """
    c = cursor
    for i, b in enumerate(data):
        if i and c.mode in VALUE_MODES and b not in b"{[ ":
            return i
        c = advance(c, bytes((b,)), schema)
        if c.mode == ERROR:
            return i
        if c.mode == DONE:
            return i + 1
    return len(data)


def prompt_start(segments: Sequence[bytes], min_length: int = 32) -> int:
    """Offset of the last substantial segment of a prompt split at special tokens.

    The prompt cursor starts there: in a chat prompt, that is the user's
    message (the system text before it may quote the schema).

    ``prompt_start([b'system...', b'user\\\\nlong message ...', b'assistant\\\\n'])``
    is the offset of the second segment when it is at least ``min_length`` long.
    """
    offset, best = 0, 0
    for segment in segments:
        if len(segment) >= min_length:
            best = offset
        offset += len(segment)
    return best


# ---------------------------------------------------------------------------
# The document generated so far
# ---------------------------------------------------------------------------


class _Document:
    """The generated JSON with a cursor per token and a record of what happened where.

    ``points``: decision-point signature -> offsets where it occurred.
    ``values``: normalized value path -> the values' JSON texts, in order.
    ``prompt_cursor``: escaped-prompt offset after the latest value found in
    the prompt.  ``endings``: per value path, how often each delimiter ended
    a copied value or occurred inside one.  Truncating to fewer tokens undoes
    everything recorded after the cut.
    """

    def __init__(self, schema: SchemaIndex, prompt: bytes, start: int) -> None:
        self.schema = schema
        self.prompt = prompt
        self.lower = prompt.lower()
        self.numbers = number_spans(prompt)
        self.text = bytearray()
        self.tokens: list[int] = []
        self.cursors: list[Cursor] = [Cursor()]  # cursor after i tokens
        self.ends: list[int] = [0]  # text length after i tokens
        self.points: dict[tuple, list[int]] = {}
        self.values: dict[Path, list[bytes]] = {}
        self.endings: dict[Path, Counter] = {}
        self.prompt_cursor = start
        self.floor = start  # the cursor follows values found at or after this offset
        self._undo: list[tuple[int, Callable[[], None]]] = []  # (offset, how to undo)

    @property
    def cursor(self) -> Cursor:
        return self.cursors[-1]

    def sync(self, generated: Sequence[int], token_bytes: list[bytes], skip: frozenset[int]) -> None:
        """Make the document hold exactly ``generated`` (rolls back and feeds as needed)."""
        have = len(self.tokens)
        same = have if list(generated[:have]) == self.tokens else 0
        if same < have:
            limit = min(have, len(generated))
            while same < limit and self.tokens[same] == generated[same]:
                same += 1
            self._truncate(same)
        for token in generated[same:]:
            token = int(token)
            data = b"" if token in skip or not 0 <= token < len(token_bytes) else token_bytes[token]
            self.text += data
            self.cursors.append(advance(self.cursor, data, self.schema, self._event) if data else self.cursor)
            self.ends.append(len(self.text))
            self.tokens.append(token)

    def _truncate(self, n_tokens: int) -> None:
        del self.tokens[n_tokens:]
        del self.cursors[n_tokens + 1 :]
        del self.ends[n_tokens + 1 :]
        offset = self.ends[-1]
        del self.text[offset:]
        while self._undo and self._undo[-1][0] > offset:
            self._undo.pop()[1]()

    def _event(self, kind: str, cursor: Cursor, start: int = 0, end: int = 0) -> None:
        if kind == "point":
            sig = signature(cursor)
            if sig is not None:
                offsets = self.points.setdefault(sig, [])
                offsets.append(cursor.offset)
                self._undo.append((cursor.offset, offsets.pop))
            return
        path = normalize(value_path(cursor))
        value = bytes(self.text[start:end])
        values = self.values.setdefault(path, [])
        values.append(value)
        self._undo.append((end, values.pop))
        self._note_copy(path, value, end)

    def _note_copy(self, path: Path, value: bytes, end: int) -> None:
        """Move the prompt cursor past ``value`` if it came from the prompt; learn its delimiters."""
        where = self.locate(value)
        if where is None:
            return
        start, stop = where
        previous = self.prompt_cursor
        self.prompt_cursor = stop

        def undo_cursor() -> None:
            self.prompt_cursor = previous

        self._undo.append((end, undo_cursor))
        if value[:1] == b'"':
            inside, at_end = delimiters(self.prompt, start, stop)
            counts = self.endings.setdefault(path, Counter())
            changes = Counter({(d, "in"): 1 for d in inside})
            if at_end is not None:
                changes[(at_end, "end")] += 1
            counts.update(changes)
            self._undo.append((end, lambda: counts.subtract(changes)))

    def locate(self, value: bytes) -> tuple[int, int] | None:
        """The prompt span (escaped offsets) a string or number value was most likely copied from.

        Only the prompt from ``floor`` on counts (in a chat prompt: the user's
        message; a system text before it may quote the schema's enums).
        """
        floor, cursor = self.floor, self.prompt_cursor
        if len(value) >= 4 and value[:1] == b'"' and value[-1:] == b'"':
            content = value[1:-1]
            pos = find_near(self.prompt[floor:], content, cursor - floor)
            if pos < 0:
                pos = find_near(self.lower[floor:], content.lower(), cursor - floor)
            return (floor + pos, floor + pos + len(content)) if pos >= 0 else None
        if value[:1] in b"-0123456789" and value:
            try:
                number = float(value)
            except ValueError:
                return None
            spans = [(near_cost(s, cursor), s, e) for s, e, v in self.numbers if s >= floor and float(v) == number]
            if spans:
                _, s, e = min(spans)
                return s, e
        return None

    def ignored_delimiters(self, path: Path) -> set[bytes]:
        """Delimiters seen inside values at ``path`` more often than ending them."""
        counts = self.endings.get(path)
        if not counts:
            return set()
        return {d for (d, where), n in counts.items() if where == "in" and n > counts[(d, "end")]}

    def repeat_rate(self, path: Path) -> float:
        """How often values at ``path`` repeat an earlier one (smoothed; 0.25 with one value)."""
        values = self.values.get(path, ())
        return (len(values) - len(set(values)) + 0.5) / (len(values) + 1)

    def earlier(self, sig: tuple, before: int) -> list[int]:
        """Offsets of ``sig`` before offset ``before``, most recent first."""
        return [o for o in reversed(self.points.get(sig, ())) if o < before]


# ---------------------------------------------------------------------------
# The proposer
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Candidate:
    source: str
    data: bytes  # JSON text to append
    weight: float = 1.0  # rank within the source (1 = best)
    prompt_end: int = -1  # prompt cursor after this candidate (-1: unchanged)
    closes_string: bool = False  # data = string content + '"' (may be cut at the grammar's limit)
    certain: bool = False  # implied by the schema: proposed whatever its rank


class SchemaNgramProposer:
    """Drafts JSON from this document's history, the prompt and the schema.

    ``max_candidates``: how many candidates per round are tried against the
    grammar.  ``min_score``: candidates scoring lower (source acceptance
    times rank within the source) are not proposed.  A draft token pays when
    its acceptance chance exceeds its share of the verification cost: about
    0.05 when a pass over 16 tokens costs 1.7 plain steps.

    Deterministic drafts (``probs=None``).  Works without a schema (history
    and prompt only) and without a grammar (no validation); proposes nothing
    once the output is not JSON.
    """

    def __init__(self, *, name: str = "schema_ngram", max_candidates: int = 6, min_score: float = 0.05) -> None:
        self.name = name
        self.max_candidates = max_candidates
        self.min_score = min_score
        #: source -> [tokens proposed, tokens accepted] in this request.
        self.stats: dict[str, list[float]] = {}
        self._tokenizer = None
        self._doc: _Document | None = None
        self._prompt_len = 0
        self._last: tuple[tuple[int, ...], tuple[str, ...]] = ((), ())

    # -- protocol -------------------------------------------------------------

    def start(self, request: Request) -> None:
        """Reset for a new generation: read the prompt and index the schema."""
        self._tokenizer = request.tokenizer
        self._helper = helper = token_text(request.tokenizer)
        # Escape the prompt piece by piece between special tokens (escaping is
        # per character, so the pieces concatenate to the escaped whole).
        segments: list[bytes] = []
        run: list[int] = []
        for token in list(request.prompt_ids) + [-1]:
            if token in helper.special_ids or token == -1:
                segments.append(escape_text(helper.bytes_of(run).decode("utf-8", errors="replace")))
                run = []
            else:
                run.append(int(token))
        prompt = b"".join(segments)
        self._doc = _Document(SchemaIndex(request.schema), prompt, prompt_start(segments))
        self._prompt_len = len(request.prompt_ids)
        self.stats = {source: [0.0, 0.0] for source in SOURCE_PRIORS}
        self._splits = SplitPreferences(request.tokenizer)
        self._last = ((), ())

    def propose(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft:
        """Up to ``k`` tokens of predicted JSON.  Does not change the grammar state."""
        doc = self._doc
        if doc is None or k <= 0 or len(context) < self._prompt_len:
            return EMPTY_DRAFT
        self._splits.observe(context)
        doc.sync(context[self._prompt_len :], self._helper.vocab_bytes, self._helper.special_ids)
        if doc.cursor.mode in (DONE, ERROR):
            return EMPTY_DRAFT
        tokens, sources = self._plan(context, grammar, k)
        self._splits.remember(context, tokens)
        if not tokens:
            return EMPTY_DRAFT
        self._last = (tuple(tokens), tuple(sources))
        return Draft(tokens=tuple(tokens), sources=(self.name,) * len(tokens), kind=sources[0])

    def feedback(self, draft: Draft, num_accepted: int) -> None:
        """Credit each source with its proposed and accepted tokens (``draft`` may be a prefix)."""
        tokens, sources = self._last
        if not draft.tokens or tokens[: len(draft.tokens)] != draft.tokens:
            return
        for i, source in enumerate(sources[: len(draft.tokens)]):
            entry = self.stats.setdefault(source, [0.0, 0.0])
            entry[0] += 1
            entry[1] += i < num_accepted
        self._last = ((), ())

    def score(self, source: str) -> float:
        """Expected acceptance of ``source``'s tokens: its prior updated by this request's feedback."""
        proposed, accepted = self.stats.get(source, (0.0, 0.0))
        prior = SOURCE_PRIORS.get(source, 0.3)
        return (prior * _PRIOR_WEIGHT + accepted) / (_PRIOR_WEIGHT + proposed)

    # -- planning -------------------------------------------------------------

    def _plan(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> tuple[list[int], list[str]]:
        """Choose segments round by round; returns the tokens and each token's source.

        Planning goes on until the text holds more than ``k`` tokens, so the
        last kept token is followed by text and is split canonically.
        """
        doc = self._doc
        assert doc is not None
        cursor, text, segments = doc.cursor, b"", []  # segments: (source, end byte in text)
        prompt_cursor = doc.prompt_cursor
        tokens: list[int] = []
        for _ in range(_MAX_ROUNDS):
            chosen, partial = None, None
            for cand in self._ranked(cursor, text, prompt_cursor):
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
            if chosen is None or len(tokens) > k:
                break
            cursor = advance(cursor, cand.data, doc.schema)
            if cursor.mode in (DONE, ERROR):
                break
        if tokens:
            # The target's own way of splitting this text, where it was seen to differ.
            tokens = self._splits.resplit(context, tokens)[:k]
            if grammar is not None:
                tokens = tokens[: grammar.validate(tokens)]
        return tokens[:k], self._token_sources(tokens[:k], segments)

    def _ranked(self, cursor: Cursor, planned: bytes, prompt_cursor: int) -> list[_Candidate]:
        """The candidates worth trying, best first: source score times rank, at least ``min_score``."""
        scored = [
            (self.score(cand.source) * cand.weight, i, cand)
            for i, cand in enumerate(self._candidates(cursor, planned, prompt_cursor))
        ]
        scored.sort(key=lambda entry: (-entry[0], entry[1]))
        kept = [cand for score, _, cand in scored if score >= self.min_score or cand.certain]
        return kept[: self.max_candidates]

    def _check(
        self, context: Sequence[int], grammar: GrammarView | None, k: int, text: bytes, cand: _Candidate, have: int
    ) -> tuple[_Candidate, list[int], bool] | None:
        """Tokenise ``text + cand``: ``(cand, tokens, all legal)`` or ``None`` if it adds nothing legal.

        Only the first ``k + 1`` tokens are validated (the rest are dropped anyway).
        """
        tokens = self._tokens(context, text + cand.data)
        if not tokens:
            return None
        limit = min(len(tokens), k + 1)
        legal = grammar.validate(tokens[:limit]) if grammar is not None else limit
        if legal == limit:
            return cand, tokens, True
        if cand.closes_string and legal > have and grammar is not None:
            # The grammar ended the string earlier (pattern, format, maxLength):
            # close it where the legal part ends.
            legal_bytes = len(self._helper.bytes_of(tokens[:legal])) - len(text)
            least = 2 if cand.data[:1] == b'"' else 1  # keep the opening quote and some content
            for cut in (legal_bytes, legal_bytes - 1):
                if least <= cut < len(cand.data) - 1:
                    shorter = _Candidate(cand.source, cand.data[:cut] + b'"', cand.weight, -1, True)
                    retry = self._tokens(context, text + shorter.data)
                    n = min(len(retry), k + 1)
                    if retry and grammar.validate(retry[:n]) == n:
                        return shorter, retry, True
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
        """Every candidate for the position ``c`` (``planned``: text drafted so far this step)."""
        out = self._from_history(c, planned)
        if c.mode in KEY_MODES or c.mode == KEY:
            out += self._keys(c)
        elif c.mode == COLON:
            out.append(_Candidate("schema", b":"))
        elif c.mode == AFTER:
            out += self._separators(c)
        elif c.mode in VALUE_MODES or c.mode in (STRING, SCALAR):
            out += self._values(c, prompt_cursor)
        seen: dict[bytes, _Candidate] = {}  # one candidate per text: the first (best) one
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
        known = len(doc.text)
        typed = bytes(doc.text[c.anchor : c.offset]) + planned[max(0, c.anchor - known) : max(0, c.offset - known)]
        in_value = c.mode in (STRING, SCALAR) or c.mode in VALUE_MODES
        array_text = b""
        if in_value and c.stack and c.stack[-1].kind == 0x5B:  # an array element: skip values it already has
            top = c.stack[-1]
            array_text = bytes(doc.text[top.start :]) + planned[max(0, top.start - known) :]
        out: list[_Candidate] = []
        for offset in doc.earlier(sig, c.anchor):
            if doc.text[offset : offset + len(typed)] != typed:
                continue
            rest = bytes(doc.text[offset + len(typed) : offset + len(typed) + MAX_SPAN])
            n = follow_length(c, rest, doc.schema)
            if n == 0:
                continue
            scalar = in_value and (c.mode in (STRING, SCALAR) or rest[:1] not in (b"{", b"["))
            weight = 1.0 - 0.1 * len(out)
            if scalar:
                value = typed + rest[: _scalar_length(typed + rest)]
                if array_text and value in array_text:
                    continue
                weight *= 2 * doc.repeat_rate(sig[1])
            out.append(_Candidate("history_value" if scalar else "history", rest[:n], weight))
            if len(out) == 2:
                break
        return out

    def _keys(self, c: Cursor) -> list[_Candidate]:
        """The next declared property names (and ``}`` when nothing is required)."""
        doc = self._doc
        assert doc is not None
        top = c.stack[-1]
        names = doc.schema.property_names(top.nodes)
        if not names:
            return []
        remaining = _remaining(names, top.keys)
        typed = c.tok if c.mode == KEY else None
        required = doc.schema.required(top.nodes)
        out = []
        for i, name in enumerate(remaining):
            if typed is not None and not name.startswith(typed):
                continue
            data = (b"" if typed is not None else b'"') + name[len(typed or b"") :] + b'":'
            out.append(_Candidate("schema", data, 1.0 if i == 0 else 0.5 / i))
            if name in required:
                break  # properties come in declared order: a required one cannot be skipped
        if c.mode == OBJ_FIRST and not required & set(names):
            out.append(_Candidate("schema_guess", b"}", 0.5))
        return out

    def _separators(self, c: Cursor, weight: float = 1.0) -> list[_Candidate]:
        """``,`` or the closing bracket after a value."""
        doc = self._doc
        assert doc is not None
        top = c.stack[-1]
        schema = doc.schema
        if top.kind == 0x7B:
            names = schema.property_names(top.nodes)
            if not names:
                return [_Candidate("schema_guess", b",", 0.6 * weight), _Candidate("schema_guess", b"}", 0.5 * weight)]
            remaining = _remaining(names, top.keys)
            if not remaining:
                return [_Candidate("schema", b"}", weight)]
            if set(remaining) & schema.required(top.nodes):
                return [_Candidate("schema", b",", weight)]
            return [_Candidate("schema_guess", b"}", 0.6 * weight), _Candidate("schema_guess", b",", 0.5 * weight)]
        low, high = schema.array_bounds(top.nodes) if top.nodes else (0, None)
        if high is not None and top.count >= high:
            return [_Candidate("schema", b"]", weight)]
        if top.count < low:
            return [_Candidate("schema", b",", weight)]
        return [_Candidate("schema_guess", b",", 0.6 * weight), _Candidate("schema_guess", b"]", 0.4 * weight)]

    def _values(self, c: Cursor, prompt_cursor: int) -> list[_Candidate]:
        """Candidates for the value expected, or being typed, at ``c``."""
        doc = self._doc
        assert doc is not None
        nodes = value_nodes(c, doc.schema)
        types = doc.schema.types(nodes)
        path = normalize(value_path(c))
        typed = b'"' + c.tok if c.mode == STRING else c.tok if c.mode == SCALAR else b""
        out = self._schema_values(nodes, types, typed, prompt_cursor)
        if c.mode == STRING and c.tok:
            out += self._prompt_continuation(c.tok, prompt_cursor, path)
            out += self._document_continuation(c)
        elif c.mode == SCALAR:
            numbers, complete = self._prompt_number(c.tok, prompt_cursor)
            out += numbers
            if c.stack:  # the number may end here: what follows it
                out += self._separators(end_scalar(c, doc.schema), 1.0 if complete else 0.3)
        else:
            key = value_path(c)[-1] if c.stack else None
            label = key.decode("utf-8", "replace") if isinstance(key, bytes) else None
            if not types or "string" in types:
                out += self._prompt_string_start(label, prompt_cursor, path, opened=c.mode == STRING)
            if (not types or "number" in types) and c.mode != STRING:
                out += self._prompt_number_start(label, prompt_cursor, "integer" in types and "number" not in types)
        out += self._sibling_value(c, types, typed)
        if c.mode in VALUE_MODES and len(types) == 1:
            opener = {"string": b'"', "object": b"{", "array": b"["}.get(next(iter(types)))
            if opener is not None:
                out.append(_Candidate("schema", opener, 0.05, certain=True))
        return out

    def _sibling_value(self, c: Cursor, types: set[str], typed: bytes) -> list[_Candidate]:
        """The value of the nearest earlier member of this object with the same type, if a scalar.

        Objects often hold uniform members: ``"strength":10,"dexterity":10``,
        flags that are all ``true``, placeholders that are all ``"N/A"``.
        ``typed``: what the current value already holds (the rest is proposed).
        """
        doc = self._doc
        assert doc is not None
        top = c.stack[-1] if c.stack else None
        if top is None or top.kind != 0x7B or not top.keys or top.keys[-1] != top.key:
            return []
        for previous in reversed(top.keys[:-1]):  # the nearest member with a value written (not just planned)
            if doc.schema.types(doc.schema.object_child(top.nodes, previous)) != types:
                return []
            values = doc.values.get(normalize(top.path + (previous,)))
            if values:
                value = values[-1]
                if value[:1] in (b"{", b"[") or not value.startswith(typed) or value == typed:
                    return []
                return [_Candidate("sibling", value[len(typed) :])]
        return []

    def _schema_values(self, nodes: Nodes, types: set[str], typed: bytes, prompt_cursor: int) -> list[_Candidate]:
        """``const``/``enum``/``default``/``examples`` values and literals that fit what was typed."""
        doc = self._doc
        assert doc is not None
        texts = [(kind, t) for kind, t in doc.schema.value_texts(nodes) if t.startswith(typed) and t != typed]
        for literal, kind in ((b"true", "boolean"), (b"false", "boolean"), (b"null", "null")):
            if kind in types and literal.startswith(typed) and literal != typed:
                texts.append(("literal", literal))
        if not texts:
            return []
        if len(texts) == 1 and doc.schema.fixed_values(nodes) is not None:
            return [_Candidate("schema", texts[0][1][len(typed) :])]  # the only value left
        out = []
        for i, (kind, text) in enumerate(texts):
            # Rank guesses by where the prompt mentions them (reading order).
            weight = 0.5 / (1 + i)
            content = text[1:-1].lower() if text[:1] == b'"' else text
            if content:
                pos = _find_word(doc.lower, content, prompt_cursor)
                if pos >= 0:
                    weight = 1.0 / (1 + near_cost(pos, prompt_cursor) / 500)
            out.append(_Candidate("schema_guess", text[len(typed) :], weight))
        return out

    def _prompt_continuation(self, typed: bytes, prompt_cursor: int, path: Path) -> list[_Candidate]:
        """The rest of a string value whose content so far is ``typed``, from the prompt."""
        doc = self._doc
        assert doc is not None
        pos, used = _find_typed(doc, typed, prompt_cursor)
        if pos < 0:
            return []
        start = pos + len(used)
        end, closed = span_end(doc.prompt, start, ignore=doc.ignored_delimiters(path))
        data = doc.prompt[start:end] + (b'"' if closed else b"")
        return [_Candidate("prompt", data, 1.0, end, closed)] if data else []

    def _document_continuation(self, c: Cursor) -> list[_Candidate]:
        """The rest of an earlier string value in this document that starts the same way."""
        doc = self._doc
        assert doc is not None
        needle = b'"' + c.tok
        pos = doc.text.rfind(needle, 0, min(c.vstart, len(doc.text)))
        while pos > 0 and doc.text[pos - 1 : pos] not in (b":", b"[", b","):  # a value, not a key
            pos = doc.text.rfind(needle, 0, pos)
        if pos <= 0:
            return []
        start = pos + len(needle)
        end = start + _scalar_length(b'"' + bytes(doc.text[start : start + MAX_SPAN])) - 1
        data = bytes(doc.text[start:end])
        return [_Candidate("document", data, 1.0, -1, True)] if data.endswith(b'"') else []

    def _prompt_string_start(self, label: str | None, prompt_cursor: int, path: Path, opened: bool) -> list[_Candidate]:
        """Guesses for a string value's start: after a label naming the key, after the latest copy."""
        doc = self._doc
        assert doc is not None
        starts = [("prompt_label", pos, 1.0 - 0.1 * i) for i, pos in enumerate(self._labels(label, prompt_cursor))]
        if prompt_cursor > 0:
            starts.append(("prompt_next", skip_separators(doc.prompt, prompt_cursor, numbering=True), 1.0))
        ignore = doc.ignored_delimiters(path)
        out = []
        for source, start, weight in starts:
            end, closed = span_end(doc.prompt, start, ignore=ignore)
            if end > start:
                data = (b"" if opened else b'"') + doc.prompt[start:end] + (b'"' if closed else b"")
                out.append(_Candidate(source, data, weight, end, closed))
        return out

    def _prompt_number(self, typed: bytes, prompt_cursor: int) -> tuple[list[_Candidate], bool]:
        """The rest of a number that starts with ``typed``, and whether the prompt says it is complete."""
        doc = self._doc
        assert doc is not None
        fits = [(near_cost(s, prompt_cursor), e, v) for s, e, v in doc.numbers if v.startswith(typed)]
        if not fits:
            return [], False
        _, end, value = min(fits)
        if value == typed:
            return [], True
        return [_Candidate("prompt", value[len(typed) :], 1.0, end)], False

    def _prompt_number_start(self, label: str | None, prompt_cursor: int, integer: bool) -> list[_Candidate]:
        """Guesses for a number: right after a label, next after the latest copy, or just before it."""
        doc = self._doc
        assert doc is not None
        out = []
        for i, origin in enumerate(self._labels(label, prompt_cursor)):
            for s, e, v in doc.numbers:
                if origin <= s <= origin + 2:  # the value follows the label directly ($ and spaces skipped)
                    out.append(_Candidate("prompt_label", v, 1.0 - 0.1 * i, e))
        if prompt_cursor > 0:
            ahead = [(s, e, v) for s, e, v in doc.numbers if prompt_cursor <= s <= prompt_cursor + _NEAR_WINDOW]
            if ahead:
                s, e, v = ahead[0]
                out.append(_Candidate("prompt_next", v, 1.0, e))
            line = doc.prompt.rfind(b"\\n", 0, prompt_cursor)
            behind = [(s, e, v) for s, e, v in doc.numbers if line < s and e <= prompt_cursor]
            if behind:
                s, e, v = behind[-1]
                out.append(_Candidate("prompt_near", v, 1.0, e))
        if integer:
            out = [c for c in out if b"." not in c.data]
        return out

    def _labels(self, label: str | None, prompt_cursor: int) -> list[int]:
        """Value starts after labels naming ``label``, nearest the cursor first (at most two)."""
        if not label:
            return []
        doc = self._doc
        assert doc is not None
        found = label_values(doc.lower, label)
        found.sort(key=lambda p: near_cost(p, prompt_cursor))
        return found[:2]


# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------


def _anchor_signature(c: Cursor) -> tuple | None:
    """The signature of the decision point the current token started at."""
    if c.mode == KEY:
        return signature(c._replace(mode=OBJ_FIRST))
    if c.mode in (STRING, SCALAR):
        return signature(c._replace(mode=VALUE))
    return signature(c)


def _remaining(names: list[bytes], seen: tuple[bytes, ...]) -> list[bytes]:
    """Declared names that may still come: after the last one seen, not seen yet."""
    last = max((names.index(k) for k in seen if k in names), default=-1)
    return [n for n in names[last + 1 :] if n not in seen]


def _scalar_length(text: bytes) -> int:
    """Length of the string, number or literal at the start of ``text``."""
    if text[:1] == b'"':
        i, escaped = 1, False
        while i < len(text):
            if escaped:
                escaped = False
            elif text[i] == 0x5C:
                escaped = True
            elif text[i] == 0x22:
                return i + 1
            i += 1
        return len(text)
    i = 0
    while i < len(text) and text[i] not in b",}] \n":
        i += 1
    return i


def _find_word(lowered: bytes, word: bytes, cursor: int) -> int:
    """The whole-word occurrence of ``word`` nearest the cursor in lower-cased text, or -1."""
    best, best_cost = -1, None
    pos = lowered.find(word)
    while pos >= 0:
        end = pos + len(word)
        if (pos == 0 or not lowered[pos - 1 : pos].isalnum()) and not lowered[end : end + 1].isalnum():
            cost = near_cost(pos, cursor)
            if best_cost is None or cost < best_cost:
                best, best_cost = pos, cost
            if pos >= cursor:
                break
        pos = lowered.find(word, pos + 1)
    return best


def _find_typed(doc: _Document, typed: bytes, cursor: int) -> tuple[int, bytes]:
    """Where the typed start of a string value sits in the prompt, and the part of it matched.

    Exact case first, then ignoring case; if the whole is not there, its
    last words (at least 3 bytes) -- the model may paraphrase the start.
    """
    suffixes = [typed] + [typed[i:] for i in range(1, len(typed) - 2) if typed[i - 1 : i] == b" "]
    for used in suffixes:
        pos = find_near(doc.prompt, used, cursor)
        if pos < 0:
            pos = find_near(doc.lower, used.lower(), cursor)
        if pos >= 0:
            return pos, used
    return -1, b""


# ---------------------------------------------------------------------------
# Tree alternatives (issue 16): the other top candidates, for proposers/tree.py
# ---------------------------------------------------------------------------


def alternative_drafts(
    proposer: SchemaNgramProposer, context: Sequence[int], grammar: GrammarView, k: int, n: int = 3
) -> list[list[int]]:
    """Up to ``n`` legal token lists, one per top-ranked candidate for the text after ``context``.

    Each is one candidate segment (an earlier item's value, a prompt span, an
    enum value, a key...) split canonically and cut at its first illegal
    token and at ``k`` tokens; the best-ranked first.  Unlike ``propose`` it
    plans one round only and remembers nothing: it does not change the
    proposer's feedback or split memory, nor the grammar state (the document
    is synced to ``context``, as ``propose`` would).
    """
    doc = proposer._doc
    if doc is None or k <= 0 or len(context) < proposer._prompt_len:
        return []
    doc.sync(context[proposer._prompt_len :], proposer._helper.vocab_bytes, proposer._helper.special_ids)
    if doc.cursor.mode in (DONE, ERROR):
        return []
    out: list[list[int]] = []
    # Every candidate, best first (no score floor: a tree verifies alternatives a chain would not bet on).
    candidates = proposer._candidates(doc.cursor, b"", doc.prompt_cursor)
    ranked = sorted(enumerate(candidates), key=lambda e: (-proposer.score(e[1].source) * e[1].weight, e[0]))
    for _, cand in ranked:
        found = proposer._check(context, grammar, k, b"", cand, 0)
        if found is None:
            continue
        tokens = found[1][:k]
        tokens = tokens[: grammar.validate(tokens)]
        if tokens and tokens not in out:
            out.append(tokens)
        if len(out) >= n:
            break
    return out
