"""Drafters for speculative decoding.

Every proposer speaks the small protocol of :mod:`proposers.base`
(``name``, ``start``, ``propose``, ``commit``) and returns a frozen
:class:`Draft`.  Proposals are validated by the grammar and verified by
exact rejection sampling, so no proposer changes the output distribution.

* :class:`JumpForwardProposer` -- the grammar's forced text, in canonical tokens;
* :class:`SchemaNgramProposer` -- JSON from this document's history, the prompt and the schema;
* :class:`PromptLookupProposer` -- longest-suffix n-gram lookup over prompt + output;
* :class:`~proposers.draft_model.DraftModelProposer` -- a small draft model (imported lazily);
* :class:`CompositeProposer` -- forced span first, then the best continuation;
* :func:`resolve_assistant` -- ``assistant=`` values and presets -> a proposer.
"""

from typing import TYPE_CHECKING, Any

from .base import EMPTY_DRAFT, Draft, GrammarView, Proposer, Request
from .compose import CompositeProposer
from .jump_forward import JumpForwardProposer
from .presets import PRESETS, resolve_assistant
from .prompt_lookup import PromptLookupProposer, find_ngram_continuation
from .schema_ngram import SchemaNgramProposer
from .text import continuation_tokens

if TYPE_CHECKING:
    from .draft_model import DraftModelProposer

__all__ = [
    "Draft",
    "EMPTY_DRAFT",
    "Request",
    "GrammarView",
    "Proposer",
    "JumpForwardProposer",
    "SchemaNgramProposer",
    "PromptLookupProposer",
    "DraftModelProposer",
    "CompositeProposer",
    "PRESETS",
    "resolve_assistant",
    "find_ngram_continuation",
    "continuation_tokens",
]


def __getattr__(name: str) -> Any:
    if name == "DraftModelProposer":  # lazy: it pulls in the decoding machinery
        from .draft_model import DraftModelProposer

        return DraftModelProposer
    raise AttributeError(f"module 'proposers' has no attribute {name!r}")
