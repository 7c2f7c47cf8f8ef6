"""What each grammar backend enforces of a JSON Schema, as the fuzz checks judge it.

:data:`ENFORCED` lists the keywords whose violation a backend's grammar
rejects; :func:`is_enforced` says whether one ``jsonschema`` error is of
such a keyword in a place where the backend applies it.  The fuzz uses it
to tell a bug (an enforced keyword violated) from a known gap (a keyword
the backend ignores, which a :class:`grammarspec.Completion` checks).
Measured on xgrammar 0.2.9 and outlines-core 0.2.14; every claim is pinned by
``tests/grammars/test_fuzz_corpus.py`` on a toy vocabulary.

:mod:`grammars.capabilities` holds the runtime's own table (which
features each backend enforces, ignores or refuses, per schema); this one
answers a different question, per ``jsonschema`` error and its schema path,
and is kept here until the two are reconciled.  They differ where the
schema's shape matters: outlines-core rejects ``{}`` for ``minProperties: 1``
beside ``additionalProperties`` (pinned by tests/grammars/test_fuzz_corpus.py), not
beside optional ``properties`` alone (the capabilities probe), so one says
enforced and the other ignored.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT7

from grammars.capabilities import LOOKAROUND
from grammars.outlines_backend import length_yields_to_shape
from grammars.registry import get

__all__ = ["BACKENDS", "ENFORCED", "FORMATS", "UNENFORCED_CONTEXTS", "is_enforced"]

#: The backends this module has tables for (llguidance refuses what it does not enforce: nothing to tell apart).
BACKENDS = ("xgrammar", "outlines")

#: Keywords whose violation the backend's grammar rejects, wherever they stand outside
#: the contexts in :data:`UNENFORCED_CONTEXTS` (with the exceptions of
#: :func:`_step_enforced` and :func:`_keyword_enforced`).  Measured on xgrammar 0.2.9 and outlines-core 0.2.14 in
#: grammarspec's default (compact, strict) mode; tests/grammars/test_fuzz_corpus.py pins every
#: entry with a violating instance on a toy vocabulary.
# Keyword tables: packed lines read better than one keyword per line.
# fmt: off
ENFORCED: dict[str, frozenset[str]] = {
    "xgrammar": frozenset(
        {
            "type", "enum", "const", "required", "additionalProperties", "items", "prefixItems",
            "minItems", "maxItems", "minLength", "maxLength", "pattern", "minimum", "maximum",
            "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minProperties", "maxProperties",
            "propertyNames", "anyOf", "oneOf",
        }
    ),
    "outlines": frozenset(
        {
            "type", "enum", "const", "required", "additionalProperties", "items", "prefixItems",
            "minItems", "maxItems", "minLength", "maxLength", "pattern", "minProperties", "anyOf",
            "oneOf",
        }
    ),
}

#: ``format`` values each backend turns into a grammar (its declared capabilities; others are ignored or
#: refused).  A format is only approximated by a regex (``2023-02-30`` has the shape of a date), so
#: ``format`` is not in :data:`ENFORCED`: a completion must check it, and does.
FORMATS: dict[str, frozenset[str]] = {name: get(name).capabilities.formats for name in BACKENDS}

#: Nothing below these keywords is enforced: the backends ignore them (``not``,
#: ``if``/``then``/``else``, ``dependencies``, ``contains``, ...) or only approximate
#: them (``allOf``, ``patternProperties``).
UNENFORCED_CONTEXTS = frozenset(
    {
        "not", "if", "then", "else", "allOf", "dependencies", "dependentSchemas", "dependentRequired",
        "contains", "patternProperties", "unevaluatedProperties", "unevaluatedItems", "additionalItems",
    }
)
# fmt: on

#: Keywords that lead to subschemas without being enforced themselves.
_STRUCTURAL = frozenset({"properties", "definitions", "$defs", "$ref"})
#: Keywords whose next schema-path segment is a name (not a keyword).
_NAMED_CHILDREN = frozenset(
    {"properties", "patternProperties", "definitions", "$defs", "dependencies", "dependentSchemas"}
)
#: Keywords whose next schema-path segment is an index.
_INDEXED_CHILDREN = frozenset({"anyOf", "oneOf", "allOf", "prefixItems", "items"})
#: Keywords that only constrain one JSON type; both backends ignore them unless ``type`` names it.
# A keyword -> type table, packed like the ones above.
# fmt: off
_TYPE_OF = {
    "pattern": "string", "minLength": "string", "maxLength": "string", "format": "string",
    "minimum": "number", "maximum": "number", "exclusiveMinimum": "number", "exclusiveMaximum": "number",
    "multipleOf": "number", "items": "array", "prefixItems": "array", "minItems": "array", "maxItems": "array",
}
# fmt: on
_COMBINATORS = ("anyOf", "oneOf", "allOf")


def is_enforced(error: Any, backend: str, root: Any) -> bool:
    """Whether ``backend``'s grammar must reject an instance that has this jsonschema error.

    ``error``: a ``jsonschema.ValidationError`` raised against the schema
    ``root``.  Every step of the error's schema path must be enforced (see
    :func:`_step_enforced`): what the backends ignore (``not``, siblings of
    ``$ref``/``anyOf``/``enum``, string keywords without ``"type": "string"``,
    ...) enforces nothing below it.  An ``anyOf``/``oneOf`` error is enforced
    when every branch fails on an enforced keyword; a ``oneOf`` error where
    some branch matches ("valid under each of") is not.  Pure.

    Worked example (xgrammar): ``{"type": "integer", "not": {"const": 1}}`` and
    the instance ``1`` give one error, keyword ``not``: not enforced.  The
    instance ``"x"`` gives a ``type`` error: enforced.
    """
    steps = _path_steps(root, list(error.absolute_schema_path))
    if not steps or not all(_step_enforced(node, keyword, backend) for node, keyword in steps):
        return False
    node, keyword = steps[-1]
    if keyword in ("anyOf", "oneOf"):
        if not isinstance(error.validator_value, list):
            return False
        failing: dict[Any, list[Any]] = defaultdict(list)
        for sub in error.context or ():
            failing[sub.relative_schema_path[0]].append(sub)
        if len(failing) < len(error.validator_value):  # some branch matches
            return False
        return all(any(is_enforced(sub, backend, root) for sub in subs) for subs in failing.values())
    return _keyword_enforced(keyword, node, backend)


def _path_steps(root: Any, path: Sequence[Any]) -> list[tuple[dict[str, Any], str]] | None:
    """``(schema node, keyword)`` for every keyword on a jsonschema schema path.

    jsonschema leaves ``$ref`` out of its paths; where the next segment is not
    in the node but the node has a local ``$ref``, the walk follows it (as the
    step ``(node, "$ref")``).  ``None`` when the path cannot be followed (a
    remote reference, say).  Pure.

    >>> _path_steps({"properties": {"a": {"type": "string"}}}, ["properties", "a", "type"])
    [({'properties': {'a': {'type': 'string'}}}, 'properties'), ({'type': 'string'}, 'type')]
    """
    steps: list[tuple[dict[str, Any], str]] = []
    node = root
    i = 0
    for _ in range(10_000):  # bounded: a $ref cycle without progress ends the walk
        if i >= len(path):
            return steps
        if not isinstance(node, dict):
            return None
        keyword = path[i]
        if keyword not in node:
            target = _resolve(root, node.get("$ref"))
            if target is None:
                return None
            steps.append((node, "$ref"))
            node = target
            continue
        steps.append((node, keyword))
        child = node[keyword]
        i += 1
        if keyword == "propertyNames" and isinstance(child, dict):
            child = {"type": "string", **child}  # property names are strings
        if keyword in _NAMED_CHILDREN or (keyword in _INDEXED_CHILDREN and isinstance(child, list)):
            if i >= len(path):
                return steps
            try:
                child = child[path[i]]
            except (KeyError, IndexError, TypeError):
                return None
            i += 1
        node = child
    return None


def _resolve(root: Any, ref: Any) -> Any:
    """The subschema a local ``$ref`` (``#`` or ``#/json/pointer``) points at, else ``None``.

    Resolved by ``referencing`` (jsonschema's own resolver) against ``root``;
    remote references are not followed.

    >>> _resolve({"$defs": {"a": {"type": "string"}}}, "#/$defs/a")
    {'type': 'string'}
    >>> _resolve({}, "#/$defs/missing") is None
    True
    """
    if not isinstance(ref, str) or not ref.startswith("#") or not isinstance(root, dict):
        return None
    resource = Resource.from_contents(root, default_specification=DRAFT7)
    try:
        return Registry().resolver_with_root(resource).lookup(ref).contents
    except Unresolvable:
        return None


def _step_enforced(node: dict[str, Any], keyword: str | None, backend: str) -> bool:
    """Whether the backend applies ``keyword`` of ``node`` at all (what it checks aside).

    Both backends drop the siblings of ``$ref``, of ``anyOf``/``oneOf``/``allOf``
    and of ``enum``/``const``, and ignore a type-specific keyword (``pattern``,
    ``maximum``, ``maxItems``, ...) when ``type`` does not name that type.
    """
    if keyword is None or keyword in UNENFORCED_CONTEXTS:
        return False
    if keyword not in ENFORCED[backend] and keyword not in _STRUCTURAL:
        return False
    if "$ref" in node and keyword != "$ref":
        return False
    if any(c in node for c in _COMBINATORS) and keyword not in _COMBINATORS:
        return False
    if ("enum" in node or "const" in node) and keyword not in ("enum", "const"):
        return False
    kind = _TYPE_OF.get(keyword)
    if kind is not None:
        declared = node.get("type")
        types = declared if isinstance(declared, list) else [declared]
        if kind not in types and not (kind == "number" and "integer" in types):
            return False
    return True


def _keyword_enforced(keyword: str | None, node: dict[str, Any], backend: str) -> bool:
    """Whether the backend checks ``keyword`` of ``node`` exactly (for the failing keyword)."""
    if keyword == "pattern":
        return _plain_pattern(node.get("pattern"))
    if keyword in ("minLength", "maxLength") and _shaped(node, backend):
        return False  # a pattern or format wins over length bounds (xgrammar; grammarspec's outlines adapter)
    if keyword == "multipleOf":
        return node.get("type") == "integer"  # xgrammar: "multipleOf is not supported for type:number"
    if keyword in ("minimum", "maximum") and any(
        isinstance(node.get(k), bool) for k in ("exclusiveMinimum", "exclusiveMaximum")
    ):
        return False  # draft-4 boolean exclusive bounds
    return keyword in ENFORCED[backend]


def _shaped(node: dict[str, Any], backend: str) -> bool:
    """Whether ``node``'s string shape comes from ``pattern`` or ``format`` rather than its length bounds."""
    if backend == "xgrammar":
        return "pattern" in node or "format" in node
    return length_yields_to_shape(node)


def _plain_pattern(pattern: Any) -> bool:
    """A regex without lookaround and without ``^``/``$`` in the middle (xgrammar ignores both)."""
    if not isinstance(pattern, str) or LOOKAROUND.search(pattern):
        return False
    inner = pattern[1:] if pattern.startswith("^") else pattern
    inner = inner[:-1] if inner.endswith("$") and not inner.endswith("\\$") else inner
    in_class = escaped = False
    for char in inner:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "[":
            in_class = True
        elif char == "]":
            in_class = False
        elif char in "^$" and not in_class:
            return False
    return True
