"""Tool calls streamed as they are generated: OpenAI's ``tool_calls[i].function.arguments`` deltas.  Pure.

A JSON-format reply is ``{"name":"f","arguments":{...}}`` (or an array of
them with ``parallel_tool_calls``), written compactly under the grammar.  The
finished message carries each call's arguments as ``json.dumps(arguments,
ensure_ascii=False)`` (:func:`grammarspec.tool_calls.parse_tool_reply`), so
the deltas are that same text, produced prefix by prefix from the generated
one (:func:`normalized_prefix`): a client that concatenates the deltas gets
exactly the non-streamed call.

Worked example::

    >>> s = ToolCallStream(["call_1"])
    >>> s.feed('{"name":"add","arguments":{"a":1')
    [{'index': 0, 'id': 'call_1', 'type': 'function', 'function': {'name': 'add', 'arguments': ''}}, \
{'index': 0, 'function': {'arguments': '{"a": '}}]
    >>> s.feed('{"name":"add","arguments":{"a":12,"b":3}}')
    [{'index': 0, 'function': {'arguments': '12, "b": 3}'}}]
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

__all__ = ["ToolCallStream", "normalized_prefix", "call_prefixes"]

_NUMBER = re.compile(r"-?[0-9][0-9.eE+\-]*")
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')
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

    A call appears once its name is complete; its arguments grow as ``text`` does.
    """
    stripped = text.lstrip()
    array = stripped.startswith("[")
    pos = 1 if array else 0
    calls: list[tuple[str, str]] = []
    while True:
        m = _HEADER.match(stripped, pos)
        if m is None:
            return calls
        name = json.loads(m.group(1))
        rest = stripped[m.end() :]
        end = _value_end(rest)
        calls.append((name, rest if end is None else rest[:end]))
        if end is None or not array:
            return calls
        pos = m.end() + end
        tail = re.compile(r"\s*\}\s*,\s*").match(stripped, pos)
        if tail is None:
            return calls
        pos = tail.end()


class ToolCallStream:
    """What has been sent of one choice's calls; :meth:`feed` gives the new deltas, :meth:`finish` the rest.

    ``ids``: the ids the calls get, in order (the finished message uses the same, :meth:`call_ids`); default:
    ``call_`` and 24 random hex digits each.
    """

    def __init__(self, ids: Sequence[str] | None = None) -> None:
        self.ids = list(ids) if ids is not None else []
        self.sent: list[str] = []  # arguments text sent per call

    def call_ids(self, count: int) -> list[str]:
        """The first ``count`` call ids (made as needed; the same on every call).  Changes state."""
        while len(self.ids) < count:
            self.ids.append(f"call_{uuid.uuid4().hex[:24]}")
        return self.ids[:count]

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Deltas for what ``text`` (the reply so far) adds.  Changes what counts as sent."""
        deltas: list[dict[str, Any]] = []
        for index, (name, raw) in enumerate(call_prefixes(text)):
            if index == len(self.sent):
                self.sent.append("")
                deltas.append(
                    {
                        "index": index,
                        "id": self.call_ids(index + 1)[index],
                        "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }
                )
            arguments, _ = normalized_prefix(raw)
            if arguments.startswith(self.sent[index]) and len(arguments) > len(self.sent[index]):
                deltas.append({"index": index, "function": {"arguments": arguments[len(self.sent[index]) :]}})
                self.sent[index] = arguments
        return deltas

    def finish(self, tool_calls: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The deltas that complete the finished message's ``tool_calls`` from what was sent.  Changes state."""
        deltas: list[dict[str, Any]] = []
        for index, call in enumerate(tool_calls):
            arguments = call["function"]["arguments"]
            if index == len(self.sent):
                self.sent.append("")
                deltas.append(
                    {
                        "index": index,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": ""},
                    }
                )
            sent = self.sent[index]
            if not arguments.startswith(sent):  # cannot happen for a reply that parses (the deltas are its prefix)
                raise ValueError(f"streamed arguments {sent!r} are not a prefix of {arguments!r}")
            if len(arguments) > len(sent):
                deltas.append({"index": index, "function": {"arguments": arguments[len(sent) :]}})
                self.sent[index] = arguments
        return deltas
