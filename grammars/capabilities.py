"""Which JSON-Schema keywords each backend enforces: the :class:`Capabilities` each declares, checked by probes.

Each backend module declares its own ``capabilities`` (a
:class:`~grammars.features.Capabilities`, re-exported here: the grammar kinds it
compiles, a table of features, its formats, its rank for ``backend="auto"``);
this module reads them through :mod:`grammars.registry` and answers, per
schema, what a backend enforces.  For every backend and every *feature* (a keyword, or a keyword in a setting
that changes how a backend treats it, such as ``maxLength`` beside a
``pattern``) the table says one of:

* ``"enforced"``: the grammar rejects every instance that violates it;
* ``"ignored"``: the schema compiles but the grammar lets violations through
  (the output must be post-validated: see :mod:`grammars.validation`);
* ``"refused"``: the backend does not compile a schema that uses it
  (a :class:`~grammars.base.GrammarError` that names it).

The entries come from the fuzz tool's findings on the production corpus
(xgrammar 0.2.9, outlines-core 0.2.14, llguidance 1.9) and every one is
checked by :data:`PROBES`: tests/grammars/test_spec.py compiles each probe's
schema on a toy vocabulary (:func:`grammars.probes.run_probe`) and checks that
an invalid instance is (or is not) rejected, so a backend upgrade that changes an entry fails a test.

A ``format`` is the feature ``"format:<name>"``: ``"enforced"`` when the
backend turns it into a grammar (:attr:`Capabilities.formats`; only approximately: the
regex of a date accepts ``2023-02-30``, so a finished output is always
validated with format checking), else what the backend does with an unknown
format (xgrammar ignores it; outlines-core and llguidance refuse it).

    >>> unenforced({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "xgrammar")
    ['uniqueItems']
    >>> refused({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "llguidance")
    ['uniqueItems']
    >>> unenforced({"type": "string", "pattern": "^a+$", "maxLength": 3}, "llguidance")
    []
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .features import CORE, FEATURES, Capabilities, Support
from .keywords import ANNOTATIONS, KNOWN_KEYWORDS, schema_objects
from .registry import REGISTRY, get

__all__ = [
    "Support",
    "Capabilities",
    "CORE",
    "FEATURES",
    "tables",
    "PROBES",
    "Probe",
    "features_used",
    "unenforced",
    "refused",
    "support",
    "LOOKAROUND",
    "enforced_keywords",
    "KEYWORDS_2020_12",
    "NEUTRAL_2020_12",
]

#: A regex with look-ahead or look-behind.
LOOKAROUND = re.compile(r"\(\?<?[=!]")

_E: Support = "enforced"
_I: Support = "ignored"
_R: Support = "refused"


def tables() -> dict[str, Mapping[str, Support]]:
    """Every registered backend's table, by backend name.  Pure."""
    return {backend.name: backend.capabilities.table for backend in REGISTRY}


#: Keywords that change which values are valid although :data:`~grammars.keywords.ANNOTATIONS` lists them (their
#: values are not schemas): dynamic references resolve at validation time, and a backend that ignores them leaves
#: that part of the schema unconstrained.
_DYNAMIC = frozenset({"$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor"})

#: Keywords that only annotate or lead to subschemas; never reported as unenforced.
_NEUTRAL = (ANNOTATIONS - _DYNAMIC) | {"properties", "format"}

#: Every keyword of JSON Schema 2020-12 (core, applicator, unevaluated, validation, format, content, meta-data).
#: Each is either in :data:`NEUTRAL_2020_12` or a feature with an entry in every backend's table (a test checks).
KEYWORDS_2020_12 = frozenset(
    "$schema $id $ref $anchor $dynamicRef $dynamicAnchor $vocabulary $comment $defs prefixItems items contains "
    "additionalProperties properties patternProperties dependentSchemas propertyNames if then else allOf anyOf "
    "oneOf not unevaluatedItems unevaluatedProperties type const enum multipleOf maximum exclusiveMaximum minimum "
    "exclusiveMinimum maxLength minLength pattern maxItems minItems uniqueItems maxContains minContains "
    "maxProperties minProperties required dependentRequired format contentEncoding contentMediaType contentSchema "
    "title description default deprecated readOnly writeOnly examples".split()
)
#: The 2020-12 keywords that constrain nothing themselves (annotations; ``properties`` and ``format`` are judged
#: through their subschemas and ``format:<name>``).
NEUTRAL_2020_12 = KEYWORDS_2020_12 & _NEUTRAL


def support(backend: str, feature: str) -> Support:
    """The table entry for ``feature`` on ``backend`` (``"ignored"`` when not listed).  Pure."""
    capabilities = get(backend).capabilities
    if feature.startswith("format:"):
        return "enforced" if feature[7:] in capabilities.formats else capabilities.other_formats
    return capabilities.table.get(feature, _I)


def features_used(schema: Any) -> list[str]:
    """The features (keys of a backend's table) ``schema`` uses, in order of first use.  Pure.

    >>> features_used({"type": "string", "pattern": "^(?!x)a+$", "maxLength": 3})
    ['type', 'pattern', 'maxLength', 'pattern:lookaround', 'maxLength+pattern']
    """
    found: dict[str, None] = {}
    for node in schema_objects(schema):
        for key in node:
            if isinstance(key, str) and key in KNOWN_KEYWORDS and key not in _NEUTRAL:
                found[key] = None
        if isinstance(node.get("format"), str) and node.get("type", "string") == "string":
            found[f"format:{node['format']}"] = None
        pattern = node.get("pattern")
        if isinstance(pattern, str) and LOOKAROUND.search(pattern):
            found["pattern:lookaround"] = None
        if isinstance(pattern, str) or "format" in node:
            for bound in ("maxLength", "minLength"):
                if bound in node:
                    found[f"{bound}+pattern"] = None
        if "multipleOf" in node and node.get("type") != "integer":
            found["multipleOf:number"] = None
        if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
            found["allOf:multi"] = None
        if isinstance(node.get("oneOf"), list) and len(node["oneOf"]) > 1:
            found["oneOf:overlap"] = None  # overlap is not decidable here: assume it may
        validation = [k for k in node if k in KNOWN_KEYWORDS and k not in _NEUTRAL]
        if "$ref" in node and validation:
            found["$ref+siblings"] = None
        if any(k in node for k in ("anyOf", "oneOf", "allOf")) and any(
            k not in ("anyOf", "oneOf", "allOf") for k in validation
        ):
            found["anyOf+siblings"] = None
        if any(k in node for k in ("enum", "const")) and (
            any(k not in ("enum", "const", "type") for k in validation) or not _values_have_type(node)
        ):
            found["enum+siblings"] = None
    if "$dynamicRef" not in found:  # an anchor nothing refers to dynamically changes nothing
        found.pop("$dynamicAnchor", None)
    return list(found)


_JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
    "array": (list,),
    "object": (dict,),
}


def _values_have_type(node: dict[str, Any]) -> bool:
    """Whether every ``enum``/``const`` value of ``node`` has the ``type`` beside it (then dropping it loses nothing)."""
    declared = node.get("type")
    if declared is None:
        return True
    types = declared if isinstance(declared, list) else [declared]
    values = list(node.get("enum") or []) + ([node["const"]] if "const" in node else [])

    def has(value: Any, name: Any) -> bool:
        if isinstance(value, bool) and name in ("integer", "number"):
            return False
        if name == "integer" and isinstance(value, float):
            return value.is_integer()
        return isinstance(value, _JSON_TYPES.get(name, ()))

    return all(any(has(v, t) for t in types) for v in values)


def unenforced(schema: Any, backend: str, features: Iterable[str] | None = None) -> list[str]:
    """The features of ``schema`` that ``backend`` does not enforce, were the schema to compile.  Pure.

    A feature the table marks ``"refused"`` counts as unenforced too: when
    a schema that uses it compiles all the same (the probe's form was
    refused, this one was not), nothing says it is enforced.
    ``oneOf:overlap`` is left out where ``oneOf`` is enforced: a ``oneOf``
    over disjoint branches (the common case) is, and overlap is not
    decidable from the schema alone.
    """
    used = features_used(schema) if features is None else list(features)
    return [f for f in used if f != "oneOf:overlap" and support(backend, f) != _E]


def refused(schema: Any, backend: str) -> list[str]:
    """The features of ``schema`` that ``backend`` refuses to compile.  Pure."""
    return [f for f in features_used(schema) if support(backend, f) == _R]


@dataclass(frozen=True)
class Probe:
    """A schema, an instance that violates ``feature`` only, and (optionally) one that is valid.

    Instances are compact JSON over the toy vocabulary of tests/toy.py
    (lower-case letters, digits, ``{}[]":,-._`` and space).
    """

    feature: str
    schema: dict[str, Any]
    invalid: str
    valid: str | None = None


_INT = {"type": "integer"}
_AB = {"a": _INT, "b": _INT}

#: One probe per feature of the backends' tables.
PROBES: tuple[Probe, ...] = (
    Probe("type", {"type": "integer"}, '"a"', "1"),
    Probe("enum", {"enum": ["a", "b"]}, '"c"', '"a"'),
    Probe("const", {"const": "a"}, '"b"', '"a"'),
    Probe("required", {"type": "object", "properties": {"a": _INT}, "required": ["a"]}, "{}", '{"a":1}'),
    Probe(
        "additionalProperties",
        {"type": "object", "properties": {"a": _INT}, "additionalProperties": False},
        '{"b":1}',
        '{"a":1}',
    ),
    Probe("items", {"type": "array", "items": _INT}, '["a"]', "[1]"),
    Probe("prefixItems", {"type": "array", "prefixItems": [_INT]}, '["a"]', "[1]"),
    Probe("minItems", {"type": "array", "items": _INT, "minItems": 2}, "[1]", "[1,2]"),
    Probe("maxItems", {"type": "array", "items": _INT, "maxItems": 1}, "[1,2]", "[1]"),
    Probe("minLength", {"type": "string", "minLength": 3}, '"ab"', '"abc"'),
    Probe("maxLength", {"type": "string", "maxLength": 2}, '"abc"', '"ab"'),
    Probe("pattern", {"type": "string", "pattern": "^a+$"}, '"b"', '"aa"'),
    Probe("format:date", {"type": "string", "format": "date"}, '"abc"', '"2024-01-02"'),
    Probe("format:uuid", {"type": "string", "format": "uuid"}, '"abc"', '"12345678-1234-1234-1234-123456789abc"'),
    Probe("format:ipv4", {"type": "string", "format": "ipv4"}, '"abc"', '"1.2.3.4"'),
    Probe("format:uri-reference", {"type": "string", "format": "uri-reference"}, '"a b"', '"a"'),
    Probe("anyOf", {"anyOf": [_INT, {"type": "boolean"}]}, '"a"', "1"),
    Probe("oneOf", {"oneOf": [_INT, {"type": "boolean"}]}, '"a"', "true"),
    Probe("$ref", {"$defs": {"i": _INT}, "$ref": "#/$defs/i"}, '"a"', "1"),
    Probe("minimum", {"type": "integer", "minimum": 5}, "3", "7"),
    Probe("maximum", {"type": "integer", "maximum": 5}, "7", "3"),
    Probe("exclusiveMinimum", {"type": "integer", "exclusiveMinimum": 5}, "5", "6"),
    Probe("exclusiveMaximum", {"type": "integer", "exclusiveMaximum": 5}, "5", "4"),
    Probe("multipleOf", {"type": "integer", "multipleOf": 3}, "4", "6"),
    Probe("multipleOf:number", {"type": "number", "multipleOf": 0.5}, "0.3", "1.5"),
    Probe("minProperties", {"type": "object", "properties": _AB, "minProperties": 1}, "{}", '{"a":1}'),
    Probe("maxProperties", {"type": "object", "properties": _AB, "maxProperties": 1}, '{"a":1,"b":2}', '{"a":1}'),
    Probe("propertyNames", {"type": "object", "propertyNames": {"pattern": "^a+$"}}, '{"b":1}', '{"aa":1}'),
    Probe("pattern:lookaround", {"type": "string", "pattern": "^(?!b)[a-z]+$"}, '"bc"', '"ab"'),
    Probe("maxLength+pattern", {"type": "string", "pattern": "^a+$", "maxLength": 2}, '"aaa"', '"aa"'),
    Probe("minLength+pattern", {"type": "string", "pattern": "^a+$", "minLength": 2}, '"a"', '"aa"'),
    Probe("allOf", {"allOf": [_INT]}, '"a"', "1"),
    Probe(
        "allOf:multi", {"allOf": [{"type": "object", "properties": {"a": _INT}}, {"required": ["a"]}]}, "{}", '{"a":1}'
    ),
    Probe("oneOf:overlap", {"oneOf": [_INT, {"type": "integer", "minimum": 0}]}, "1", "-1"),
    Probe("$ref+siblings", {"$defs": {"i": _INT}, "$ref": "#/$defs/i", "minimum": 5}, "3", "7"),
    Probe(
        "anyOf+siblings",
        {"type": "object", "properties": {"a": _INT}, "required": ["a"], "anyOf": [{"type": "object"}]},
        "{}",
        '{"a":1}',
    ),
    Probe("enum+siblings", {"type": "string", "enum": ["a", "bbb"], "maxLength": 2}, '"bbb"', '"a"'),
    Probe("enum+siblings", {"type": "object", "enum": ["a", {"b": 1}]}, '"a"', '{"b":1}'),  # type beside enum
    Probe("uniqueItems", {"type": "array", "items": _INT, "uniqueItems": True}, "[1,1]", "[1,2]"),
    Probe("contains", {"type": "array", "items": _INT, "contains": {"const": 5}}, "[1]", "[5]"),
    Probe("not", {"type": "integer", "not": {"const": 1}}, "1", "2"),
    Probe(
        "if",
        {"type": "object", "properties": _AB, "if": {"required": ["a"]}, "then": {"required": ["b"]}},
        '{"a":1}',
        '{"a":1,"b":2}',
    ),
    Probe(
        "then",
        {"type": "object", "properties": _AB, "if": {"required": ["a"]}, "then": {"required": ["b"]}},
        '{"a":1}',
        '{"b":2}',
    ),
    Probe(
        "else",
        {"type": "object", "properties": _AB, "if": {"required": ["a"]}, "then": {}, "else": {"required": ["b"]}},
        "{}",
        '{"b":2}',
    ),
    Probe(
        "dependentRequired",
        {"type": "object", "properties": _AB, "dependentRequired": {"a": ["b"]}},
        '{"a":1}',
        '{"b":2}',
    ),
    Probe(
        "dependentSchemas",
        {"type": "object", "properties": _AB, "dependentSchemas": {"a": {"required": ["b"]}}},
        '{"a":1}',
        '{"b":2}',
    ),
    Probe("dependencies", {"type": "object", "properties": _AB, "dependencies": {"a": ["b"]}}, '{"a":1}', '{"b":2}'),
    Probe(
        "patternProperties",
        {"type": "object", "patternProperties": {"^a": _INT}, "additionalProperties": True},
        '{"ab":"x"}',
        '{"ab":1}',
    ),
    Probe(
        "unevaluatedProperties",
        {"type": "object", "allOf": [{"properties": {"a": _INT}}], "unevaluatedProperties": False},
        '{"b":1}',
        '{"a":1}',
    ),
    Probe(
        "unevaluatedProperties",
        {"type": "object", "properties": {"a": _INT}, "unevaluatedProperties": _INT},
        '{"b":"x"}',
        '{"a":1}',
    ),
    Probe("propertyNames", {"type": "object", "propertyNames": {"maxLength": 1}}, '{"ab":1}', '{"a":1}'),
    Probe("unevaluatedItems", {"type": "array", "prefixItems": [_INT], "unevaluatedItems": False}, "[1,2]", "[1]"),
    Probe("unevaluatedItems", {"type": "array", "prefixItems": [_INT], "unevaluatedItems": _INT}, '[1,"a"]', "[1]"),
    Probe(
        "minContains", {"type": "array", "items": _INT, "contains": {"const": 5}, "minContains": 2}, "[5,1]", "[5,5]"
    ),
    Probe("maxContains", {"type": "array", "items": _INT, "contains": {"const": 5}, "maxContains": 1}, "[5,5]", "[5]"),
    Probe(
        "$dynamicRef",
        {"type": "array", "items": {"$dynamicRef": "#i"}, "$defs": {"i": {"$dynamicAnchor": "i", "type": "integer"}}},
        '["a"]',
        "[1]",
    ),
    Probe(
        "$dynamicAnchor",  # what the anchor names is what a $dynamicRef to it must match
        {"$defs": {"i": {"$dynamicAnchor": "i", "type": "integer"}}, "$dynamicRef": "#i"},
        '"a"',
        "1",
    ),
)


def enforced_keywords(backend: str) -> frozenset[str]:
    """The plain keywords (no setting) the table marks enforced for ``backend`` -- the fuzz tool's ``ENFORCED`` view.

    >>> "uniqueItems" in enforced_keywords("xgrammar"), "maxLength" in enforced_keywords("xgrammar")
    (False, True)
    """
    table = get(backend).capabilities.table
    return frozenset(k for k, v in table.items() if v == _E and ":" not in k and "+" not in k)
