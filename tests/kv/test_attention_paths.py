"""The accelerator's one-call attention path decodes as the CPU's row path does: the same greedy tokens on the
embedded SmolLM2 model (trained) and a random Llama, with drafting rows, branching trees and a prompt that joins
and is read in chunks beside them.  Both paths run here on the CPU (a test forces the path; users never choose
it: :func:`grammarspec.kv.packed_attention.attention_path` does, by device)."""

from __future__ import annotations

import pytest
import torch

from grammars import compile_grammar, grammar_spec
from grammarspec.engine.decoding import DecodeConfig, RowRequest, decode_batch, sampling_processing
from grammarspec.engine.rows import RowSettings
from grammarspec.kv import batch as kv_module
from grammarspec.kv import packed_attention
from grammarspec.kv.packed_attention import BATCHED, ROWS
from grammarspec.policy.adaptive import AdaptiveController
from tests.helpers import BranchyTreeProposer, ImprobableProposer, single_thread
from tests.toy import toy_tokenizer, toy_vocab_size
from tests.toy_models import tiny_llama

one_thread = pytest.fixture(autouse=True)(single_thread)  # one torch thread per test: helpers.single_thread says why

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}}},
    "required": ["name", "tags"],
    "additionalProperties": False,
}


def decode_on(path, model, grammar, prompts, *, new_tokens, batch):
    """Greedy ``decode_batch`` of ``prompts`` on ``path``: at most ``batch`` rows at once (the rest join as rows
    end, their prompts read 3 tokens a step beside the decoding rows; the first row ends after 4 tokens); even rows
    draft trees, odd ones chains.
    Returns each row's tokens and how many one-call attentions, drafted tokens and prompt chunks the run had."""
    config = DecodeConfig(max_new_tokens=new_tokens, eos_token_ids=grammar.stop_token_ids)
    requests = []
    for i, prompt in enumerate(prompts):
        proposer = BranchyTreeProposer(i) if i % 2 == 0 else ImprobableProposer()
        controller = AdaptiveController(k_min=3, k_max=3, adaptive=False)
        settings = RowSettings(4) if i == 0 else None  # the first row ends early: the last request joins then
        processing = sampling_processing(config, (), 0)
        requests.append(RowRequest(prompt, grammar.matcher(max_rollback=8), proposer, controller, processing, settings))
    seen = {"one-call attentions": 0, "drafted": 0, "prompt chunks": 0}
    original, forward = packed_attention._attend_batched, kv_module.BatchKV.forward

    def attend(*args, **kwargs):
        seen["one-call attentions"] += 1
        return original(*args, **kwargs)

    def traced(self, chunks, parents, **kwargs):
        seen["drafted"] += sum(map(len, parents))
        seen["prompt chunks"] += sum(1 for scored in kwargs.get("scored") or () if not scored)
        return forward(self, chunks, parents, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kv_module, "attention_path", lambda device: path)
        patch.setattr(packed_attention, "_attend_batched", attend)
        patch.setattr(kv_module.BatchKV, "forward", traced)
        rows = decode_batch(model, requests, config, max_batch_size=batch, prompt_chunk=3, step_cost=lambda tokens: 1.0)
    return [row.generated for row in rows], seen


def assert_same_on_both_paths(model, grammar, prompts, *, new_tokens, batch):
    want, by_rows = decode_on(ROWS, model, grammar, prompts, new_tokens=new_tokens, batch=batch)
    got, one_call = decode_on(BATCHED, model, grammar, prompts, new_tokens=new_tokens, batch=batch)
    assert by_rows["one-call attentions"] == 0 and one_call["one-call attentions"] > 0
    assert one_call["drafted"] > 0 and (one_call["prompt chunks"] > 0 or batch == 1)
    assert got == want


def test_smollm2_greedy_is_the_same_on_both_paths(smol):
    """The trained model: four requests, three at once, the fourth joining; trees and chains."""
    model, tok = smol
    assert next(model.parameters()).dtype == torch.float32
    grammar = compile_grammar(
        grammar_spec(schema=SCHEMA), tok, vocab_size=model.config.vocab_size, stop_token_ids=(tok.eos_token_id,)
    )
    texts = ["Describe Rust as JSON:", "A user called Ada, as JSON:", "Tags for a tiny cat:", "One more record:"]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    prompts[-1] = prompts[-1] * 3  # a longer prompt, read in chunks beside the decoding rows
    assert_same_on_both_paths(model, grammar, prompts, new_tokens=20, batch=3)


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_random_llama_greedy_is_the_same_on_both_paths(batch):
    """A random Llama over the toy vocabulary: 1, 4 and 16 rows at once and one more joining."""
    tok = toy_tokenizer()
    grammar = compile_grammar(
        grammar_spec(schema={"type": "array", "items": {"enum": ["ab", "ba", "b"]}, "maxItems": 5}),
        tok,
        vocab_size=len(tok),
        stop_token_ids=(0,),
    )
    model = tiny_llama(toy_vocab_size(), seed=3)
    prompts = [[2, 3 + i % 5, 4 + i % 7] for i in range(batch)] + [[2, 5, 6, 7, 8, 9, 10, 11]]
    assert_same_on_both_paths(model, grammar, prompts, new_tokens=16, batch=batch)
