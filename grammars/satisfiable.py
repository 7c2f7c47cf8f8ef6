"""JSON schemas no value satisfies, refused before any backend compiles them.

A grammar backend handed such a schema does one of three things, none of
them useful: it refuses it with its own message (llguidance), it compiles a
grammar that accepts what the schema forbids (xgrammar compiles ``allOf``
of ``string`` and ``integer`` and lets an object through), or it decodes
until the token limit (a two-value ``enum`` with ``uniqueItems`` and
``minItems: 3``).  :func:`check_satisfiable` finds the common conflicts
first and raises one :class:`~grammars.base.GrammarError` that names the
conflict and where it is (a JSON pointer):

* types that exclude each other: ``type`` and the ``type`` of the ``allOf``
  parts (``integer`` is a ``number``);
* an ``enum``/``const`` none of whose values satisfies the rest of its
  schema object (checked with ``jsonschema``: the ``type`` beside it, its
  ``allOf``, ...);
* bounds that cross: ``minimum``/``exclusiveMinimum`` above
  ``maximum``/``exclusiveMaximum`` (no integer between them, for an
  integer), ``minLength > maxLength``, ``minItems > maxItems``,
  ``minProperties > maxProperties``, more ``required`` names than
  ``maxProperties``;
* a ``required`` property that ``additionalProperties: false`` forbids (no
  ``properties`` entry, no ``patternProperties`` pattern matches it) or
  whose own schema accepts nothing;
* ``minItems`` beyond what ``uniqueItems`` allows when the items come from
  a finite set (an ``enum``, a ``const``, ``boolean``, ``null``), or items
  that must exist but accept nothing;
* ``anyOf``/``oneOf`` whose every branch accepts nothing; ``false``.

A conflict counts only where a value must pass through it: the root, a
part of ``allOf``, a ``$ref`` target (local refs resolved with
``referencing``; a cycle is assumed satisfiable), a required property,
an item the array must have.  An optional property that accepts nothing
leaves the schema satisfiable (the property is just never written), and so
does one ``anyOf`` branch of several.  Every rule only refuses what no value
can satisfy; what it cannot decide (``not``, ``if``, ``multipleOf``,
patterns) it takes as satisfiable.

    >>> conflict({"allOf": [{"type": "string"}, {"type": "integer"}]})
    "at /allOf/1: type 'integer' excludes the type allowed before it ('string', from /allOf/0)"
    >>> conflict({"allOf": [{"type": "number"}, {"type": "integer"}], "minimum": 1}) is None
    True
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from .base import GrammarError
from .schema_walk import local_resolver, pointer_token
from .spec import GrammarSpec

__all__ = ["check_satisfiable", "conflict"]

_TYPES = ("null", "boolean", "object", "array", "string", "number")  # "integer" is a number with a flag


def check_satisfiable(spec: GrammarSpec) -> None:
    """Raise :class:`GrammarError` when no JSON value satisfies ``spec``'s schema, naming the conflict.  Cached."""
    if spec.is_json:
        found = _conflict_of(spec)
        if found is not None:
            raise GrammarError(
                f"the JSON schema accepts no value, so no output could follow it: {found}; fix the schema "
                "(no backend can help)"
            )


@functools.lru_cache(maxsize=512)
def _conflict_of(spec: GrammarSpec) -> str | None:
    return conflict(spec.schema)


def conflict(schema: Any) -> str | None:
    """Why no JSON value satisfies ``schema`` (with a JSON pointer to where), or ``None`` when none was found.  Pure."""
    if schema is False:
        return "the schema is false"
    if not isinstance(schema, dict):
        return None
    try:
        return _Checker(schema).node(schema, "")
    except RecursionError:  # nested past the stack: no verdict
        return None


@dataclass
class _Part:
    node: dict[str, Any]
    where: str


def _at(where: str) -> str:
    return f"at {where or '(root)'}"


class _Checker:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.resolver = local_resolver(root)
        #: drafts 3 to 7: a ``$ref`` makes its siblings ignored
        self.ref_alone = any(f"draft-0{n}" in str(root.get("$schema", "")) for n in range(3, 8))
        self.memo: dict[int, str | None] = {}
        self.active: set[int] = set()
        self._validator: Any = None

    # -- a schema object and everything that must hold with it ----------------------------------------------

    def node(self, node: Any, where: str) -> str | None:
        """Why nothing satisfies ``node`` (at pointer ``where``), else ``None``."""
        if node is False:
            return f"{_at(where)}: the schema is false"
        if not isinstance(node, dict):
            return None
        key = id(node)
        if key in self.memo:
            return self.memo[key]
        if key in self.active:  # a $ref cycle: assumed satisfiable
            return None
        self.active.add(key)
        try:
            found = self._node(node, where)
        finally:
            self.active.discard(key)
        self.memo[key] = found
        return found

    def _node(self, node: dict[str, Any], where: str) -> str | None:
        parts: list[_Part] = []
        found = self._gather(node, where, parts, set())
        if found is not None:
            return found
        for part in parts:
            for keyword in ("anyOf", "oneOf"):
                branches = part.node.get(keyword)
                if isinstance(branches, list) and branches:
                    reasons: list[str] = []
                    for i, branch in enumerate(branches):
                        reason = self.node(branch, f"{part.where}/{keyword}/{i}")
                        if reason is None:
                            break  # a branch some value satisfies
                        reasons.append(reason)
                    else:
                        return f"every {keyword} branch {_at(part.where)} accepts nothing ({reasons[0]}; ...)"
        found = self._values(node, where, parts)
        if found is not None:
            return found
        return self._types(parts)

    def _gather(self, node: Any, where: str, parts: list[_Part], seen: set[int]) -> str | None:
        """Collect ``node``, its ``allOf`` parts and ``$ref`` targets (all must hold) into ``parts``."""
        if node is False:
            return f"{_at(where)}: the schema is false"
        if not isinstance(node, dict) or id(node) in seen:
            return None
        seen.add(id(node))
        ref = node.get("$ref")
        if isinstance(ref, str):
            if self.ref_alone:  # the target stands for the whole object
                target = self._resolve(ref)
                return self._gather(target, ref.lstrip("#"), parts, seen) if target is not None else None
        parts.append(_Part(node, where))
        if isinstance(ref, str):
            target = self._resolve(ref)
            if target is not None:
                found = self._gather(target, ref.lstrip("#") if ref.startswith("#") else ref, parts, seen)
                if found is not None:
                    return found
        all_of = node.get("allOf")
        if isinstance(all_of, list):
            for i, sub in enumerate(all_of):
                found = self._gather(sub, f"{where}/allOf/{i}", parts, seen)
                if found is not None:
                    return found
        return None

    def _resolve(self, ref: str) -> Any:
        if self.resolver is None:
            return None
        try:
            return self.resolver.lookup(ref).contents
        except Exception:  # unresolvable here (a nested $id scope): no verdict
            return None

    # -- enum / const: some value must pass the whole schema object -----------------------------------------

    def _values(self, node: dict[str, Any], where: str, parts: list[_Part]) -> str | None:
        for part in parts:
            values: list[Any] | None = None
            keyword = ""
            if "const" in part.node:
                values, keyword = [part.node["const"]], "const"
            elif isinstance(part.node.get("enum"), list):
                values, keyword = part.node["enum"], "enum"
            if values is None:
                continue
            if not values:
                return f"{_at(part.where)}: the enum is empty"
            first = None
            for value in values:
                error = self._error(node, value)
                if error is None:
                    return None  # one value passes everything
                first = first or error
            shown = json.dumps(values if keyword == "enum" else values[0], ensure_ascii=False)
            if len(shown) > 80:
                shown = shown[:77] + "..."
            return f"{_at(part.where)}: no value of its {keyword} {shown} satisfies the schema {_at(where)} ({first})"
        return None

    def _error(self, node: dict[str, Any], value: Any) -> str | None:
        """The first jsonschema error of ``value`` against ``node`` (resolved in the root document), else ``None``."""
        try:
            if self._validator is None:
                from .validation import schema_validator

                self._validator = schema_validator(self.root)
            error = next(iter(self._validator.evolve(schema=node).iter_errors(value)), None)
        except Exception:  # a schema jsonschema cannot read here: no verdict
            return None
        if error is None:
            return None
        path = "/".join(str(p) for p in error.absolute_path)
        return f"at {path}: {error.message}" if path else error.message

    # -- types, and each type's own keywords ----------------------------------------------------------------

    def _types(self, parts: list[_Part]) -> str | None:
        allowed = set(_TYPES)
        integer = False
        sources: list[str] = []
        for part in parts:
            declared = part.node.get("type")
            if declared is None:
                continue
            names = declared if isinstance(declared, list) else [declared]
            names = [n for n in names if isinstance(n, str)]
            mine = {"number" if n == "integer" else n for n in names}
            narrowed = allowed & mine
            if not narrowed:
                before = "', '".join(sorted(allowed)) if len(allowed) < len(_TYPES) else ""
                return (
                    f"{_at(part.where)}: type {_show(declared)} excludes the type allowed before it "
                    f"('{before}', from {', '.join(sources)})"
                )
            if "number" in narrowed and "number" not in names and "integer" in names:
                integer = True
            allowed = narrowed
            sources.append(part.where or "(root)")
        reasons = []
        for name in sorted(allowed, key=_TYPES.index):
            reason = getattr(self, f"_{name}")(parts, integer)
            if reason is None:
                return None
            reasons.append(reason)
        return "; ".join(dict.fromkeys(reasons)) if reasons else None

    def _null(self, parts: list[_Part], integer: bool) -> str | None:
        return None

    _boolean = _null

    def _number(self, parts: list[_Part], integer: bool) -> str | None:
        low: tuple[float, bool, str] | None = None  # (bound, exclusive, where)
        high: tuple[float, bool, str] | None = None
        for part in parts:
            node = part.node
            for key, lower, exclusive in (
                ("minimum", True, node.get("exclusiveMinimum") is True),
                ("exclusiveMinimum", True, True),
                ("maximum", False, node.get("exclusiveMaximum") is True),
                ("exclusiveMaximum", False, True),
            ):
                value = node.get(key)
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                bound = (float(value), exclusive, f"{key} {value:g} {_at(part.where)}")
                if lower and (low is None or (bound[0], bound[1]) > (low[0], low[1])):
                    low = bound
                if not lower and (high is None or (bound[0], -bound[1]) < (high[0], -high[1])):
                    high = bound
        if low is None or high is None:
            return None
        if low[0] > high[0] or (low[0] == high[0] and (low[1] or high[1])):
            return f"{low[2]} and {high[2]} leave no number between them"
        if integer:
            first = math.floor(low[0]) + 1 if low[1] else math.ceil(low[0])
            last = math.ceil(high[0]) - 1 if high[1] else math.floor(high[0])
            if first > last:
                return f"no integer lies between {low[2]} and {high[2]}"
        return None

    def _string(self, parts: list[_Part], integer: bool) -> str | None:
        return _crossed(parts, "minLength", "maxLength")

    def _array(self, parts: list[_Part], integer: bool) -> str | None:
        found = _crossed(parts, "minItems", "maxItems")
        if found is not None:
            return found
        least = max(((_count(p.node.get("minItems")), p.where) for p in parts), default=(0, ""))
        if least[0] == 0:
            return None
        for part in parts:
            prefix = part.node.get("prefixItems")
            prefix = prefix if isinstance(prefix, list) else []
            for i, sub in enumerate(prefix[: least[0]]):
                reason = self.node(sub, f"{part.where}/prefixItems/{i}")
                if reason is not None:
                    return f"{_at(least[1])}: minItems {least[0]} needs item {i}, and {reason}"
            items = part.node.get("items")
            if least[0] > len(prefix) and isinstance(items, (dict, bool)):
                reason = self.node(items, f"{part.where}/items")
                if reason is not None:
                    return f"{_at(least[1])}: minItems {least[0]} needs items, and {reason}"
        if any(p.node.get("uniqueItems") is True for p in parts):
            for part in parts:
                prefix = part.node.get("prefixItems")
                size = self._distinct(part.node.get("items"))
                if size is None:
                    continue
                most = size + (len(prefix) if isinstance(prefix, list) else 0)
                if least[0] > most:
                    return (
                        f"{_at(least[1])}: minItems {least[0]} with uniqueItems needs {least[0]} different items, "
                        f"and the items {_at(part.where + '/items')} allow only {size} different value"
                        f"{'s' if size != 1 else ''}"
                    )
        return None

    def _distinct(self, items: Any) -> int | None:
        """How many different values ``items`` allows, when that is a finite count found simply; else ``None``."""
        if items is False:
            return 0
        if not isinstance(items, dict):
            return None
        if "const" in items:
            return 1 if self._error(items, items["const"]) is None else 0
        if isinstance(items.get("enum"), list):
            return len({_canonical(v) for v in items["enum"] if self._error(items, v) is None})
        declared = items.get("type")
        names = declared if isinstance(declared, list) else [declared]
        if names and all(n in ("boolean", "null") for n in names):
            return sum(2 if n == "boolean" else 1 for n in set(names))
        return None

    def _object(self, parts: list[_Part], integer: bool) -> str | None:
        found = _crossed(parts, "minProperties", "maxProperties")
        if found is not None:
            return found
        required: dict[str, str] = {}
        for part in parts:
            names = part.node.get("required")
            if isinstance(names, list):
                for name in names:
                    if isinstance(name, str):
                        required.setdefault(name, part.where)
        most = min(
            ((_count(p.node.get("maxProperties")), p.where) for p in parts if "maxProperties" in p.node), default=None
        )
        if most is not None and len(required) > most[0]:
            return (
                f"{_at(most[1])}: maxProperties {most[0]} is fewer than the {len(required)} required properties "
                f"({', '.join(map(repr, required))})"
            )
        for name, where in required.items():
            for part in parts:
                properties = part.node.get("properties")
                properties = properties if isinstance(properties, dict) else {}
                patterns = part.node.get("patternProperties")
                patterns = patterns if isinstance(patterns, dict) else {}
                if name in properties:
                    reason = self.node(properties[name], f"{part.where}/properties/{pointer_token(name)}")
                    if reason is not None:
                        return f"the property {name!r} is required ({_at(where)}), and {reason}"
                elif part.node.get("additionalProperties") is False and not any(_matches(p, name) for p in patterns):
                    also = f" ({_at(where)})" if where != part.where else ""
                    return (
                        f"{_at(part.where)}: the property {name!r} is required{also}, and additionalProperties: "
                        "false forbids it (no properties entry or patternProperties pattern there admits it)"
                    )
        return None


def _crossed(parts: list[_Part], low_key: str, high_key: str) -> str | None:
    lows = [(_count(p.node.get(low_key)), p.where) for p in parts if low_key in p.node]
    highs = [(_count(p.node.get(high_key)), p.where) for p in parts if high_key in p.node]
    if not lows or not highs:
        return None
    low, high = max(lows), min(highs)
    if low[0] > high[0]:
        return f"{low_key} {low[0]} {_at(low[1])} is greater than {high_key} {high[0]} {_at(high[1])}"
    return None


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    return int(value)


def _show(declared: Any) -> str:
    return repr(declared) if not isinstance(declared, list) else "[" + ", ".join(map(repr, declared)) + "]"


def _matches(pattern: Any, name: str) -> bool:
    """Whether ``patternProperties`` pattern ``pattern`` matches ``name`` (``True`` when it cannot be read)."""
    from .ecma_regex import python_pattern

    if not isinstance(pattern, str):
        return True
    try:
        return re.search(python_pattern(pattern), name) is not None
    except (re.error, ValueError):
        return True


def _canonical(value: Any) -> str:
    """A key equal for values JSON Schema calls equal (``1`` and ``1.0``; ``true`` is not ``1``)."""

    def norm(v: Any) -> Any:
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return v
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, list):
            return [norm(x) for x in v]
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items()}
        return v

    return json.dumps(norm(value), sort_keys=True)
