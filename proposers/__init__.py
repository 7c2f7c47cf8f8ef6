"""Drafters for speculative decoding.

Pure drafters over token ids and a read-only grammar view (no models, no KV
caches: the draft-model drafter lives in :mod:`grammarspec.drafting.draft_model`).
Every proposer speaks the small protocol of :mod:`proposers.base`
(``name``, ``start``, ``propose``, ``commit``) and returns a frozen
:class:`Draft`.  Proposals are validated by the grammar and verified by
exact rejection sampling, so no proposer changes the output distribution.

* :class:`JumpForwardProposer` -- the grammar's forced text, in canonical tokens;
* :class:`SchemaNgramProposer` -- JSON from this document's history, the prompt and the schema;
* :class:`PromptLookupProposer` -- longest-suffix n-gram lookup over prompt + output;
* :class:`SuffixProposer` -- what earlier outputs of the same kind wrote next (a shared :class:`SuffixIndex`);
* :class:`CompositeProposer` -- forced span first, then the best continuation;
* :func:`resolve_assistant` -- ``assistant=`` values and presets -> a proposer.
"""

from .base import EMPTY_DRAFT, Draft, GrammarView, Proposer, Request
from .compose import CompositeProposer
from .jump_forward import JumpForwardProposer
from .presets import PRESETS, resolve_assistant
from .prompt_lookup import PromptLookupProposer, find_ngram_continuation
from .schema_ngram import SchemaNgramProposer
from .suffix import SuffixProposer
from .suffix_index import SuffixIndex
from .text import continuation_tokens

__all__ = [
    "Draft",
    "EMPTY_DRAFT",
    "Request",
    "GrammarView",
    "Proposer",
    "JumpForwardProposer",
    "SchemaNgramProposer",
    "PromptLookupProposer",
    "CompositeProposer",
    "SuffixProposer",
    "SuffixIndex",
    "PRESETS",
    "resolve_assistant",
    "find_ngram_continuation",
    "continuation_tokens",
]
