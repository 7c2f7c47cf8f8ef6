"""What to do when a backend refuses a grammar, or compiles it without enforcing all of it.

After a refusal, :func:`alternatives` names the other backends that both
compile the grammar *and* can decode it -- having tried them, not guessed
from tables: a backend is suggested only when its grammar compiles and a
fresh matcher accepts a first token (:func:`decodes`), so a suggestion is
never a grammar that accepts nothing.  Nor is it a backend that leaves
unenforced a keyword the refusal was for (llguidance refuses ``$dynamicRef``,
naming it; xgrammar compiles it and ignores it): that one is named as
compiling it without enforcing it, not suggested.  Suggestions name the keyword users
pass, ``grammar_backend='...'`` (the command line shows it as
``--grammar-backend``).

:func:`report_unenforced` warns about (or with ``strict=True`` refuses) the
schema features a compiled grammar does not enforce, with :func:`advice`.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

from .base import CompiledGrammar, GrammarError, GrammarWarning
from .capabilities import refused, support, unenforced
from .deadline import Budget, CompileTimeout, NotTried
from .registry import PREFERENCE
from .spec import GrammarSpec

__all__ = ["SUGGESTION_TIMEOUT", "NO_VALUE", "alternatives", "decodes", "advice", "report_unenforced"]

#: How long a backend may take to compile when it is tried in order to suggest it (a failed compile's advice);
#: with ``compile_timeout`` set, at most what the call has left of it.
SUGGESTION_TIMEOUT = 30.0
#: What every backend's message says when the schema admits no value (then no other backend is suggested).
NO_VALUE = "accepts no value"
#: How many of a fresh matcher's legal first tokens :func:`decodes` tries.
_FIRST_TOKENS = 8


def alternatives(
    failed: str, spec: GrammarSpec, compile_with: Callable[..., CompiledGrammar], budget: Budget, reason: str = ""
) -> str:
    """Which other backends compile and decode ``spec``, found by compiling it on each (cached, so switching is free).

    Each gets what the call has left of its ``compile_timeout`` (at most
    :data:`SUGGESTION_TIMEOUT`); once that is spent the rest are not tried,
    and the advice says so.
    """
    compiles: list[str] = []
    notes: list[str] = []
    lacking: list[str] = []  # compile it, but leave unenforced the features the failed backend refused
    why = _refused_for(spec, failed, reason)
    tried: list[str] = []
    untried: list[str] = []
    undecodable: list[str] = []
    for other in PREFERENCE:
        if other == failed:
            continue
        limit = budget.left(SUGGESTION_TIMEOUT)
        try:
            compiled = compile_with(other, SUGGESTION_TIMEOUT)
        except NotTried:
            untried.append(other)
            continue
        except CompileTimeout:
            tried.append(other)
            notes.append(f"{other} did not finish within {limit:.3g} s")
            continue
        except GrammarError:
            tried.append(other)
            continue
        tried.append(other)
        if not decodes(compiled):
            undecodable.append(other)
            notes.append(f"{other} compiles it, but its grammar accepts no first token")
            continue
        gaps = unenforced(spec.schema, other) if spec.kind == "json_schema" else []
        missing = [f for f in why if f in gaps]
        if missing:  # suggesting it would trade a refusal for a keyword silently not enforced
            lacking.append(other)
            continue
        compiles.append(f"grammar_backend='{other}'" + (f" (it does not enforce {', '.join(gaps)})" if gaps else ""))
    if untried:
        notes.append(
            f"{', '.join(untried)} not tried: compile_timeout={budget.total:g} s was spent; raise it to find out "
            f"whether {'it compiles' if len(untried) == 1 else 'they compile'} this grammar"
        )
    if lacking:
        notes.append(
            f"{' and '.join(lacking)} {'compiles' if len(lacking) == 1 else 'compile'} it but {'does' if len(lacking) == 1 else 'do'} "
            f"not enforce {', '.join(why)} either: an output may break it, and is then reported with valid=false"
        )
    detail = f" ({'; '.join(notes)})" if notes else ""
    if not compiles:
        if lacking:
            return f"No other backend enforces {', '.join(why)}{detail}; rewrite that part of the schema."
        if not tried:
            return f"No other backend was tried{detail}."
        decode = " into a grammar that can decode" if undecodable else ""
        return f"No other backend compiles it either{decode} (tried {', '.join(tried)}){detail}."
    they = "it compiles and decodes" if len(compiles) == 1 else "they compile and decode"
    return f"Try {' or '.join(compiles)}: tried, {they} this grammar{detail}."


def _refused_for(spec: GrammarSpec, failed: str, reason: str) -> list[str]:
    """The features ``failed`` refuses (its table) that its refusal ``reason`` names: what the refusal was for."""
    if spec.kind != "json_schema":
        return []
    return [f for f in refused(spec.schema, failed) if f'"{re.split(r"[:+]", f)[0]}"' in reason]  # as its JSON key


def decodes(compiled: CompiledGrammar) -> bool:
    """Whether a fresh matcher of ``compiled`` has a legal first token that it accepts.  Changes no shared state.

    A grammar that compiles but accepts nothing (llguidance on some ``$ref``
    cycles) has an empty first mask, or a mask whose tokens the matcher then
    refuses; suggesting it would only move the failure to generation.
    """
    try:
        matcher = compiled.matcher(max_rollback=1)
        first = matcher.allowed_tokens()[:_FIRST_TOKENS].tolist()
        return any(matcher.fork().accept(int(token)) for token in first)
    except GrammarError:
        return False


def advice(features: tuple[str, ...], backend: str) -> str:
    """What to do about ``features`` that ``backend`` does not enforce: a backend that does, or post-validation."""
    better = [name for name in PREFERENCE if name != backend and all(support(name, f) == "enforced" for f in features)]
    post = (
        "or rely on post-validation: every finished result carries stats.valid and stats.schema_errors "
        "(grammars.validation.output_errors)"
    )
    if better:
        return f"use grammar_backend='{better[0]}' (it enforces them), {post}"
    return f"no backend enforces all of them; simplify the schema, {post}"


def report_unenforced(compiled: CompiledGrammar, strict: bool) -> None:
    """Warn (or with ``strict``, raise) about schema features ``compiled`` does not enforce."""
    if not compiled.unenforced:
        return
    features = compiled.unenforced
    message = (
        f"the {compiled.backend} grammar does not enforce {', '.join(features)} in this schema, so an output "
        f"may break {'them' if len(features) > 1 else 'it'}; {advice(features, compiled.backend)}"
    )
    if strict:
        raise GrammarError(message + ". (strict=True refuses such schemas; pass strict=False to generate anyway.)")
    warnings.warn(message, GrammarWarning, stacklevel=3)
