"""OpenAI Chat Completions shapes: a request body checked against pydantic models of it, errors.  Pure.

:func:`parse_request` turns a request body (a decoded JSON value) into a
:class:`ChatRequest` or raises :class:`RequestError` -- an HTTP status plus
OpenAI's error object.  The body is read by :class:`ChatBody`, pydantic
models that follow OpenAI's request: messages by role (``tool`` messages need
``tool_call_id``; an assistant's ``tool_calls`` each need ``id``, ``type`` and
``function`` with a string ``name`` and a JSON-text ``arguments``),
``tool_choice`` as ``"none"`` / ``"auto"`` / ``"required"`` / ``{"type":
"function", "function": {"name": ...}}``, ``response_format`` as ``text`` /
``json_object`` / ``json_schema``.  Types are strict (no string read as a
number, no number as a string).  A malformed field is a 400 whose ``param`` is
its path (``messages[2].tool_calls[0].function``) and whose message names it
and the problem.

Every field is either honoured or refused: an unknown field, a wrong type, or
a setting the server cannot honour (``logprobs``, ``frequency_penalty``,
``logit_bias``, ...) is a 400 that names it.  A number JSON cannot hold
(``1e400`` reads as infinity) is a 400 naming where it is.

grammarspec's own settings ride in ``"grammarspec"``: ``assistant`` (a
speculation preset), ``max_draft_tokens`` and ``grammar_backend`` (the backend
that compiles this request's constraint; the server's ``--grammar-backend``
when left out).

Worked example::

    >>> parse_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_k": 5}, "m")
    Traceback (most recent call last):
    RequestError: unknown field 'top_k' ...
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from grammars.registry import BACKEND_CHOICES
from proposers.presets import PRESETS

__all__ = ["ChatBody", "ChatRequest", "RequestError", "error_body", "parse_request", "ASSISTANT_PRESETS"]

#: The speculation presets a request may name (``"grammarspec": {"assistant": ...}``).
ASSISTANT_PRESETS = tuple(p for p in PRESETS if p != "draft_model")

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


# --- the request's models -----------------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


def _text(value: Any) -> str:
    """A message's ``content``: a string, or an array of text parts joined (only text can be honoured)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise PydanticCustomError("invalid_type", "must be a string or an array of text parts")
    texts = []
    for j, part in enumerate(value):
        if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise PydanticCustomError(
                "invalid_value",
                f"content[{j}] is {kind!r}: only text parts ({{'type': 'text', 'text': ...}}) are supported",
            )
        texts.append(part["text"])
    return "".join(texts)


Text = Annotated[str, BeforeValidator(_text)]


class SystemMessage(_Model):
    role: Literal["system", "developer"]
    content: Text
    name: str | None = None


class UserMessage(_Model):
    role: Literal["user"]
    content: Text
    name: str | None = None


class FunctionCall(_Model):
    name: str
    arguments: str

    @field_validator("arguments")
    @classmethod
    def _json_text(cls, value: str) -> str:
        try:
            json.loads(value)
        except json.JSONDecodeError as e:
            raise PydanticCustomError(
                "invalid_value", "must be JSON text (the arguments as a JSON string): {error}", {"error": str(e)}
            ) from None
        return value


class ToolCall(_Model):
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(_Model):
    role: Literal["assistant"]
    content: Text | None = None
    refusal: str | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None

    @model_validator(mode="after")
    def _says_something(self) -> AssistantMessage:
        if self.content is None and not self.tool_calls:
            raise PydanticCustomError("missing", "an assistant message needs content or tool_calls")
        return self


class ToolMessage(_Model):
    role: Literal["tool"]
    content: Text
    tool_call_id: str


_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def _by_tag(tag: Any, error: str, message: str) -> Discriminator:
    """A union's discriminator: ``tag(value)`` names the member that reads a value; no name gives ``error``."""
    return Discriminator(tag, custom_error_type=error, custom_error_message=message)


def _role(value: Any) -> str | None:
    role = value.get("role") if isinstance(value, Mapping) else getattr(value, "role", None)
    return _ROLES.get(role) if isinstance(role, str) else None


Message = Annotated[
    Annotated[SystemMessage, Tag("system")]
    | Annotated[UserMessage, Tag("user")]
    | Annotated[AssistantMessage, Tag("assistant")]
    | Annotated[ToolMessage, Tag("tool")],
    _by_tag(
        _role, "invalid_role", "each message is an object whose role is system, developer, user, assistant or tool"
    ),
]


class FunctionDefinition(_Model):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Model):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Model):
    name: str


class NamedToolChoice(_Model):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Annotated[
    Annotated[Literal["none", "auto", "required"], Tag("mode")] | Annotated[NamedToolChoice, Tag("named")],
    _by_tag(
        lambda v: "mode" if isinstance(v, str) else "named" if isinstance(v, Mapping | NamedToolChoice) else None,
        "invalid_type",
        "must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}",
    ),
]


def _schema(value: Any) -> Any:
    if not isinstance(value, dict | bool):
        raise PydanticCustomError("invalid_type", "must be a JSON Schema: an object (or a boolean)")
    return value


class JsonSchemaFormat(_Model):
    name: str
    description: str | None = None
    schema_: Annotated[Any, BeforeValidator(_schema)] = Field(alias="schema")
    strict: bool | None = None


class TextFormat(_Model):
    type: Literal["text"]


class JsonObjectFormat(_Model):
    type: Literal["json_object"]


class JsonSchemaResponseFormat(_Model):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


def _format_type(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, Mapping) else getattr(value, "type", None)
    return kind if kind in ("text", "json_object", "json_schema") else None


ResponseFormat = Annotated[
    Annotated[TextFormat, Tag("text")]
    | Annotated[JsonObjectFormat, Tag("json_object")]
    | Annotated[JsonSchemaResponseFormat, Tag("json_schema")],
    _by_tag(
        _format_type, "invalid_format", "response_format is an object whose type is text, json_object or json_schema"
    ),
]


class StreamOptions(_Model):
    include_usage: bool | None = None


def _stop(value: Any) -> Any:
    stops = [value] if isinstance(value, str) else value
    if value is not None and (
        not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or not 1 <= len(stops) <= 4
    ):
        raise PydanticCustomError("invalid_value", "must be a non-empty string or an array of up to 4 of them")
    return value


def _draft(value: Any) -> Any:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 64):
        return value
    raise PydanticCustomError("invalid_value", "must be 'auto' or an integer between 1 and 64")


class Extension(_Model):
    """grammarspec's own settings (``"grammarspec": {...}``)."""

    assistant: Literal[ASSISTANT_PRESETS] = "auto"  # type: ignore[valid-type]
    max_draft_tokens: Annotated[Any, BeforeValidator(_draft)] = "auto"
    grammar_backend: Literal[BACKEND_CHOICES] | None = None  # type: ignore[valid-type]


MetadataKey = Annotated[str, StringConstraints(max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]


class ChatBody(_Model):
    """OpenAI's Chat Completions request, as far as this server reads it."""

    model: str
    messages: list[Message] = Field(min_length=1)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: Annotated[Any, BeforeValidator(_stop)] = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    n: int | None = Field(None, ge=1, le=MAX_N)
    user: str | None = None
    metadata: dict[MetadataKey, MetadataValue] | None = Field(None, max_length=16)
    grammarspec: Extension | None = None
    # accepted only at their "off" value (_OFF_ONLY)
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    logit_bias: dict[str, float] | None = None
    store: bool | None = None


#: Fields a request may hold.
_FIELDS = tuple(ChatBody.model_fields)


# --- errors ------------------------------------------------------------------------------------------------

#: The union tags pydantic writes into an error's location (not fields: left out of the path).
_TAGS = {"system", "user", "assistant", "tool", "mode", "named", "text", "json_object", "json_schema"}
_CODES = {"missing": "missing_required_parameter", "extra_forbidden": "unknown_parameter"}


def _path(loc: tuple[Any, ...]) -> str:
    """``("messages", 2, "tool", "tool_call_id")`` -> ``messages[2].tool_call_id`` (union tags left out)."""
    out, tagged = "", None
    for item in loc:
        if isinstance(item, int):
            out += f"[{item}]"
        elif item in _TAGS and _is_tag(out) and tagged != out:
            tagged = out
        else:
            out += ("." if out else "") + str(item)
    return out


def _is_tag(path: str) -> bool:
    """Whether what follows ``path`` in a location is a union's tag (``response_format.json_schema`` is both)."""
    return path in ("tool_choice", "response_format") or bool(re.fullmatch(r"messages\[\d+\]", path))


#: The model at each place of the body, by the names (fields and union tags) of its location, list indices left out.
_PLACES: dict[tuple[str, ...], type[BaseModel]] = {
    ("messages", "system"): SystemMessage,
    ("messages", "user"): UserMessage,
    ("messages", "assistant"): AssistantMessage,
    ("messages", "tool"): ToolMessage,
    ("messages", "assistant", "tool_calls"): ToolCall,
    ("messages", "assistant", "tool_calls", "function"): FunctionCall,
    ("tools",): Tool,
    ("tools", "function"): FunctionDefinition,
    ("tool_choice", "named"): NamedToolChoice,
    ("tool_choice", "named", "function"): FunctionName,
    ("response_format", "text"): TextFormat,
    ("response_format", "json_object"): JsonObjectFormat,
    ("response_format", "json_schema"): JsonSchemaResponseFormat,
    ("response_format", "json_schema", "json_schema"): JsonSchemaFormat,
    ("stream_options",): StreamOptions,
    ("grammarspec",): Extension,
}


def _unknown(loc: tuple[Any, ...], path: str) -> str:
    """What an unknown field's message says: the fields its place may hold."""
    if len(loc) == 1:
        return f"unknown field '{path}'; grammarspec serve accepts {', '.join(_FIELDS)}"
    place = _PLACES.get(tuple(item for item in loc[:-1] if not isinstance(item, int)))
    if place is None:
        return f"unknown field '{path}'"
    fields = [f.alias or name for name, f in place.model_fields.items()]
    return f"unknown field '{path}'; {path.rsplit('.', 1)[0]} may hold {', '.join(fields)}"


def _refusal(e: ValidationError) -> RequestError:
    errors = e.errors(include_url=False)
    first = errors[0]
    loc = tuple(first["loc"])
    path = _path(loc)
    kind = first["type"]
    if kind == "invalid_role":
        path += ".role"
    elif kind == "invalid_format":
        path += ".type"
    said = first["msg"][:1].lower() + first["msg"][1:]
    if kind == "extra_forbidden":
        message = _unknown(loc, path)
    elif kind == "missing":
        message = f"{path}: field required" if said == "field required" else f"{path}: {said}"
    else:
        got = f" (got {type(first['input']).__name__})" if kind.endswith("_type") else ""
        message = f"{path}: {said}{got}" if path else said
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    code = _CODES.get(kind, "invalid_type" if kind.endswith("_type") or kind == "invalid_type" else "invalid_value")
    return RequestError(message, param=path or None, code=code)


def _non_finite(value: Any, path: str = "") -> str | None:
    """The path of the first number JSON cannot hold (infinity or NaN, as ``1e400`` or ``NaN`` read), or ``None``."""
    if isinstance(value, float) and not math.isfinite(value):
        return path or "the body"
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = _non_finite(item, f"{path}.{key}" if path else str(key))
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _non_finite(item, f"{path}[{i}]")
            if found:
                return found
    return None


# --- the checked request ---------------------------------------------------------------------------------


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
    grammar_backend: str | None = None  # None: the server's
    metadata: dict[str, str] = field(default_factory=dict)  # the client's tags; they change no output
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _message(m: BaseModel) -> dict[str, Any]:
    """A message as the chat template reads it: developer is system; name and refusal are not rendered."""
    out: dict[str, Any] = {"role": _ROLES[m.role], "content": m.content}  # type: ignore[attr-defined]
    if isinstance(m, AssistantMessage) and m.tool_calls:
        out["tool_calls"] = [c.model_dump() for c in m.tool_calls]
    if isinstance(m, ToolMessage):
        out["tool_call_id"] = m.tool_call_id
    return out


def parse_request(body: Any, model_name: str) -> ChatRequest:
    """Check a Chat Completions body; raises :class:`RequestError` for anything that cannot be honoured."""
    if not isinstance(body, Mapping):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if isinstance(model, str) and model != model_name:
        raise RequestError(
            f"the model {model!r} does not exist; this server serves {model_name!r}",
            param="model",
            code="model_not_found",
            status=404,
        )
    where = _non_finite(body)
    if where:
        raise RequestError(
            f"{where}: the number is out of range (infinity or NaN, as a number beyond a 64-bit float such as 1e400 "
            "reads); JSON has no such value: write a finite number",
            param=where,
            code="invalid_value",
        )
    try:
        checked = ChatBody.model_validate(dict(body))
    except ValidationError as e:
        raise _refusal(e) from None
    for name, (off, why) in _OFF_ONLY.items():
        value = getattr(checked, name)
        if value not in off and not (name == "logit_bias" and value == {}):
            raise RequestError(
                f"'{name}'={value!r} cannot be honoured: {why}", param=name, code="unsupported_parameter"
            )
    request = ChatRequest(messages=[_message(m) for m in checked.messages])
    fmt = checked.response_format
    if isinstance(fmt, JsonObjectFormat):
        request.json_object = True
    elif isinstance(fmt, JsonSchemaResponseFormat):
        schema = fmt.json_schema.schema_
        request.schema = dict(schema) if isinstance(schema, dict) else schema
    if checked.tools:
        request.tools = [t.model_dump(exclude_unset=True) for t in checked.tools]
    choice = checked.tool_choice
    if isinstance(choice, NamedToolChoice):
        names = [t.function.name for t in checked.tools or []]
        if choice.function.name not in names:
            raise RequestError(
                f"tool_choice.function.name: {choice.function.name!r} is not one of the tools "
                f"({', '.join(map(repr, names)) or 'none given'}); name one of them, or pass 'auto', 'required' "
                "or 'none'",
                param="tool_choice.function.name",
                code="invalid_value",
            )
        request.tool_choice = choice.model_dump()
    elif choice is not None:
        if choice == "required" and not checked.tools:
            raise RequestError(
                "tool_choice='required' needs tools: pass tools=[...], or tool_choice 'auto' or 'none'",
                param="tool_choice",
                code="invalid_value",
            )
        request.tool_choice = choice
    request.parallel_tool_calls = bool(checked.parallel_tool_calls)
    if request.tools and (request.schema is not None or request.json_object) and request.tool_choice != "none":
        raise RequestError(
            "response_format with tools cannot both constrain one answer; pass tool_choice='none' "
            "or drop response_format",
            param="response_format",
            code="unsupported_parameter",
        )
    request.stream = bool(checked.stream)
    if checked.stream_options is not None:
        if not request.stream:
            raise RequestError("'stream_options' needs stream=true", param="stream_options", code="invalid_value")
        request.include_usage = bool(checked.stream_options.include_usage)
    request.temperature = 1.0 if checked.temperature is None else float(checked.temperature)
    request.top_p = 1.0 if checked.top_p is None else float(checked.top_p)
    if checked.max_tokens is not None and checked.max_completion_tokens is not None:
        raise RequestError(
            "give max_tokens or max_completion_tokens, not both", param="max_tokens", code="invalid_value"
        )
    request.max_tokens = checked.max_tokens or checked.max_completion_tokens
    stop = checked.stop
    request.stop = () if stop is None else (stop,) if isinstance(stop, str) else tuple(stop)
    request.seed = checked.seed
    request.n = checked.n or 1
    request.metadata = dict(checked.metadata or {})
    ours = checked.grammarspec
    if ours is not None:
        request.assistant = ours.assistant
        request.max_draft_tokens = None if ours.max_draft_tokens == "auto" else ours.max_draft_tokens
        request.grammar_backend = ours.grammar_backend
    return request
