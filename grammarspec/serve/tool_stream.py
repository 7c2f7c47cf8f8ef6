"""Tool calls streamed as they are generated: OpenAI's ``tool_calls[i].function.arguments`` deltas.  Pure.

A JSON-format reply is ``{"name":"f","arguments":{...}}`` (or an array of
them with ``parallel_tool_calls``), written compactly under the grammar.  The
finished message carries each call's arguments as ``json.dumps(arguments,
ensure_ascii=False)`` (:func:`grammarspec.tool_calls.parse_tool_reply`), so
the deltas are that same text, produced prefix by prefix from the generated
one (:func:`normalized_prefix`): a client that concatenates the deltas gets
exactly the non-streamed call.  A reply cut by ``max_tokens`` keeps its calls
(:func:`grammarspec.tool_calls.parse_cut_reply`): :meth:`ToolCallStream.finish`
sends the rest of their cut arguments, so the deltas add up to the cut call too.

Worked example::

    >>> s = ToolCallStream(["call_1"])
    >>> s.feed('{"name":"add","arguments":{"a":1')
    [{'index': 0, 'id': 'call_1', 'type': 'function', 'function': {'name': 'add', 'arguments': ''}}, \
{'index': 0, 'function': {'arguments': '{"a": '}}]
    >>> s.feed('{"name":"add","arguments":{"a":12,"b":3}}')
    [{'index': 0, 'function': {'arguments': '12, "b": 3}'}}]
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from grammarspec.partial_calls import call_prefixes, normalized_prefix

__all__ = ["ToolCallStream", "normalized_prefix", "call_prefixes"]


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
        if text.endswith("\ufffd"):  # a character whose bytes are not all there yet: it may still change
            text = text[:-1]
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
            if not arguments.startswith(sent):  # cannot happen: the deltas are a prefix of the finished arguments
                raise ValueError(f"streamed arguments {sent!r} are not a prefix of {arguments!r}")
            if len(arguments) > len(sent):
                deltas.append({"index": index, "function": {"arguments": arguments[len(sent) :]}})
                self.sent[index] = arguments
        return deltas
