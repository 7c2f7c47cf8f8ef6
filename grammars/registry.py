"""The grammar backends: what a backend is (:class:`Backend`), and the one registry every part reads.

**Adding a backend** takes one module and one line here:

1. write ``grammars/<name>_backend.py`` that satisfies :class:`Backend` at
   module level -- ``name``, ``aliases``, ``capabilities`` (a
   :class:`~grammars.features.Capabilities`: the grammar kinds it
   compiles, what it does with each JSON-Schema feature, its formats, its
   rank for ``backend="auto"``), ``prepare`` / ``prepared_nbytes`` (the
   tokenizer-level state and its size), ``compile_spec`` (a
   :class:`~grammars.base.CompiledGrammar` whose matchers implement
   :class:`~grammars.base.Matcher`), and ``serialize`` / ``deserialize``
   (bytes for a worker process, or ``None`` when it cannot serialise: its
   compile then runs in-process under its own limits);
   ``grammars/llguidance_backend.py`` is a complete example;
2. add the module to :data:`REGISTRY` below.

Everything else reads the registry: :func:`grammars.compile_grammar`'s
``backend=`` (:data:`BACKENDS`, :data:`BACKEND_CHOICES`), ``backend="auto"``'s
order (:data:`PREFERENCE`, from each ``auto_rank``), the capability tables
(:mod:`grammars.capabilities`), the suggestions after a refusal, the CLI's
``--grammar-backend`` choices and the tools.  The contract tests
(tests/grammars/test_contract.py) and the capability probes
(tests/grammars/test_spec.py) run over every registered backend.

Importing this module imports no backend library (xgrammar, outlines-core,
llguidance): each backend module imports its library inside the functions
that use it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from . import llguidance_backend, outlines_backend, xgrammar_backend
from .base import CompiledGrammar, GrammarError
from .features import Capabilities
from .spec import GrammarSpec

__all__ = ["Backend", "REGISTRY", "BACKENDS", "BACKEND_CHOICES", "DEFAULT", "PREFERENCE", "get", "canonical"]


class Backend(Protocol):
    """A grammar backend: a module with these names (see the module docstring)."""

    @property
    def name(self) -> str:
        """What ``backend=`` calls it."""

    @property
    def aliases(self) -> tuple[str, ...]:
        """Other spellings ``backend=`` accepts (``"outlines-core"``)."""

    @property
    def capabilities(self) -> Capabilities:
        """What it compiles and enforces (checked by the probes of :mod:`grammars.capabilities`)."""

    def prepare(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]) -> Any:
        """The tokenizer-level state (built once per tokenizer, logits width and stop tokens; cached)."""

    def prepared_nbytes(self, prepared: Any) -> int:
        """Estimated resident bytes of :meth:`prepare`'s result.  Pure."""

    def compile_spec(
        self, prepared: Any, spec: GrammarSpec, vocab_size: int, stop_token_ids: Sequence[int]
    ) -> CompiledGrammar:
        """Compile ``spec``; raises :class:`~grammars.base.GrammarError` naming what it cannot compile."""

    @property
    def serialize(self) -> Callable[[Any], bytes] | None:
        """A compiled grammar as bytes (for a worker process), or ``None`` when the backend cannot."""

    @property
    def deserialize(self) -> Callable[[Any, bytes, int, Sequence[int]], CompiledGrammar] | None:
        """``(prepared, bytes, vocab_size, stop_token_ids)`` back to a grammar; ``None`` with ``serialize``."""


#: Every grammar backend; the first is the default.
REGISTRY: tuple[Backend, ...] = (xgrammar_backend, outlines_backend, llguidance_backend)

#: The backends' names, in registry order.
BACKENDS: tuple[str, ...] = tuple(backend.name for backend in REGISTRY)
#: The backend ``backend=`` defaults to.
DEFAULT: str = BACKENDS[0]
#: What ``backend=`` accepts: a backend, or ``"auto"`` (see :mod:`grammars.select`).
BACKEND_CHOICES: tuple[str, ...] = BACKENDS + ("auto",)
#: The order ``backend="auto"`` tries backends in (by ``capabilities.auto_rank``).
PREFERENCE: tuple[str, ...] = tuple(
    backend.name for backend in sorted(REGISTRY, key=lambda backend: backend.capabilities.auto_rank)
)

_BY_NAME: dict[str, Backend] = {
    **{alias: backend for backend in REGISTRY for alias in backend.aliases},
    **{backend.name: backend for backend in REGISTRY},
}


def get(name: Any) -> Backend:
    """The backend called ``name`` (or one of its aliases); a GrammarError naming the choices for any other name."""
    backend = _BY_NAME.get(name) if isinstance(name, str) else None
    if backend is None:
        raise GrammarError(f"unknown grammar backend {name!r}; choose one of {', '.join(map(repr, BACKEND_CHOICES))}")
    return backend


def canonical(name: Any) -> str:
    """The registered name for ``name`` or one of its aliases (``"auto"`` stays); a GrammarError for others."""
    return "auto" if name == "auto" else get(name).name
