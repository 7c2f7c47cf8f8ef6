"""A bf16 target (processing runs in float32 inside): greedy parity with HF and the same sampling distribution."""

from __future__ import annotations

import torch

from tests.toy import toy_tokenizer
from tests.toy_models import tiny_llama
from tools import gpu_check


def bf16_model(tok):
    model = tiny_llama(len(tok), seed=4).to(torch.bfloat16)
    assert model.lm_head.weight.dtype == torch.bfloat16
    return model


def test_bf16_greedy_parity_at_batch_one_and_two():
    tok = toy_tokenizer()
    model = bf16_model(tok)
    prompts, schemas = gpu_check.PROMPTS[:2], gpu_check.SCHEMAS[:2]
    for size in (1, 2):
        row = gpu_check.parity(f"bf16 batch {size}", model, tok, "cpu", prompts, schemas, 16, size)
        assert row["ok"], row


def test_bf16_sampling_has_hf_s_distribution():
    tok = toy_tokenizer()
    row = gpu_check.exactness(bf16_model(tok), tok, "cpu", 400, 100)
    assert row["ok"], row
    assert len(row["ours"]) >= 3  # several answers drawn: a real test of the distribution, not a point mass
