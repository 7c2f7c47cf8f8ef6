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
from dataclasses import dataclass, field
from typing import Any

import torch

from grammars import grammar_spec

from .api import generate
from .stats import GenerationStats

__all__ = ["Completion", "complete", "build_prompt", "describe_schema"]


@dataclass
class Completion:
    text: str
    value: Any  # the parsed JSON (JSON constraints) or the text (grammar=/regex=); None when incomplete
    finish_reason: str
    stats: GenerationStats
    tokens: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # schema violations (should stay empty)

    @property
    def valid(self) -> bool:
        """Complete (the grammar finished), parsed when JSON, and valid against the schema if any."""
        return self.finish_reason == "stop" and self.value is not None and not self.errors


def describe_schema(schema: dict[str, Any] | None, tools: list[dict[str, Any]] | None) -> str:
    """The sentence that tells the model what to produce."""
    if tools:
        listing = json.dumps([t.get("function", t) for t in tools], separators=(",", ":"), ensure_ascii=False)
        return (
            "You can call these tools. Reply with one JSON object "
            '{"name": <tool name>, "arguments": {...}} for the call to make.\nTools: ' + listing
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
) -> list[int]:
    """Token ids of a chat prompt ready for generation (with the assistant turn opened)."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    extra = describe_schema(schema, tools) if describe else ""
    system_text = "\n\n".join(part for part in (system, extra) if part)
    if system_text:
        if messages and messages[0].get("role") == "system":
            messages[0] = {"role": "system", "content": messages[0]["content"] + "\n\n" + system_text}
        else:
            messages.insert(0, {"role": "system", "content": system_text})
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = "\n".join(m["content"] for m in messages) + "\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError("the prompt is empty: give the model something to condition on")
    return list(ids)


def complete(
    model: torch.nn.Module,
    tokenizer: Any,
    prompt: str | list[dict[str, str]],
    *,
    system: str | None = None,
    schema: Any = None,
    tools: list[dict[str, Any]] | None = None,
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
    """Generate one constrained answer to a chat prompt and parse it (see :class:`Completion`)."""
    spec = grammar_spec(schema=schema, tools=tools, grammar=grammar, regex=regex, json_object=json_object,
                        parallel_tool_calls=parallel_tool_calls, any_whitespace=any_whitespace)  # fmt: skip
    json_schema = spec.schema if spec is not None else None
    ids = build_prompt(tokenizer, prompt, system=system, schema=json_schema if not tools else None,
                       tools=tools, describe=describe)  # fmt: skip
    out = generate(
        model,
        torch.tensor([ids], device="cpu"),  # generate moves the prompt to the model
        tokenizer=tokenizer,
        schema=schema,
        tools=tools,
        parallel_tool_calls=parallel_tool_calls,
        grammar=grammar,
        regex=regex,
        json_object=json_object,
        any_whitespace=any_whitespace,
        assistant=assistant,
        max_new_tokens=max_new_tokens,
        return_dict_in_generate=True,
        **generate_kwargs,
    )
    stats = out.stats[0]
    new = out.sequences[0, len(ids) :].tolist()
    new = new[: stats.new_tokens]
    text = tokenizer.decode(new, skip_special_tokens=True)
    value, errors = None, []
    if stats.finish_reason == "stop":
        if spec is not None and spec.kind in ("json_schema", "any_json"):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                errors.append(f"not JSON: {exc}")
            else:
                errors = _schema_errors(json_schema, value) if json_schema is not None else []
        else:  # grammar=, regex= (the grammar finished) or no constraint (EOS)
            value = text
    return Completion(text=text, value=value, finish_reason=stats.finish_reason, stats=stats, tokens=new, errors=errors)


def _schema_errors(schema: dict[str, Any], value: Any) -> list[str]:
    from grammars.validation import schema_errors  # the one jsonschema validator (formats checked)

    return schema_errors(schema, value)
