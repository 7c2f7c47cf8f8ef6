"""Finding values in the prompt: pure helpers over JSON-escaped prompt text.

Extraction copies values from a source document; tool calls copy arguments
from the user's message.  These helpers locate the span a value comes from
and guess where it ends.  The prompt is searched in its JSON-escaped form
(:func:`escape_text`), so a copied span is ready to paste inside a JSON
string and offsets agree with the generated text.

Reading order: values are mostly copied in the order the document states
them, so a *prompt cursor* (just after the latest copied value) ranks
occurrences -- the nearest one ahead of it wins, one behind it counts double
the distance plus :data:`BACKWARD_PENALTY` (:func:`find_near`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

__all__ = [
    "MAX_SPAN",
    "BACKWARD_PENALTY",
    "escape_text",
    "span_end",
    "delimiters",
    "find_near",
    "near_cost",
    "number_spans",
    "label_variants",
    "label_values",
    "skip_separators",
]

#: How far (bytes) a copied span may run before it is cut at a word boundary.
MAX_SPAN = 160
#: Extra cost of an occurrence behind the prompt cursor (see :func:`near_cost`).
BACKWARD_PENALTY = 64

# Where a copied value usually ends (escaped text): before an escaped newline,
# tab or quote; before a run of , ; : . ! ? ) ] followed by a space or line
# end; before " (", " @", " =", " |", " /", " -" or a space and an en/em
# dash.  A ")" the span did not open also ends it.
_END = re.compile(rb"\\[nrt\"]|[,;:.!?)\]](?= |\\[nrt]|$)| [(@=|/]| -| \xe2\x80[\x93\x94]")
_NUMBER = re.compile(rb"(?<![\w.\-])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.\-])-?\d+(?:\.\d+)?(?![\w])")
_SEPARATORS = frozenset(b" ,;:.-@$=()|*#>+~")
_NUMBERING = re.compile(rb"(?:\d{1,2}[.)]|[a-zA-Z]\)) ")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_LABEL_GLUE = re.compile(rb"(?: ?\([^)]{0,24}\))? ?(?:[:=#]|\\t)")


def escape_text(text: str) -> bytes:
    """``text`` as it appears inside a JSON string (escaped, UTF-8).

    ``escape_text('say "hi"\\n') == b'say \\\\"hi\\\\"\\\\n'`` (quote and newline escaped).
    """
    return json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8")


def span_end(text: bytes, start: int, limit: int = MAX_SPAN, ignore: Iterable[bytes] = ()) -> tuple[int, bool]:
    """Where a value copied from ``text`` at ``start`` most likely ends.

    Returns ``(end, closed)``: ``closed`` is ``True`` at a natural end (see
    the delimiters above; those in ``ignore`` -- delimiters seen *inside*
    earlier values at this path -- are passed over).  Otherwise the span is cut
    at the last word boundary within ``limit`` bytes and ``closed`` is ``False``.

    Worked example (escaped text)::

        span_end(b'Inkwell Print Co., 88 Quarry Lane\\\\nBest', 0)   -> (17, True)
            'Inkwell Print Co.' ends before ', '
        span_end(b'Tri-fold menus, 11x17: 250', 0)                 -> (14, True)
        span_end(b'Tri-fold menus, 11x17: 250', 0, ignore=[b','])  -> (21, True)
    """
    skip = frozenset(ignore)
    stop = min(len(text), start + limit + 2)
    close = text.find(b")", start, stop)
    if close >= 0 and text.find(b"(", start, close) >= 0:
        close = -1  # the span opened this parenthesis itself
    for m in _END.finditer(text, start, stop):
        if m.group() in skip:
            continue
        if 0 <= close < m.start():
            return close, True
        if m.start() - start <= limit:
            return m.start(), True
        break
    stop = min(len(text), start + limit)
    if stop == len(text):
        return stop, True
    cut = text.rfind(b" ", start, stop)
    return (cut if cut > start else stop), False


def delimiters(text: bytes, start: int, end: int) -> tuple[set[bytes], bytes | None]:
    """Delimiters inside ``text[start:end]`` and the one right at ``end`` (or ``None``).

    Used to learn, per document path, which delimiters end values and which
    occur inside them.  ``delimiters(b'a, b. Next', 0, 4) == ({b','}, b'.')``.
    """
    inside = {m.group() for m in _END.finditer(text, start, end) if m.end() <= end}
    at_end = _END.match(text, end)
    return inside, (at_end.group() if at_end else None)


def near_cost(pos: int, cursor: int) -> int:
    """Distance of ``pos`` from the prompt cursor: ahead counts once, behind double plus a penalty."""
    return pos - cursor if pos >= cursor else 2 * (cursor - pos) + BACKWARD_PENALTY


def find_near(text: bytes, needle: bytes, cursor: int, max_hits: int = 64) -> int:
    """The occurrence of ``needle`` in ``text`` nearest the cursor (:func:`near_cost`); ``-1`` if none.

    Worked example::

        find_near(b'Bob: 2 tbsp oil; 4 garlic', b'2', 16)  -> 5
            (11 behind costs 86; nothing ahead)
        find_near(b'a Bob, then Bo Diddley', b'Bo', 3)       -> 12
    """
    if not needle:
        return -1
    best, best_cost = -1, None
    pos = text.find(needle)
    hits = 0
    while pos >= 0 and hits < max_hits:
        cost = near_cost(pos, cursor)
        if best_cost is None or cost < best_cost:
            best, best_cost = pos, cost
        if pos >= cursor:
            break  # later occurrences are farther ahead
        hits += 1
        pos = text.find(needle, pos + 1)
    return best


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


def label_values(lowered: bytes, key: str, limit: int = 3) -> list[int]:
    """Offsets where a value labelled with ``key`` starts (``Due date: 2024-10-03``).

    ``lowered`` is the escaped prompt in lower case.  The label must be a
    whole word, followed by ``:``, ``=``, ``#`` or a tab (an optional short
    parenthesis may come between: ``Sales tax (6%): 28.80``).

    ``label_values(b'name: ada\\\\nage: 3', 'name') == [6]``
    """
    found: list[int] = []
    for variant in label_variants(key):
        pos = lowered.find(variant)
        while pos >= 0 and len(found) < limit:
            end = pos + len(variant)
            if (pos == 0 or not lowered[pos - 1 : pos].isalnum()) and not lowered[end : end + 1].isalnum():
                glue = _LABEL_GLUE.match(lowered, end)
                if glue is not None:
                    found.append(skip_separators(lowered, glue.end()))
            pos = lowered.find(variant, end)
    return found


def skip_separators(text: bytes, pos: int, limit: int = 24, numbering: bool = False) -> int:
    """Skip spaces, escaped line breaks and list/label punctuation from ``pos``.

    With ``numbering``, list markers such as ``2. `` or ``b) `` are skipped too.

    ``skip_separators(b': 250 @ $1.20', 0) == 2``;
    ``skip_separators(b'\\\\n2. While', 0, numbering=True) == 5``.
    """
    end = min(len(text), pos + limit)
    while pos < end:
        if text[pos] in _SEPARATORS:
            pos += 1
        elif text[pos] == 0x5C and pos + 1 < len(text) and text[pos + 1] in b"nrt":
            pos += 2
        elif numbering and (pos == 0 or text[pos - 1] in b" n") and (m := _NUMBERING.match(text, pos)):
            pos = m.end()
        else:
            break
    return pos
