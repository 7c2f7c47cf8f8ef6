"""vLLM engine settings shared by the bench worker, the integration tests and the README.

Nothing here imports vLLM at module level; :func:`make_llm` imports it when called.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "ARM_SPECULATION",
    "arm_environment",
    "llm_kwargs",
    "make_llm",
    "speculation",
    "spec_decode_counts",
    "iomp_preload",
    "suffix_missing",
]

#: The vLLM arms of the bench: vLLM without speculation, with its n-gram proposer, with its suffix method
#: (SuffixDecoding), and with grammarspec's drafters, with and without their index of earlier outputs.
ARM_SPECULATION = ("vllm", "vllm-ngram", "vllm-suffix", "vllm-grammarspec", "vllm-grammarspec-noindex")
#: vLLM's n-gram proposer as the peer: the same suffix lengths as grammarspec's prompt lookup.
NGRAM = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 5}
#: vLLM's suffix method at its own defaults (a global tree of earlier outputs beside each prompt's; its draft
#: depth, 24, and its draft length follow the matched length): the anchor as its authors tune it.
SUFFIX = {"method": "suffix"}


def speculation(arm: str, num_speculative_tokens: int = 8) -> dict[str, Any] | None:
    """``speculative_config`` of a vLLM arm (``None``: no speculation).

    >>> speculation("vllm-ngram", 4)["method"], speculation("vllm") is None
    ('ngram', True)

    Pure.  Raises ``ValueError`` naming the known arms.
    """
    if arm == "vllm":
        return None
    if arm == "vllm-ngram":
        return {**NGRAM, "num_speculative_tokens": num_speculative_tokens}
    if arm == "vllm-suffix":
        return dict(SUFFIX)
    if arm in ("vllm-grammarspec", "vllm-grammarspec-noindex"):
        from grammarspec.vllm import speculative_config

        return speculative_config(num_speculative_tokens)
    raise ValueError(f"unknown vLLM arm {arm!r}; choose from {', '.join(ARM_SPECULATION)}")


def arm_environment(arm: str) -> dict[str, str]:
    """Environment variables the engine of ``arm`` starts under (vLLM's ``custom_class`` takes no options).

    >>> arm_environment("vllm-grammarspec-noindex"), arm_environment("vllm-grammarspec")
    ({'GRAMMARSPEC_DRAFT_MEMORY_MB': '0'}, {})

    Pure.
    """
    return {"GRAMMARSPEC_DRAFT_MEMORY_MB": "0"} if arm == "vllm-grammarspec-noindex" else {}


def suffix_missing() -> str | None:
    """Why vLLM's ``suffix`` method cannot run in this environment (``None``: it can).

    Its suffix tree comes from Snowflake's ``arctic-inference``, which ships as a source package that builds
    C++ on install: ``make vllm-suffix`` builds it into ``.venv-vllm``.  Does not change state.
    """
    import importlib.util

    if importlib.util.find_spec("arctic_inference") is None:
        return (
            "vLLM's suffix method needs arctic-inference, which is not installed in this environment: "
            "`make vllm-suffix` builds it into .venv-vllm (about a minute; needs a C++ compiler)"
        )
    return None


def llm_kwargs(
    model: str,
    speculative_config: dict[str, Any] | None,
    *,
    max_model_len: int = 2048,
    seed: int = 0,
    kv_cache_gib: float = 1.0,
) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` for the bench and the tests (pure).

    float32 like grammarspec's Hugging Face path (vLLM would downcast to bfloat16); eager mode (no compile
    on CPU); a fixed KV-cache size instead of a fraction of host memory (``gpu_memory_utilization`` is
    that fraction on the CPU backend); compact JSON (``disable_any_whitespace``) like grammarspec.
    """
    return {
        "model": model,
        "dtype": "float32",
        "enforce_eager": True,
        "max_model_len": max_model_len,
        "seed": seed,
        "kv_cache_memory_bytes": int(kv_cache_gib * (1 << 30)),
        "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
        "speculative_config": speculative_config,
        "disable_log_stats": False,  # spec-decode counters for get_metrics()
    }


def iomp_preload() -> str | None:
    """The Intel OpenMP library shipped in this environment, if any (vLLM's CPU backend wants it in LD_PRELOAD).

    Does not change state.
    """
    import sys

    path = os.path.join(sys.prefix, "lib", "libiomp5.so")
    return path if os.path.isfile(path) else None


def make_llm(model: str, speculative_config: dict[str, Any] | None, **kwargs: Any) -> Any:
    """A ``vllm.LLM`` with :func:`llm_kwargs` (call under ``if __name__ == "__main__":``)."""
    from vllm import LLM

    return LLM(**llm_kwargs(model, speculative_config, **kwargs))


def spec_decode_counts(llm: Any) -> dict[str, int]:
    """vLLM's cumulative spec-decode counters: ``drafts``, ``draft_tokens``, ``accepted_tokens``.

    Reads ``llm.get_metrics()`` (needs ``disable_log_stats=False``); zeros without speculation.
    Does not change state.
    """
    names = {
        "vllm:spec_decode_num_drafts": "drafts",
        "vllm:spec_decode_num_draft_tokens": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    }
    counts = dict.fromkeys(names.values(), 0)
    for metric in llm.get_metrics():
        key = names.get(metric.name)
        if key is not None:
            counts[key] += int(getattr(metric, "value", 0) or 0)
    return counts
