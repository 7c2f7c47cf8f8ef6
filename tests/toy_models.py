"""Tiny random causal LMs for fast, exact tests of the decoding loop.

``ToyCausalLM`` speaks the Hugging Face forward protocol the loop uses
(``input_ids``, ``past_key_values``, ``use_cache``, ``logits_to_keep``) and keeps
its context in a real ``DynamicCache``.  Its next-token logits depend on the last
token, the position and a hash of the WHOLE cached context, so a rejected
position that lingered in the cache would change every later distribution --
the statistical tests would see it.  ``next_logits(context)`` computes the same
logits without a cache, for enumerating exact distributions.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import torch
from transformers import DynamicCache, LlamaForCausalLM

from grammarspec.bench.tiny_llama import tiny_llama as random_llama
from grammarspec.bench.tiny_llama import tiny_llama_config


class ToyCausalLM(torch.nn.Module):
    def __init__(self, vocab_size: int, seed: int = 0, scale: float = 2.0, buckets: int = 7) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.config = tiny_llama_config(
            vocab_size,
            hidden_size=8,
            intermediate_size=8,
            num_attention_heads=1,
            max_position_embeddings=2048,
            eos_token_id=0,
        )
        self.bigram = scale * torch.randn(vocab_size, vocab_size, generator=g)
        self.position = scale * 0.5 * torch.randn(8, vocab_size, generator=g)
        self.history = scale * 0.5 * torch.randn(buckets, vocab_size, generator=g)
        self.buckets = buckets
        self.device = torch.device("cpu")

    def get_output_embeddings(self) -> None:
        return None

    def next_logits(self, context: Sequence[int]) -> torch.Tensor:
        """Logits ``[V]`` for the token after ``context`` (no cache)."""
        last = context[-1]
        return self.bigram[last] + self.position[len(context) % 8] + self.history[sum(context) % self.buckets]

    def forward(self, input_ids, cache=None, use_cache=True, logits_to_keep=0, attention_mask=None, position_ids=None):
        """Batched: row ``b``'s context is its cached columns where ``attention_mask`` is 1, then its new tokens.

        A masked column (a hole or a pad) is no part of the context, so a rejected
        token that stayed visible would change every later distribution.
        ``position_ids`` are ignored: the position is the length of the visible context.
        """
        batch, n = input_ids.shape
        if attention_mask is not None and attention_mask.dim() == 4:
            logits = self._attend(input_ids, cache, attention_mask, position_ids)
            return SimpleNamespace(
                logits=logits[logits_to_keep]
                if isinstance(logits_to_keep, torch.Tensor)
                else logits[:, -logits_to_keep:]
                if logits_to_keep
                else logits
            )
        past_len = cache.get_seq_length() if cache is not None else 0
        past = cache.layers[0].keys[:, 0, :, 0].long().tolist() if past_len else [[] for _ in range(batch)]
        mask = attention_mask.tolist() if attention_mask is not None else [[1] * (past_len + n)] * batch
        if cache is not None:
            states = input_ids.to(torch.float32).reshape(batch, 1, n, 1)
            cache.update(states, states, 0)
        rows = []
        for b in range(batch):
            context = [t for t, m in zip(past[b], mask[b][:past_len]) if m]
            logits = []
            for j, token in enumerate(input_ids[b].tolist()):
                if mask[b][past_len + j]:
                    context = context + [token]
                logits.append(self.next_logits(context or [token]))
            rows.append(torch.stack(logits))
        logits = torch.stack(rows)  # [B, n, V]
        if isinstance(logits_to_keep, torch.Tensor):
            if logits_to_keep.dtype == torch.bool:
                return SimpleNamespace(logits=logits[logits_to_keep])  # [num_true, V]
            logits = logits[:, logits_to_keep]
        elif logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return SimpleNamespace(logits=logits)

    def _attend(self, input_ids, cache, mask, position_ids=None):
        """Logits ``[B, n, V]`` under a 4-D additive mask: query ``j``'s context is the keys it sees, in column order
        (its own column last), as a Hugging Face attention layer reads the cache ``update`` returns.  Each query's
        position id must be its context's length - 1 (a pad query, which sees only itself, is not checked)."""
        batch, n = input_ids.shape
        states = input_ids.to(torch.float32).reshape(batch, 1, n, 1)
        keys, _ = cache.update(states, states, 0)
        tokens = keys[:, 0, :, 0].long()
        seen = mask[:, 0] == 0  # [B, n, W]
        rows = []
        for b in range(batch):
            logits = []
            for j in range(n):
                context = tokens[b][seen[b, j]].tolist()
                if position_ids is not None and not (j > 0 and len(context) == 1):
                    assert int(position_ids[b, j]) == len(context) - 1, "a position id disagrees with the mask"
                logits.append(self.next_logits(context))
            rows.append(torch.stack(logits))
        return torch.stack(rows)


def tiny_llama(vocab_size: int, seed: int = 0) -> LlamaForCausalLM:
    """A real (random) 2-layer Llama with a handful of parameters, its logits peaky enough that sampling differs
    from uniform."""
    model = random_llama(
        vocab_size,
        seed,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=0,
        pad_token_id=1,
        tie_word_embeddings=False,
    )
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return model


def new_toy_cache() -> DynamicCache:
    return DynamicCache()
