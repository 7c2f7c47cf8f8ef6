"""grammarspec's drafters inside vLLM (``speculative_config={"method": "custom_class", ...}``).

vLLM's ``custom_class`` speculative method builds a user class with the
``VllmConfig`` and asks it, every engine step, for draft tokens for every
running request.  :class:`GrammarspecProposer` answers with grammarspec's
``"auto"`` drafters (jump-forward, the JSON-document-aware schema n-gram,
prompt lookup with its LZ77 continuation, learned target splits), one
per-request state each, fed with what vLLM accepted::

    from vllm import LLM
    import grammarspec.vllm as gsv

    llm = LLM(model=gsv.model_path("smollm2-135m"),
              speculative_config=gsv.speculative_config(num_speculative_tokens=8),
              structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True})

vLLM still verifies every draft with its own target pass and rejection
sampler, and cuts drafts at the first token its own grammar rejects, so the
output distribution is vLLM's.  Importing this package never imports vLLM:
the proposer only reads the objects vLLM hands it.
"""

from __future__ import annotations

from typing import Any

from grammarspec.vllm.proposer import GrammarspecProposer

__all__ = ["GrammarspecProposer", "CLASS_PATH", "speculative_config", "model_path"]

#: The ``speculative_config["model"]`` value that names :class:`GrammarspecProposer`.
CLASS_PATH = "grammarspec.vllm.GrammarspecProposer"


def speculative_config(num_speculative_tokens: int = 8) -> dict[str, Any]:
    """vLLM's ``speculative_config`` for grammarspec's drafters.

    >>> speculative_config(4)
    {'method': 'custom_class', 'model': 'grammarspec.vllm.GrammarspecProposer', 'num_speculative_tokens': 4}

    Pure.  Raises ``ValueError`` for fewer than one token.
    """
    if not isinstance(num_speculative_tokens, int) or num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {num_speculative_tokens!r}")
    return {"method": "custom_class", "model": CLASS_PATH, "num_speculative_tokens": num_speculative_tokens}


def model_path(name_or_path: str = "smollm2-135m") -> str:
    """A local model directory vLLM can load: the safetensors copy of an embedded model, or ``name_or_path``.

    The embedded models are cached (dequantized once) by :func:`grammarspec.load_model`'s loader; the directory
    has the tokenizer files.  Raises :class:`grammarspec.model.loading.ModelNotFoundError` like ``load_model``.
    """
    from grammarspec.model.loading import _resolve

    return str(_resolve(name_or_path))
