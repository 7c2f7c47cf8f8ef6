"""``backend="auto"``: per grammar, the backend that enforces everything it uses.

The rule (from the capability tables of :mod:`grammars.capabilities`):

1. a JSON schema no value satisfies (``minimum > maximum``, an empty
   ``enum``, ``false``) is refused with a :class:`GrammarError` that says so
   (no backend can help);
2. the first backend of :data:`PREFERENCE` whose table enforces every
   feature the schema uses and that compiles it wins (llguidance, then
   xgrammar, then outlines-core);
3. if none does, the compiling backend that leaves the fewest features
   unenforced wins (ties: :data:`PREFERENCE` order) and the result names
   what is not enforced.

Capabilities decide first: a backend is compiled only when its table says
it can win (it enforces everything, or it could leave fewer features
unenforced than the best so far, and refuses none), so a fallback is compiled
only when needed, and the caches of :mod:`grammars.compile` (compiled grammars
and remembered errors) make sure nothing is compiled twice.

Regexes and EBNF grammars are enforced fully by every backend that compiles
them; the first of :data:`PREFERENCE` that compiles wins.

The preference order is llguidance (it refuses what it does not implement,
so what it compiles it enforces: 0 of 585 invalid corpus examples accepted;
compile p50 31 ms, p99 0.5 s), then xgrammar (compiles 419 of the 420
corpus schemas, fastest mask, but accepts 22 of 652 invalid examples), then
outlines-core (enforces least; slow to compile).  Measured in
docs/COVERAGE.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .base import CompiledGrammar, GrammarError
from .capabilities import refused, unenforced
from .keywords import unsatisfiable
from .registry import PREFERENCE, get
from .spec import GrammarSpec

__all__ = ["PREFERENCE", "Choice", "choose"]


@dataclass(frozen=True)
class Choice:
    """The compiled grammar auto chose, why, and what it leaves unenforced."""

    compiled: CompiledGrammar
    backend: str
    reason: str
    unenforced: tuple[str, ...]


def choose(spec: GrammarSpec, compile_with: Callable[[str], CompiledGrammar]) -> Choice:
    """Pick a backend for ``spec``; ``compile_with(name)`` compiles on one backend (may raise GrammarError)."""
    errors: dict[str, str] = {}

    def attempt(name: str) -> CompiledGrammar | None:
        try:
            return compile_with(name)
        except GrammarError as e:
            errors[name] = str(e)
            return None

    if not spec.is_json:
        for name in PREFERENCE:
            if spec.kind not in get(name).capabilities.kinds:
                continue
            compiled = attempt(name)
            if compiled is not None:
                return Choice(compiled, name, f"{name}: the first backend that compiles this {spec.kind}", ())
        raise GrammarError(_none_compiled(errors))
    why_not = unsatisfiable(spec.schema)
    if why_not is not None:
        raise GrammarError(f"no JSON value satisfies the schema ({why_not}); fix the schema (no backend can help)")
    gaps = {name: tuple(unenforced(spec.schema, name)) for name in PREFERENCE}
    for name in PREFERENCE:
        if gaps[name] or refused(spec.schema, name):
            continue
        compiled = attempt(name)
        if compiled is not None:
            skipped = [
                f"{n} does not enforce {', '.join(gaps[n])}" for n in PREFERENCE[: PREFERENCE.index(name)] if gaps[n]
            ]
            detail = f" ({'; '.join(skipped)})" if skipped else ""
            return Choice(compiled, name, f"{name} enforces every keyword this schema uses{detail}", ())
    best: tuple[int, str, CompiledGrammar] | None = None
    for name in sorted(PREFERENCE, key=lambda n: (len(gaps[n]), PREFERENCE.index(n))):
        if name in errors or refused(spec.schema, name) or (best is not None and len(gaps[name]) >= best[0]):
            continue  # failed above, declared to refuse, or no better than the best so far
        compiled = attempt(name)
        if compiled is not None:
            best = (len(gaps[name]), name, compiled)
    if best is None:
        raise GrammarError(_none_compiled(errors))
    _, name, compiled = best
    failed = "; ".join(
        f"{n} refused it" if n in errors else f"{n} refuses {', '.join(refused(spec.schema, n))}"
        for n in PREFERENCE
        if n != name and (n in errors or refused(spec.schema, n))
    )
    reason = (
        f"no backend enforces every keyword this schema uses; {name} compiles it and leaves the fewest "
        f"unenforced ({', '.join(gaps[name])})" + (f"; {failed}" if failed else "")
    )
    return Choice(compiled, name, reason, gaps[name])


def _none_compiled(errors: dict[str, str]) -> str:
    return "no grammar backend compiles this grammar: " + " | ".join(errors.values())
