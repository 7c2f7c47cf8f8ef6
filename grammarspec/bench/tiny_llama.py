"""Tiny random Llamas: the stand-in targets of the count-only benchmarks, the oracle and the tests.

A real Llama architecture (transformers' own cache, masks and positions) with a
handful of parameters.  It has learned nothing, which is the point wherever only
counts or scripted logits matter: the target-pass counts of a run over it are
the same on any machine.

    >>> config = tiny_llama_config(100, hidden_size=8)
    >>> config.vocab_size, config.hidden_size, config.num_hidden_layers, config.bos_token_id
    (100, 8, 1, None)
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

__all__ = ["tiny_llama_config", "tiny_llama"]


def tiny_llama_config(vocab_size: int, **overrides: Any) -> LlamaConfig:
    """A 1-layer Llama config over *vocab_size* tokens (hidden 32, 2 heads, 1 KV head, no BOS); *overrides* win."""
    settings: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 16384,
        "bos_token_id": None,
    }
    settings.update(overrides)
    return LlamaConfig(**settings)


def tiny_llama(vocab_size: int, seed: int = 0, **overrides: Any) -> LlamaForCausalLM:
    """A :func:`tiny_llama_config` model in eval mode with random weights drawn from *seed*."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config(vocab_size, **overrides)).eval()
