"""A JSON-format tool-call reply read before it is complete: while it streams, or after ``max_tokens`` cut it.  Pure.

A JSON-format reply is ``{"name":"f","arguments":{...}}`` (or an array of
them with ``parallel_tool_calls``), written compactly under the grammar.  A
finished call's arguments are ``json.dumps(arguments, ensure_ascii=False)``
(:func:`grammarspec.tool_calls.parse_tool_reply`); :func:`normalized_prefix`
gives that text prefix by prefix from the generated one, which is what a
stream sends (:class:`grammarspec.serve.tool_stream.ToolCallStream`), and
:func:`cut_arguments` what a reply cut short ends with, so the deltas of a
stream always add up to the finished message.
"""

from __future__ import annotations

import json
import re

__all__ = ["call_begun", "call_prefixes", "compact_prefix", "cut_arguments", "normalized_prefix"]

_NUMBER = re.compile(r"-?[0-9][0-9.eE+\-]*")
_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")')
_ARGUMENTS = re.compile(r'\s*,\s*"arguments"\s*:\s*')
_LITERALS = ("true", "false", "null")


def _string_char(raw: str, i: int) -> tuple[str, int] | None:
    """The character at ``raw[i]`` inside a JSON string, as ``json.dumps`` writes it, and where the next begins."""
    c = raw[i]
    if c != "\\":
        return json.dumps(c, ensure_ascii=False)[1:-1], i + 1
    if i + 1 >= len(raw):
        return None
    if raw[i + 1] != "u":
        return json.dumps(json.loads(f'"{raw[i : i + 2]}"'), ensure_ascii=False)[1:-1], i + 2
    if i + 6 > len(raw):
        return None
    code = int(raw[i + 2 : i + 6], 16)
    end = i + 6
    if 0xD800 <= code < 0xDC00:  # a high surrogate pairs with a following low one
        rest = raw[end : end + 6]
        if len(rest) < 6 and ("\\u".startswith(rest) or rest.startswith("\\u")):  # the reply goes on
            return None
        if rest.startswith("\\u") and 0xDC00 <= int(rest[2:6], 16) < 0xE000:
            end += 6
    return json.dumps(json.loads(f'"{raw[i:end]}"'), ensure_ascii=False)[1:-1], end


def normalized_prefix(raw: str) -> tuple[str, int]:
    """``json.dumps(json.loads(v), ensure_ascii=False)``'s text for the longest prefix of ``raw`` it is sure of.

    ``raw``: a prefix of a JSON value's text.  Returns the normalised text and
    how many characters of ``raw`` it covers; an unfinished number, literal or
    escape is held back.  Pure.

        >>> normalized_prefix('{"a":[1,2.50,"x\\\\u00e9"],"b":1')
        ('{"a": [1, 2.5, "xé"], "b": ', 28)
    """
    out: list[str] = []
    i, n = 0, len(raw)
    in_string = False
    while i < n:
        c = raw[i]
        if in_string:
            if c == '"':
                out.append('"')
                in_string = False
                i += 1
                continue
            step = _string_char(raw, i)
            if step is None:
                break
            out.append(step[0])
            i = step[1]
        elif c == '"':
            out.append('"')
            in_string = True
            i += 1
        elif c in "{}[]":
            out.append(c)
            i += 1
        elif c in ",:":
            out.append(c + " ")
            i += 1
        elif c.isspace():
            i += 1
        elif c == "-" or c.isdigit():
            m = _NUMBER.match(raw, i)
            if m is None or m.end() == n:  # may go on
                break
            out.append(json.dumps(json.loads(m.group())))
            i = m.end()
        else:
            word = next((w for w in _LITERALS if w.startswith(c)), None)
            if word is None or not raw.startswith(word, i):
                break  # unfinished (or not JSON: nothing more is sent before the end)
            out.append(word)
            i += len(word)
    return "".join(out), i


def _value_end(raw: str) -> int | None:
    """Where the JSON value at the start of ``raw`` ends (container or string), or ``None`` while it is open."""
    depth, in_string, escaped = 0, False, False
    for i, c in enumerate(raw):
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
                if depth == 0:
                    return i + 1
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        elif depth == 0 and not c.isspace():
            m = _NUMBER.match(raw, i)
            word = next((w for w in _LITERALS if raw.startswith(w, i)), None)
            end = m.end() if m else i + len(word) if word else None
            return end if end is not None and end < len(raw) else None
    return None


def call_prefixes(text: str) -> list[tuple[str, str]]:
    """The calls begun in a JSON-format reply so far: ``(name, raw arguments so far)``, names complete.  Pure.

    A call appears once its name is complete (its arguments ``""`` until the
    ``"arguments":`` key is written); its arguments grow as ``text`` does.

        >>> call_prefixes('{"name":"add","argu')
        [('add', '')]
        >>> call_prefixes('[{"name":"a","arguments":{}},{"name":"b","arguments":{"x":1')
        [('a', '{}'), ('b', '{"x":1')]
    """
    stripped = text.lstrip()
    array = stripped.startswith("[")
    pos = 1 if array else 0
    calls: list[tuple[str, str]] = []
    while True:
        m = _NAME.match(stripped, pos)
        if m is None:
            return calls
        name = json.loads(m.group(1))
        key = _ARGUMENTS.match(stripped, m.end())
        if key is None:  # the "arguments" key is still to come
            calls.append((name, ""))
            return calls
        rest = stripped[key.end() :]
        end = _value_end(rest)
        calls.append((name, rest if end is None else rest[:end]))
        if end is None or not array:
            return calls
        pos = key.end() + end
        tail = re.compile(r"\s*\}\s*,\s*").match(stripped, pos)
        if tail is None:
            return calls
        pos = tail.end()


def call_begun(text: str) -> bool:
    """Whether ``text`` is the start of a JSON-format call that has not reached its name's end.  Pure.

    ``{"na`` and ``[{"name":"get_w`` are; plain text (`` {abc``, ``Hello``) is not.

        >>> call_begun('{"name":"get_w'), call_begun('[{'), call_begun(' {abc'), call_begun('')
        (True, True, False, False)
    """
    rest = text.lstrip()
    if not rest:
        return False
    if rest.startswith("["):
        rest = rest[1:]
    for piece in ("{", '"name"', ":", '"'):
        rest = rest.lstrip()
        if not rest:
            return True
        if not rest.startswith(piece):
            return piece.startswith(rest)
        rest = rest[len(piece) :]
    return True


def cut_arguments(raw: str) -> str:
    """The arguments of a call cut short, as the finished message gives them.  Pure.

    :func:`normalized_prefix`'s text (what a stream has sent of them, at most)
    followed by the rest of ``raw`` as written (an unfinished number, literal
    or escape), so a client that concatenates the deltas gets exactly this.

        >>> cut_arguments('{"a":[1,2.50],"b":12')
        '{"a": [1, 2.5], "b": 12'
    """
    text, covered = normalized_prefix(raw)
    return text + raw[covered:]


def compact_prefix(text: str) -> str:
    """A prefix of JSON text without the blanks outside its strings (as the compact grammar writes it).  Pure.

    >>> compact_prefix('{"a": [1, 2], "b": "x y')
    '{"a":[1,2],"b":"x y'
    """
    out: list[str] = []
    in_string = escaped = False
    for c in text:
        if in_string:
            escaped = not escaped and c == "\\"
            if c == '"' and not escaped:
                in_string = False
        elif c == '"':
            in_string = True
        elif c.isspace():
            continue
        out.append(c)
    return "".join(out)
