"""Navigate a JSON Schema by document path: which schema node describes the value here.

A position in a JSON document is described by a tuple of candidate schema
nodes (``anyOf``/``oneOf`` branches stay side by side until the document
tells them apart).  Keys are handled in their JSON-escaped form as bytes,
exactly as they appear in the generated text.

Handles ``properties``, ``patternProperties``, ``additionalProperties``,
``items``/``prefixItems`` (and draft-4 tuple ``items``), ``anyOf``, ``oneOf``,
``allOf``, local ``$ref`` (``#/...`` JSON pointers), ``enum``, ``const``,
``default`` and ``examples``.  Anything else is ignored: the schema only
ranks guesses, the grammar decides what is legal.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

__all__ = ["SchemaIndex", "Nodes", "json_text", "escape_key"]

Nodes = tuple[dict[str, Any], ...]
_MAX_DEPTH = 16
_MEMO_SIZE = 4096  # entries of a SchemaIndex's memo before it starts afresh
_T = TypeVar("_T")
_P = ParamSpec("_P")


def json_text(value: Any) -> bytes:
    """``value`` as compact JSON bytes (the grammar's default format)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def escape_key(key: str) -> bytes:
    """A property name as it appears between the quotes in JSON text."""
    return json.dumps(key, ensure_ascii=False)[1:-1].encode("utf-8")


def _memoized(
    kind: str, copy: Callable[[Any], Any] | None = None
) -> Callable[[Callable[Concatenate[SchemaIndex, Nodes, _P], _T]], Callable[Concatenate[SchemaIndex, Nodes, _P], _T]]:
    """A :class:`SchemaIndex` lookup over ``(nodes, *plain values)``, answered once per argument through
    :meth:`SchemaIndex._memo`; ``copy`` hands each caller its own copy of a mutable answer."""

    def wrap(
        compute: Callable[Concatenate[SchemaIndex, Nodes, _P], _T],
    ) -> Callable[Concatenate[SchemaIndex, Nodes, _P], _T]:
        @functools.wraps(compute)
        def lookup(index: SchemaIndex, nodes: Nodes, *args: _P.args, **kwargs: _P.kwargs) -> _T:
            key = _ids(nodes) + args + tuple(kwargs.items())
            answer = index._memo(kind, nodes, key, lambda: compute(index, nodes, *args, **kwargs))
            return copy(answer) if copy is not None else answer

        return lookup

    return wrap


class SchemaIndex:
    """Read-only lookups over one schema (``None``: no schema, every lookup is empty).

    One per request.  Every lookup is a pure function of the schema and its
    arguments, so answers are memoized (:meth:`_memo`): a drafter asks the
    same ones at every step (the value under the same key, the names of the
    same object).  Node tuples are keyed by the ids of their nodes, and each
    entry keeps its nodes alive, so an id in a key cannot be reused by another
    node while the entry stands: a hit is an answer for the very same nodes.
    The schema is never modified (callers must not modify it either).  At
    most ``_MEMO_SIZE`` entries: a full memo starts afresh.
    """

    def __init__(self, schema: dict[str, Any] | None) -> None:
        self.schema = schema if isinstance(schema, dict) else None
        self._memo_table: dict[tuple[Any, ...], tuple[Any, Any]] = {}  # key -> (what keeps its ids alive, answer)
        self._props: dict[int, tuple[dict[str, Any], dict[bytes, Any]]] = {}  # id -> (node, its properties)
        self.root: Nodes = self.resolve(self.schema) if self.schema is not None else ()

    def _memo(self, kind: str, held: Any, key: tuple[Any, ...], compute: Callable[[], _T]) -> _T:
        """The memoized answer of lookup ``kind`` for ``key`` (ids of ``held``, plus plain values)."""
        full = (kind,) + key
        hit = self._memo_table.get(full)
        if hit is not None:
            answer: _T = hit[1]
            return answer
        answer = compute()
        if len(self._memo_table) >= _MEMO_SIZE:
            self._memo_table.clear()
            self._props.clear()
        self._memo_table[full] = (held, answer)
        return answer

    # -- resolution ---------------------------------------------------------

    def resolve(self, node: Any, depth: int = 0) -> Nodes:
        """Expand ``$ref``/``anyOf``/``oneOf``/``allOf`` into candidate nodes.

        Memoized from the top (``depth`` 0): the same node resolves to the
        very same tuple, so the nodes built here for a ``$ref`` with
        siblings keep their ids, and lookups keyed by them hit.
        """
        if not isinstance(node, dict) or depth > _MAX_DEPTH:
            return ()
        if depth == 0:
            return self._memo("resolve", node, (id(node),), lambda: self._resolve(node, 0))
        return self._resolve(node, depth)

    def _resolve(self, node: dict[str, Any], depth: int) -> Nodes:
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = self._pointer(ref)
            rest = {k: v for k, v in node.items() if k != "$ref"}
            resolved = self.resolve(target, depth + 1)
            if _has_content(rest):
                return (rest,) + resolved
            return resolved
        out: list[dict[str, Any]] = []
        branches = [b for key in ("anyOf", "oneOf") for b in (node.get(key) or ()) if isinstance(b, dict)]
        all_of = [b for b in (node.get("allOf") or ()) if isinstance(b, dict)]
        if _has_content(node) or not (branches or all_of):
            out.append(node)
        for branch in all_of:
            out.extend(self.resolve(branch, depth + 1))
        for branch in branches:
            out.extend(self.resolve(branch, depth + 1))
        return tuple(out)

    def _pointer(self, ref: str) -> Any:
        if not ref.startswith("#") or self.schema is None:
            return None  # remote references are out of reach
        node: Any = self.schema
        for part in ref[1:].lstrip("/").split("/") if ref not in ("#", "#/") else ():
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node

    # -- children -----------------------------------------------------------

    def properties(self, node: dict[str, Any]) -> dict[bytes, Any]:
        """Escaped property name -> property schema, in declaration order (cached; the entry keeps ``node``)."""
        hit = self._props.get(id(node))
        if hit is not None:
            return hit[1]
        props = node.get("properties")
        cached = {escape_key(k): v for k, v in props.items()} if isinstance(props, dict) else {}
        self._props[id(node)] = (node, cached)
        return cached

    @_memoized("names", copy=list)
    def property_names(self, nodes: Nodes) -> list[bytes]:
        """Declared property names of an object (union over candidates, in order)."""
        seen: dict[bytes, None] = {}
        for node in nodes:
            for key in self.properties(node):
                seen.setdefault(key, None)
        return list(seen)

    @_memoized("required", copy=set)
    def required(self, nodes: Nodes) -> set[bytes]:
        """Required property names (union over candidates)."""
        return {escape_key(name) for node in nodes for name in _strings(node.get("required"))}

    @_memoized("object")
    def object_child(self, nodes: Nodes, key: bytes) -> Nodes:
        """Candidate schemas of the value under ``key`` in an object described by ``nodes``."""
        out: list[dict[str, Any]] = []
        name = _unescape(key)
        for node in nodes:
            props = self.properties(node)
            if key in props:
                out.extend(self.resolve(props[key]))
                continue
            matched = False
            patterns = node.get("patternProperties")
            if isinstance(patterns, dict) and name is not None:
                for pattern, sub in patterns.items():
                    try:
                        if re.search(pattern, name):
                            out.extend(self.resolve(sub))
                            matched = True
                    except re.error:
                        continue
            extra = node.get("additionalProperties")
            if not matched and isinstance(extra, dict):
                out.extend(self.resolve(extra))
        return tuple(out)

    @_memoized("array")
    def array_child(self, nodes: Nodes, index: int) -> Nodes:
        """Candidate schemas of element ``index`` of an array described by ``nodes``."""
        out: list[dict[str, Any]] = []
        for node in nodes:
            prefix = node.get("prefixItems")
            items = node.get("items")
            if isinstance(prefix, list) and index < len(prefix):
                out.extend(self.resolve(prefix[index]))
            elif isinstance(items, list):  # draft-4 tuple form
                if index < len(items):
                    out.extend(self.resolve(items[index]))
                elif isinstance(node.get("additionalItems"), dict):
                    out.extend(self.resolve(node["additionalItems"]))
            elif isinstance(items, dict):
                out.extend(self.resolve(items))
        return tuple(out)

    # -- telling anyOf branches apart -----------------------------------------

    def filter_by_key(self, nodes: Nodes, key: bytes) -> Nodes:
        """Candidates that allow property ``key`` (all of them if none does)."""
        if len(nodes) < 2:
            return nodes
        return self._filter_by_key(nodes, key)

    @_memoized("by_key")
    def _filter_by_key(self, nodes: Nodes, key: bytes) -> Nodes:
        kept = tuple(
            n
            for n in nodes
            if key in self.properties(n) or n.get("additionalProperties") is not False and not self.properties(n)
        )
        return kept or nodes

    def filter_by_value(self, nodes: Nodes, key: bytes, value: bytes) -> Nodes:
        """Candidates whose ``const``/``enum`` for ``key`` admits the JSON text ``value``."""
        if len(nodes) < 2:
            return nodes
        return self._filter_by_value(nodes, key, value)

    @_memoized("by_value")
    def _filter_by_value(self, nodes: Nodes, key: bytes, value: bytes) -> Nodes:
        kept = []
        for node in nodes:
            sub = self.properties(node).get(key)
            allowed = self.fixed_values(self.resolve(sub)) if sub is not None else None
            if allowed is None or value in allowed:
                kept.append(node)
        return tuple(kept) or nodes

    @_memoized("fixed", copy=lambda found: set(found) if found is not None else None)
    def fixed_values(self, nodes: Nodes) -> set[bytes] | None:
        """The JSON texts a value may take when ``const``/``enum`` pin it, else ``None``."""
        out: set[bytes] = set()
        for node in nodes:
            if "const" in node:
                out.add(json_text(node["const"]))
            elif isinstance(node.get("enum"), list):
                out.update(json_text(v) for v in node["enum"])
            else:
                return None
        return out if nodes else None

    # -- what a value may look like -----------------------------------------

    @_memoized("texts")
    def value_texts(self, nodes: Nodes) -> list[tuple[str, bytes]]:
        """``(kind, json_text)`` for const, enum, default and examples values, in that order (shared: do not modify)."""
        found: dict[bytes, str] = {}
        for kind in ("const", "enum", "default", "examples"):
            for node in nodes:
                if kind not in node:
                    continue
                values = node[kind] if kind in ("enum", "examples") else [node[kind]]
                if not isinstance(values, list):
                    continue
                for value in values:
                    try:
                        found.setdefault(json_text(value), kind)
                    except (TypeError, ValueError):
                        continue
        return [(kind, text) for text, kind in found.items()]

    @_memoized("types", copy=set)
    def types(self, nodes: Nodes) -> set[str]:
        """JSON types the value may have (empty: unknown, anything goes)."""
        out: set[str] = set()
        for node in nodes:
            declared = node.get("type")
            if isinstance(declared, str):
                out.add(declared)
            elif isinstance(declared, list):
                out.update(_strings(declared))
            elif "const" in node or isinstance(node.get("enum"), list):
                values = [node["const"]] if "const" in node else node["enum"]
                out.update(_json_type(v) for v in values)
            elif "properties" in node:
                out.add("object")
            elif "items" in node or "prefixItems" in node:
                out.add("array")
            else:
                return set()
        if "integer" in out:
            out.add("number")
        return out

    def array_bounds(self, nodes: Nodes) -> tuple[int, int | None]:
        """``(minItems, maxItems)`` over the candidates (loosest bounds)."""
        lows = [n.get("minItems", 0) for n in nodes]
        highs = [n.get("maxItems") for n in nodes]
        low = min((x for x in lows if isinstance(x, int)), default=0)
        high = None if any(h is None for h in highs) or not highs else max(h for h in highs if h is not None)
        return low, high


def _ids(nodes: Nodes) -> tuple[int, ...]:
    return tuple(map(id, nodes))


def _has_content(node: dict[str, Any]) -> bool:
    ignored = {
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "description",
        "title",
        "$schema",
        "$id",
        "$comment",
        "definitions",
        "$defs",
    }
    return any(k not in ignored for k in node)


def _strings(value: Any) -> list[str]:
    """The strings in a keyword's list (``required``, a list of ``type``s); none for a value that is not a list."""
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def _unescape(key: bytes) -> str | None:
    try:
        value = json.loads(b'"' + key + b'"')
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"
