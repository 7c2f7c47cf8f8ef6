"""The vLLM proposer with the index of earlier outputs: a draft that ends the request, as vLLM commits it.

When a request's draft runs to its stop token and vLLM accepts it all, vLLM's rejection sampler still
appends one token of its own after the stop token to the runner's context (the "bonus" token), and the
scheduler then ends the request at the stop token.  The index of earlier outputs drafts whole answers,
stop token included, so a repeated request meets exactly this.  The fake engine from
tests/vllm/test_proposer.py stands in for vLLM; :func:`run` plays vLLM's greedy target.
"""

from __future__ import annotations

from proposers.cost import flat_until
from proposers.suffix_index import scope_of
from tests.helpers import TRIP_SCHEMA as SCHEMA
from tests.vllm.test_proposer import FakeEngine, GPUModelRunner, Recorder, ids, make

ANSWER = '{"city":"Lisbon","days":3}'


def run(engine, proposer, name: str, prompt: list[int], answer: list[int], after_stop: int) -> list[list[int]]:
    """Generate ``answer`` for request ``name`` as vLLM's greedy target would: each step appends the accepted
    draft prefix and one token of the target's own (``after_stop`` once the answer is out).  Returns the drafts.
    """
    engine.add(name, prompt, SCHEMA)
    drafts: list[list[int]] = []
    done, draft = 0, []
    while done < len(answer):
        accepted = 0
        while accepted < len(draft) and done + accepted < len(answer) and draft[accepted] == answer[done + accepted]:
            accepted += 1
        end = done + accepted
        appended = answer[done:end] + ([answer[end]] if end < len(answer) else [after_stop])
        done = min(end + 1, len(answer))
        draft = engine.step(proposer, [appended])[0]
        drafts.append(draft)
    engine.remove(name)
    return drafts


def test_a_draft_through_the_stop_token_keeps_the_grammar_and_ends_the_request(smol_tokenizer, monkeypatch):
    tok = smol_tokenizer
    eos = tok.eos_token_id
    monkeypatch.setenv("GRAMMARSPEC_DRAFT_MEMORY_MB", "16")
    engine = FakeEngine(GPUModelRunner())
    proposer = make(tok, engine.runner)
    proposer.cost_model = flat_until(64)  # every draft token pays: the allocation sends whole drafts
    answer = ids(tok, ANSWER) + [eos]
    newline = ids(tok, "\n")[0]
    run(engine, proposer, "first", ids(tok, "Trip: Lisbon, 3 days. JSON:"), answer, newline)
    drafts = run(engine, proposer, "second", ids(tok, "Lisbon for three days. JSON:"), answer, newline)
    assert any(draft and draft[-1] == eos for draft in drafts)  # the index drafted the answer's end
    # the token vLLM appends after an accepted stop token is no output: our grammar stays in step ...
    assert proposer.grammar_drops == 0 and proposer.errors == 0
    # ... the request ends at its stop token, as vLLM ends it ...
    assert proposer.states == {}
    # ... and the index holds the two answers, nothing after their stop tokens
    index = proposer.draft_index
    assert index is not None and index.as_dict()["outputs"] == 2
    assert index.candidates(scope_of(SCHEMA), answer) == (0, [])


def test_a_draft_is_cut_after_its_first_stop_token(smol_tokenizer):
    eos = smol_tokenizer.eos_token_id
    engine = FakeEngine(GPUModelRunner())
    proposer = make(smol_tokenizer, engine.runner)
    proposer.cost_model = flat_until(64)
    proposer.make_proposer = lambda: Recorder([11, eos, 12, 13], confidence=1.0)
    engine.add("a", [5, 6, 7], None)
    assert engine.step(proposer, [[10]]) == [[11, eos]]  # the request would end at the stop token
