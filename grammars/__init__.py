"""The grammar layer: a JSON Schema, pydantic model, tool list, EBNF grammar or
regex becomes a per-request :class:`Matcher` over xgrammar (default),
outlines-core or llguidance (the backends of :mod:`grammars.registry`, which
also says how to add one), or the one ``backend="auto"`` picks per schema.

    >>> spec = grammar_spec(schema={"type": "object"})            # doctest: +SKIP
    >>> compiled = compile_grammar(spec, tokenizer, vocab_size=model.config.vocab_size)  # doctest: +SKIP
    >>> matcher = compiled.matcher(max_rollback=17)                # doctest: +SKIP

Backend libraries are imported lazily: importing this package imports none of them.
"""

from .base import (
    CompiledGrammar,
    GrammarError,
    GrammarWarning,
    Matcher,
    allocate_bitmask,
    bitmask_to_ids,
    bitmask_width,
    fill_masks,
)
from .compile import (
    BACKEND_CHOICES,
    BACKENDS,
    CompileTimeout,
    cache_info,
    clear_grammar_cache,
    compile_grammar,
    set_cache_limits,
)
from .spec import GrammarSpec, check_json_schema, grammar_spec, tools_schema

__all__ = [
    "GrammarError",
    "GrammarWarning",
    "BACKEND_CHOICES",
    "GrammarSpec",
    "CompiledGrammar",
    "Matcher",
    "grammar_spec",
    "tools_schema",
    "check_json_schema",
    "compile_grammar",
    "clear_grammar_cache",
    "set_cache_limits",
    "cache_info",
    "CompileTimeout",
    "BACKENDS",
    "allocate_bitmask",
    "bitmask_width",
    "bitmask_to_ids",
    "fill_masks",
]
