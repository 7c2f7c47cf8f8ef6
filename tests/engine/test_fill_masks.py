"""One batched mask fill for a batch's root rows (xgrammar's ``BatchGrammarMatcher``), equal to filling row by row."""

from __future__ import annotations

import json

import pytest
import torch

from grammars import BACKENDS, GrammarError, allocate_bitmask, compile_grammar, fill_masks, grammar_spec
from grammars.xgrammar_backend import XGrammarMatcher
from grammarspec.engine.decoding import DecodeConfig, RowRequest, decode_batch, sampling_processing
from tests.toy import toy_vocab_size
from tests.toy_models import ToyCausalLM

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"enum": ["a", "b", "ab"]}}},
    "required": ["name", "tags"],
    "additionalProperties": False,
}
TEXT = json.dumps({"name": "ab", "tags": ["a", "ab"]}, separators=(",", ":"))


def matchers_at_every_prefix(tok, backend: str):
    """One matcher per prefix of the reference document: many different states."""
    compiled = compile_grammar(grammar_spec(schema=SCHEMA), tok, vocab_size=len(tok) + 40, backend=backend)
    tokens = tok.encode(TEXT, add_special_tokens=False)
    out = []
    for n in range(len(tokens)):
        m = compiled.matcher(max_rollback=4)
        for t in tokens[:n]:
            assert m.accept(t)
        out.append(m)
    return compiled.vocab_size, out


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batched_fill_equals_filling_row_by_row(tok, backend):
    vocab, matchers = matchers_at_every_prefix(tok, backend)
    one_by_one = allocate_bitmask(len(matchers), vocab)
    for i, m in enumerate(matchers):
        m.fill_mask(one_by_one, i)
    batched = torch.full_like(one_by_one, 7)  # garbage that every row must overwrite
    rows = list(reversed(range(len(matchers))))  # any row order
    fill_masks(matchers, batched, rows)
    assert torch.equal(batched, one_by_one.flip(0))


def test_mixed_backends_each_fill_their_own_rows(tok):
    _, xg = matchers_at_every_prefix(tok, "xgrammar")
    vocab, ol = matchers_at_every_prefix(tok, "outlines")
    mixed = [xg[3], ol[5], xg[7], ol[1]]
    expected = allocate_bitmask(4, vocab)
    for i, m in enumerate(mixed):
        m.fill_mask(expected, i)
    got = allocate_bitmask(4, vocab)
    fill_masks(mixed, got, range(4))
    assert torch.equal(got, expected)


def test_xgrammar_fills_in_one_batched_call_and_a_terminated_matcher_still_says_why(tok, monkeypatch):
    vocab, matchers = matchers_at_every_prefix(tok, "xgrammar")
    calls = []
    original = XGrammarMatcher.fill_mask
    monkeypatch.setattr(XGrammarMatcher, "fill_mask", lambda self, *a: calls.append(a) or original(self, *a))
    fill_masks(matchers, allocate_bitmask(len(matchers), vocab), range(len(matchers)))
    assert calls == []  # no per-row fill: the BatchGrammarMatcher call did them all
    done = matchers[-1]
    for t in tok.encode(TEXT, add_special_tokens=False)[-1:] + [tok.eos_token_id]:
        assert done.accept(t)
    assert done.is_terminated()
    with pytest.raises(GrammarError, match="terminated"):
        fill_masks([matchers[0], done], allocate_bitmask(2, vocab), [0, 1])
    with pytest.raises(ValueError, match="one row per matcher"):
        fill_masks(matchers[:2], allocate_bitmask(2, vocab), [0])


def test_the_loop_fills_each_step_s_roots_in_one_call_and_decodes_as_before(tok, monkeypatch):
    """A batch of 4 greedy rows: one batched fill per step for all rows, and the same tokens as row by row."""
    compiled = compile_grammar(grammar_spec(schema=SCHEMA), tok, vocab_size=toy_vocab_size(), stop_token_ids=(0,))
    config = DecodeConfig(max_new_tokens=30, eos_token_ids=(0,))

    def requests():
        return [
            RowRequest([2, 3 + i, 4], compiled.matcher(max_rollback=8), None, None, sampling_processing(config, (), 3))
            for i in range(4)
        ]

    def run() -> list[list[int]]:
        rows = decode_batch(ToyCausalLM(toy_vocab_size(), seed=3), requests(), config)
        return [list(row.generated) for row in rows]

    batched_calls: list[int] = []
    original = XGrammarMatcher.fill_masks.__func__  # type: ignore[attr-defined]

    def spy(cls, matchers, bitmask, rows):
        batched_calls.append(len(matchers))
        return original(cls, matchers, bitmask, rows)

    monkeypatch.setattr(XGrammarMatcher, "fill_masks", classmethod(spy))
    together = run()
    assert batched_calls and max(batched_calls) == 4  # every unfinished row in one call
    monkeypatch.setattr(
        XGrammarMatcher,
        "fill_masks",
        classmethod(lambda cls, ms, b, rows: [m.fill_mask(b, r) for m, r in zip(ms, rows)]),
    )
    assert run() == together


@pytest.mark.parametrize("vocab", [50, 1000, 49_157])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_masks_equals_xgrammars_kernel_on_sparse_dense_and_mixed_rows(vocab, dtype):
    """The CPU split (sparse rows copied back, the rest to the kernel) gives xgrammar's result bit for bit."""
    import xgrammar

    from grammarspec.engine.masking import apply_masks

    g = torch.Generator().manual_seed(vocab)
    words = (vocab + 31) // 32
    masks = torch.zeros((6, words), dtype=torch.int32)
    masks[1] = -1  # everything allowed
    masks[2, words // 2] = 5  # two tokens
    masks[3] = torch.randint(-(2**31), 2**31 - 1, (words,), generator=g, dtype=torch.int32)  # a random mix
    masks[4, -1] = -1  # the last word, bits past the vocabulary included
    masks[5, :: max(words // 3, 1)] = -(2**31)  # bit 31 only (a negative word)
    logits = torch.randn((6, vocab), generator=g).to(dtype)
    want = logits.clone()
    xgrammar.apply_token_bitmask_inplace(want, masks, vocab_size=vocab)
    for order in (range(6), [2, 1, 0, 5, 3, 4], [1], [0, 2]):  # row subsets: all sparse, all dense, mixed
        order = list(order)
        got = logits[order].clone()
        apply_masks(got, masks[order])
        assert torch.equal(got, want[order])
