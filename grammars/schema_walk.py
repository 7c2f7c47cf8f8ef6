"""Walks a JSON Schema's schema objects: :func:`schema_nodes`, :func:`refs_and_targets`, and
:func:`local_resolver` for its local ``$ref``s.

A leaf shared by :mod:`grammars.spec` (which checks and rewrites schemas),
:mod:`grammars.keywords` (which reads the keywords they use), and the checks
that follow references (:mod:`grammars.ref_cycles`, :mod:`grammars.satisfiable`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

__all__ = ["DATA_KEYWORDS", "SCHEMA_MAPS", "local_resolver", "pointer_token", "refs_and_targets", "schema_nodes"]


#: Keywords whose values are instances (data), not schemas: a "$ref" key there is data.
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})
#: Keywords whose values map names to schemas: every value is a schema, whatever the name.
SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"})


def schema_nodes(
    node: Any, *, follow: Mapping[int, dict[str, Any]] | None = None, skip: Collection[str] = ()
) -> Iterator[dict[str, Any]]:
    """Every schema object in ``node`` (itself included), outermost first.

    Walks schemas only: the values of ``enum``/``const``/``default``/``examples``
    are instances (a ``"$ref"`` or ``"pattern"`` key there is plain data), and
    the keys of ``properties``/``$defs``/... are names, not keywords.  Yields the
    objects themselves, so a caller may edit them in place.

    ``skip``: keywords whose values are not walked.  ``follow``: the schema each ``$ref`` object
    resolves to, by the ref object's id; the walk then goes on into it (after the object's own
    subschemas) and yields each object once, so a cycle of refs ends.
    """
    seen: set[int] = set()
    stack: list[tuple[Any, bool]] = [(node, True)]  # (item, item is a schema rather than a name map)
    while stack:
        item, is_schema = stack.pop()
        if isinstance(item, list):
            stack.extend((x, True) for x in reversed(item))
        elif isinstance(item, dict) and not is_schema:
            stack.extend((x, True) for x in reversed(list(item.values())))
        elif isinstance(item, dict) and id(item) not in seen:
            if follow is not None:
                seen.add(id(item))
            yield item
            if follow is not None and id(item) in follow:
                stack.append((follow[id(item)], True))
            for key, value in reversed(list(item.items())):
                if key not in DATA_KEYWORDS and key not in skip:
                    stack.append((value, key not in SCHEMA_MAPS))


def refs_and_targets(schema: dict[str, Any]) -> tuple[list[tuple[dict[str, Any], str]], list[dict[str, Any]]]:
    """Every schema object in ``schema`` with its JSON pointer, and the objects with a string ``$ref``
    outside any nested ``$id`` scope (where ``#`` means the root).  Pure."""
    targets: list[tuple[dict[str, Any], str]] = []
    refs: list[dict[str, Any]] = []
    stack: list[tuple[Any, str, bool, bool]] = [(schema, "", True, False)]  # (item, pointer, is schema, in $id scope)
    while stack:
        item, pointer, is_schema, scoped = stack.pop()
        if isinstance(item, list):
            stack.extend((x, f"{pointer}/{i}", True, scoped) for i, x in enumerate(item))
        elif isinstance(item, dict) and not is_schema:
            stack.extend((v, f"{pointer}/{pointer_token(k)}", True, scoped) for k, v in item.items())
        elif isinstance(item, dict):
            targets.append((item, pointer))
            if isinstance(item.get("$ref"), str) and not scoped:
                refs.append(item)
            inner = scoped or (bool(pointer) and isinstance(item.get("$id"), str))
            for key, value in item.items():
                if key not in DATA_KEYWORDS:
                    stack.append((value, f"{pointer}/{pointer_token(key)}", key not in SCHEMA_MAPS, inner))
    return targets, refs


def pointer_token(key: Any) -> str:
    """A JSON-pointer token (RFC 6901)."""
    return str(key).replace("~", "~0").replace("/", "~1")


def local_resolver(node: Any) -> Any:
    """A ``referencing`` resolver over ``node`` and the subschemas it names with ``$id`` (nothing remote)."""
    try:
        from referencing import Registry, Resource
        from referencing.jsonschema import DRAFT202012

        resource = Resource.from_contents(node, default_specification=DRAFT202012)  # $schema wins when given
        base = resource.id() or ""
        registry = Registry().with_resource(base, resource).crawl()
        return registry.resolver(base_uri=base)
    except Exception:
        return None
