"""Generation settings resolved the way ``model.generate`` resolves them, or refused.

:func:`resolve_config` follows ``GenerationMixin._prepare_generation_config``
(transformers 5.24): the user's ``generation_config`` (or a fresh one), then
the model's own ``generation_config`` for every field the user left unset,
then Hugging Face's global defaults (``top_k=50``, ``max_length=20``, ...),
then keyword arguments.  :func:`refuse_unsupported` raises a ``ValueError`` for
every setting speculative decoding cannot honour -- nothing is dropped.
:func:`max_new_tokens` reproduces ``_prepare_generated_length``.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from transformers import GenerationConfig

__all__ = ["ACCEPTED_MODEL_INPUTS", "max_new_tokens", "refuse_unsupported", "resolve_config"]

#: ``model.generate(**tokenizer(...))`` inputs accepted besides input_ids / attention_mask.
ACCEPTED_MODEL_INPUTS = ("token_type_ids", "use_cache")

#: field -> why grammarspec cannot honour it (checked when set to a non-default value).
_REFUSED: dict[str, str] = {
    "num_beams": "beam search keeps several hypotheses per row; speculative decoding verifies one sequence",
    "num_beam_groups": "group beam search is beam search; speculative decoding verifies one sequence",
    "diversity_penalty": "it only applies to group beam search",
    "constraints": "constrained beam search is beam search; pass the constraint as grammar=/regex=/schema=",
    "force_words_ids": "constrained beam search is beam search; pass the constraint as grammar=/regex=/schema=",
    "penalty_alpha": "contrastive search re-ranks candidates by hidden states, not a sampling distribution",
    "dola_layers": "DoLa contrasts layers inside the model pass, which the verifier does not do",
    "guidance_scale": "classifier-free guidance needs a second (unconditional) model pass per token",
    "watermarking_config": "watermark processors are not guaranteed stateless",
    "prompt_lookup_num_tokens": "use assistant='prompt_lookup' (grammarspec's own prompt lookup)",
    "max_matching_ngram_size": "use assistant='prompt_lookup' (grammarspec's own prompt lookup)",
    "assistant_early_exit": "self-speculation by early exit is not supported; pass assistant= instead",
    "use_mtp": "multi-token-prediction heads are not supported; pass assistant= instead",
    "num_assistant_tokens": "grammarspec sizes drafts itself: use max_draft_tokens= and adaptive=",
    "num_assistant_tokens_schedule": "grammarspec sizes drafts itself: use max_draft_tokens= and adaptive=",
    "assistant_confidence_threshold": "grammarspec sizes drafts itself: use max_draft_tokens= and adaptive=",
    "assistant_lookbehind": "only for assistants with another tokenizer, which grammarspec does not support",
    "target_lookbehind": "only for assistants with another tokenizer, which grammarspec does not support",
    "assistant_ensemble_weight": "ensembling the assistant into the output would change the distribution",
    "speculation_type": "grammarspec chooses its own speculation: pass assistant=",
    "encoder_repetition_penalty": "it needs an encoder-decoder model; grammarspec runs decoder-only models",
    "encoder_no_repeat_ngram_size": "it needs an encoder-decoder model; grammarspec runs decoder-only models",
    "output_attentions": "attentions of verification passes are not collected",
    "output_hidden_states": "hidden states of verification passes are not collected",
    "max_time": "use max_new_tokens (or a stop string) to bound the generation",
    "token_healing": "token healing rewrites the prompt, which the grammar state does not follow",
    "prefill_chunk_size": "a generate call reads its prompts in one pass (prompts joining a busy server batch are "
    "read in chunks: grammarspec serve --prompt-chunk)",
    "low_memory": "it only applies to beam search and contrastive search",
}

#: values that mean "off" for a refused field.
_OFF: dict[str, tuple[Any, ...]] = {
    "num_beams": (1,),
    "num_beam_groups": (1,),
    "diversity_penalty": (0.0,),
    "penalty_alpha": (0.0,),
    "guidance_scale": (1.0,),
    "encoder_repetition_penalty": (1.0,),
    "encoder_no_repeat_ngram_size": (0,),
    "output_attentions": (False,),
    "output_hidden_states": (False,),
    "token_healing": (False,),
    "low_memory": (False,),
    "use_mtp": (False,),
}

#: Global defaults that concern only refused features: not checked when they are HF's default.
_ASSISTANT_DEFAULTS = {
    "num_assistant_tokens": 20,
    "num_assistant_tokens_schedule": "constant",
    "assistant_confidence_threshold": 0.4,
    "assistant_lookbehind": 10,
    "target_lookbehind": 10,
}


def resolve_config(
    model: torch.nn.Module, base: GenerationConfig | None, overrides: dict[str, Any]
) -> tuple[GenerationConfig, dict[str, Any], bool]:
    """``(config, unknown keyword arguments, max_length was left at its default)``.

    Does not change ``base`` or the model's config.  Refuses unsupported
    settings (:func:`refuse_unsupported`) before HF's defaults are filled in.
    """
    model_config = getattr(model, "generation_config", None)
    has_default_max_length = (
        overrides.get("max_length") is None
        and (base is None or base.max_length is None)
        and (model_config is None or model_config.max_length is None)
    )
    config = copy.deepcopy(base) if base is not None else GenerationConfig()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # HF's consistency warnings come once, after the merge
        if model_config is not None:
            config.update(**model_config.to_dict(), defaults_only=True, allow_custom_entries=True)
    overrides = dict(overrides)
    max_new = overrides.pop("max_new_tokens", config.max_new_tokens)  # 0 is valid here: return the prompt
    try:
        unknown = config.update(**overrides)
    except ValueError as exc:
        raise ValueError(f"invalid generation settings: {exc}") from None
    refuse_unsupported(config)
    config.update(**GenerationConfig._get_default_generation_params(), defaults_only=True)
    config.max_new_tokens = max_new
    _check_ranges(config)
    if config.do_sample and config.temperature == 0:
        config.do_sample = False  # temperature 0 means greedy (as in vLLM and the OpenAI API)
    return config, unknown, has_default_max_length


def _check_ranges(config: GenerationConfig) -> None:
    """Out-of-range values Hugging Face would skip silently (or fail on deep inside a processor)."""
    checks = [
        ("temperature", config.temperature, lambda v: v >= 0, ">= 0 (0 means greedy)"),
        ("top_p", config.top_p, lambda v: 0 <= v <= 1, "in [0, 1]"),
        ("top_k", config.top_k, lambda v: v >= 0, ">= 0 (0 switches it off)"),
        ("min_p", config.min_p, lambda v: 0 <= v <= 1, "in [0, 1]"),
        ("typical_p", config.typical_p, lambda v: 0 < v <= 1, "in (0, 1]"),
        ("repetition_penalty", config.repetition_penalty, lambda v: v > 0, "> 0 (1.0 switches it off)"),
        ("epsilon_cutoff", config.epsilon_cutoff, lambda v: 0 <= v < 1, "in [0, 1)"),
        ("eta_cutoff", config.eta_cutoff, lambda v: 0 <= v < 1, "in [0, 1)"),
    ]
    for name, value, ok, rule in checks:
        if value is not None and not ok(value):
            raise ValueError(f"{name} must be {rule}, got {value}")


def refuse_unsupported(config: GenerationConfig) -> None:
    """ValueError naming every set field speculation cannot honour, and why."""
    problems = []
    for name, why in _REFUSED.items():
        value = getattr(config, name, None)
        if value is None or value in _OFF.get(name, ()) or _ASSISTANT_DEFAULTS.get(name, object()) == value:
            continue
        problems.append(f"{name}={value!r} ({why})")
    if config.cache_implementation not in (None, "dynamic"):
        problems.append(
            f"cache_implementation={config.cache_implementation!r} (speculation crops the KV cache after a "
            "rejection; only the dynamic cache can be cropped)"
        )
    if problems:
        raise ValueError(
            "grammarspec cannot honour these generation settings with speculative decoding: "
            + "; ".join(problems)
            + ". Remove them (or set them to their defaults), or call the model's original generate without "
            "grammarspec's arguments."
        )


def max_new_tokens(
    config: GenerationConfig, prompt_length: int, context: int | None, has_default_max_length: bool
) -> int:
    """New tokens per row, as ``_prepare_generated_length`` computes ``max_length``.

    ``max_new_tokens`` wins; with no length set anywhere Hugging Face generates
    ``max_length`` (20) NEW tokens, capped by the context, and warns; an
    explicit ``max_length`` counts the prompt.  ``max_new_tokens=0`` returns
    the prompt (Hugging Face raises instead).
    """
    if config.max_new_tokens is not None:
        if config.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {config.max_new_tokens}")
        return int(config.max_new_tokens)
    max_length = int(config.max_length)
    if has_default_max_length:
        warnings.warn(
            f"Using the model-agnostic default `max_length` (={max_length}) to control the generation length. "
            "We recommend setting `max_new_tokens` to control the maximum length of the generation.",
            UserWarning,
            stacklevel=3,
        )
        max_length += prompt_length
        if context is not None:
            max_length = min(max_length, context)
    if prompt_length >= max_length:
        raise ValueError(
            f"Input length of input_ids is {prompt_length}, but `max_length` is set to {max_length}. This can lead "
            "to unexpected behavior. You should consider increasing `max_length` or, better yet, setting "
            "`max_new_tokens`."
        )
    return max_length - prompt_length
