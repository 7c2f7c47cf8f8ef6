"""Whether a finished output follows the *full* request: the check no grammar backend can skip.

Backends enforce only part of JSON Schema (see :mod:`grammars.capabilities`),
so every finished output is validated here with ``jsonschema`` (format
checking on; local ``$ref`` and ``$id`` resolved with ``referencing``, nothing
fetched).  Two things ``jsonschema`` alone cannot see are checked too:

* a key repeated in one object (``{"k":1,"k":2}``): ``json.loads`` keeps the
  last value and drops the rest, so the validator would judge a different
  document from the one the model wrote.  No grammar backend forbids repeats
  of a key matched by ``patternProperties``, ``additionalProperties`` or
  ``propertyNames``, so every output is parsed with ``object_pairs_hook`` and
  a repeat, at any depth, makes it invalid;
* ``pattern``/``patternProperties`` written in ECMA-262 (the dialect JSON
  Schema specifies) with Unicode property escapes such as ``\\p{Lu}``, which
  Python's ``re`` does not read: they are checked in the exact form
  :mod:`grammars.ecma_regex` gives them.

    >>> output_errors({"type": "array", "uniqueItems": True}, "[1,1]")
    ['[1, 1] has non-unique elements']
    >>> output_errors({"type": "integer"}, "12")
    []
    >>> output_errors({"type": "object"}, '{"a":{"k":1,"k":2}}')
    ["at a: the key 'k' appears 2 times in one object (a JSON parser keeps only the last value)"]
"""

from __future__ import annotations

import json
import re
from typing import Any

from .ecma_regex import python_pattern, python_schema, regex_format_checker
from .spec import GrammarSpec

__all__ = ["output_errors", "schema_errors", "schema_validator", "parse_json", "duplicate_keys", "MAX_ERRORS"]

#: At most this many errors are reported per output.
MAX_ERRORS = 10


def output_errors(spec_or_schema: GrammarSpec | dict[str, Any] | bool, text: str) -> list[str]:
    """What is wrong with ``text`` as an output for ``spec_or_schema`` ([] when it is valid).  Pure.

    ``spec_or_schema``: a :class:`GrammarSpec` (JSON schema, any JSON object,
    regex or EBNF) or a JSON Schema.  For JSON: the text must parse, repeat no
    key within an object, then validate against the whole schema with format
    checking.  A regex must match the whole text.  An EBNF grammar is enforced
    fully by every backend, so nothing more is checked.
    """
    if isinstance(spec_or_schema, GrammarSpec):
        if spec_or_schema.kind == "regex":
            try:
                matched = re.fullmatch(python_pattern(spec_or_schema.source), text) is not None
            except (re.error, ValueError):  # a dialect Python's re does not read: the grammar enforced it
                return []
            return [] if matched else [f"the output does not match the regex {spec_or_schema.source!r}"]
        if spec_or_schema.kind == "ebnf":
            return []
        schema: Any = spec_or_schema.schema
    else:
        schema = spec_or_schema
    try:
        value, repeated = parse_json(text)
    except json.JSONDecodeError as e:
        return [f"not JSON: {e.msg} at line {e.lineno}, column {e.colno}"]
    return (repeated + schema_errors(schema, value))[:MAX_ERRORS]


class _Members(dict[str, Any]):
    """A parsed JSON object that remembers the keys its text repeats, how often, and the values it dropped."""

    repeated: dict[str, int]
    dropped: list[tuple[str, Any]]


def _members(pairs: list[tuple[str, Any]]) -> _Members:
    obj = _Members(pairs)
    obj.repeated, obj.dropped = {}, []
    if len(obj) < len(pairs):
        counts: dict[str, int] = {}
        for key, _ in pairs:
            counts[key] = counts.get(key, 0) + 1
        obj.repeated = {key: n for key, n in counts.items() if n > 1}
        seen: dict[str, int] = {}
        for key, value in pairs:  # every occurrence but the last: its value is lost, and may repeat keys itself
            seen[key] = seen.get(key, 0) + 1
            if seen[key] < counts[key]:
                obj.dropped.append((key, value))
    return obj


def parse_json(text: str) -> tuple[Any, list[str]]:
    """``(value, errors)``: ``text`` parsed as JSON (last value of a repeated key kept, as ``json.loads`` does)
    and one error per key repeated within one object, at any depth, naming the key and where it is.

    Raises :class:`json.JSONDecodeError` when ``text`` is not JSON.  The value
    holds plain ``dict``/``list``/scalars.  Pure.

        >>> parse_json('{"k":1,"k":2}')
        ({'k': 2}, ["the key 'k' appears 2 times in the top-level object (a JSON parser keeps only the last value)"])
    """
    value = json.loads(text, object_pairs_hook=_members)
    errors: list[str] = []
    return _plain(value, [], errors), errors


def duplicate_keys(text: str) -> list[str]:
    """The errors of :func:`parse_json` for ``text`` ([] when it repeats no key, or is not JSON).  Pure."""
    try:
        return parse_json(text)[1]
    except json.JSONDecodeError:
        return []


def _plain(value: Any, path: list[str], errors: list[str]) -> Any:
    """``value`` with plain dicts, reporting each repeated key into ``errors`` in document order (iterative)."""
    root: list[Any] = [None]
    stack: list[tuple[Any, list[str], Any, Any]] = [(value, path, root, 0)]  # (item, its path, parent, slot)
    while stack:
        item, where, parent, slot = stack.pop()
        children: list[tuple[Any, list[str], Any, Any]] = []
        if isinstance(item, dict):
            for key, count in getattr(item, "repeated", {}).items():
                at = f"at {'/'.join(where)}: " if where else ""
                place = "one object" if where else "the top-level object"
                errors.append(
                    f"{at}the key {key!r} appears {count} times in {place} (a JSON parser keeps only the last value)"
                )
            copy: Any = dict.fromkeys(item)
            dropped: list[tuple[Any, list[str], Any, Any]] = [
                (child, [*where, key], {}, key) for key, child in getattr(item, "dropped", ())
            ]
            children = dropped + [(child, [*where, key], copy, key) for key, child in item.items()]
        elif isinstance(item, list):
            copy = [None] * len(item)
            children = [(child, [*where, str(i)], copy, i) for i, child in enumerate(item)]
        else:
            copy = item
        parent[slot] = copy
        stack.extend(reversed(children))  # the dropped values are checked for repeats too, then discarded
    return root[0]


def schema_errors(schema: Any, value: Any) -> list[str]:
    """jsonschema's messages for ``value`` against ``schema`` (validator from ``$schema``; latest draft else)."""
    schema, originals = python_schema(schema)  # ECMA-262 property escapes (\p{Lu}) in Python's re dialect, exactly
    validator = schema_validator(schema)
    try:
        errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    except OverflowError:  # jsonschema's multipleOf on a number beyond a float (1e999 reads as inf)
        return ["a number in the output is too large to check against the schema (it overflows a float)"]
    return [_describe(e, originals) for e in errors[:MAX_ERRORS]]


def schema_validator(schema: Any) -> Any:
    """The ``jsonschema`` validator of ``schema``: draft from ``$schema`` (2020-12 else), local refs and ``$id``
    resolved with ``referencing`` (nothing fetched), formats checked, ``format: regex`` read as ECMA-262."""
    import jsonschema
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    registry: Registry = Registry()
    if isinstance(schema, dict):
        resource = Resource.from_contents(schema, default_specification=DRAFT202012)
        registry = registry.with_resource(resource.id() or "", resource).crawl()
    return cls(schema, registry=registry, format_checker=regex_format_checker(cls.FORMAT_CHECKER))


def _describe(error: Any, originals: dict[str, str]) -> str:
    message = error.message
    for expanded, original in originals.items():  # name each pattern as the schema writes it
        message = message.replace(repr(expanded), repr(original))
    path = "/".join(str(p) for p in error.absolute_path)
    return f"at {path}: {message}" if path else message
