"""The model call formats xgrammar knows (``"qwen_3"``, ``"llama"``, ``"harmony"``, ...): their structural tags.

A model format's calls are written between the begin and end strings of its
structural tag (``xgrammar.builtin_structural_tag``), each naming its tool.
:func:`call_tags` reads those strings, :func:`parse_tagged` and
:func:`parse_tagged_cut` read the calls of a whole or a cut reply by them, and
:func:`compact_arguments` makes a tag's JSON arguments compact.  The public
side (the constraint, the reply as an OpenAI message, the chat template's
messages) is :mod:`grammarspec.tool_calls`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ToolCallError", "call_tags", "compact_arguments", "parse_tagged", "parse_tagged_cut", "tag_formats"]


class ToolCallError(ValueError):
    """Tools, ``tool_choice`` or a tool message that cannot be honoured."""


def compact_arguments(fmt: Any) -> None:
    """Make every JSON-schema content of a structural tag compact JSON.  Changes ``fmt`` in place.

    xgrammar's model formats allow any whitespace inside the arguments (a
    random or weak model then writes blanks until the token limit).  Each
    ``json_schema`` content of style ``json`` becomes the schema's grammar
    without free whitespace, with the separators the format's own fixed text
    uses (``{"name": "f", "arguments": `` in Qwen's: ``", "`` and ``": "``,
    as its chat template's ``tojson`` writes them).
    """
    import xgrammar as xgr
    from xgrammar.structural_tag import GrammarFormat, JSONSchemaFormat

    spaced = any('": ' in str(getattr(tag, "begin", "")) for tag in tag_formats(fmt))
    separators = (", ", ": ") if spaced else (",", ":")
    for name, value in vars(fmt).items():
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if isinstance(item, JSONSchemaFormat) and item.style == "json" and not item.any_order:
                schema = item.json_schema if isinstance(item.json_schema, str) else json.dumps(item.json_schema)
                grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=False, separators=separators)
                compact = GrammarFormat(grammar=str(grammar))
                if isinstance(value, list):
                    value[i] = compact
                else:
                    setattr(fmt, name, compact)
            elif hasattr(item, "type") and hasattr(item, "model_fields"):
                compact_arguments(item)


def call_tags(tools: Sequence[Mapping[str, Any]], tool_format: str) -> dict[str, tuple[str, str]]:
    """``begin -> (tool name, end)`` of a model format's call tags (its structural tag's)."""
    from xgrammar.builtin_structural_tag import get_model_structural_tag

    tag = get_model_structural_tag(
        tool_format, tools=[dict(t) for t in tools], tool_choice="auto", reasoning="disabled"
    )
    tags = {}
    for item in tag_formats(tag.format):
        name = _tool_named(item.begin, tools)
        if name is not None and isinstance(item.begin, str):
            tags[item.begin] = (name, item.end if isinstance(item.end, str) else item.end[0])
    return tags


def parse_tagged(
    text: str, tools: Sequence[Mapping[str, Any]], tool_format: str
) -> tuple[str | None, list[tuple[str, Any]]]:
    """Calls written in a model format: found by the begin/end strings of its structural tag."""
    pieces, calls, _ = _read_tagged(text, call_tags(tools, tool_format), cut=False)
    content = pieces.strip()
    return (content or None) if calls else text, calls


def parse_tagged_cut(
    text: str, tools: Sequence[Mapping[str, Any]], tool_format: str
) -> tuple[str | None, list[tuple[str, str]]]:
    """A model-format reply cut short: its complete calls, the cut one (begin tag complete) and the text.

    A begin tag names its tool, so a call whose begin tag is complete has its
    name; text that ends inside a begin tag is a call cut inside its name and
    is dropped.
    """
    from grammarspec.partial_calls import cut_arguments

    joined, complete, cut = _read_tagged(text, call_tags(tools, tool_format), cut=True)
    calls = [(name, json.dumps(arguments, ensure_ascii=False)) for name, arguments in complete]
    if cut is not None:
        calls.append((cut[0], cut_arguments(cut[1])))
    if not calls:
        return joined if joined or not text else None, calls
    return joined.strip() or None, calls


def _read_tagged(
    text: str, tags: Mapping[str, tuple[str, str]], *, cut: bool
) -> tuple[str, list[tuple[str, Any]], tuple[str, str] | None]:
    """``(the text outside the calls, the complete calls with their parsed arguments, the cut call)``.

    Each call is found by the earliest begin tag (``tags``: begin -> (tool name,
    end)); its arguments are the JSON value after it, and its end tag is
    skipped.  ``cut``: the text may end anywhere -- inside a begin tag (that
    part is dropped), inside a call's arguments (the cut call: its name and the
    text written after its begin tag) or inside an end tag; otherwise arguments
    that are not complete JSON raise :class:`ToolCallError`.
    """
    decoder = json.JSONDecoder()
    calls: list[tuple[str, Any]] = []
    pieces: list[str] = []
    pos = 0
    while True:
        found = [(text.find(begin, pos), begin) for begin in tags if text.find(begin, pos) >= 0]
        if not found:
            rest = text[pos:]
            if cut:  # drop a begin tag the text ends inside
                rest = rest[
                    : min((i for i in range(len(rest)) if any(b.startswith(rest[i:]) for b in tags)), default=None)
                ]
            pieces.append(rest)
            return "".join(pieces), calls, None
        start, begin = min(found)
        pieces.append(text[pos:start])
        name, end = tags[begin]
        body = start + len(begin)
        try:
            arguments, stop = decoder.raw_decode(text, body)
        except json.JSONDecodeError:
            if not cut:
                raise ToolCallError(f"the {name!r} call is not complete JSON; raise max_new_tokens") from None
            return "".join(pieces), calls, (name, text[body:])  # the cut call: the last thing in the text
        calls.append((name, arguments))
        if cut and end.startswith(text[stop:]):  # cut inside the call's end tag
            return "".join(pieces), calls, None
        pos = stop + len(end) if text.startswith(end, stop) else stop


def tag_formats(fmt: Any) -> list[Any]:
    """Every ``TagFormat`` inside a structural-tag format, outermost first."""
    from xgrammar.structural_tag import TagFormat

    found = [fmt] if isinstance(fmt, TagFormat) else []
    for value in vars(fmt).values():
        for item in value if isinstance(value, list) else [value]:
            if hasattr(item, "type") and hasattr(item, "model_fields"):
                found += tag_formats(item)
    return found


def _tool_named(begin: Any, tools: Sequence[Mapping[str, Any]]) -> str | None:
    if not isinstance(begin, str):
        return None
    names = [t.get("function", t)["name"] for t in tools]
    hits = [n for n in names if n in begin]
    return max(hits, key=len) if hits else None
