"""OpenAI Chat Completions shapes: a request body checked field by field, errors, answers.  Pure.

:func:`parse_request` turns a request body (a JSON object) into a
:class:`ChatRequest` or raises :class:`RequestError` -- an HTTP status plus
OpenAI's error object.  Every field is either honoured or refused: an unknown
field, a wrong type, or a setting the server cannot honour (``logprobs``,
``frequency_penalty``, ``logit_bias``, ...) is a 400 that names it.

Worked example::

    >>> parse_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_k": 5}, "m")
    Traceback (most recent call last):
    RequestError: unknown field 'top_k' ...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ChatRequest", "RequestError", "error_body", "parse_request", "ASSISTANT_PRESETS"]

#: The speculation presets a request may name (``"grammarspec": {"assistant": ...}``).
ASSISTANT_PRESETS = ("auto", "none", "prompt_lookup", "schema_ngram", "jump_forward")

#: Fields honoured as they are.
_FIELDS = {
    "model",
    "messages",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "n",
    "user",
    "metadata",
    "grammarspec",
}

#: Fields accepted only at their "off" value, and why any other value is refused.
_OFF_ONLY: dict[str, tuple[tuple[Any, ...], str]] = {
    "frequency_penalty": ((0, 0.0, None), "OpenAI's frequency penalty has no exact counterpart in the processors"),
    "presence_penalty": ((0, 0.0, None), "OpenAI's presence penalty has no exact counterpart in the processors"),
    "logprobs": ((False, None), "log-probabilities are not returned"),
    "top_logprobs": ((None, 0), "log-probabilities are not returned"),
    "logit_bias": ((None,), "logit_bias is not applied"),
    "store": ((False, None), "nothing is stored"),
}

#: Longest ``n`` (choices per request).
MAX_N = 8


class RequestError(Exception):
    """A request the server refuses: ``status`` (400, 404, ...) and OpenAI's error object."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int = 400,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = message, param, code, status, kind

    def body(self) -> dict[str, Any]:
        return error_body(self.message, param=self.param, code=self.code, kind=self.kind)


def error_body(
    message: str, *, param: str | None = None, code: str | None = None, kind: str = "invalid_request_error"
) -> dict[str, Any]:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``.  Pure."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass
class ChatRequest:
    """A checked Chat Completions request (plain values)."""

    messages: list[dict[str, Any]]
    schema: Any = None  # response_format json_schema
    json_object: bool = False  # response_format json_object
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = False
    stream: bool = False
    include_usage: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    n: int = 1
    assistant: str = "auto"
    max_draft_tokens: int | None = None
    metadata: dict[str, str] = field(default_factory=dict)  # the client's tags; they change no output
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _number(body: Mapping[str, Any], name: str, low: float, high: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"'{name}' must be a number, got {type(value).__name__}", param=name, code="invalid_type")
    if not low <= value <= high:
        raise RequestError(f"'{name}' must be between {low} and {high}, got {value}", param=name, code="invalid_value")
    return float(value)


def _integer(body: Mapping[str, Any], name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"'{name}' must be an integer, got {type(value).__name__}", param=name, code="invalid_type")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise RequestError(f"'{name}' must be {bound}, got {value}", param=name, code="invalid_value")
    return value


def _boolean(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"'{name}' must be a boolean, got {type(value).__name__}", param=name, code="invalid_type")
    return value


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise RequestError("'messages' must be a non-empty array of messages", param="messages", code="invalid_type")
    out = []
    for i, message in enumerate(value):
        param = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise RequestError(f"{param} must be an object", param=param, code="invalid_type")
        role = message.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise RequestError(
                f"{param}.role must be system, developer, user, assistant or tool, got {role!r}",
                param=f"{param}.role",
                code="invalid_value",
            )
        unknown = set(message) - {"role", "content", "name", "tool_calls", "tool_call_id", "refusal"}
        if unknown:
            raise RequestError(
                f"{param} has unknown field(s) {', '.join(sorted(unknown))}", param=param, code="unknown_parameter"
            )
        m = dict(message)
        m["role"] = "system" if role == "developer" else role
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text can be honoured
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise RequestError(
                        f"{param}.content[{j}]: only text parts are supported",
                        param=f"{param}.content",
                        code="invalid_value",
                    )
                texts.append(part["text"])
            m["content"] = "".join(texts)
        elif content is not None and not isinstance(content, str):
            raise RequestError(
                f"{param}.content must be a string or an array of text parts",
                param=f"{param}.content",
                code="invalid_type",
            )
        if m.get("content") is None and not (role == "assistant" and m.get("tool_calls")):
            raise RequestError(f"{param}.content is missing", param=f"{param}.content", code="invalid_value")
        m.pop("refusal", None)
        m.pop("name", None)
        out.append(m)
    return out


def _response_format(value: Any, request: ChatRequest) -> None:
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise RequestError("'response_format' must be an object", param="response_format", code="invalid_type")
    kind = value.get("type")
    if kind == "text":
        return
    if kind == "json_object":
        request.json_object = True
        return
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping) or "schema" not in spec:
            raise RequestError(
                "response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}",
                param="response_format.json_schema",
                code="invalid_value",
            )
        schema = spec["schema"]
        if not isinstance(schema, (Mapping, bool)):
            raise RequestError(
                "response_format.json_schema.schema must be a JSON Schema object",
                param="response_format.json_schema.schema",
                code="invalid_type",
            )
        request.schema = dict(schema) if isinstance(schema, Mapping) else schema
        return
    raise RequestError(
        f"response_format.type must be text, json_object or json_schema, got {kind!r}",
        param="response_format.type",
        code="invalid_value",
    )


def _tools(body: Mapping[str, Any], request: ChatRequest) -> None:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools):
            raise RequestError("'tools' must be an array of tool objects", param="tools", code="invalid_type")
        for i, tool in enumerate(tools):
            if tool.get("type", "function") != "function" or not isinstance(tool.get("function"), Mapping):
                raise RequestError(
                    f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}",
                    param=f"tools[{i}]",
                    code="invalid_value",
                )
            if not isinstance(tool["function"].get("name"), str):
                raise RequestError(
                    f"tools[{i}].function.name must be a string",
                    param=f"tools[{i}].function.name",
                    code="invalid_value",
                )
        request.tools = [dict(t) for t in tools] or None
    choice = body.get("tool_choice")
    if choice is not None:
        if not (choice in ("auto", "none", "required") or isinstance(choice, Mapping)):
            raise RequestError(
                "'tool_choice' must be 'auto', 'none', 'required' or {'type': 'function', ...}",
                param="tool_choice",
                code="invalid_value",
            )
        request.tool_choice = choice
    request.parallel_tool_calls = _boolean(body, "parallel_tool_calls", False)


def _metadata(value: Any) -> dict[str, str]:
    """OpenAI's ``metadata``: up to 16 string pairs (keys up to 64 characters, values up to 512)."""
    if value is None:
        return {}
    if (
        not isinstance(value, Mapping)
        or len(value) > 16
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in value.items()
        )
    ):
        raise RequestError(
            "'metadata' must be an object of up to 16 string values (keys up to 64 characters, values up to 512)",
            param="metadata",
            code="invalid_value",
        )
    return dict(value)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
        raise RequestError(
            "'stop' must be a non-empty string or an array of up to 4 of them", param="stop", code="invalid_value"
        )
    return tuple(stops)


def parse_request(body: Any, model_name: str) -> ChatRequest:
    """Check a Chat Completions body; raises :class:`RequestError` for anything that cannot be honoured."""
    if not isinstance(body, Mapping):
        raise RequestError("the request body must be a JSON object")
    for name, value in body.items():
        if name in _OFF_ONLY:
            off, why = _OFF_ONLY[name]
            if value not in off and not (name == "logit_bias" and value == {}):
                raise RequestError(
                    f"'{name}'={value!r} cannot be honoured: {why}", param=name, code="unsupported_parameter"
                )
        elif name not in _FIELDS:
            raise RequestError(
                f"unknown field '{name}'; grammarspec serve accepts {', '.join(sorted(_FIELDS))}",
                param=name,
                code="unknown_parameter",
            )
    model = body.get("model")
    if not isinstance(model, str):
        raise RequestError("'model' must be a string", param="model", code="invalid_type")
    if model != model_name:
        raise RequestError(
            f"the model {model!r} does not exist; this server serves {model_name!r}",
            param="model",
            code="model_not_found",
            status=404,
        )
    request = ChatRequest(messages=_messages(body.get("messages")))
    _response_format(body.get("response_format"), request)
    _tools(body, request)
    if request.tools and (request.schema is not None or request.json_object) and request.tool_choice != "none":
        raise RequestError(
            "response_format with tools cannot both constrain one answer; pass tool_choice='none' "
            "or drop response_format",
            param="response_format",
            code="unsupported_parameter",
        )
    request.stream = _boolean(body, "stream", False)
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, Mapping) or set(options) - {"include_usage"}:
            raise RequestError(
                "'stream_options' may only hold include_usage", param="stream_options", code="invalid_value"
            )
        if not request.stream:
            raise RequestError("'stream_options' needs stream=true", param="stream_options", code="invalid_value")
        request.include_usage = _boolean(options, "include_usage", False)
    request.temperature = _number(body, "temperature", 0.0, 2.0, 1.0)
    request.top_p = _number(body, "top_p", 0.0, 1.0, 1.0)
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise RequestError(
            "give max_tokens or max_completion_tokens, not both", param="max_tokens", code="invalid_value"
        )
    request.max_tokens = _integer(body, "max_tokens", 1) or _integer(body, "max_completion_tokens", 1)
    request.stop = _stop(body.get("stop"))
    request.seed = _integer(body, "seed", -(2**63), 2**63 - 1)
    request.n = _integer(body, "n", 1, MAX_N) or 1
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise RequestError("'user' must be a string", param="user", code="invalid_type")
    request.metadata = _metadata(body.get("metadata"))
    ours = body.get("grammarspec")
    if ours is not None:
        if not isinstance(ours, Mapping) or set(ours) - {"assistant", "max_draft_tokens"}:
            raise RequestError(
                "'grammarspec' may hold 'assistant' (a preset) and 'max_draft_tokens'",
                param="grammarspec",
                code="invalid_value",
            )
        assistant = ours.get("assistant", "auto")
        if assistant not in ASSISTANT_PRESETS:
            raise RequestError(
                f"grammarspec.assistant must be one of {', '.join(ASSISTANT_PRESETS)}, got {assistant!r}",
                param="grammarspec.assistant",
                code="invalid_value",
            )
        request.assistant = assistant
        draft = ours.get("max_draft_tokens", "auto")
        request.max_draft_tokens = None if draft == "auto" else _integer(ours, "max_draft_tokens", 1, 64)
    return request
