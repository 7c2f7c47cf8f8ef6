"""The prepacked output head: the same logits as the plain head, the same weight, and a plain fallback."""

from __future__ import annotations

import pytest
import torch

from grammarspec.model.prepacked_head import PrepackedLinear, prepack_head
from tests.toy_models import random_llama

V = 300


def _logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("tied", [True, False])
def test_the_packed_head_shares_the_weight_and_gives_the_plain_heads_logits(tied):
    model = random_llama(V, 2, tie_word_embeddings=tied)
    ids = [5, 17, 3, 250, 99, 7, 41]
    want = _logits(model, ids)
    weight = model.get_output_embeddings().weight
    assert prepack_head(model)
    head = model.get_output_embeddings()
    assert isinstance(head, PrepackedLinear) and head.weight is weight  # shared, not copied
    if tied:
        assert model.get_input_embeddings().weight is head.weight
    got = _logits(model, ids)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for rows in (1, 3, 4, 16):  # the widths where MKL changes its kernel, and past them
        x = torch.randn(rows, head.in_features)
        with torch.inference_mode():
            torch.testing.assert_close(head(x), torch.nn.functional.linear(x, weight), atol=1e-5, rtol=1e-5)


def test_a_weight_changed_in_place_is_packed_again():
    model = random_llama(V, 3, tie_word_embeddings=False)
    assert prepack_head(model)
    head = model.get_output_embeddings()
    x = torch.randn(5, head.in_features)
    with torch.inference_mode():
        before = head(x)
    with torch.no_grad():
        head.weight.mul_(2.0)
    with torch.inference_mode():
        after = head(x)
    torch.testing.assert_close(after, 2 * before, atol=1e-5, rtol=1e-5)


def test_gradients_and_other_dtypes_take_the_plain_product():
    model = random_llama(V, 4, tie_word_embeddings=False)
    assert prepack_head(model)
    head = model.get_output_embeddings()
    x = torch.randn(4, head.in_features, requires_grad=True)
    head(x).sum().backward()  # the oneDNN op has no gradient: the plain product runs
    assert x.grad is not None and head.weight.grad is not None
    head.double()  # a model converted after packing
    with torch.inference_mode():
        assert head(x.detach().double()).dtype == torch.float64
    bf16 = random_llama(V, 4, tie_word_embeddings=False).to(torch.bfloat16)
    assert not prepack_head(bf16)  # measured only for float32: left as it was
    assert type(bf16.get_output_embeddings()) is torch.nn.Linear
