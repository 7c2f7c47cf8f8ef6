"""Where a JSON document being generated stands: an incremental, byte-level tracker.

:func:`advance` feeds bytes to an immutable :class:`Cursor` and returns the new
one, so a proposer can keep one cursor per committed token (cheap rollback)
and try hypothetical continuations on a copy.  Structural bytes are ASCII, so
working on bytes is exact for any UTF-8 text (multi-byte characters only occur
inside strings).  Whitespace between tokens is skipped, so compact and
indented JSON both work.

The cursor knows the container stack, the key being filled, the partial key,
string or scalar being typed, and the candidate schema nodes of every open
container.  It reports events to an optional callback:

* ``("point", cursor)`` -- a decision point: a value, a key or the separator
  after a value is expected next (see :func:`signature`);
* ``("value", cursor, start, end)`` -- a value ended; ``cursor`` is the state
  before the value was closed, ``start:end`` its byte span.

Worked example::

    >>> c = advance(Cursor(), b'{"a":[1,')
    >>> c.mode == ARR_NEXT, value_path(c)
    (True, (b'a', 1))
    >>> signature(c)
    ('V', (b'a', None))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from .schema_nav import Nodes, SchemaIndex

__all__ = [
    "Cursor",
    "Frame",
    "advance",
    "end_scalar",
    "signature",
    "value_path",
    "value_nodes",
    "normalize",
    "VALUE",
    "ARR_FIRST",
    "ARR_NEXT",
    "OBJ_FIRST",
    "OBJ_NEXT",
    "KEY",
    "COLON",
    "STRING",
    "SCALAR",
    "AFTER",
    "DONE",
    "ERROR",
    "VALUE_MODES",
    "KEY_MODES",
]

# Modes: what the next byte may be.
VALUE = 0  # a value (document start, after ':')
ARR_FIRST = 1  # a value or ']' (after '[')
ARR_NEXT = 2  # a value (after ',' in an array)
OBJ_FIRST = 3  # a key or '}' (after '{')
OBJ_NEXT = 4  # a key (after ',' in an object)
KEY = 5  # inside a key string
COLON = 6  # ':' after a key
STRING = 7  # inside a string value
SCALAR = 8  # inside a number or literal
AFTER = 9  # ',' or the closing bracket, after a value in a container
DONE = 10  # the top-level value is complete
ERROR = 11  # not JSON: nothing more is tracked

VALUE_MODES = frozenset({VALUE, ARR_FIRST, ARR_NEXT})
KEY_MODES = frozenset({OBJ_FIRST, OBJ_NEXT})
_WS = frozenset(b" \t\n\r")
_SCALAR_START = frozenset(b"-0123456789tfn")
_SCALAR_BODY = frozenset(b"0123456789+-.eEtruefalsn")

Path = tuple[Any, ...]  # keys (bytes) and array indices (int)


class Frame(NamedTuple):
    """An open container."""

    kind: int  # ord('{') or ord('[')
    path: Path  # where the container sits in the document
    nodes: Nodes  # candidate schemas of the container
    start: int  # offset of its opening bracket
    key: bytes | None = None  # object: the key being filled (or just filled)
    keys: tuple[bytes, ...] = ()  # object: keys seen so far, in order
    completed: int = 0  # array: elements completed; object: members completed


class Cursor(NamedTuple):
    """An immutable position in a JSON document."""

    mode: int = VALUE
    stack: tuple[Frame, ...] = ()
    tok: bytes = b""  # partial key/string content (raw, escaped) or scalar text
    esc: bool = False  # inside a string, right after a backslash
    offset: int = 0  # bytes consumed
    anchor: int = 0  # offset of the latest decision point
    vstart: int = 0  # offset where the current scalar value began


def normalize(path: Path) -> Path:
    """Array indices -> ``None``: every element of an array shares a path."""
    return tuple([None if isinstance(p, int) else p for p in path])


def value_path(cursor: Cursor) -> Path:
    """Path of the value expected or being typed at ``cursor``."""
    if not cursor.stack:
        return ()
    top = cursor.stack[-1]
    if top.kind == 0x7B:  # '{'
        return top.path + (top.key,)
    return top.path + (top.completed,)


def value_nodes(cursor: Cursor, schema: SchemaIndex | None) -> Nodes:
    """Candidate schemas of the value expected or being typed at ``cursor``."""
    if schema is None:
        return ()
    if not cursor.stack:
        return schema.root
    top = cursor.stack[-1]
    if top.kind == 0x7B:
        return schema.object_child(top.nodes, top.key) if top.key is not None else ()
    return schema.array_child(top.nodes, top.completed)


def signature(cursor: Cursor) -> tuple[Any, ...] | None:
    """What kind of decision the cursor faces, independent of array indices.

    ``('V', path)`` a value at ``path``; ``('K', object_path, previous_key)``
    a key; ``('A', container_path, key)`` the separator after a value.
    ``None`` in the middle of a token.
    """
    mode = cursor.mode
    if mode in VALUE_MODES:
        return ("V", normalize(value_path(cursor)))
    if not cursor.stack:
        return None
    top = cursor.stack[-1]
    if mode in KEY_MODES:
        return ("K", normalize(top.path), top.keys[-1] if top.keys else None)
    if mode == AFTER:
        return ("A", normalize(top.path), top.key if top.kind == 0x7B else None)
    return None


Events = Callable[..., None]


def advance(cursor: Cursor, data: bytes, schema: SchemaIndex | None = None, on_event: Events | None = None) -> Cursor:
    """The cursor after ``data``.  Pure; events go to ``on_event`` if given.

    Byte by byte (:func:`_step`), except that a run of plain bytes inside a
    key or string (no quote, no backslash, no pending escape) is taken at
    once: byte by byte it would only append to ``tok`` and move ``offset``.
    """
    c = cursor
    i, n = 0, len(data)
    while i < n:
        mode = c.mode
        if mode == ERROR:
            return c
        if (mode == STRING or mode == KEY) and not c.esc:
            j = _string_run_end(data, i)
            if j > i:
                c = c._replace(tok=c.tok + data[i:j], offset=c.offset + (j - i))
                i = j
                continue
        c = _step(c, data[i], schema, on_event)
        i += 1
    return c


def _string_run_end(data: bytes, i: int) -> int:
    """The end of the run of bytes from ``i`` that are neither a quote nor a backslash."""
    quote, backslash = data.find(b'"', i), data.find(b"\\", i)
    ends = [e for e in (quote, backslash) if e >= 0]
    return min(ends) if ends else len(data)


def end_scalar(cursor: Cursor, schema: SchemaIndex | None = None) -> Cursor:
    """The cursor after the number or literal being typed ends here (no byte consumed).

    A scalar ends only when the next byte is not part of it; this answers
    "what if it ended now".  Cursors in other modes are returned unchanged.
    """
    if cursor.mode != SCALAR:
        return cursor
    return _end_value(cursor, cursor.vstart, cursor.offset, schema, None, cursor.tok)


def _point(c: Cursor, on_event: Events | None) -> Cursor:
    c = c._replace(anchor=c.offset)
    if on_event is not None:
        on_event("point", c)
    return c


def _step(c: Cursor, b: int, schema: SchemaIndex | None, on_event: Events | None) -> Cursor:
    mode = c.mode
    if mode in (KEY, STRING):
        if c.esc:
            return c._replace(tok=c.tok + bytes((b,)), esc=False, offset=c.offset + 1)
        if b == 0x5C:  # backslash
            return c._replace(tok=c.tok + b"\\", esc=True, offset=c.offset + 1)
        if b != 0x22:  # not the closing quote
            return c._replace(tok=c.tok + bytes((b,)), offset=c.offset + 1)
        if mode == KEY:
            top = c.stack[-1]
            nodes = schema.filter_by_key(top.nodes, c.tok) if schema is not None else top.nodes
            top = top._replace(key=c.tok, keys=top.keys + (c.tok,), nodes=nodes)
            return c._replace(mode=COLON, stack=c.stack[:-1] + (top,), tok=b"", offset=c.offset + 1)
        c = c._replace(offset=c.offset + 1)
        return _end_value(c, c.vstart, c.offset, schema, on_event, b'"' + c.tok + b'"')
    if mode == SCALAR:
        if b in _SCALAR_BODY:
            return c._replace(tok=c.tok + bytes((b,)), offset=c.offset + 1)
        c = _end_value(c, c.vstart, c.offset, schema, on_event, c.tok)
        return _step(c, b, schema, on_event) if c.mode != ERROR else c
    if b in _WS:
        return c._replace(offset=c.offset + 1)
    offset = c.offset + 1
    if mode in VALUE_MODES:
        if b == 0x7B or b == 0x5B:  # '{' or '['
            frame = Frame(kind=b, path=value_path(c), nodes=value_nodes(c, schema), start=c.offset)
            new_mode = OBJ_FIRST if b == 0x7B else ARR_FIRST
            return _point(c._replace(mode=new_mode, stack=c.stack + (frame,), offset=offset), on_event)
        if b == 0x22:
            return c._replace(mode=STRING, tok=b"", esc=False, vstart=c.offset, offset=offset)
        if b in _SCALAR_START:
            return c._replace(mode=SCALAR, tok=bytes((b,)), vstart=c.offset, offset=offset)
        if b == 0x5D and mode == ARR_FIRST:  # ']' closes an empty array
            return _close(c._replace(offset=offset), schema, on_event)
        return c._replace(mode=ERROR)
    if mode in KEY_MODES:
        if b == 0x22:
            return c._replace(mode=KEY, tok=b"", esc=False, offset=offset)
        if b == 0x7D and mode == OBJ_FIRST:  # '}' closes an empty object
            return _close(c._replace(offset=offset), schema, on_event)
        return c._replace(mode=ERROR)
    if mode == COLON:
        if b == 0x3A:
            return _point(c._replace(mode=VALUE, offset=offset), on_event)
        return c._replace(mode=ERROR)
    if mode == AFTER:
        top = c.stack[-1]
        if b == 0x2C:  # ','
            return _point(c._replace(mode=OBJ_NEXT if top.kind == 0x7B else ARR_NEXT, offset=offset), on_event)
        if (b == 0x7D and top.kind == 0x7B) or (b == 0x5D and top.kind == 0x5B):
            return _close(c._replace(offset=offset), schema, on_event)
        return c._replace(mode=ERROR)
    return c._replace(mode=ERROR)  # DONE: nothing may follow


def _close(c: Cursor, schema: SchemaIndex | None, on_event: Events | None) -> Cursor:
    """Pop the container whose closing bracket was just consumed."""
    frame = c.stack[-1]
    c = c._replace(stack=c.stack[:-1])
    return _end_value(c, frame.start, c.offset, schema, on_event)


def _end_value(
    c: Cursor,
    start: int,
    end: int,
    schema: SchemaIndex | None,
    on_event: Events | None,
    scalar: bytes | None = None,
) -> Cursor:
    """A value spanning ``start:end`` is complete; move to what follows it.

    ``scalar``: the value's JSON text when it is a string, number or literal
    (it tells ``anyOf`` branches apart by their ``const``/``enum``).
    """
    if on_event is not None:
        on_event("value", c, start, end)
    c = c._replace(tok=b"", esc=False)
    if not c.stack:
        return c._replace(mode=DONE, anchor=c.offset)
    top = c.stack[-1]
    top = top._replace(completed=top.completed + 1)
    if scalar is not None and schema is not None and top.kind == 0x7B and top.key is not None:
        top = top._replace(nodes=schema.filter_by_value(top.nodes, top.key, scalar))
    c = c._replace(mode=AFTER, stack=c.stack[:-1] + (top,))
    return _point(c, on_event)
