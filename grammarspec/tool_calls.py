"""OpenAI-style tool calls: the constraint for one assistant turn, and the calls out of its text.

Three pure steps, used by :class:`grammarspec.Conversation` and usable alone:

* :func:`tool_constraint` -- ``tools`` + ``tool_choice`` + ``parallel_tool_calls``
  -> the keyword arguments for :func:`grammarspec.generate` (``tools=``,
  ``grammar=`` or nothing).  ``tool_choice`` is read by xgrammar's
  ``normalize_tool_choice`` (``"auto"``, ``"required"``, ``"none"``, or
  ``{"type": "function", "function": {"name": ...}}``).
* :func:`parse_tool_reply` -- the generated text -> an OpenAI assistant message
  ``{"role": "assistant", "content": ..., "tool_calls": [{"id", "type":
  "function", "function": {"name", "arguments": <JSON string>}}]}``.
* :func:`chat_messages` -- OpenAI-format messages -> what the chat template
  renders.

Two call formats (``tool_format``):

* ``"json"`` -- for chat templates without a tool-call format (SmolLM2's): the
  call grammarspec has always written, ``{"name": ..., "arguments": {...}}``
  in compact JSON (a JSON array of them with ``parallel_tool_calls``).  Under
  ``"auto"`` the reply is either exactly that or plain text that does not
  start with ``{`` or ``[``: an xgrammar structural tag (``OrFormat``) over the
  compact call grammar and free text.  The tools are described in the system
  message (:func:`describe_tools`); an assistant message with ``tool_calls``
  is rendered back as the call's JSON, so the next turn's prompt repeats the
  tokens the model wrote.
* any model format xgrammar knows (``"qwen_3"``, ``"llama"``, ``"harmony"``,
  ... -- ``xgrammar.builtin_structural_tag``): xgrammar's
  ``get_model_structural_tag`` builds the grammar (text or call, reasoning
  off), the chat template renders the tools and the calls itself, and calls
  are read back by the tags of that structural tag (formats whose arguments
  are JSON; :mod:`grammarspec.tool_formats`).  ``"auto"`` picks the format from the chat template: ``"json"``
  when the template does not use ``tools``.

Worked example (``"json"``, pure functions)::

    >>> tools = [{"type": "function", "function": {"name": "get_weather",
    ...           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    >>> tool_constraint(tools, "required")  # doctest: +ELLIPSIS
    {'tools': [...], 'parallel_tool_calls': False}
    >>> parse_tool_reply('{"name":"get_weather","arguments":{"city":"Oslo"}}', tools, "json", ["call_0"])
    ... # doctest: +NORMALIZE_WHITESPACE
    {'role': 'assistant', 'content': None, 'tool_calls': [{'id': 'call_0', 'type': 'function',
     'function': {'name': 'get_weather', 'arguments': '{"city": "Oslo"}'}}]}
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from grammars import GrammarError, tools_schema
from grammarspec.tool_formats import ToolCallError, compact_arguments, parse_tagged, parse_tagged_cut

__all__ = [
    "NO_TOOL_NOTE",
    "ToolCallError",
    "add_note",
    "call_json",
    "chat_messages",
    "describe_tools",
    "earlier_documents",
    "history_text",
    "parse_cut_reply",
    "parse_tool_reply",
    "prompt_text",
    "template_renders_tools",
    "tool_constraint",
    "tool_format_for",
]

#: Chat-template markers of the model formats xgrammar builds structural tags for.
_TEMPLATE_MARKERS = (("<|python_tag|>", "llama"), ("<tool_call>", "qwen_3"), ("<|tool_calls_section_begin|>", "kimi"))


def tool_format_for(tokenizer: Any, tool_format: str = "auto") -> str:
    """The call format to use with ``tokenizer``'s chat template.  Pure.

    ``"auto"``: ``"json"`` when the template does not use ``tools`` (it has no
    native format), else the xgrammar format its markers name; a
    tool-aware template with markers we do not know is refused (pass the
    format, or ``"json"``).
    """
    if tool_format != "auto":
        _check_format(tool_format)
        return tool_format
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, Mapping):
        template = str(template.get("tool_use") or template.get("default") or "")
    if "tools" not in template:
        return "json"
    for marker, name in _TEMPLATE_MARKERS:
        if marker in template:
            return name
    raise ToolCallError(
        "the chat template renders tools in a format grammarspec cannot name; pass tool_format= one of "
        "xgrammar's model formats (e.g. 'qwen_3', 'llama', 'harmony'), or tool_format='json' for "
        "grammarspec's JSON call"
    )


def _check_format(tool_format: str) -> None:
    if tool_format == "json":
        return
    from xgrammar.builtin_structural_tag import _structural_tag_registry

    if tool_format not in _structural_tag_registry:
        known = ", ".join(["json", *sorted(_structural_tag_registry)])
        raise ToolCallError(f"unknown tool_format {tool_format!r}; choose 'auto' or one of {known}")


def _normalize(tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any) -> tuple[list[dict[str, Any]], str]:
    """``(tools offered this turn, "auto" | "required" | "forced")`` via xgrammar's reading of OpenAI's rules."""
    from pydantic import ValidationError
    from xgrammar.builtin_structural_tag import normalize_tool_choice

    if (tool_choice == "required" or isinstance(tool_choice, Mapping)) and not tools:
        raise ToolCallError(f"tool_choice={tool_choice!r} needs tools: pass tools=[...] or tool_choice='none'")
    try:
        functions, _builtin, mode = normalize_tool_choice([dict(t) for t in tools or []], tool_choice)
    except (ValueError, ValidationError) as e:
        raise ToolCallError(
            f"tool_choice={tool_choice!r} cannot be used with these tools ({str(e).splitlines()[0]}); pass "
            "'auto', 'required', 'none' or {'type': 'function', 'function': {'name': <one of the tools>}}"
        ) from None
    offered = {f.function.name for f in functions}
    chosen = [dict(t) for t in (tools or []) if t.get("function", t).get("name") in offered]
    return chosen, mode


def tool_constraint(
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: Any = "auto",
    parallel_tool_calls: bool = False,
    tool_format: str = "json",
    any_whitespace: bool = False,
) -> dict[str, Any]:
    """Keyword arguments for :func:`grammarspec.generate` that make one assistant turn.  Pure.

    ``{}``: free text (no tools, or ``tool_choice="none"``); ``{"tools": ...,
    "parallel_tool_calls": ...}``: exactly one call (or a list) in the JSON
    format -- ``"required"`` and a named function; ``{"grammar": <EBNF>}``:
    text or call(s), or any model format, from an xgrammar structural tag.
    A model format's arguments are compact JSON unless ``any_whitespace``
    (:func:`grammarspec.tool_formats.compact_arguments`).
    """
    chosen, mode = _normalize(tools, tool_choice)
    if not chosen:
        return {}
    if tool_format == "json":
        if mode in ("required", "forced"):
            return {"tools": chosen, "parallel_tool_calls": bool(parallel_tool_calls)}
        return {"grammar": _text_or_call_ebnf(tools_schema(chosen, parallel=bool(parallel_tool_calls)))}
    import xgrammar as xgr
    from xgrammar.builtin_structural_tag import get_model_structural_tag

    choice: Any = "auto" if mode == "auto" else "required"
    if mode == "forced":
        choice = {"type": "function", "function": {"name": chosen[0]["function"]["name"]}}
    tag = get_model_structural_tag(
        tool_format,
        tools=list[Any](chosen),
        tool_choice=choice,
        reasoning="disabled",
        parallel_tool_calls=bool(parallel_tool_calls),
    )
    if not any_whitespace:
        compact_arguments(tag.format)
    return {"grammar": str(xgr.Grammar.from_structural_tag(tag))}


def _text_or_call_ebnf(call_schema: dict[str, Any]) -> str:
    """EBNF of "the compact JSON call, or text that does not start with ``{``/``[``" (xgrammar structural tag)."""
    import xgrammar as xgr
    from xgrammar.structural_tag import (
        AnyTextFormat,
        GrammarFormat,
        OrFormat,
        RegexFormat,
        SequenceFormat,
        StructuralTag,
    )

    try:
        call = str(xgr.Grammar.from_json_schema(json.dumps(call_schema), any_whitespace=False, separators=(",", ":")))
    except RuntimeError as e:  # xgrammar's converter: a cycle with no content, an unsupported pattern, ...
        reason = str(e).strip().splitlines()[0].split("] ", 1)[-1]  # without its timestamp
        raise ToolCallError(
            f"the tools' parameters do not compile into a grammar (xgrammar: {reason.split(': ', 1)[-1]}); "
            "fix or simplify that part of the tool's parameters"
        ) from None
    text = SequenceFormat(elements=[RegexFormat(pattern="[^{\\[]"), AnyTextFormat()])
    return str(
        xgr.Grammar.from_structural_tag(StructuralTag(format=OrFormat(elements=[GrammarFormat(grammar=call), text])))
    )


# --- reading a reply ---------------------------------------------------------------------


def parse_tool_reply(
    text: str, tools: Sequence[Mapping[str, Any]] | None, tool_format: str, ids: Sequence[str]
) -> dict[str, Any]:
    """The OpenAI assistant message for the generated ``text``.  Pure.

    ``ids``: the ids to give the calls, in order (at least as many as calls).
    ``content`` is ``None`` when the reply is only calls; ``tool_calls`` is
    absent when there are none.  Raises :class:`ToolCallError` for a call
    that does not parse (only possible for output cut by ``max_new_tokens``).
    """
    calls: list[tuple[str, Any]] = []
    content: str | None = text
    if tools and tool_format == "json":
        stripped = text.strip()
        if stripped[:1] in ("{", "["):
            try:
                value = json.loads(stripped)
            except json.JSONDecodeError as e:
                raise ToolCallError(f"the tool call is not complete JSON ({e.msg}); raise max_new_tokens") from None
            calls = [(c["name"], c["arguments"]) for c in (value if isinstance(value, list) else [value])]
            content = None
    elif tools:
        content, calls = parse_tagged(text, tools, tool_format)
    return _message(content, [(name, json.dumps(arguments, ensure_ascii=False)) for name, arguments in calls], ids)


def parse_cut_reply(
    text: str, tools: Sequence[Mapping[str, Any]] | None, tool_format: str, ids: Sequence[str]
) -> dict[str, Any]:
    """The OpenAI assistant message for ``text`` cut short (``max_tokens``, a stop string).  Pure.

    As OpenAI returns a cut call: a call whose name is complete stays a call,
    its ``arguments`` the JSON written so far (not parseable;
    :func:`grammarspec.partial_calls.cut_arguments`).  A call cut inside its
    name (or before it) gives neither a call nor its text: ``content`` is
    ``None``.  Text before any call, and a reply that is plain text, stay
    ``content``.  ``ids`` as for :func:`parse_tool_reply`.
    """
    from grammarspec.partial_calls import call_begun, call_prefixes, cut_arguments

    calls: list[tuple[str, str]] = []
    content: str | None = text
    if tools and tool_format == "json":
        calls = [(name, cut_arguments(raw)) for name, raw in call_prefixes(text)]
        if calls or call_begun(text):
            content = None
    elif tools:
        content, calls = parse_tagged_cut(text, tools, tool_format)
    return _message(content, calls, ids)


def _message(content: str | None, calls: Sequence[tuple[str, str]], ids: Sequence[str]) -> dict[str, Any]:
    """The OpenAI assistant message of ``content`` and ``calls`` (name, arguments as JSON text), ids in order."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        if len(ids) < len(calls):
            raise ToolCallError(f"{len(calls)} calls but only {len(ids)} ids")
        message["tool_calls"] = [
            {"id": ids[i], "type": "function", "function": {"name": name, "arguments": arguments}}
            for i, (name, arguments) in enumerate(calls)
        ]
    return message


# --- writing the conversation for the chat template ----------------------------------------


def call_json(tool_calls: Sequence[Mapping[str, Any]]) -> str:
    """The JSON text of OpenAI ``tool_calls`` in the ``"json"`` format (as the grammar writes it).  Pure.

    >>> call_json([{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}])
    '{"name":"f","arguments":{"x":1}}'
    """
    calls = []
    for call in tool_calls:
        function = call.get("function") or {}
        arguments = function.get("arguments", "{}")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            raise ToolCallError(f"tool call {call.get('id')!r}: 'arguments' is not a JSON string") from None
        calls.append({"name": function.get("name"), "arguments": parsed})
    value: Any = calls[0] if len(calls) == 1 else calls
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def history_text(tool_calls: Sequence[Mapping[str, Any]]) -> str:
    """:func:`call_json`, or for calls cut short (arguments that do not parse) the text as far as it went.  Pure.

    How an assistant message's ``tool_calls`` read in the next turn's prompt
    (``"json"`` format): a cut call is written as the grammar wrote it, up to
    where it stopped.

    >>> history_text([{"function": {"name": "f", "arguments": '{"x": "Os'}}])
    '{"name":"f","arguments":{"x":"Os'
    """
    from grammarspec.partial_calls import compact_prefix

    try:
        return call_json(tool_calls)
    except ToolCallError:
        pass
    pieces = []
    for call in tool_calls:
        function = call.get("function") or {}
        arguments = function.get("arguments", "")
        head = '{"name":' + json.dumps(function.get("name"), ensure_ascii=False) + ',"arguments":'
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:  # the cut call: the last one written
            pieces.append(head + compact_prefix(arguments))
            break
        pieces.append(head + json.dumps(parsed, separators=(",", ":"), ensure_ascii=False) + "}")
    return ("[" if len(tool_calls) > 1 else "") + ",".join(pieces)


def earlier_documents(messages: Sequence[Any]) -> tuple[str, ...]:
    """The JSON documents of the assistant messages in ``messages``, oldest first.  Pure.

    A message's ``tool_calls`` give their :func:`call_json` (the text the
    ``"json"`` format's grammar writes); a ``content`` that is a JSON object or
    array gives itself.  What the schema n-gram drafter copies from in the
    next turn (``Request.documents``); anything else is skipped.

    >>> earlier_documents([{"role": "user", "content": "{}"}, {"role": "assistant", "content": ' {"a": 1}'},
    ...     {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1}'}}]}])
    ('{"a": 1}', '{"name":"f","arguments":{"x":1}}')
    """
    out = []
    for message in messages:
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            continue
        content = message.get("content")
        if message.get("tool_calls"):
            try:
                out.append(call_json(message["tool_calls"]))
            except (ToolCallError, TypeError, AttributeError):
                pass
        elif isinstance(content, str) and content.strip()[:1] in ("{", "["):
            try:
                json.loads(content)
            except ValueError:
                continue
            out.append(content.strip())
    return tuple(out)


#: What the last user message says in a ``tool_choice="none"`` turn of a conversation with tools.
NO_TOOL_NOTE = "Answer in plain text now; do not call a tool."


def add_note(rendered: list[dict[str, Any]], note: str) -> None:
    """Append ``note`` to the last user message of ``rendered`` (a rendered copy; a system message if none)."""
    for message in reversed(rendered):
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            message["content"] += "\n\n" + note
            return
    rendered.append({"role": "system", "content": note})


def prompt_text(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    tool_format: str,
    tool_choice: Any = "auto",
    *,
    describe: bool = False,
) -> str:
    """The chat template's text of ``messages`` with the assistant turn opened.  Pure.

    What :class:`grammarspec.Conversation` and the server both read.  The
    tools are offered as the format wants them: described in the system
    message (``"json"``, or ``describe``: a model format whose template drops
    ``tools=``), else given to the template as ``tools=``.  Under
    ``tool_choice="none"`` no tool is offered, so nothing in the prompt asks
    for a call (a template's tool section is its call format): the
    conversation renders as without tools (earlier calls and results stay
    in it) and the last user message gets :data:`NO_TOOL_NOTE`.
    """
    from grammarspec.templates import fit_messages

    offered = [dict(t) for t in tools] if tools and tool_choice != "none" else None
    rendered = chat_messages(messages, offered, tool_format)
    if tools and not offered:
        add_note(rendered, NO_TOOL_NOTE)
    if offered and describe and tool_format != "json":  # the template drops tools=: describe them ourselves
        description = describe_tools(offered)  # one text for "auto" and "required": the turns share the cache
        if rendered and rendered[0]["role"] == "system":
            rendered[0]["content"] += "\n\n" + description
        else:
            rendered.insert(0, {"role": "system", "content": description})
    extra = {"tools": offered} if offered and tool_format != "json" else {}
    rendered = fit_messages(tokenizer, rendered)  # what the template drops goes into a user turn
    return str(tokenizer.apply_chat_template(rendered, tokenize=False, add_generation_prompt=True, **extra))


def template_renders_tools(tokenizer: Any, tools: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the chat template writes ``tools=`` into the prompt (SmolLM2's does not)."""
    probe = [{"role": "user", "content": "hi"}]
    render = tokenizer.apply_chat_template
    return bool(render(probe, tokenize=False, tools=[dict(t) for t in tools]) != render(probe, tokenize=False))


def describe_tools(tools: Sequence[Mapping[str, Any]], text_allowed: bool = True) -> str:
    """The system-message text that tells the model about ``tools`` in the ``"json"`` format.  Pure."""
    listing = json.dumps([t.get("function", t) for t in tools], separators=(",", ":"), ensure_ascii=False)
    reply = 'To call a tool, reply with one JSON object {"name": <tool name>, "arguments": {...}}'
    if text_allowed:
        reply += "; otherwise reply in plain text"
    return f"You can call these tools. {reply}.\nTools: {listing}"


def chat_messages(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, tool_format: str
) -> list[dict[str, Any]]:
    """OpenAI-format ``messages`` as the chat template should see them.  Pure.

    ``"json"``: the tool description joins the system message (one is added
    when there is none), assistant ``tool_calls`` become their JSON text, a
    tool result that is not a string is JSON-encoded, and every ``content`` is
    a string.  Model formats: messages pass as they are (the template renders
    ``tool_calls``; their ``arguments`` as a dict), with tool results as strings.
    """
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in ("system", "user", "assistant", "tool"):
            raise ToolCallError(
                f"messages[{i}] must be a dict with role 'system', 'user', 'assistant' or 'tool', got {message!r:.80}"
            )
        m = dict(message)
        content = m.get("content")
        if m["role"] == "tool" and content is not None and not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False)
        if tool_format == "json" and m["role"] == "assistant" and m.get("tool_calls"):
            prefix = (content or "").strip()
            content = (prefix + "\n" if prefix else "") + history_text(m.pop("tool_calls"))
        if tool_format == "json":
            m.pop("tool_call_id", None)
        elif m.get("tool_calls"):  # chat templates write the arguments themselves (``| tojson``): give a dict
            m["tool_calls"] = [_with_parsed_arguments(c) for c in m["tool_calls"]]
        m["content"] = "" if content is None else content
        out.append(m)
    if tools and tool_format == "json":
        description = describe_tools(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = out[0]["content"] + "\n\n" + description
        else:
            out.insert(0, {"role": "system", "content": description})
    return out


def _with_parsed_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    if isinstance(function.get("arguments"), str):
        try:
            function["arguments"] = json.loads(call_json([call]))["arguments"]
        except ToolCallError:  # a call cut short: its text as it went
            pass
    return {**call, "function": function}


def check_tools(tools: Sequence[Mapping[str, Any]] | None) -> None:
    """Raise :class:`ToolCallError` (a ``ValueError``) for tool definitions the grammar layer refuses."""
    if tools:
        try:
            tools_schema(tools)
        except GrammarError as e:
            raise ToolCallError(str(e)) from None
