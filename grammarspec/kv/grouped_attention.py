"""Grouped-query attention under a mask without copying the keys, on the CPU.

For a forward of several query tokens under an attention mask (a draft chain
after a cached prefix, rows of different lengths under a 4-D mask), transformers'
SDPA attention repeats every key and value head once per query head that shares
it (``repeat_kv``): a copy of the row's whole cache, twice per layer, every
step.  It does so because CUDA's fast kernels refuse grouped-query attention
with a mask.  The CPU's kernels take it (``enable_gqa``) and compute the same
numbers, bit for bit, without the copy.

:func:`grouped_model` runs a model with :func:`grouped_attention` (registered
with transformers' ``AttentionInterface`` under :data:`NAME`, with SDPA's own
mask function) for the duration of a block.  Everything but that one case
(one query token, no mask, another device, soft-capping, position biases) goes
to transformers' SDPA attention unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.nn import functional

from grammarspec.kv.packed_attention import _configs, attention_implementation

__all__ = ["NAME", "grouped_attention", "grouped_model"]

#: The attention implementation's name in transformers' registry (set on the model's config during a forward).
NAME = "grammarspec_grouped_sdpa"

_registered = False


def grouped_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA attention with ``enable_gqa`` for several CPU queries under a mask; transformers' SDPA otherwise.

    ``query [B, H, q, D]``, ``key`` / ``value [B, H_kv, k, D]``; returns ``[B, q, H, D]`` as transformers'
    attention functions do.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    simple = dropout == 0.0 and all(kwargs.get(name) is None for name in ("softcap", "position_bias", "s_aux"))
    if (
        groups <= 1
        or attention_mask is None
        or query.shape[2] == 1
        or query.device.type != "cpu"
        or not simple
        or key.shape[-1] != value.shape[-1]
    ):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    out = functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, grouped_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    _registered = True


@contextmanager
def grouped_model(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model`` with :func:`grouped_attention` for the block where it uses SDPA attention; else unchanged.

    Sets the implementation on the model's config and sub-configs that say
    ``"sdpa"`` and restores each afterwards.
    """
    configs = [
        config
        for config in _configs(getattr(model, "config", None))
        if getattr(config, "_attn_implementation", None) == "sdpa"
    ]
    if not configs:
        yield
        return
    _register()
    with attention_implementation(configs, NAME):
        yield
