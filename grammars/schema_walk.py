"""Walks a JSON Schema's schema objects: :func:`schema_nodes`.

A leaf shared by :mod:`grammars.spec` (which checks and rewrites schemas) and
:mod:`grammars.keywords` (which reads the keywords they use).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["DATA_KEYWORDS", "SCHEMA_MAPS", "schema_nodes"]


#: Keywords whose values are instances (data), not schemas: a "$ref" key there is data.
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})
#: Keywords whose values map names to schemas: every value is a schema, whatever the name.
SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"})


def schema_nodes(node: Any) -> Iterator[dict[str, Any]]:
    """Every schema object in ``node`` (itself included), outermost first.

    Walks schemas only: the values of ``enum``/``const``/``default``/``examples``
    are instances (a ``"$ref"`` or ``"pattern"`` key there is plain data), and
    the keys of ``properties``/``$defs``/... are names, not keywords.  Yields the
    objects themselves, so a caller may edit them in place.
    """
    stack: list[tuple[Any, bool]] = [(node, True)]  # (item, item is a schema rather than a name map)
    while stack:
        item, is_schema = stack.pop()
        if isinstance(item, list):
            stack.extend((x, True) for x in reversed(item))
        elif isinstance(item, dict) and not is_schema:
            stack.extend((x, True) for x in reversed(list(item.values())))
        elif isinstance(item, dict):
            yield item
            for key, value in reversed(list(item.items())):
                if key not in DATA_KEYWORDS:
                    stack.append((value, key not in SCHEMA_MAPS))
