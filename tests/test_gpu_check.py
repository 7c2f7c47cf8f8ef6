"""tools/gpu_check.py: refuses to run without CUDA, and its parity path agrees on CPU (tiny model)."""

from __future__ import annotations

import torch
from toy import toy_tokenizer
from toy_models import tiny_llama

from tools import gpu_check

SCHEMAS = [
    {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"a": {"type": "array", "items": {"enum": ["x", "yy"]}, "maxItems": 2}},
     "required": ["a"], "additionalProperties": False},
]  # fmt: skip


def test_without_cuda_it_says_so(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().out


def test_the_parity_path_agrees_with_hf_at_batch_one_and_two():
    tok = toy_tokenizer()
    model = tiny_llama(len(tok), seed=4)
    prompts = ["{a:[x", "ab"]
    alone = [gpu_check.hf_generate(model, tok, *gpu_check.batch_inputs(tok, [p], "cpu"), [s], 12)[0]
             for p, s in zip(prompts, SCHEMAS)]  # fmt: skip
    for size in (1, 2):
        got = []
        for first in range(0, 2, size):
            ids, mask = gpu_check.batch_inputs(tok, prompts[first : first + size], "cpu")
            got += gpu_check.ours(model, tok, ids, mask, SCHEMAS[first : first + size], 12)
        assert got == alone
    assert all(len(out) > 2 for out in alone)  # real answers, not empty rows
