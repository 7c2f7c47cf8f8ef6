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
    assert make(tok, engine.runner).draft_index is None  # off inside vLLM unless asked for
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
