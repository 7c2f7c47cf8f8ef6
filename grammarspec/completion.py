"""Chat-level convenience: prompt in, parsed JSON and statistics out.

``complete`` builds a chat prompt (system + user, optionally describing the
schema or tools), runs :func:`grammarspec.generate`, and returns the text, the
parsed value and whether it is a complete, valid answer: the grammar finished,
and -- for JSON constraints (``schema=``, ``tools=``, ``json_object=True``) --
the text parses as JSON, and validates against the schema when there is one.
An output cut by the token limit is never reported as valid.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from grammarspec.stats import GenerationStats
from grammarspec.templates import fit_messages

__all__ = ["Completion", "complete", "build_prompt", "describe_schema"]


class AssistantMessage:
    """Reads an OpenAI assistant ``message``: what :class:`Completion` and :class:`~grammarspec.Reply` share."""

    message: dict[str, Any]

    @property
    def content(self) -> str | None:
        """The message's text (``None`` for a tool call)."""
        return self.message.get("content")

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """OpenAI ``tool_calls`` (``{"id", "type": "function", "function": {"name", "arguments": <JSON>}}``)."""
        return list(self.message.get("tool_calls") or [])


@dataclass
class Completion(AssistantMessage):
    """One answer.  ``valid`` means *schema-valid* (complete and following the constraint), not correct.

    ``value``: the parsed JSON (JSON constraints; a JSON ``null`` answer is
    ``None`` with ``has_value=True``) or the text (``grammar=``/``regex=``,
    text replies); ``None`` with ``has_value=False`` when there is no value
    (cut by the token limit, or not JSON).  ``message``: the OpenAI assistant
    message, with ``tool_calls`` when the answer is a call (``tools=``), the
    shape :class:`~grammarspec.Reply` has too.
    """

    text: str
    value: Any
    finish_reason: str
    stats: GenerationStats
    tokens: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # schema violations (should stay empty)
    has_value: bool = False
    message: dict[str, Any] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        """Complete (the grammar finished), parsed when JSON, and valid against the schema if any.

        Schema-valid only: it says nothing of whether the values are right.
        """
        return self.finish_reason == "stop" and self.has_value and not self.errors


def describe_schema(
    schema: dict[str, Any] | None, tools: list[dict[str, Any]] | None, text_allowed: bool = False
) -> str:
    """The sentence that tells the model what to produce (``text_allowed``: a call or plain text)."""
    if tools:
        listing = json.dumps([t.get("function", t) for t in tools], separators=(",", ":"), ensure_ascii=False)
        tail = "; otherwise reply in plain text" if text_allowed else " for the call to make"
        return (
            "You can call these tools. Reply with one JSON object "
            '{"name": <tool name>, "arguments": {...}}' + tail + ".\nTools: " + listing
        )
    if schema is not None:
        return "Reply with a single JSON object that follows this JSON Schema:\n" + json.dumps(
            schema, separators=(",", ":"), ensure_ascii=False
        )
    return ""


def build_prompt(
    tokenizer: Any,
    prompt: str | list[dict[str, str]],
    *,
    system: str | None = None,
    schema: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    describe: bool = True,
    text_allowed: bool = False,
) -> list[int]:
    """Token ids of a chat prompt ready for generation (with the assistant turn opened).

    ``describe``: put :func:`describe_schema`'s text (the whole schema, or the
    tools' definitions) into the system message, so the model reads what to
    write; ``False`` leaves it out (the grammar enforces the schema either way).
    """
    _check_prompt(prompt)
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    extra = describe_schema(schema, tools, text_allowed) if describe else ""
    system_text = "\n\n".join(part for part in (system, extra) if part)
    if system_text:
        if messages and messages[0].get("role") == "system":
            messages[0] = {"role": "system", "content": messages[0]["content"] + "\n\n" + system_text}
        else:
            messages.insert(0, {"role": "system", "content": system_text})
    if getattr(tokenizer, "chat_template", None):
        messages = fit_messages(tokenizer, messages)  # what the template drops goes into a user turn
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = "\n".join(m["content"] for m in messages) + "\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError("the prompt is empty: give the model something to condition on")
    return list(ids)


def _check_prompt(prompt: Any) -> None:
    """``prompt``: a string, or a list of chat messages (dicts with a ``role`` and a string ``content``)."""
    if isinstance(prompt, str):
        return
    accepts = 'pass a string or a list of messages like [{"role": "user", "content": "..."}]'
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise ValueError(f"prompt must be a non-empty string or list of chat messages, got {prompt!r:.60}; {accepts}")
    for i, message in enumerate(prompt):
        if (
            not isinstance(message, dict)
            or message.get("role") not in ("system", "user", "assistant", "tool")
            or not isinstance(message.get("content"), str)
        ):
            raise ValueError(
                f"prompt[{i}] must be a dict with role 'system', 'user', 'assistant' or 'tool' and a string "
                f"content, got {message!r:.80}; {accepts}"
            )


def complete(
    model: torch.nn.Module,
    tokenizer: Any,
    prompt: str | list[dict[str, str]],
    *,
    system: str | None = None,
    schema: Any = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: Any = None,
    parallel_tool_calls: bool = False,
    grammar: str | None = None,
    regex: str | None = None,
    json_object: bool = False,
    any_whitespace: bool = False,
    assistant: Any = "auto",
    max_new_tokens: int = 512,
    describe: bool = True,
    **generate_kwargs: Any,
) -> Completion:
    """Generate one constrained answer to a chat prompt and parse it (see :class:`Completion`).

    ``tool_choice`` (with ``tools=``): as for :func:`grammarspec.generate`
    (default ``"required"``); the calls come back OpenAI-shaped in
    ``Completion.tool_calls``.

    ``describe`` (default ``True``): the system message carries the whole
    schema as JSON (or the tools' definitions), so the model knows what to
    write.  A large schema (a long enum, many properties) can fill the model's
    context this way: ``describe=False`` leaves the description out and the
    grammar still enforces the schema (describe it yourself in ``system=`` or
    the prompt, if the model needs to know more than the grammar lets it write).
    A prompt that does not fit raises ``ValueError`` naming how many of its
    tokens the description takes.
    """
    from grammarspec.api import run_generate
    from grammarspec.constraint import Constraint
    from grammarspec.tool_calls import parse_tool_reply

    _check_prompt(prompt)
    asked = Constraint.among(locals())
    constraint = asked.resolve()
    (spec,) = constraint.specs(1)
    json_schema = spec.schema if spec is not None else None
    offered = tools if tools is not None and tool_choice != "none" else None
    ids = build_prompt(
        tokenizer,
        prompt,
        system=system,
        schema=json_schema if not offered else None,
        tools=offered,
        describe=describe,
        text_allowed=tool_choice == "auto",
    )
    if describe:
        _check_described_prompt(model, ids, lambda: build_prompt(tokenizer, prompt, system=system, describe=False))
    out: Any = run_generate(
        model,
        torch.tensor([ids], device="cpu"),  # generate moves the prompt to the model
        constraint,
        tokenizer=tokenizer,
        assistant=assistant,
        max_new_tokens=max_new_tokens,
        return_dict_in_generate=True,
        **generate_kwargs,
    )
    stats = out.stats[0]
    new = out.sequences[0, len(ids) :].tolist()
    new = new[: stats.new_tokens]
    text = tokenizer.decode(new, skip_special_tokens=True)
    value, errors, has_value = None, [], False
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if stats.finish_reason == "stop":
        if offered:
            message = parse_tool_reply(text, offered, "json", [f"call_{i}" for i in range(64)])
        if spec is not None and spec.kind in ("json_schema", "any_json"):
            from grammars.validation import parse_json

            try:
                (value, repeated), has_value = parse_json(text), True  # repeated: keys written twice in one object
            except json.JSONDecodeError as exc:
                errors.append(f"not JSON: {exc}")
            else:
                errors = repeated + (_schema_errors(json_schema, value) if json_schema is not None else [])
        else:  # grammar=, regex=, a text reply under tool_choice="auto" (the grammar finished) or no constraint
            value, has_value = text, True
            if message.get("tool_calls"):
                value = json.loads(text.strip())
    return Completion(
        text=text,
        value=value,
        finish_reason=stats.finish_reason,
        stats=stats,
        tokens=new,
        errors=errors,
        has_value=has_value,
        message=message,
    )


def _check_described_prompt(model: torch.nn.Module, ids: list[int], bare: Callable[[], list[int]]) -> None:
    """Refuse a prompt that fills the model's context because of the schema's description in it.

    ``bare``: the same prompt without the description.  A prompt too long on its own is left to
    :func:`grammarspec.inputs.check_prompt`, whose advice (shorten the prompt) is then the right one.
    """
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if context is None or len(ids) < context:
        return
    described = len(ids) - len(bare())
    if described <= 0:
        return
    raise ValueError(
        f"the prompt has {len(ids)} tokens but the model's context is {context} "
        f"(config.max_position_embeddings); {described} of them are the schema's (or tools') description, which "
        "complete() puts in the system message: pass describe=False to leave it out (the grammar still enforces "
        "the schema; say what the model needs to know in system= or the prompt), or shorten the schema"
    )


def _schema_errors(schema: dict[str, Any], value: Any) -> list[str]:
    from grammars.validation import schema_errors  # the one jsonschema validator (formats checked)

    return schema_errors(schema, value)
