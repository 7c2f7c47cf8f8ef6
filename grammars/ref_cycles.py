"""Schemas that apply themselves to the same value: a ``$ref`` cycle that never reaches a property or an item.

``{"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}``
says nothing about the value: ``a`` is whatever ``b`` is, and ``b`` whatever
``a`` is.  Checking a value against it never ends (``jsonschema`` recurses
until Python stops it; JSON Schema leaves such a schema undefined), and the
backends disagree: xgrammar refuses it, outlines-core stops at its recursion
limit, llguidance compiles a grammar that allows no text.  A recursion through
a property or an item (a tree's children) is fine: each step reads a smaller
value.

:func:`same_value_cycle` finds such a cycle -- through ``$ref`` and the
keywords that apply a subschema to the same value (``allOf``, ``anyOf``,
``oneOf``, ``not``, ``if``/``then``/``else``, ``dependentSchemas``) -- among
the subschemas the root can reach, so :func:`grammars.spec.check_json_schema`
refuses the schema the same way on every backend, naming the chain.

    >>> same_value_cycle({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})
    ['#/$defs/a', '#/$defs/b', '#/$defs/a']
    >>> same_value_cycle({"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}})
"""

from __future__ import annotations

from typing import Any

from .schema_walk import local_resolver as _local_resolver
from .schema_walk import refs_and_targets as _refs_and_targets
from .schema_walk import schema_nodes as _schema_nodes

__all__ = ["same_value_cycle", "cycle_message"]

#: Keywords whose subschemas apply to the value itself (not to a property or an item of it).
_SAME_VALUE_LISTS = ("allOf", "anyOf", "oneOf")
_SAME_VALUE_ONE = ("not", "if", "then", "else")
_SAME_VALUE_MAPS = ("dependentSchemas",)
#: Keywords whose subschemas apply only where something refers to them.
_NOT_APPLIED = ("$defs", "definitions")


def same_value_cycle(schema: Any) -> list[str] | None:
    """The JSON pointers (``#/...``) of a cycle of subschemas applied to the same value, the first repeated at
    the end; ``None`` when there is none.  Only subschemas the root can reach count, and only local refs outside
    nested ``$id`` scopes are followed (a ref that does not resolve is refused elsewhere).  Pure."""
    if not isinstance(schema, dict):
        return None
    targets, refs = _refs_and_targets(schema)
    pointer = {id(node): where for node, where in targets}
    ref_target: dict[int, dict[str, Any]] = {}
    local = [node for node in refs if node["$ref"].startswith("#")]
    resolver = _local_resolver(schema) if local else None
    for node in local:
        if resolver is None:
            break
        try:
            found = resolver.lookup(node["$ref"]).contents
        except Exception:  # referencing.exceptions.Unresolvable: refused by the dangling-ref check
            continue
        if isinstance(found, dict) and id(found) in pointer:
            ref_target[id(node)] = found

    def same_value(node: dict[str, Any]) -> list[dict[str, Any]]:
        out = [ref_target[id(node)]] if id(node) in ref_target else []
        for key in _SAME_VALUE_LISTS:
            out += [s for s in node.get(key, ()) if isinstance(s, dict)] if isinstance(node.get(key), list) else []
        out += [node[key] for key in _SAME_VALUE_ONE if isinstance(node.get(key), dict)]
        for key in _SAME_VALUE_MAPS:
            if isinstance(node.get(key), dict):
                out += [s for s in node[key].values() if isinstance(s, dict)]
        return out

    reachable = _reachable(schema, ref_target)
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    for start in reachable:
        if state.get(id(start)):
            continue
        path: list[dict[str, Any]] = [start]
        stack = [iter(same_value(start))]
        state[id(start)] = 1
        while stack:
            child = next(stack[-1], None)
            if child is None:
                state[id(path.pop())] = 2
                stack.pop()
            elif state.get(id(child)) == 1:
                cycle = path[[id(n) for n in path].index(id(child)) :] + [child]
                return ["#" + pointer[id(n)] for n in cycle]
            elif not state.get(id(child)):
                state[id(child)] = 1
                path.append(child)
                stack.append(iter(same_value(child)))
    return None


def _reachable(schema: dict[str, Any], ref_target: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """The subschemas a value checked against ``schema`` can meet (``$defs`` only where referred to), root first."""
    return list(_schema_nodes(schema, follow=ref_target, skip=_NOT_APPLIED))


def cycle_message(cycle: list[str], where: str = "the schema") -> str:
    """What :func:`grammars.spec.check_json_schema` says about ``cycle``.  Pure."""
    return (
        f"{where} has a circular $ref chain that never reaches a property or an item: {' -> '.join(cycle)}. "
        "Each schema in it applies the next one to the same value, so checking a value against it never ends "
        "(JSON Schema leaves such a schema undefined, and no grammar backend can generate from it). "
        "Give the schema content of its own (a type, properties, an enum) instead of only a $ref, or make the "
        "recursion go through a property or an array item, as a tree's children do."
    )
