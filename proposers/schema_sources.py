"""Candidate sources of the schema-aware drafter: what might come next at a JSON position.

(Over 400 lines on purpose: a dozen small pure functions that share one
vocabulary, each with its worked example; see tests/proposers/test_schema_sources.py.)

Each source is a pure function of the position (a
:class:`~proposers.json_cursor.Cursor`), the document so far
(:class:`~proposers.json_document.Document`, read only), the prompt
(:class:`~proposers.json_document.Prompt`) and the prompt cursor ``at`` (the
escaped-prompt offset after the latest copied value), and returns
:class:`Candidate` segments of JSON text, best first within the source.
:func:`candidates` asks the ones that fit the position.  The sources (names
as in :data:`proposers.schema_ngram.SOURCE_PRIORS`):

* **history** -- :func:`from_history`: what followed the same decision point
  earlier (``history``: keys and punctuation; ``history_value``: a value seen
  at the same path); :func:`sibling_value` (``sibling``): the value of the
  nearest earlier member of the same object and type.
* **prompt** -- :func:`prompt_continuation` (``prompt``) and
  :func:`document_continuation` (``document``) finish a started string;
  :func:`prompt_number` finishes a number; at a value's start
  :func:`prompt_string_start` and :func:`prompt_number_start` guess it after a
  label naming the key (``prompt_label``), after the latest copy
  (``prompt_next``) or just before it (``prompt_near``).
* **schema** -- :func:`keys`, :func:`separators` and :func:`schema_values`
  (``schema`` when the schema implies it, ``schema_guess`` otherwise).

The examples use :data:`~proposers.json_document.BYTE_TOKENS` (one token per
byte) and ``doc_of(text, schema, prompt)`` -- a :class:`Document` fed ``text``
(see the tests).  All text is bytes of JSON text: string contents stay
JSON-escaped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .json_cursor import (
    AFTER,
    COLON,
    DONE,
    ERROR,
    KEY,
    KEY_MODES,
    OBJ_FIRST,
    SCALAR,
    STRING,
    VALUE,
    VALUE_MODES,
    Cursor,
    advance,
    end_scalar,
    normalize,
    signature,
    value_nodes,
    value_path,
)
from .json_document import Document, Prompt
from .prompt_spans import MAX_SPAN, find_near, label_values, near_cost, skip_separators, span_end
from .schema_nav import Nodes, SchemaIndex

__all__ = [
    "Candidate",
    "candidates",
    "follow_length",
    "from_history",
    "keys",
    "separators",
    "values",
    "sibling_value",
    "schema_values",
    "prompt_continuation",
    "document_continuation",
    "prompt_string_start",
    "prompt_number",
    "prompt_number_start",
    "labels",
]

_NEAR_WINDOW = 60  # bytes: how far from the cursor a guessed number may start


@dataclass(frozen=True)
class Candidate:
    """A segment of JSON text to append, and where it came from."""

    source: str
    data: bytes  # JSON text to append
    weight: float = 1.0  # rank within the source (1 = best)
    prompt_end: int = -1  # prompt cursor after this candidate (-1: unchanged)
    closes_string: bool = False  # data = string content + '"' (may be cut at the grammar's limit)
    certain: bool = False  # implied by the schema: proposed whatever its rank


def candidates(c: Cursor, doc: Document, planned: bytes, at: int) -> list[Candidate]:
    """Every candidate for the position ``c``, one per text (the first source to offer it).

    ``c`` is the cursor after the document's text plus ``planned`` (text
    drafted so far this step); ``at`` the prompt cursor there.

    Worked example (schema ``{"a": string, "b": string}``)::

        doc = doc_of(b'{"a":"x",', schema)
        candidates(doc.cursor, doc, b"", doc.prompt_cursor)
        -> [Candidate("schema", b'"b":')]
    """
    out = from_history(c, doc, planned)
    if c.mode in KEY_MODES or c.mode == KEY:
        out += keys(c, doc.schema)
    elif c.mode == COLON:
        out.append(Candidate("schema", b":"))
    elif c.mode == AFTER:
        out += separators(c, doc.schema)
    elif c.mode in VALUE_MODES or c.mode in (STRING, SCALAR):
        out += values(c, doc, at)
    seen: dict[bytes, Candidate] = {}
    for cand in out:
        if cand.data and cand.data not in seen:
            seen[cand.data] = cand
    return list(seen.values())


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


def from_history(c: Cursor, doc: Document, planned: bytes) -> list[Candidate]:
    """What followed the same decision point earlier in the document, then in ``doc.past`` (at most two).

    Positions compare by path with array indices erased, so the second item
    of an array copies the first.  A scalar copy (``history_value``) is
    weighted by how often values repeat at that path, and skipped when the
    array it goes into already holds it.  The conversation's earlier
    documents (:attr:`Document.past`) come after this one's, as ``past`` /
    ``past_value``: the next call of a tool repeats the last one's keys.

    Worked example::

        doc = doc_of(b'[{"a":1,"b":2},{')
        from_history(doc.cursor, doc, b"")  -> [Candidate("history", b'"a":')]
    """
    sig = _anchor_signature(c)
    if sig is None:
        return []
    known = len(doc.text)
    typed = bytes(doc.text[c.anchor : c.offset]) + planned[max(0, c.anchor - known) : max(0, c.offset - known)]
    in_value = c.mode in (STRING, SCALAR) or c.mode in VALUE_MODES
    # An array element: skip values the array already has (its text, built when first needed).
    array_start = c.stack[-1].start if in_value and c.stack and c.stack[-1].kind == 0x5B else -1
    array_text: bytes | None = None
    out: list[Candidate] = []
    for text, offset, source in _earlier_points(doc, sig, c.anchor):
        if text[offset : offset + len(typed)] != typed:
            continue
        rest = bytes(text[offset + len(typed) : offset + len(typed) + MAX_SPAN])
        n = follow_length(c, rest, doc.schema)
        if n == 0:
            continue
        scalar = in_value and (c.mode in (STRING, SCALAR) or rest[:1] not in (b"{", b"["))
        weight = 1.0 - 0.1 * len(out)
        if scalar:
            value = typed + rest[: _scalar_length(typed + rest)]
            if array_start >= 0 and array_text is None:
                array_text = bytes(doc.text[array_start:]) + planned[max(0, array_start - known) :]
            if array_text and value in array_text:
                continue
            if source == "history":
                weight *= 2 * doc.repeat_rate(sig[1])
        out.append(Candidate(source + "_value" if scalar else source, rest[:n], weight))
        if len(out) == 2:
            break
    return out


def keys(c: Cursor, schema: SchemaIndex) -> list[Candidate]:
    """The next declared property names (and ``}`` when nothing is required).

    Worked example (properties ``a``, ``b``; ``b`` required)::

        keys(doc_of(b'{').cursor, schema)
        -> [Candidate("schema", b'"a":'), Candidate("schema", b'"b":', 0.5)]
    """
    top = c.stack[-1]
    names = schema.property_names(top.nodes)
    if not names:
        return []
    remaining = _remaining(names, top.keys)
    typed = c.tok if c.mode == KEY else None
    required = schema.required(top.nodes)
    out = []
    for i, name in enumerate(remaining):
        if typed is not None and not name.startswith(typed):
            continue
        data = (b"" if typed is not None else b'"') + name[len(typed or b"") :] + b'":'
        out.append(Candidate("schema", data, 1.0 if i == 0 else 0.5 / i))
        if name in required:
            break  # properties come in declared order: a required one cannot be skipped
    if c.mode == OBJ_FIRST and not required & set(names):
        out.append(Candidate("schema_guess", b"}", 0.5))
    return out


def separators(c: Cursor, schema: SchemaIndex, weight: float = 1.0) -> list[Candidate]:
    """``,`` or the closing bracket after a value (``schema`` when the schema decides it).

    Worked example (properties ``a``, ``b``, both required)::

        separators(doc_of(b'{"a":"x"').cursor, schema)  -> [Candidate("schema", b",")]
    """
    top = c.stack[-1]
    if top.kind == 0x7B:
        names = schema.property_names(top.nodes)
        if not names:
            return [Candidate("schema_guess", b",", 0.6 * weight), Candidate("schema_guess", b"}", 0.5 * weight)]
        remaining = _remaining(names, top.keys)
        if not remaining:
            return [Candidate("schema", b"}", weight)]
        if set(remaining) & schema.required(top.nodes):
            return [Candidate("schema", b",", weight)]
        return [Candidate("schema_guess", b"}", 0.6 * weight), Candidate("schema_guess", b",", 0.5 * weight)]
    low, high = schema.array_bounds(top.nodes) if top.nodes else (0, None)
    if high is not None and top.completed >= high:
        return [Candidate("schema", b"]", weight)]
    if top.completed < low:
        return [Candidate("schema", b",", weight)]
    return [Candidate("schema_guess", b",", 0.6 * weight), Candidate("schema_guess", b"]", 0.4 * weight)]


def values(c: Cursor, doc: Document, at: int) -> list[Candidate]:
    """Candidates for the value expected, or being typed, at ``c``: every value source that fits.

    Worked example (prompt ``Name: Ada``, property ``name`` a string)::

        values(doc_of(b'{"name":').cursor, doc, doc.prompt_cursor)
        -> [Candidate("prompt_label", b'"Ada"', 1.0, 9, True), Candidate("schema", b'"', 0.05, certain=True)]
    """
    schema, prompt = doc.schema, doc.prompt
    nodes = value_nodes(c, schema)
    types = schema.types(nodes)
    path = normalize(value_path(c))
    typed = b'"' + c.tok if c.mode == STRING else c.tok if c.mode == SCALAR else b""
    out = schema_values(schema, nodes, types, typed, prompt, at)
    if c.mode == STRING and c.tok:
        out += prompt_continuation(c.tok, prompt, at, doc.ignored_delimiters(path))
        out += document_continuation(c, doc)
    elif c.mode == SCALAR:
        numbers, complete = prompt_number(c.tok, prompt, at)
        out += numbers
        if c.stack:  # the number may end here: what follows it
            out += separators(end_scalar(c, schema), schema, 1.0 if complete else 0.3)
    else:
        key = value_path(c)[-1] if c.stack else None
        label = key.decode("utf-8", "replace") if isinstance(key, bytes) else None
        if not types or "string" in types:
            out += prompt_string_start(label, prompt, at, doc.ignored_delimiters(path), opened=c.mode == STRING)
        if (not types or "number" in types) and c.mode != STRING:
            out += prompt_number_start(label, prompt, at, "integer" in types and "number" not in types)
    out += sibling_value(c, doc, types, typed)
    if c.mode in VALUE_MODES and len(types) == 1:
        opener = {"string": b'"', "object": b"{", "array": b"["}.get(next(iter(types)))
        if opener is not None:
            out.append(Candidate("schema", opener, 0.05, certain=True))
    return out


def sibling_value(c: Cursor, doc: Document, types: set[str], typed: bytes) -> list[Candidate]:
    """The value of the nearest earlier member of this object with the same type, if a scalar.

    Objects often hold uniform members: ``"strength":10,"dexterity":10``,
    flags that are all ``true``, placeholders that are all ``"N/A"``.
    ``typed``: what the current value already holds (the rest is proposed).

    Worked example (``s`` and ``d`` integers)::

        doc = doc_of(b'{"s":10,"d":', schema)
        sibling_value(doc.cursor, doc, {"integer", "number"}, b"")  -> [Candidate("sibling", b"10")]
    """
    top = c.stack[-1] if c.stack else None
    if top is None or top.kind != 0x7B or not top.keys or top.keys[-1] != top.key:
        return []
    schema = doc.schema
    for previous in reversed(top.keys[:-1]):  # the nearest member with a value written (not just planned)
        if schema.types(schema.object_child(top.nodes, previous)) != types:
            return []
        written = doc.values.get(normalize(top.path + (previous,)))
        if written:
            value = written[-1]
            if value[:1] in (b"{", b"[") or not value.startswith(typed) or value == typed:
                return []
            return [Candidate("sibling", value[len(typed) :])]
    return []


def schema_values(
    schema: SchemaIndex, nodes: Nodes, types: set[str], typed: bytes, prompt: Prompt, at: int
) -> list[Candidate]:
    """``const``/``enum``/``default``/``examples`` values and literals that fit what was typed.

    The only value left is certain (``schema``); guesses (``schema_guess``)
    rank by where the prompt mentions them, nearest the prompt cursor first.

    Worked example (``enum: ["celsius", "fahrenheit"]``, prompt ``in Fahrenheit``)::

        schema_values(schema, nodes, {"string"}, b"", prompt, 0)
        -> [Candidate("schema_guess", b'"celsius"', 0.5),
            Candidate("schema_guess", b'"fahrenheit"', 0.994...)]
        schema_values(schema, nodes, {"string"}, b'"c', prompt, 0)  -> [Candidate("schema", b'elsius"')]
    """
    texts = [(kind, t) for kind, t in schema.value_texts(nodes) if t.startswith(typed) and t != typed]
    for literal, kind in ((b"true", "boolean"), (b"false", "boolean"), (b"null", "null")):
        if kind in types and literal.startswith(typed) and literal != typed:
            texts.append(("literal", literal))
    if not texts:
        return []
    if len(texts) == 1 and schema.fixed_values(nodes) is not None:
        return [Candidate("schema", texts[0][1][len(typed) :])]  # the only value left
    out = []
    for i, (_, text) in enumerate(texts):
        # Rank guesses by where the prompt mentions them (reading order).
        weight = 0.5 / (1 + i)
        content = text[1:-1].lower() if text[:1] == b'"' else text
        if content:
            pos = _find_word(prompt.lower, content, at)
            if pos >= 0:
                weight = 1.0 / (1 + near_cost(pos, at) / 500)
        out.append(Candidate("schema_guess", text[len(typed) :], weight))
    return out


def prompt_continuation(typed: bytes, prompt: Prompt, at: int, ignore: Iterable[bytes] = ()) -> list[Candidate]:
    """The rest of a string value whose content so far is ``typed``, from the prompt (``prompt``).

    Runs to a likely end of the span (``ignore``: delimiters that did not end
    values here before) and closes the string there.

    Worked example::

        prompt_continuation(b"Pri", Prompt.from_text(b"Order from Priya Raman (email: p@x.io)."), 0)
        -> [Candidate("prompt", b'ya Raman"', 1.0, 22, True)]
    """
    pos, used = _find_typed(prompt, typed, at)
    if pos < 0:
        return []
    start = pos + len(used)
    end, closed = span_end(prompt.text, start, ignore=ignore)
    data = prompt.text[start:end] + (b'"' if closed else b"")
    return [Candidate("prompt", data, 1.0, end, closed)] if data else []


def document_continuation(c: Cursor, doc: Document) -> list[Candidate]:
    """The rest of an earlier string value in this document that starts the same way (``document``).

    Worked example::

        doc = doc_of(b'["Desk Lamp","De')
        document_continuation(doc.cursor, doc)  -> [Candidate("document", b'sk Lamp"', 1.0, -1, True)]
    """
    needle = b'"' + c.tok
    pos = doc.text.rfind(needle, 0, min(c.vstart, len(doc.text)))
    while pos > 0 and bytes(doc.text[pos - 1 : pos]) not in (b":", b"[", b","):  # a value, not a key
        pos = doc.text.rfind(needle, 0, pos)
    if pos <= 0:
        return []
    start = pos + len(needle)
    end = start + _scalar_length(b'"' + bytes(doc.text[start : start + MAX_SPAN])) - 1
    data = bytes(doc.text[start:end])
    return [Candidate("document", data, 1.0, -1, True)] if data.endswith(b'"') else []


def prompt_string_start(
    label: str | None, prompt: Prompt, at: int, ignore: Iterable[bytes], opened: bool
) -> list[Candidate]:
    """Guesses for a string value's start: after a label naming the key, after the latest copy.

    ``opened``: the opening quote is already written.

    Worked example::

        prompt_string_start("email", Prompt.from_text(b"Ada. Email: ada@x.io"), 0, set(), False)
        -> [Candidate("prompt_label", b'"ada@x.io"', 1.0, 20, True)]
    """
    starts = [("prompt_label", pos, 1.0 - 0.1 * i) for i, pos in enumerate(labels(label, prompt, at))]
    if at > 0:
        starts.append(("prompt_next", skip_separators(prompt.text, at, numbering=True), 1.0))
    out = []
    for source, start, weight in starts:
        end, closed = span_end(prompt.text, start, ignore=ignore)
        if end > start:
            data = (b"" if opened else b'"') + prompt.text[start:end] + (b'"' if closed else b"")
            out.append(Candidate(source, data, weight, end, closed))
    return out


def prompt_number(typed: bytes, prompt: Prompt, at: int) -> tuple[list[Candidate], bool]:
    """The rest of a number that starts with ``typed``, and whether the prompt says it is complete.

    Worked example::

        prompt_number(b"12", Prompt.from_text(b"qty 125, 12"), 0)
        -> ([Candidate("prompt", b"5", 1.0, 7)], False)
    """
    fits = [(near_cost(s, at), e, v) for s, e, v in prompt.numbers if v.startswith(typed)]
    if not fits:
        return [], False
    _, end, value = min(fits)
    if value == typed:
        return [], True
    return [Candidate("prompt", value[len(typed) :], 1.0, end)], False


def prompt_number_start(label: str | None, prompt: Prompt, at: int, integer: bool) -> list[Candidate]:
    """Guesses for a number: right after a label, next after the latest copy, or just before it.

    ``integer``: only integers fit.

    Worked example::

        prompt_number_start("age", Prompt.from_text(b"Ada, age: 36, 1.70 m"), 0, True)
        -> [Candidate("prompt_label", b"36", 1.0, 12)]
    """
    out = []
    for i, origin in enumerate(labels(label, prompt, at)):
        for s, e, v in prompt.numbers:
            if origin <= s <= origin + 2:  # the value follows the label directly ($ and spaces skipped)
                out.append(Candidate("prompt_label", v, 1.0 - 0.1 * i, e))
    if at > 0:
        ahead = [(s, e, v) for s, e, v in prompt.numbers if at <= s <= at + _NEAR_WINDOW]
        if ahead:
            s, e, v = ahead[0]
            out.append(Candidate("prompt_next", v, 1.0, e))
        line = prompt.text.rfind(b"\\n", 0, at)
        behind = [(s, e, v) for s, e, v in prompt.numbers if line < s and e <= at]
        if behind:
            s, e, v = behind[-1]
            out.append(Candidate("prompt_near", v, 1.0, e))
    if integer:
        out = [c for c in out if b"." not in c.data]
    return out


def labels(label: str | None, prompt: Prompt, at: int) -> list[int]:
    """Value starts after labels naming ``label``, nearest the cursor first (at most two).

    Worked example::

        labels("due_date", Prompt.from_text(b"Due date: May 3"), 0)  -> [10]
    """
    if not label:
        return []
    found = label_values(prompt.lower, label)
    found.sort(key=lambda p: near_cost(p, at))
    return found[:2]


# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------


def _anchor_signature(c: Cursor) -> tuple[Any, ...] | None:
    """The signature of the decision point the current token started at."""
    if c.mode == KEY:
        return signature(c._replace(mode=OBJ_FIRST))
    if c.mode in (STRING, SCALAR):
        return signature(c._replace(mode=VALUE))
    return signature(c)


def _earlier_points(doc: Document, sig: tuple[Any, ...], before: int) -> Iterator[tuple[bytearray, int, str]]:
    """``(text, offset, source)`` of each earlier ``sig``: this document's before ``before``, then ``doc.past``'s.

    Lazily: :func:`from_history` stops after two candidates.
    """
    for offset in doc.earlier(sig, before):
        yield doc.text, offset, "history"
    for past in doc.past:  # a past document is finished: every point in it counts
        for offset in past.earlier(sig, len(past.text) + 1):
            yield past.text, offset, "past"


def _remaining(names: Sequence[bytes], seen: tuple[bytes, ...]) -> list[bytes]:
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


def _find_typed(prompt: Prompt, typed: bytes, cursor: int) -> tuple[int, bytes]:
    """Where the typed start of a string value sits in the prompt, and the part of it matched.

    Exact case first, then ignoring case; if the whole is not there, its
    last words (at least 3 bytes) -- the model may paraphrase the start.
    The longest such suffix that occurs wins.  Whether a suffix occurs (in
    either case) only gets likelier as it gets shorter (a longer one's every
    occurrence holds the shorter one), so the longest is found by bisection:
    O(log words) searches, not one per word of a long string the prompt
    does not hold.  The word starts are only listed when the whole is not there.
    """

    def found(i: int) -> tuple[int, bytes]:
        used = typed[starts[i] :]
        pos = find_near(prompt.text, used, cursor)
        if pos < 0:
            pos = find_near(prompt.lower, used.lower(), cursor)
        return pos, used

    starts = [0]
    first = found(0)
    if first[0] >= 0:
        return first
    space = typed.find(b" ", 0, len(typed) - 3)
    while space >= 0:  # a word starts after each space, leaving at least 3 bytes
        starts.append(space + 1)
        space = typed.find(b" ", space + 1, len(typed) - 3)
    last = found(len(starts) - 1) if len(starts) > 1 else (-1, b"")
    if last[0] < 0:
        return -1, b""
    low, high, best = 0, len(starts) - 1, last  # found(low) fails, found(high) succeeds
    while high - low > 1:
        mid = (low + high) // 2
        got = found(mid)
        if got[0] >= 0:
            high, best = mid, got
        else:
            low = mid
    return best
