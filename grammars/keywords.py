"""What a JSON Schema uses: its keywords, the ones no draft knows, and whether any value satisfies it.

Pure functions over a parsed schema; no backend state.

    >>> sorted(used_keywords({"type": "array", "items": {"type": "string", "pattern": "^a$"}}))
    ['items', 'pattern', 'type']
    >>> unknown_keywords({"type": "object", "propertiez": {"a": {}}})
    ['propertiez']
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .schema_walk import schema_nodes

__all__ = ["KNOWN_KEYWORDS", "ANNOTATIONS", "used_keywords", "unknown_keywords", "unsatisfiable", "schema_objects"]

#: Keywords whose values are not schemas and that, but for the dynamic references (``$dynamicRef``,
#: ``$dynamicAnchor``, ``$recursiveRef``, ``$recursiveAnchor``, which :mod:`grammars.capabilities` classifies per
#: backend), only describe: no backend needs to enforce them.
ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "id",
        "$anchor",
        "$dynamicAnchor",
        "$comment",
        "$vocabulary",
        "$defs",
        "definitions",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$ref",
        "$dynamicRef",
        "$recursiveRef",
        "$recursiveAnchor",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
        # OpenAPI / pydantic / Snowplow ("self") / json-editor ("propertyOrder") extensions seen in production schemas
        "nullable",
        "discriminator",
        "example",
        "externalDocs",
        "xml",
        "self",
        "propertyOrder",
    }
)

#: Every keyword of JSON Schema drafts 4 to 2020-12 (validation and applicators) plus :data:`ANNOTATIONS`.
KNOWN_KEYWORDS = ANNOTATIONS | frozenset(
    {
        "type",
        "enum",
        "const",
        "properties",
        "required",
        "additionalProperties",
        "patternProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "dependencies",
        "dependentRequired",
        "dependentSchemas",
        "unevaluatedProperties",
        "items",
        "prefixItems",
        "additionalItems",
        "contains",
        "minContains",
        "maxContains",
        "minItems",
        "maxItems",
        "uniqueItems",
        "unevaluatedItems",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
    }
)


def used_keywords(schema: Any) -> set[str]:
    """Every keyword used by any schema object in ``schema`` (annotations included).  Pure."""
    found: set[str] = set()
    for node in schema_nodes(schema):
        found.update(key for key in node if isinstance(key, str))
    return found


def schema_objects(schema: Any) -> Iterator[dict[str, Any]]:
    """Every schema object in ``schema`` (itself included), outermost first, reached through known keywords only.

    Unlike :func:`grammars.spec.schema_nodes`, the value of an unknown
    keyword (``"self": {"vendor": ..., "format": "jsonschema"}`` in a
    Snowplow schema) is not a schema and is not searched.  Pure.
    """
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(reversed(node))
            continue
        if not isinstance(node, dict):
            continue
        yield node
        children: list[Any] = []
        for key, value in node.items():
            if not isinstance(key, str) or key not in KNOWN_KEYWORDS or key in _DATA or key in _NOT_SCHEMAS:
                continue
            if key in _MAPS and isinstance(value, dict):
                children.extend(value.values())
            elif isinstance(value, (dict, list)):
                children.append(value)
        stack.extend(reversed(children))


def unknown_keywords(schema: Any) -> list[str]:
    """Keywords no JSON Schema draft defines (``x-...`` extensions aside), in order of appearance.

    A typo such as ``propertiez`` makes a schema object accept anything, so
    callers warn about these.  Only schema objects are searched (those of
    :func:`schema_objects`): the values of unknown keywords and annotations
    such as OpenAPI's ``discriminator`` are not schemas.  Pure.

    >>> unknown_keywords({"discriminator": {"propertyName": "kind"}, "oneOf": [{"typ": "string"}]})
    ['typ']
    """
    found: dict[str, None] = {}
    for node in schema_objects(schema):
        found.update((key, None) for key in node if isinstance(key, str) and _unknown(key))
    return list(found)


def _unknown(key: str) -> bool:
    return key not in KNOWN_KEYWORDS and not key.startswith("x-")


#: Annotations whose values are not schemas (``$defs``/``definitions`` are maps of schemas; ``contentSchema`` is one).
_NOT_SCHEMAS = ANNOTATIONS - {"$defs", "definitions", "contentSchema"}
#: Keywords whose values are data, and keywords whose values map names to schemas.
_DATA = frozenset({"enum", "const", "default", "examples", "example", "required", "dependentRequired"})
_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"})


def unsatisfiable(schema: Any) -> str | None:
    """Why no JSON value satisfies ``schema`` (``minimum > maximum``, an empty ``enum``, ``false``, ...), else ``None``.

    Asks llguidance's JSON compiler, which proves these cases without a
    tokenizer; ``None`` when llguidance is not installed or finds nothing
    (which is not a proof of satisfiability).  Pure.

    >>> unsatisfiable({"type": "integer", "minimum": 5, "maximum": 2})  # doctest: +SKIP
    'minimum (5) is greater than maximum (2)'
    """
    if schema is False:
        return "the schema is false (it admits no value)"
    if isinstance(schema, dict) and any(f"draft-0{n}" in str(schema.get("$schema", "")) for n in range(3, 8)):
        return None  # llguidance reads a $ref beside other keywords as 2020-12 does; drafts 3 to 7 ignore those
    try:
        import llguidance
    except ImportError:  # pragma: no cover - llguidance is a dependency
        return None
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides={"lenient": True})
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    except Exception:
        return None
    if not is_error or not messages:
        return None
    marker = "Unsatisfiable schema:"
    text = " ".join(messages[0].split())
    if marker not in text:
        return None
    return text.split(marker, 1)[1].strip()
