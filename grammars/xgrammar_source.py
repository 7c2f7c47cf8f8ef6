"""A schema or regex as xgrammar reads it: :func:`readable_source`.

A leaf shared by the xgrammar backend and :mod:`grammars.emptiness` (which
reads xgrammar's normalised grammar without a tokenizer).
"""

from __future__ import annotations

import json

from .ecma_regex import expand, has_property_escapes, xgrammar_schema
from .spec import GrammarSpec

__all__ = ["readable_source"]


def readable_source(spec: GrammarSpec) -> str:
    """``spec``'s source as xgrammar reads it: ECMA-262 property escapes (``\\p{Lu}``), which its regex compiler
    lacks, written out as the exact classes of their code points (:mod:`grammars.ecma_regex`).

    Raises ``ValueError`` for an escape that names no ECMA-262 property.
    """
    if spec.is_json:
        readable = xgrammar_schema(spec.schema)
        return spec.source if readable is spec.schema else json.dumps(readable, ensure_ascii=False)
    if spec.kind == "regex" and has_property_escapes(spec.source):
        return expand(spec.source, dialect="xgrammar")
    return spec.source
