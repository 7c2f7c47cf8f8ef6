"""Chat templates that drop messages: what grammarspec renders goes where the model sees it.

grammarspec puts the schema's description, the tool descriptions and tool
results into ``system`` and ``tool`` messages.  Some chat templates render
neither (Phi-3's renders only user and assistant turns; others raise "System
role not supported"), and the model would never see them.
:func:`fit_messages` probes the template once per tokenizer and template
(:func:`dropped_roles`) and moves the content of a dropped role into the next
user turn (or a user turn of its own at the end), so nothing is lost and the
prompt of an earlier turn stays a prefix of the next one.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["dropped_roles", "fit_messages"]

_SENTINEL = "grammarspec-probe-7f3a"
_CACHE: dict[tuple[int, str], frozenset[str]] = {}
_LOCK = threading.Lock()


def _renders(tokenizer: Any, messages: list[dict[str, Any]]) -> bool | None:
    """Whether the template writes the sentinel (``None``: it raised on these messages)."""
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template may raise on any role it does not support
        return None
    return _SENTINEL in str(text)


def dropped_roles(tokenizer: Any) -> frozenset[str]:
    """The roles among ``system`` and ``tool`` whose content the chat template does not render.

    ``system`` counts as dropped when the template leaves it out or raises on
    it; ``tool`` only when the template renders a tool call's result nowhere
    (a template that raises on the probe is left to raise on the real
    conversation, with its own message).  Cached per tokenizer and template.
    """
    template = getattr(tokenizer, "chat_template", None)
    if not template or not isinstance(template, str):
        return frozenset()
    key = (id(tokenizer), template)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    dropped = set()
    if not _renders(tokenizer, [{"role": "system", "content": _SENTINEL}, {"role": "user", "content": "hi"}]):
        dropped.add("system")
    call: dict[str, Any] = {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": {}}}
    tool_probe: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": _SENTINEL},
    ]
    if _renders(tokenizer, tool_probe) is False:
        dropped.add("tool")
    found = frozenset(dropped)
    with _LOCK:
        _CACHE[key] = found
    return found


def fit_messages(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with the content of every role the template drops moved into a user turn.  Pure.

    A dropped message's text is put before the next user message's (a blank
    line between); dropped messages after the last user message (tool
    results) become one user message of their own.  Unchanged when the
    template renders everything.

    >>> class Phi3Like:  # renders user and assistant turns only
    ...     chat_template = "phi-3"
    ...     def apply_chat_template(self, messages, **kw):
    ...         return "".join(m["content"] for m in messages if m["role"] in ("user", "assistant"))
    >>> fit_messages(Phi3Like(), [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    [{'role': 'user', 'content': 'Be brief.\\n\\nHi'}]
    """
    dropped = dropped_roles(tokenizer)
    out = [dict(m) for m in messages]
    if not dropped:
        return out
    fitted: list[dict[str, Any]] = []
    pending: list[str] = []
    for message in out:
        role = message.get("role")
        if role in dropped:
            text = message.get("content")
            text = text if isinstance(text, str) else ""
            if role == "tool":
                text = f"Tool result ({message.get('tool_call_id', 'call')}): {text}"
            if text:
                pending.append(text)
            continue
        if role == "user" and pending and isinstance(message.get("content"), str):
            message["content"] = "\n\n".join([*pending, message["content"]])
            pending = []
        fitted.append(message)
    if pending:
        fitted.append({"role": "user", "content": "\n\n".join(pending)})
    return fitted
