"""Up-front checks of what ``generate`` receives: prompts, model inputs, arguments, assistants.

Everything here runs before any model pass and raises a ``ValueError`` that
names what was wrong and what to do, so bad input never fails deep inside a
dependency.  Pure functions; nothing changes state.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig

__all__ = [
    "REFUSED_ARGUMENTS",
    "check_assistant",
    "check_model_inputs",
    "check_prompt",
    "eos_ids",
    "needs_tokenizer",
    "prompt_rows",
    "refuse_arguments",
]  # fmt: skip

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
    ids = torch.as_tensor(input_ids)
    if ids.numel() == 0:
        ids = ids.long()
    if ids.is_floating_point() or ids.is_complex():
        raise ValueError(f"input_ids must hold integer token ids, got dtype {ids.dtype}")
    ids = ids.long()
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(
            f"input_ids must be a non-empty [batch, length] tensor, got shape {tuple(ids.shape)}; an empty "
            "prompt gives the model nothing to condition on (use at least a BOS token or a chat template)"
        )
    mask = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(attention_mask).reshape(ids.shape)
    rows = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    if any(not r for r in rows):
        raise ValueError("a batch row has no unmasked token: every prompt needs at least one token")
    return rows, int(ids.shape[1])


def check_prompt(model: torch.nn.Module, rows: list[list[int]], vocab: int) -> None:
    """Token ids inside the vocabulary; prompts shorter than the model's context."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
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
    """Whether a resolved assistant holds one of grammarspec's text drafters (they read the tokenizer)."""
    from proposers.compose import CompositeProposer
    from proposers.jump_forward import JumpForwardProposer
    from proposers.schema_ngram import SchemaNgramProposer

    members = proposer.proposers if isinstance(proposer, CompositeProposer) else [proposer]
    return any(isinstance(p, (JumpForwardProposer, SchemaNgramProposer)) for p in members)


def check_assistant(model: torch.nn.Module, assistant: Any, tokenizer: Any) -> None:
    """Refuse a draft model whose tokenizer cannot be the target's."""
    if not isinstance(assistant, torch.nn.Module):
        return
    target_cfg, draft_cfg = model.config, assistant.config
    problems = []
    n_tokens = len(tokenizer) if tokenizer is not None else None
    if n_tokens is not None and draft_cfg.vocab_size < n_tokens:
        problems.append(f"its vocabulary has {draft_cfg.vocab_size} entries but the tokenizer has {n_tokens}")
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
