"""Where the index of earlier outputs lives outside the server: batched ``generate``, ``Conversation``, vLLM.

Toy tokenizer with a chat template and a tiny random Llama (fast); the vLLM
proposer with the SmolLM2 tokenizer and a fake engine, as tests/vllm/test_proposer.py
drives it.  Outputs never change: each case is compared with the index off.
"""

from __future__ import annotations

import pytest

import grammarspec
from proposers import SuffixIndex, SuffixProposer
from proposers.base import members
from tests.helpers import TRIP_SCHEMA
from tests.vllm.test_proposer import FakeEngine, GPUModelRunner, ids, make


def _generate(model, chat, prompts, **kwargs):
    out = grammarspec.generate(
        model,
        prompts,
        schema=TRIP_SCHEMA,
        tokenizer=chat,
        assistant="auto",
        max_new_tokens=24,
        return_dict_in_generate=True,
        **kwargs,
    )
    return out.sequences.tolist(), out.stats


def test_the_rows_of_a_batched_call_share_an_index_and_one_passed_in_is_shared_across_calls(chat_model, chat):
    prompts = [chat.encode(f"trip {i}:", add_special_tokens=False) for i in range(3)]
    assert len({len(p) for p in prompts}) == 1  # one length: no padding needed
    plain, plain_stats = _generate(chat_model, chat, prompts, draft_index=False)
    assert all("suffix" not in s.proposed for s in plain_stats)
    shared = SuffixIndex(1 << 20)
    again, stats = _generate(chat_model, chat, prompts, max_batch_size=1, draft_index=shared)
    assert again == plain  # outputs never change
    assert shared.as_dict()["outputs"] == 3  # every row wrote its output
    assert sum(s.proposed.get("suffix", 0) for s in stats) > 0  # and the later rows drafted from the earlier
    before = shared.as_dict()["outputs"]
    third, _ = _generate(chat_model, chat, prompts[:1], draft_index=shared)  # one row: only a passed-in index
    assert third == plain[:1] and shared.as_dict()["outputs"] == before + 1
    with pytest.raises(TypeError, match="draft_index="):
        _generate(chat_model, chat, prompts, draft_index="on")


def test_a_conversation_drafts_from_its_earlier_turns_and_false_turns_it_off(chat_model, chat):
    turns = ["a trip to oslo", "a trip to oslo"]
    replies = {}
    for index in (None, False):
        conv = grammarspec.Conversation(chat_model, chat, draft_index=index, do_sample=False)
        if index is None:
            assert isinstance(conv.draft_index, SuffixIndex)
            assert any(isinstance(m, SuffixProposer) for m in members(conv._proposer))
        else:
            assert conv.draft_index is None
        replies[index] = []
        for turn in turns:
            conv.add_user(turn)
            replies[index].append(conv.reply(schema=TRIP_SCHEMA, max_new_tokens=24))
    on, off = replies[None], replies[False]
    assert [r.message for r in on] == [r.message for r in off]  # outputs never change
    assert on[1].stats.proposed.get("suffix", 0) > 0 and "suffix" not in off[1].stats.proposed


def test_the_vllm_proposer_shares_one_index_across_requests(smol_tokenizer, monkeypatch):
    tok = smol_tokenizer
    engine = FakeEngine(GPUModelRunner())
    monkeypatch.delenv("GRAMMARSPEC_DRAFT_MEMORY_MB", raising=False)
    assert make(tok, engine.runner).draft_index.max_bytes == 256 << 20  # on by default, as in the server
    monkeypatch.setenv("GRAMMARSPEC_DRAFT_MEMORY_MB", "128")
    proposer = make(tok, engine.runner)
    assert isinstance(proposer.draft_index, SuffixIndex) and proposer.draft_index.max_bytes == 128 << 20
    for name, city in (("a", "Lisbon"), ("b", "Porto")):
        engine.add(name, ids(tok, f"Trip: city {city}, 3 days. JSON:"), TRIP_SCHEMA)
        for token in ids(tok, f'{{"city":"{city}","days":3}}'):  # vLLM commits the answer token by token
            engine.step(proposer, [[token]])
        engine.step(proposer, [[tok.eos_token_id]])
        engine.remove(name)
    assert proposer.draft_index.as_dict()["outputs"] == 2  # both requests wrote into the one index
    monkeypatch.setenv("GRAMMARSPEC_DRAFT_MEMORY_MB", "0")
    assert make(tok, engine.runner).draft_index is None
    monkeypatch.setenv("GRAMMARSPEC_DRAFT_MEMORY_MB", "lots")
    with pytest.raises(ValueError, match="GRAMMARSPEC_DRAFT_MEMORY_MB"):
        make(tok, engine.runner)


def test_greedy_calls_share_one_index_per_model_and_thread_across_calls(chat_model, chat):
    import threading

    from grammarspec.drafting.earlier_outputs import shared_index

    prompts = [chat.encode(f"trip {i}:", add_special_tokens=False) for i in range(3)]
    plain = [_generate(chat_model, chat, [p], draft_index=False)[0] for p in prompts]
    grammarspec.forget_earlier_outputs()
    index = shared_index(chat_model)
    assert index.as_dict()["outputs"] == 0
    runs = [_generate(chat_model, chat, [p]) for p in prompts]  # greedy, no draft_index: the shared index
    assert [tokens for tokens, _ in runs] == plain  # outputs never change
    assert shared_index(chat_model) is index and index.as_dict()["outputs"] == 3
    assert "suffix" not in runs[0][1][0].proposed or runs[0][1][0].proposed["suffix"] == 0
    assert sum(stats[0].proposed.get("suffix", 0) for _, stats in runs[1:]) > 0  # later calls drafted from it
    other: list = []
    worker = threading.Thread(target=lambda: other.append(shared_index(chat_model)))
    worker.start()
    worker.join()
    assert other[0] is not index and other[0].as_dict()["outputs"] == 0  # one index per thread
    grammarspec.forget_earlier_outputs()
    assert shared_index(chat_model) is not index and shared_index(chat_model).as_dict()["outputs"] == 0


def test_a_sampled_call_leaves_the_shared_index_alone_so_its_seed_repeats(chat_model, chat):
    import torch

    from grammarspec.drafting.earlier_outputs import shared_index

    prompt = [chat.encode("trip 7:", add_special_tokens=False)]
    grammarspec.forget_earlier_outputs()
    torch.manual_seed(11)
    first, _ = _generate(chat_model, chat, prompt, do_sample=True)
    _generate(chat_model, chat, prompt)  # a greedy call in between fills the shared index
    before = shared_index(chat_model).as_dict()["outputs"]
    torch.manual_seed(11)
    again, _ = _generate(chat_model, chat, prompt, do_sample=True)
    assert again == first and shared_index(chat_model).as_dict()["outputs"] == before == 1
