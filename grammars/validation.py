"""Whether a finished output follows the *full* request: the check no grammar backend can skip.

Backends enforce only part of JSON Schema (see :mod:`grammars.capabilities`),
so every finished output is validated here with ``jsonschema`` (format
checking on; local ``$ref`` and ``$id`` resolved with ``referencing``, nothing
fetched).

    >>> output_errors({"type": "array", "uniqueItems": True}, "[1,1]")
    ['[1, 1] has non-unique elements']
    >>> output_errors({"type": "integer"}, "12")
    []
"""

from __future__ import annotations

import json
import re
from typing import Any

from .spec import GrammarSpec

__all__ = ["output_errors", "MAX_ERRORS"]

#: At most this many errors are reported per output.
MAX_ERRORS = 10


def output_errors(spec_or_schema: GrammarSpec | dict[str, Any] | bool, text: str) -> list[str]:
    """What is wrong with ``text`` as an output for ``spec_or_schema`` ([] when it is valid).  Pure.

    ``spec_or_schema``: a :class:`GrammarSpec` (JSON schema, any JSON object,
    regex or EBNF) or a JSON Schema.  For JSON: the text must parse, then
    validate against the whole schema with format checking.  A regex must
    match the whole text.  An EBNF grammar is enforced fully by every
    backend, so nothing more is checked.
    """
    if isinstance(spec_or_schema, GrammarSpec):
        if spec_or_schema.kind == "regex":
            try:
                matched = re.fullmatch(spec_or_schema.source, text) is not None
            except re.error:  # a dialect Python's re does not read: the grammar enforced it
                return []
            return [] if matched else [f"the output does not match the regex {spec_or_schema.source!r}"]
        if spec_or_schema.kind == "ebnf":
            return []
        schema: Any = spec_or_schema.schema
    else:
        schema = spec_or_schema
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return [f"not JSON: {e.msg} at line {e.lineno}, column {e.colno}"]
    return schema_errors(schema, value)


def schema_errors(schema: Any, value: Any) -> list[str]:
    """jsonschema's messages for ``value`` against ``schema`` (validator from ``$schema``; latest draft else)."""
    import jsonschema
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    registry: Registry = Registry()
    if isinstance(schema, dict):
        resource = Resource.from_contents(schema, default_specification=DRAFT202012)
        registry = registry.with_resource(resource.id() or "", resource).crawl()
    validator = cls(schema, registry=registry, format_checker=cls.FORMAT_CHECKER)
    try:
        errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    except OverflowError:  # jsonschema's multipleOf on a number beyond a float (1e999 reads as inf)
        return ["a number in the output is too large to check against the schema (it overflows a float)"]
    return [_describe(e) for e in errors[:MAX_ERRORS]]


def _describe(error: Any) -> str:
    path = "/".join(str(p) for p in error.absolute_path)
    return f"at {path}: {error.message}" if path else error.message
