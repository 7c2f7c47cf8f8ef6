"""grammarspec.vllm's custom_class proposer against stand-ins for vLLM's objects (no vLLM needed).

The stand-ins reproduce what vLLM 0.32's V1 model runner hands the proposer (see
``grammarspec/vllm/proposer.py``): per-row sampled tokens, ``num_tokens_no_spec``,
``token_ids_cpu``, and a runner with ``input_batch.req_ids`` and ``requests``.
The integration tests with vLLM itself are beside it (test_vllm_*.py, run in .venv-vllm).
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from proposers.base import Draft
from tests.helpers import TRIP_SCHEMA

MAX_LEN = 512


def vllm_config(k: int = 8, disable_any_whitespace: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=MAX_LEN, get_vocab_size=lambda: 49152, tokenizer=None),
        structured_outputs_config=SimpleNamespace(disable_any_whitespace=disable_any_whitespace),
    )


class GPUModelRunner:  # the name find_model_runner looks for
    def __init__(self) -> None:
        self.input_batch = SimpleNamespace(req_ids=[])
        self.requests: dict[str, SimpleNamespace] = {}


class FakeEngine:
    """Rows of token ids as vLLM's input batch keeps them, and the runner's request table."""

    def __init__(self, runner: GPUModelRunner | None) -> None:
        self.runner = runner
        self.tokens = np.zeros((4, MAX_LEN), dtype=np.int32)
        self.lengths = np.zeros(4, dtype=np.int32)
        self.rows: list[str] = []

    def add(self, req_id: str, prompt: list[int], schema=None, max_tokens: int = 64) -> None:
        row = len(self.rows)
        self.rows.append(req_id)
        self.tokens[row, : len(prompt)] = prompt
        self.lengths[row] = len(prompt)
        outputs = SimpleNamespace(json=json.dumps(schema), json_object=None, regex=None, disable_any_whitespace=False)
        params = SimpleNamespace(structured_outputs=outputs if schema else None, max_tokens=max_tokens)
        if self.runner is not None:
            self.runner.requests[req_id] = SimpleNamespace(prompt_token_ids=list(prompt), sampling_params=params)
            self.runner.input_batch.req_ids = list(self.rows)

    def remove(self, req_id: str) -> None:
        row = self.rows.index(req_id)
        self.rows.pop(row)
        self.tokens[row:-1] = self.tokens[row + 1 :].copy()
        self.lengths[row:-1] = self.lengths[row + 1 :].copy()
        if self.runner is not None:
            del self.runner.requests[req_id]
            self.runner.input_batch.req_ids = list(self.rows)

    def step(self, proposer, appended: list[list[int]]) -> list[list[int]]:
        """Append ``appended[row]`` to each row (vLLM's bookkeeping), then ask for drafts."""
        for row, new in enumerate(appended):
            n = self.lengths[row]
            self.tokens[row, n : n + len(new)] = new
            self.lengths[row] = n + len(new)
        return proposer.propose(appended, self.lengths, self.tokens)


def make(smol_tokenizer, runner=None, **kwargs):
    from grammarspec.vllm import GrammarspecProposer

    return GrammarspecProposer(vllm_config(**kwargs), runner=runner, tokenizer=smol_tokenizer)


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


class Recorder:
    """A proposer that drafts a fixed continuation and records what it is told."""

    name = "recorder"

    def __init__(self, guess: list[int], confidence: float | None = None) -> None:
        self.guess, self.confidence = guess, confidence
        self.told: list[tuple[tuple[int, ...], int]] = []
        self.requests = []

    def start(self, request) -> None:
        self.requests.append(request)

    def propose(self, context, grammar, k):
        n = min(k, len(self.guess))
        sure = (self.confidence,) * n if self.confidence is not None else None
        return Draft(tokens=tuple(self.guess[:k]), sources=("recorder",) * n, confidence=sure)

    def commit(self, draft, num_accepted, committed) -> None:
        self.told.append((draft.tokens, num_accepted, tuple(committed)))


def test_schema_request_drafts_forced_keys_and_copies_the_prompt(smol_tokenizer):
    tok = smol_tokenizer
    engine = FakeEngine(GPUModelRunner())
    proposer = make(tok, engine.runner)
    prompt = ids(tok, "Trip: city Lisbon, 3 days. JSON:")
    engine.add("a", prompt, TRIP_SCHEMA)
    first = ids(tok, '{"')
    draft = engine.step(proposer, [first[:1]])[0]
    text = tok.decode(first[:1] + draft)
    # jump-forward from the schema: the first key is forced (no schema, no key: see the next test)
    assert text.startswith('{"city'), text
    assert proposer.states["a"].view is not None


def test_without_a_schema_no_grammar_view(smol_tokenizer):
    tok = smol_tokenizer
    engine = FakeEngine(GPUModelRunner())
    proposer = make(tok, engine.runner)
    engine.add("a", ids(tok, "Trip: city Lisbon, 3 days. JSON:"), None)
    draft = engine.step(proposer, [ids(tok, '{"')[:1]])[0]
    assert proposer.states["a"].view is None
    assert "city" not in tok.decode(draft)


def test_commit_reports_what_vllm_accepted(smol_tokenizer):
    engine = FakeEngine(GPUModelRunner())
    proposer = make(smol_tokenizer, engine.runner)
    recorder = Recorder([11, 12, 13, 14])
    proposer.make_proposer = lambda: recorder
    engine.add("a", [5, 6, 7], None)
    assert engine.step(proposer, [[10]]) == [[11, 12, 13, 14]]
    # vLLM accepted 11, 12 and then sampled 99 itself
    engine.step(proposer, [[11, 12, 99]])
    # first step: no draft yet, the target's first token; then 11 and 12 accepted, 99 the target's own
    assert recorder.told == [((), 0, (10,)), ((11, 12, 13, 14), 2, (11, 12, 99))]
    # nothing accepted: the target's token differs at once
    engine.step(proposer, [[42]])
    assert recorder.told[-1] == ((11, 12, 13, 14), 0, (42,))
    assert recorder.requests[0].prompt_ids == (5, 6, 7)


def test_state_per_request_and_dropped_when_the_request_ends(smol_tokenizer):
    engine = FakeEngine(GPUModelRunner())
    proposer = make(smol_tokenizer, engine.runner)
    made: list[Recorder] = []

    def factory():
        made.append(Recorder([1, 2]))
        return made[-1]

    proposer.make_proposer = factory
    engine.add("a", [5, 6, 7], None)
    engine.add("b", [8, 9], None)
    engine.step(proposer, [[10], [20]])
    assert set(proposer.states) == {"a", "b"} and len(made) == 2
    engine.remove("a")  # finished: the runner forgets it, "b" moves to row 0
    engine.step(proposer, [[21]])
    assert set(proposer.states) == {"b"} and len(made) == 2
    assert made[1].told == [((), 0, (20,)), ((1, 2), 0, (21,))]  # "b" kept its own state across the move


def test_a_row_in_prefill_gets_no_draft_and_keeps_no_state(smol_tokenizer):
    engine = FakeEngine(GPUModelRunner())
    proposer = make(smol_tokenizer, engine.runner)
    proposer.make_proposer = lambda: Recorder([1, 2])
    engine.add("a", [5, 6, 7], None)
    assert engine.step(proposer, [[]]) == [[]]
    assert proposer.states == {}


def test_k_is_capped_by_max_tokens_and_the_speculative_budget(smol_tokenizer):
    engine = FakeEngine(GPUModelRunner())
    proposer = make(smol_tokenizer, engine.runner, k=3)
    proposer.make_proposer = lambda: Recorder(list(range(100, 110)), confidence=1.0)  # sure: the budget alone cuts it
    engine.add("a", [5, 6, 7], None, max_tokens=4)
    assert engine.step(proposer, [[10]]) == [[100, 101]]  # 1 output token, room for 3: 2 drafted + the target's
    assert engine.step(proposer, [[100, 101, 55]]) == [[]]  # 4 output tokens: the request ends here
    engine.add("b", [5, 6], None, max_tokens=100)
    assert engine.step(proposer, [[], [10]])[1] == [100, 101, 102]  # num_speculative_tokens=3


def test_grammar_dropped_when_vllm_commits_a_token_ours_rejects(smol_tokenizer):
    tok = smol_tokenizer
    engine = FakeEngine(GPUModelRunner())
    proposer = make(tok, engine.runner)
    engine.add("a", ids(tok, "JSON:"), TRIP_SCHEMA)
    engine.step(proposer, [ids(tok, " hello")])  # not JSON: vLLM's grammar differs from ours
    assert proposer.states["a"].view is None and proposer.grammar_drops == 1


def test_without_a_runner_rows_are_keyed_by_index_and_told_apart(smol_tokenizer):
    engine = FakeEngine(None)
    proposer = make(smol_tokenizer, None)
    made: list[Recorder] = []

    def factory():
        made.append(Recorder([1]))
        return made[-1]

    proposer.make_proposer = factory
    engine.add("a", [5, 6, 7], None)
    engine.step(proposer, [[10]])
    assert made[0].requests[0].prompt_ids == (5, 6, 7)
    engine.remove("a")
    engine.add("b", [8, 9, 9], None)  # a new request in row 0
    engine.step(proposer, [[11]])
    assert len(made) == 2 and made[1].requests[0].prompt_ids == (8, 9, 9)


def test_find_model_runner_walks_the_stack():
    from grammarspec.vllm.proposer import find_model_runner

    class CPUModelRunner(GPUModelRunner):
        def __init__(self) -> None:
            super().__init__()
            self.found = find_model_runner()

    runner = CPUModelRunner()
    assert runner.found is runner
    assert find_model_runner() is None


def test_speculative_config_and_import_without_vllm():
    import grammarspec.vllm as gsv

    assert gsv.speculative_config(5) == {"method": "custom_class", "model": gsv.CLASS_PATH, "num_speculative_tokens": 5}
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        gsv.speculative_config(0)
    module, name = gsv.CLASS_PATH.rsplit(".", 1)
    assert getattr(sys.modules[module], name) is gsv.GrammarspecProposer
    assert "vllm" not in sys.modules  # importing grammarspec.vllm never imports vLLM


def test_state_dropped_at_the_step_the_request_ends(smol_tokenizer):
    tok = smol_tokenizer
    engine = FakeEngine(GPUModelRunner())
    proposer = make(tok, engine.runner)
    engine.add("a", ids(tok, "JSON:"), TRIP_SCHEMA)
    engine.step(proposer, [ids(tok, '{"city":"Oslo","days":3}')])
    assert "a" in proposer.states
    # the stop token: the request is over, though the runner still lists it during this step
    assert engine.step(proposer, [[tok.eos_token_id]]) == [[]]
    assert proposer.states == {}


def test_a_failing_drafter_gives_no_draft_and_the_engine_goes_on(smol_tokenizer):
    engine = FakeEngine(GPUModelRunner())
    proposer = make(smol_tokenizer, engine.runner)

    class Broken(Recorder):
        def propose(self, context, grammar, k):
            raise RuntimeError("drafter bug")

    proposer.make_proposer = lambda: Broken([1])
    engine.add("a", [5, 6, 7], None)
    engine.add("b", [8, 9], None)
    assert engine.step(proposer, [[10], [11]]) == [[], []]
    assert proposer.errors == 2 and proposer.states == {}


def test_drafts_are_sized_by_the_cost_at_the_engines_batch(smol_tokenizer):
    """The same guesses: all sent where rows are free, none where each row costs a plain step."""
    from proposers.cost import PassCost, flat_until

    tok = smol_tokenizer
    sent = {}
    for name, cost in (("free", flat_until(64)), ("dear", PassCost(0.01, 1.0, 1))):
        proposer = make(tok, None)
        proposer.make_proposer = lambda: Recorder(ids(tok, " and then some more words"))
        proposer.cost_model = cost
        contexts = [ids(tok, f"request number {i} says hello") for i in range(8)]
        width = max(map(len, contexts))
        table = np.zeros((8, width + 8), dtype=np.int32)
        for i, c in enumerate(contexts):
            table[i, : len(c)] = c
        out = proposer.propose([c[-1:] for c in contexts], np.array([len(c) for c in contexts]), table)
        sent[name] = sum(map(len, out))
    assert sent["free"] > 0 and sent["dear"] == 0


class Counting(Recorder):
    """Guesses that the context counts up by one, and counts how often it is asked."""

    def __init__(self) -> None:
        super().__init__([])
        self.asked = 0

    def propose(self, context, grammar, k):
        self.asked += 1
        self.guess = [context[-1] + j for j in range(1, 5)]
        return super().propose(context, grammar, k)


def test_where_no_draft_pays_the_drafters_rest_and_their_cut_guesses_are_still_judged(smol_tokenizer):
    """Drafts cut to nothing: the request's drafters are asked less and less often (rests of 1, 2, 4, ...
    steps), and the first token of each cut draft is judged against vLLM's own token there, so a drafter that
    would have been right is trusted, and sent, once rows get cheap."""
    from proposers.cost import PassCost, flat_until

    engine = FakeEngine(GPUModelRunner())
    proposer = make(smol_tokenizer, engine.runner)
    counting = Counting()
    proposer.make_proposer = lambda: counting
    proposer.cost_model = PassCost(0.01, 1.0, 1)  # every row costs a plain step: no draft pays
    engine.add("a", [5, 6, 7], None, max_tokens=200)
    token = 100
    for _ in range(30):  # vLLM's own tokens count up: what the drafter guesses
        assert engine.step(proposer, [[token]]) == [[]]
        token += 1
    assert 3 <= counting.asked <= 8  # asked at the rests' ends only, not at each of the 30 steps
    first = Draft(tokens=(1,), sources=("recorder",))
    assert proposer.states["a"].controller.calibration.estimate(first)[0] > 0.5  # judged right each time asked
    proposer.cost_model = flat_until(64)  # rows are free now
    sent = []
    for _ in range(20):
        sent = engine.step(proposer, [[token]])[0]
        token += 1
        if sent:
            break
    assert sent == [token, token + 1, token + 2, token + 3]


def test_the_step_cost_is_learned_from_decode_steps_only(smol_tokenizer):
    """A step that also computed a prompt (a row still in prefill, or a request seen for the first time) is
    mostly the prompt's time: the pass cost learns nothing from it, and learns from the decode steps."""
    engine = FakeEngine(GPUModelRunner())
    proposer = make(smol_tokenizer, engine.runner)
    proposer.make_proposer = lambda: Recorder([100, 101])
    learned = []
    proposer.cost_model.update = lambda rows, seconds: learned.append(rows)
    engine.add("a", [5, 6, 7], None)
    engine.step(proposer, [[10]])  # a's prompt ended in the step before: nothing to learn yet
    engine.add("b", [8, 9], None)
    engine.step(proposer, [[100, 101, 11], []])  # b's prompt chunk shared this step
    engine.step(proposer, [[12], [20]])  # b seen for the first time: its prompt ended in this step
    assert learned == []
    engine.step(proposer, [[13], [21]])  # decode rows alone
    assert learned == [1 + 2 + 1 + 2]  # each request's row and the two draft tokens sent to each
