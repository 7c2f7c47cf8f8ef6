"""What the user asked the output to follow, as one hashable value.

:func:`grammar_spec` turns the user-facing arguments (a JSON Schema as a dict or
a JSON string, a pydantic model class, OpenAI-style ``tools``, an EBNF grammar,
a regex, or "any JSON object") into a :class:`GrammarSpec`.  Everything is
checked here, before any backend sees it, so that bad input fails with a
:class:`~grammars.base.GrammarError` that says what is wrong and what to do.

Worked example (tools -> the schema of one call)::

    >>> tools = [{"type": "function", "function": {"name": "get_weather",
    ...           "parameters": {"type": "object",
    ...                          "properties": {"city": {"type": "string"}}}}}]
    >>> tools_schema(tools)["properties"]["name"]
    {'type': 'string', 'const': 'get_weather'}
    >>> grammar_spec(tools=tools, parallel_tool_calls=True).schema["type"]
    'array'
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .base import GrammarError
from .lru import LRU
from .schema_walk import DATA_KEYWORDS as _DATA_KEYWORDS
from .schema_walk import SCHEMA_MAPS as _SCHEMA_MAPS
from .schema_walk import local_resolver as _local_resolver
from .schema_walk import refs_and_targets as _refs_and_targets
from .schema_walk import schema_nodes

__all__ = ["GrammarSpec", "GrammarKind", "grammar_spec", "tools_schema", "check_json_schema", "schema_nodes"]

GrammarKind = Literal["json_schema", "ebnf", "regex", "any_json"]
_KINDS = ("json_schema", "ebnf", "regex", "any_json")

#: The schema used for ``json_object=True``: any JSON object (OpenAI's JSON mode).
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class GrammarSpec:
    """A grammar request, independent of tokenizer and backend.

    ``kind``: ``"json_schema"``, ``"ebnf"``, ``"regex"`` or ``"any_json"``.
    ``source``: the grammar text -- for the JSON kinds the schema as JSON
    (property order kept: it is the order fields are generated in).
    ``any_whitespace``: JSON kinds only; ``False`` means compact JSON exactly
    as ``json.dumps(obj, separators=(",", ":"))`` writes it.
    ``schema``: the parsed schema for the JSON kinds, else ``None``.  Treat it
    as read-only; it does not take part in equality or hashing (``source``
    does).
    """

    kind: GrammarKind
    source: str
    any_whitespace: bool = False
    schema: dict[str, Any] | None = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise GrammarError(f"unknown grammar kind {self.kind!r}; choose one of {', '.join(_KINDS)}")
        if self.kind in ("json_schema", "any_json") and self.schema is None:
            object.__setattr__(self, "schema", json.loads(self.source))
        if self.kind in ("ebnf", "regex") and self.any_whitespace:
            # Whitespace in an EBNF grammar or a regex is whatever the grammar says.
            object.__setattr__(self, "any_whitespace", False)

    @property
    def is_json(self) -> bool:
        """Whether the output is a JSON document (schema or any JSON object)."""
        return self.kind in ("json_schema", "any_json")


def grammar_spec(
    *,
    schema: Any = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    grammar: str | None = None,
    regex: str | None = None,
    json_object: bool = False,
    parallel_tool_calls: bool = False,
    any_whitespace: bool = False,
) -> GrammarSpec | None:
    """Build the :class:`GrammarSpec` for one request, or ``None`` when nothing constrains it.

    Exactly one source may be given:

    * ``schema``: a JSON Schema (dict or JSON string) or a pydantic model class;
    * ``tools``: OpenAI-style tool definitions; the output is one call
      ``{"name": ..., "arguments": {...}}`` (or, with ``parallel_tool_calls``,
      a non-empty JSON array of calls) -- see :func:`tools_schema`;
    * ``grammar``: an EBNF grammar (xgrammar's GBNF dialect, root rule ``root``);
    * ``regex``: a regular expression the whole output must match;
    * ``json_object=True``: any JSON object.

    ``any_whitespace=False`` (default) gives compact JSON; ``True`` allows
    flexible whitespace.  Raises :class:`GrammarError` on conflicting or
    invalid input, and for a schema nested deeper than :data:`MAX_SCHEMA_DEPTH`.
    Pure function: changes nothing.
    """
    try:
        given = [
            name
            for name, value in (
                ("schema", schema),
                ("tools", tools),
                ("grammar", grammar),
                ("regex", regex),
                ("json_object", json_object or None),
            )
            if value is not None
        ]
        if len(given) > 1:
            raise GrammarError(
                f"got more than one grammar source ({', '.join(given)}); pass exactly one of "
                "schema=, tools=, grammar=, regex= or json_object=True"
            )
        if parallel_tool_calls and tools is None:
            raise GrammarError("parallel_tool_calls=True needs tools=[...]; pass the tool definitions too")
        if not given:
            return None
        any_whitespace = bool(any_whitespace)
        if schema is not None:
            return _json_spec("json_schema", _schema_dict(schema), any_whitespace)
        if tools is not None:
            return _json_spec("json_schema", tools_schema(tools, parallel=parallel_tool_calls), any_whitespace)
        if json_object:
            return _json_spec("any_json", dict(ANY_JSON_OBJECT), any_whitespace)
        if grammar is not None:
            example = 'an EBNF grammar such as \'root ::= "yes" | "no"\''
            return GrammarSpec("ebnf", _grammar_text(grammar, "grammar", example))
        return GrammarSpec("regex", _grammar_text(regex, "regex", "a regular expression such as '[0-9]{4}'"))
    except RecursionError:
        raise GrammarError(
            "the schema is nested too deeply to check; flatten it, or put repeated parts under $defs and refer "
            "to them with a local $ref"
        ) from None


#: Deepest nesting of subschemas accepted: the validator and the compilers recurse once per level.
MAX_SCHEMA_DEPTH = 64


def _json_spec(kind: GrammarKind, schema: dict[str, Any], any_whitespace: bool) -> GrammarSpec:
    check_json_schema(schema)
    _warn_unknown_keywords(schema)
    _resolve_id_refs(schema)
    try:
        source = json.dumps(schema, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise GrammarError(
            f"the schema is not JSON-serialisable ({e}); use only dicts, lists, strings, numbers, "
            "booleans and None in it"
        ) from None
    return GrammarSpec(kind, source, any_whitespace, schema=json.loads(source))


def _check_depth(schema: Any) -> None:
    """Refuse a schema nested deeper than :data:`MAX_SCHEMA_DEPTH` subschemas (counted without recursion)."""
    stack: list[tuple[Any, bool, int]] = [(schema, True, 0)]  # (item, item is a schema, schemas around it)
    while stack:
        item, is_schema, depth = stack.pop()
        if isinstance(item, Mapping) and is_schema and depth >= MAX_SCHEMA_DEPTH:
            raise GrammarError(
                f"the schema nests subschemas more than {MAX_SCHEMA_DEPTH} levels deep; grammarspec accepts at "
                f"most {MAX_SCHEMA_DEPTH} (the validator and the grammar compilers go down one level at a time). "
                "Flatten it, or put repeated parts under $defs and refer to them with a local $ref."
            )
        if isinstance(item, list):
            stack.extend((x, True, depth) for x in item)
        elif isinstance(item, Mapping) and not is_schema:
            stack.extend((x, True, depth) for x in item.values())
        elif isinstance(item, Mapping):
            stack.extend((v, k not in _SCHEMA_MAPS, depth + 1) for k, v in item.items() if k not in _DATA_KEYWORDS)


def _resolve_id_refs(schema: dict[str, Any]) -> None:
    """Rewrite each ``$ref`` to a subschema's ``$id`` as the local ``#/...`` pointer to it.  Changes ``schema``.

    Backends resolve ``#/...`` pointers, but not every one resolves ``$id``
    (xgrammar left such a property unconstrained).  Only refs outside any
    nested ``$id`` scope are rewritten, where ``#`` means the root; a ref
    that does not resolve in the document stays as it is (the remote check
    refuses it).
    """
    targets, refs = _refs_and_targets(schema)
    refs = [node for node in refs if not node["$ref"].startswith("#")]
    resolver = _local_resolver(schema) if refs else None
    if resolver is None:
        return
    for node in refs:
        try:
            found = resolver.lookup(node["$ref"]).contents
        except Exception:  # referencing.exceptions.Unresolvable and friends
            continue
        where = next((p for obj, p in targets if obj is found), None)
        if where is not None:
            node["$ref"] = "#" + where


def _rebase_refs(schema: dict[str, Any], prefix: str) -> None:
    """Rewrite the local refs in ``schema`` for its place at JSON pointer ``prefix`` in a larger one.  Changes it.

    ``#`` and ``#/...`` (and ``#anchor``) inside a tool's parameters mean the
    parameters object; once it sits inside the tools' combined schema they
    must name the same subschema from that schema's root.  Refs inside a
    nested ``$id`` scope are relative to that scope and stay.  The refs were
    checked to resolve (:func:`check_json_schema`).
    """
    targets, refs = _refs_and_targets(schema)
    refs = [node for node in refs if node["$ref"].startswith("#")]
    resolver = _local_resolver(schema) if refs else None
    if resolver is None:
        return
    for node in refs:
        ref = node["$ref"]
        try:
            found = resolver.lookup(ref).contents
        except Exception:  # referencing.exceptions.Unresolvable: refused before, by the check
            continue
        where = next((p for obj, p in targets if obj is found), None)
        if where is None and (ref == "#" or ref.startswith("#/")):
            where = ref[1:]  # a boolean subschema: the pointer itself
        if where is not None:
            node["$ref"] = "#" + prefix + where


def _warn_unknown_keywords(schema: dict[str, Any]) -> None:
    """Warn about keywords no JSON Schema draft defines (a typo makes its object accept anything)."""
    import difflib
    import warnings

    from .base import GrammarWarning
    from .keywords import KNOWN_KEYWORDS, unknown_keywords

    unknown = unknown_keywords(schema)
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(KNOWN_KEYWORDS), n=1, cutoff=0.75)
        hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    warnings.warn(
        f"the schema uses {', '.join(hints)}, which no JSON Schema draft defines: validators and every grammar "
        "backend ignore unknown keywords, so they constrain nothing. Fix the spelling, or prefix your own "
        "annotations with 'x-'.",
        GrammarWarning,
        stacklevel=4,
    )


def _grammar_text(text: Any, name: str, example: str) -> str:
    if not isinstance(text, str):
        raise GrammarError(f"{name}= must be a string, got {type(text).__name__}; pass {example}")
    if not text.strip():
        raise GrammarError(f"{name}= is empty; pass {example}")
    return text


def _schema_dict(schema: Any) -> dict[str, Any]:
    """A JSON Schema as a fresh dict, from a dict, a boolean, a JSON string or a pydantic model class.

    ``True`` (any JSON value) is ``{}``; ``False`` matches nothing, so it is refused.
    """
    if isinstance(schema, bool):
        if not schema:
            raise GrammarError(
                "schema=False is a valid JSON Schema that no value matches, so no output could follow it; pass "
                "a satisfiable schema (schema=True means any JSON value)"
            )
        return {}
    if isinstance(schema, Mapping):
        _check_depth(schema)
        return copy.deepcopy(dict(schema))
    if isinstance(schema, (str, bytes)):
        try:
            parsed = json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarError(
                f"schema= is a string but not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); "
                "pass the JSON Schema as a dict or as a JSON string"
            ) from None
        if isinstance(parsed, bool):
            return _schema_dict(parsed)
        _check_depth(parsed)
        if not isinstance(parsed, dict):
            raise GrammarError(
                f"schema= is valid JSON but holds a {type(parsed).__name__}, and a JSON Schema must be an object "
                'or a boolean; pass a JSON Schema object such as {"type": "object"}'
            )
        return parsed
    model_schema = _pydantic_schema(schema)
    if model_schema is not None:
        return model_schema
    raise GrammarError(
        f"schema= must be a JSON Schema (a dict, True, or a JSON string) or a pydantic model class, got "
        f"{type(schema).__name__}"
    )


def _pydantic_schema(obj: Any) -> dict[str, Any] | None:
    """The JSON Schema of a pydantic model class, or ``None`` if ``obj`` is not one."""
    if not isinstance(obj, type):
        return None
    try:
        from pydantic import BaseModel  # optional dependency
    except ImportError:
        return None
    if not issubclass(obj, BaseModel):
        return None
    return obj.model_json_schema()


def _remote_ref(node: Any) -> str | None:
    """The first ``$ref`` that points outside the document, if any.

    A reference to a URI the document itself declares with ``$id`` (at the
    root or on a subschema) is local: it is resolved with ``referencing``
    over the document alone, so nothing is fetched.
    """
    refs = [s["$ref"] for s in schema_nodes(node) if isinstance(s.get("$ref"), str) and not s["$ref"].startswith("#")]
    if not refs:
        return None
    resolver = _local_resolver(node)
    for ref in refs:
        if resolver is None:
            return ref
        try:
            resolver.lookup(ref)
        except Exception:  # referencing.exceptions.Unresolvable and friends: not in this document
            return ref
    return None


def _dangling_ref(node: dict[str, Any]) -> str | None:
    """The first local ``$ref`` (``#...``, outside nested ``$id`` scopes) that resolves to nothing in ``node``."""
    _, refs = _refs_and_targets(node)
    local = [n["$ref"] for n in refs if n["$ref"].startswith("#")]
    resolver = _local_resolver(node) if local else None
    if resolver is None:
        return None
    for ref in local:
        try:
            resolver.lookup(ref)
        except Exception:  # referencing.exceptions.Unresolvable and friends
            return ref
    return None


#: Digests of schemas that passed :func:`check_json_schema` lately (at most this many, 32 bytes each).
_CHECKED_LIMIT = 1024
_CHECKED: LRU[bytes, bool] = LRU(_CHECKED_LIMIT)
_CHECKED_LOCK = threading.Lock()


def _digest(schema: Any) -> bytes | None:
    """SHA-256 of ``schema``'s canonical JSON (keys sorted), or ``None`` when it is not plain JSON.

    Plain means it reads back equal: a tuple, a non-string key or a NaN (which
    the check may judge differently from their JSON forms) gives ``None``.
    """
    try:
        text = json.dumps(schema, sort_keys=True, ensure_ascii=False, allow_nan=False)
        if json.loads(text) != schema:
            return None
    except (TypeError, ValueError, RecursionError):
        return None
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def check_json_schema(schema: Any, *, where: str = "the schema") -> None:
    """Raise :class:`GrammarError` unless ``schema`` is a valid JSON Schema object.

    Uses the validator class named by ``$schema`` (latest draft by default).
    Does not change ``schema``.  A schema that passed lately (the same
    canonical JSON, keys in any order) passes again without the meta-schema
    walk, which costs tens of milliseconds for a large schema on every call
    otherwise; a failing one is checked, and refused, every time.
    """
    digest = _digest(schema) if isinstance(schema, dict) else None
    if digest is not None:
        with _CHECKED_LOCK:
            if _CHECKED.get(digest, False):
                return
    _check_json_schema(schema, where)
    if digest is not None:
        with _CHECKED_LOCK:
            _CHECKED.put(digest, True)


def _check_json_schema(schema: Any, where: str) -> None:
    """:func:`check_json_schema` without the memo."""
    if not isinstance(schema, dict):
        raise GrammarError(
            f"{where} must be a JSON object (a dict), got {type(schema).__name__}; "
            'for example {"type": "object", "properties": {...}}'
        )
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    remote = _remote_ref(schema)
    if remote is not None:
        raise GrammarError(
            f"{where} has a remote $ref {remote!r}; grammarspec fetches nothing over the network. "
            "Inline the referenced schema (or put it under $defs and refer to it as '#/$defs/...')."
        )
    from .ecma_regex import regex_format_checker

    cls = validator_for(schema)
    meta = validator_for(cls.META_SCHEMA, default=cls)  # what cls.check_schema does, with ECMA-262 patterns read
    checker = regex_format_checker(meta.FORMAT_CHECKER)  # Unicode property escapes (\p{Lu}), which re alone is not
    error = next(iter(meta(cls.META_SCHEMA, format_checker=checker).iter_errors(schema)), None)
    if error is not None:
        e = SchemaError.create_from(error)
        path = "/".join(str(p) for p in e.absolute_path) or "(root)"
        cause = f" ({e.cause})" if e.cause is not None else ""
        raise GrammarError(
            f"{where} is not a valid JSON Schema: at {path}: {e.message}{cause}. "
            "Fix that part of the schema (jsonschema's check_schema must pass)."
        )
    from .ref_cycles import cycle_message, same_value_cycle

    cycle = same_value_cycle(schema)
    if cycle is not None:
        raise GrammarError(cycle_message(cycle, where))


#: Keywords that bring properties from other schema objects: ``additionalProperties`` sees only its siblings.
_ELSEWHERE = ("$ref", "allOf", "anyOf", "oneOf", "$dynamicRef")

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def tools_schema(tools: Sequence[Mapping[str, Any]], parallel: bool = False) -> dict[str, Any]:
    """The JSON Schema of one call to any of ``tools`` (a list of calls if ``parallel``).

    ``tools``: OpenAI-style definitions ``{"type": "function", "function":
    {"name", "description", "parameters"}}`` (the flat form with ``name`` and
    ``parameters`` at the top level is accepted too).  One call is
    ``{"name": <const>, "arguments": <the tool's parameters>}``; with several
    tools the schema is an ``anyOf`` over them, in the given order.  The
    arguments object gets ``additionalProperties: false`` unless the tool sets
    it (as OpenAI's strict mode does) or takes its properties from elsewhere
    (a ``$ref``, ``allOf``, ``anyOf`` or ``oneOf`` beside it, where ``false``
    would forbid them all).  With ``parallel=True`` the schema is an
    array of such calls with ``minItems: 1``.  A local ``$ref`` inside a
    tool's parameters names a part of those parameters (``#`` is the
    parameters object), as when the tool is used alone: it is rewritten to
    that part's path in the combined schema; one that names nothing there is
    refused, naming the tool and the ref.  Pure function.
    """
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise GrammarError(
            "tools= must be a list of tool definitions like "
            '[{"type": "function", "function": {"name": ..., "parameters": {...}}}]'
        )
    if not tools:
        raise GrammarError("tools= is empty; pass at least one tool definition")
    calls = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        name, parameters = _tool_definition(tool, i)
        if name in seen:
            raise GrammarError(f"tools[{i}]: the tool name {name!r} is used twice; tool names must be unique")
        seen.add(name)
        # refs inside name the tool's own parameters: rebase them onto the root of the combined schema
        where = ("/items" if parallel else "") + (f"/anyOf/{i}" if len(tools) > 1 else "") + "/properties/arguments"
        _rebase_refs(parameters, where)
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"type": "string", "const": name}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    call = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if parallel:
        return {"type": "array", "items": call, "minItems": 1}
    return call


def _tool_definition(tool: Any, i: int) -> tuple[str, dict[str, Any]]:
    """``(name, arguments schema)`` of ``tools[i]``, checked."""
    where = f"tools[{i}]"
    if not isinstance(tool, Mapping):
        raise GrammarError(
            f'{where} must be a dict like {{"type": "function", "function": {{...}}}}, got {type(tool).__name__}'
        )
    kind = tool.get("type", "function")
    if kind != "function":
        raise GrammarError(f'{where} has type {kind!r}; only function tools ("type": "function") are supported')
    function = tool.get("function", tool)
    if not isinstance(function, Mapping):
        raise GrammarError(f"{where}['function'] must be a dict with 'name' and 'parameters'")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise GrammarError(f'{where} has no function name; add "name": "..." to its function definition')
    if not _TOOL_NAME.match(name):
        raise GrammarError(f"{where}: tool name {name!r} is invalid; use 1-64 letters, digits, '_', '-' or '.'")
    where = f"{where} ({name!r})"
    parameters = function.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, Mapping):
        raise GrammarError(
            f"{where}: 'parameters' must be a JSON Schema object (dict), got {type(parameters).__name__}"
        )
    parameters = copy.deepcopy(dict(parameters))
    declared = parameters.get("type", "object")
    if declared != "object":
        raise GrammarError(
            f'{where}: \'parameters\' must describe an object ("type": "object"), got type {declared!r}; '
            'wrap the arguments in an object schema with "properties"'
        )
    parameters.setdefault("type", "object")
    if not any(key in parameters for key in _ELSEWHERE):  # there, false would forbid the properties named elsewhere
        parameters.setdefault("additionalProperties", False)
    check_json_schema(parameters, where=f"{where} parameters")
    dangling = _dangling_ref(parameters)
    if dangling is not None:  # checked here, where the tool can be named: once combined, a backend only sees a path
        raise GrammarError(
            f"{where} parameters has a $ref {dangling!r} that points at nothing in them (there '#' means the "
            "parameters object, and '#/$defs/NAME' a schema under its own $defs). Fix the reference, or add "
            "the schema it names."
        )
    return name, parameters
