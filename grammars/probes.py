"""Runs a capability probe: compiles its schema on a backend and checks its instances token by token.

The probes themselves (:data:`~grammars.capabilities.PROBES`) are data beside
the tables they check; this module holds what compiles them, so that reading a
table never imports the compiler.
"""

from __future__ import annotations

import warnings
from typing import Any

from .base import GrammarError
from .capabilities import Probe
from .compile import compile_grammar
from .features import Support
from .spec import grammar_spec

__all__ = ["run_probe"]


def run_probe(probe: Probe, backend: str, tokenizer: Any) -> tuple[Support, str]:
    """What ``backend`` does with ``probe``: ``(support, detail)``.  Compiles; changes no state.

    ``"refused"`` when the schema does not compile; ``"enforced"`` when the
    invalid instance is rejected token by token (and the valid one, if
    given, accepted to the end); ``"ignored"`` when the invalid instance is
    accepted.  A valid instance the grammar rejects makes the detail say so
    (the grammar is then stricter than the schema, not laxer).
    """
    try:
        with warnings.catch_warnings():  # the probe measures what the warning would predict
            warnings.simplefilter("ignore")
            spec = grammar_spec(schema=probe.schema)
            assert spec is not None, "a probe always has a schema"
            compiled = compile_grammar(spec, tokenizer, backend=backend)
    except GrammarError as e:
        return "refused", str(e)[:200]
    eos = compiled.stop_token_ids[0]

    def accepted(text: str) -> bool:
        tokens = list(tokenizer.encode(text, add_special_tokens=False))
        if tokenizer.decode(tokens) != text:
            raise ValueError(f"probe text {text!r} is not expressible in this vocabulary")
        return compiled.matcher().validate(tokens + [eos]) == len(tokens) + 1

    detail = ""
    if probe.valid is not None and not accepted(probe.valid):
        detail = f"the valid instance {probe.valid} is rejected too"
    return ("ignored" if accepted(probe.invalid) else "enforced"), detail
