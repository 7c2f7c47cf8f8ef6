"""Up-front checks of what ``generate`` receives: prompts, model inputs, arguments, assistants.

Everything here runs before any model pass and raises a ``ValueError`` that
names what was wrong and what to do, so bad input never fails deep inside a
dependency.  Pure functions; nothing changes state.
"""

from __future__ import annotations

from typing import Any, TypeGuard

import torch
from transformers import GenerationConfig

__all__ = [
    "REFUSED_ARGUMENTS",
    "check_arguments",
    "check_assistant",
    "check_prompt_cache",
    "warn_unmasked_padding",
    "check_model_inputs",
    "check_prompt",
    "eos_ids",
    "needs_tokenizer",
    "prompt_rows",
    "refuse_arguments",
]

#: Hugging Face ``generate`` arguments with no meaning here: refused when given.
REFUSED_ARGUMENTS = {
    "negative_prompt_ids": "classifier-free guidance needs a second model pass per token",
    "negative_prompt_attention_mask": "classifier-free guidance needs a second model pass per token",
    "prefix_allowed_tokens_fn": "pass the constraint as grammar=, regex= or schema= instead",
    "stopping_criteria": "use max_new_tokens, eos_token_id or stop_strings",
    "synced_gpus": "multi-GPU synchronised generation is not supported",
    "custom_generate": "grammarspec is itself the decoding method",
    "inputs_embeds": "grammarspec needs token ids (the grammar and the drafters read them)",
}


def refuse_arguments(kwargs: dict[str, Any]) -> None:
    """Refuse Hugging Face ``generate`` arguments grammarspec cannot honour; drops their ``None`` values."""
    for name, why in REFUSED_ARGUMENTS.items():
        if kwargs.get(name) not in (None, False):
            raise ValueError(f"grammarspec cannot honour {name}= ({why})")
        kwargs.pop(name, None)


#: Generation settings that take a whole number: name -> (smallest value, what it accepts).
_INT_SETTINGS = {
    "max_new_tokens": (0, "an int >= 0"),
    "min_new_tokens": (0, "an int >= 0"),
    "max_length": (1, "an int >= 1"),
    "min_length": (0, "an int >= 0"),
    "num_return_sequences": (1, "an int >= 1 (the number of sampled outputs per prompt)"),
    "top_k": (0, "an int >= 0 (0 switches it off)"),
    "no_repeat_ngram_size": (0, "an int >= 0 (0 switches it off)"),
}
#: Generation settings that take a real number.
_FLOAT_SETTINGS = ("temperature", "top_p", "min_p", "typical_p", "repetition_penalty", "epsilon_cutoff", "eta_cutoff")
#: Generation settings that take a boolean.
_BOOL_SETTINGS = (
    "do_sample",
    "output_scores",
    "output_logits",
    "return_dict_in_generate",
    "renormalize_logits",
    "remove_invalid_values",
)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def check_arguments(options: dict[str, Any], generation_config: GenerationConfig | None = None) -> None:
    """Type and range checks of ``generate``'s own arguments and of the generation settings.  Pure.

    ``options``: keyword arguments by name (grammarspec's own, e.g.
    ``max_draft_tokens``, and ``GenerationConfig`` fields); the fields set on
    ``generation_config`` are checked too.  Raises ``ValueError`` naming the
    argument, what it got and what it accepts, before anything runs.
    """
    settings = {}
    if generation_config is not None:
        settings.update(
            {
                k: v
                for k, v in generation_config.to_dict().items()
                if k in _INT_SETTINGS or k in _FLOAT_SETTINGS or k in _BOOL_SETTINGS
            }
        )
    settings.update(options)
    for name, value in settings.items():
        if value is None:
            continue
        if name in _INT_SETTINGS:
            low, accepts = _INT_SETTINGS[name]
            if not _is_int(value) or value < low:
                raise ValueError(f"{name} must be {accepts}, got {value!r}")
        elif name in _FLOAT_SETTINGS:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number, got {value!r}")
        elif name in _BOOL_SETTINGS and not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    for name in ("strict", "json_object", "parallel_tool_calls", "any_whitespace", "adaptive", "update_cache"):
        if name in options and not isinstance(options[name], bool):
            raise ValueError(f"{name}= must be True or False, got {options[name]!r}")
    draft = options.get("max_draft_tokens")
    if "max_draft_tokens" in options and (not _is_int(draft) or draft < 1):
        raise ValueError(f"max_draft_tokens must be an int >= 1 (tokens per draft), got {draft!r}")
    batch = options.get("max_batch_size")
    if batch is not None and (not _is_int(batch) or batch < 1):
        raise ValueError(f"max_batch_size must be None (every row at once) or an int >= 1, got {batch!r}")
    timeout = options.get("compile_timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ValueError(f"compile_timeout must be None or a number of seconds > 0, got {timeout!r}")
    generator = options.get("generator")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(
            f"generator= must be a torch.Generator, got {type(generator).__name__}; for a seed pass "
            "generator=torch.Generator().manual_seed(42)"
        )
    if options.get("use_cache") is False or (generation_config is not None and generation_config.use_cache is False):
        raise ValueError(
            "use_cache=False cannot be honoured: speculative decoding keeps the KV cache and rolls it back after "
            "a rejection. Drop use_cache= (or call the model's original generate without grammarspec's arguments)."
        )
    if options.get("regex") is not None and options.get("any_whitespace"):
        raise ValueError(
            "any_whitespace=True has no effect with regex=: the regex alone says where whitespace may go. "
            "Drop any_whitespace=, or write the whitespace into the regex (e.g. '\\s*')."
        )


def check_prompt_cache(past_key_values: Any) -> None:
    """``past_key_values`` must be a transformers ``Cache`` (the legacy tuple format is refused)."""
    if past_key_values is None:
        return
    from transformers import Cache

    if not isinstance(past_key_values, Cache):
        raise ValueError(
            f"past_key_values must be a transformers Cache such as DynamicCache (a prompt cache), got "
            f"{type(past_key_values).__name__}; convert a legacy tuple with DynamicCache.from_legacy_cache(...)"
        )


def warn_unmasked_padding(rows: list[list[int]], attention_mask: Any, pad_token_id: int | None) -> None:
    """Warn, as Hugging Face does, about a batch that starts with pad tokens but has no ``attention_mask``."""
    if attention_mask is not None or pad_token_id is None or len(rows) < 2:
        return
    padded = [i for i, row in enumerate(rows) if row and row[0] == pad_token_id]
    if padded and len({len(r) for r in rows}) == 1:
        import warnings

        warnings.warn(
            f"input_ids row {padded[0]} starts with the pad token ({pad_token_id}) but no attention_mask was "
            "given, so the pad tokens are read as part of the prompt; pass the tokenizer's attention_mask "
            "(tokenizer(texts, padding=True, return_tensors='pt'))",
            UserWarning,
            stacklevel=4,
        )


def check_model_inputs(model: torch.nn.Module, inputs: dict[str, Any]) -> None:
    """``token_type_ids`` from ``tokenizer(...)``: all 0 (one segment) carries nothing and is accepted."""
    types_ = inputs.get("token_type_ids")
    if types_ is not None and bool(torch.as_tensor(types_).ne(0).any()):
        raise ValueError(
            "token_type_ids with non-zero entries: grammarspec feeds only input_ids to the model, so several "
            "segments cannot be told apart. Drop token_type_ids (or use the model's original generate)."
        )


def prompt_rows(input_ids: Any, attention_mask: torch.Tensor | None) -> tuple[list[list[int]], int]:
    """The unpadded rows and the padded width (``input_ids.shape[1]``, as HF counts the prompt)."""
    if input_ids is None:
        raise ValueError("generate() needs input_ids (the tokenized prompt)")
    if isinstance(input_ids, (list, tuple)) and input_ids and all(isinstance(r, (list, tuple)) for r in input_ids):
        lengths = sorted({len(r) for r in input_ids})
        if len(lengths) > 1:
            raise ValueError(
                f"input_ids rows have different lengths ({', '.join(map(str, lengths))}); left-pad them to one "
                "length and pass an attention_mask (tokenizer(texts, padding=True, return_tensors='pt') does "
                "both, with tokenizer.padding_side='left'), or generate one row per call"
            )
    try:
        ids = torch.as_tensor(input_ids)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(
            f"input_ids must be a [batch, length] tensor or list of token ids, got {type(input_ids).__name__} "
            f"({str(e).splitlines()[0]})"
        ) from None
    if ids.numel() == 0:
        ids = ids.long()
    if ids.is_floating_point() or ids.is_complex():
        raise ValueError(f"input_ids must hold integer token ids, got dtype {ids.dtype}")
    ids = ids.long()
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() > 2:
        raise ValueError(
            f"input_ids must be a [batch, length] tensor (2-D), got {ids.dim()}-D shape {tuple(ids.shape)}; "
            "stack the prompts as rows of one 2-D tensor"
        )
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(
            f"input_ids must be a non-empty [batch, length] tensor, got shape {tuple(ids.shape)}; an empty "
            "prompt gives the model nothing to condition on (use at least a BOS token or a chat template)"
        )
    mask = torch.ones_like(ids) if attention_mask is None else _check_mask(attention_mask, ids)
    rows = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    if any(not r for r in rows):
        raise ValueError("a batch row has no unmasked token: every prompt needs at least one token")
    return rows, int(ids.shape[1])


def _check_mask(attention_mask: Any, ids: torch.Tensor) -> torch.Tensor:
    """The ``attention_mask`` as a ``[batch, length]`` 0/1 tensor, checked: padding on the left only."""
    mask = torch.as_tensor(attention_mask)
    if mask.dim() == 1 and ids.shape[0] == 1:
        mask = mask.unsqueeze(0)
    if tuple(mask.shape) != tuple(ids.shape):
        raise ValueError(
            f"attention_mask must have the shape of input_ids {tuple(ids.shape)}, got {tuple(mask.shape)}; pass "
            "the attention_mask the tokenizer returned with these input_ids"
        )
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (token)")
    mask = mask.long()
    for i, row in enumerate(mask.tolist()):
        ones = [j for j, m in enumerate(row) if m]
        if ones and 0 in row[ones[0] : ones[-1] + 1]:
            raise ValueError(
                f"attention_mask row {i} has a 0 between prompt tokens (at position "
                f"{row.index(0, ones[0])}); only padding may be masked, on the left (tokenizer.padding_side='left'). "
                "grammarspec would drop those tokens from the prompt."
            )
    return mask


def check_prompt(model: torch.nn.Module, rows: list[list[int]], vocab: int) -> None:
    """Token ids inside the vocabulary; prompts shorter than the model's context."""
    hf: Any = model  # a Hugging Face model (or a toy speaking its protocol)
    embeddings = hf.get_input_embeddings() if hasattr(hf, "get_input_embeddings") else None
    limit = int(getattr(embeddings, "num_embeddings", 0) or vocab)
    for i, row in enumerate(rows):
        bad = [t for t in row if t < 0 or t >= limit]
        if bad:
            raise ValueError(
                f"input_ids row {i} holds token id {bad[0]}, outside the model's vocabulary (0..{limit - 1}); "
                "tokenize the prompt with this model's tokenizer"
            )
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    longest = max(len(r) for r in rows)
    if context is not None and longest >= context:
        raise ValueError(
            f"the prompt has {longest} tokens but the model's context is {context} "
            "(config.max_position_embeddings): shorten the prompt"
        )


def eos_ids(config: GenerationConfig, tokenizer: Any) -> tuple[int, ...]:
    eos = config.eos_token_id
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return ()
    return tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))


def needs_tokenizer(proposer: Any) -> bool:
    """Whether a resolved assistant holds a drafter that declares it needs the tokenizer (``TextDrafter``)."""
    from proposers.base import TextDrafter, members

    return any(isinstance(p, TextDrafter) and p.needs_tokenizer for p in members(proposer))


def _warn_bigger_draft_vocabulary(draft: int, target: int | None, n_tokens: int | None) -> None:
    """Warn when a draft's vocabulary is larger than padding the target's (to a multiple of 128) explains."""
    known = max(v for v in (target, n_tokens, 1) if v is not None)
    padded = -(-known // 128) * 128
    if draft > padded:
        import warnings

        warnings.warn(
            f"the assistant model's vocabulary has {draft} entries, more than the target's {known} padded to "
            f"{padded}: it probably uses another tokenizer, and then almost every draft is rejected (the output "
            "stays exact, but slower than without it). Use a draft model from the target's family.",
            UserWarning,
            stacklevel=4,
        )


def check_assistant(model: torch.nn.Module, assistant: Any, tokenizer: Any) -> None:
    """Refuse a draft model whose tokenizer cannot be the target's."""
    if not isinstance(assistant, torch.nn.Module):
        return
    target_cfg: Any = model.config  # Hugging Face configs (a model's own attributes, such as vocab_size)
    draft_cfg: Any = assistant.config
    problems = []
    n_tokens = len(tokenizer) if tokenizer is not None else None
    if n_tokens is not None and draft_cfg.vocab_size < n_tokens:
        problems.append(f"its vocabulary has {draft_cfg.vocab_size} entries but the tokenizer has {n_tokens}")
    _warn_bigger_draft_vocabulary(int(draft_cfg.vocab_size), getattr(target_cfg, "vocab_size", None), n_tokens)
    for attr in ("bos_token_id", "eos_token_id"):
        a, b = getattr(target_cfg, attr, None), getattr(draft_cfg, attr, None)
        if a is not None and b is not None and a != b:
            problems.append(f"{attr} is {b} for the draft but {a} for the target")
    if problems:
        raise ValueError(
            "the assistant model does not share the target's tokenizer ("
            + "; ".join(problems)
            + "). grammarspec verifies draft tokens by id, so the draft must use the same tokenizer "
            "(a padded vocabulary is fine). Use a draft model from the same family, or a cheap proposer "
            "such as assistant='auto'."
        )
