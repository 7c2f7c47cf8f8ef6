"""Batched decoding: one target pass per step for every row, ragged acceptance without leaks.

Every row has its own grammar, draft, acceptance and finish.  After every step each
row's valid cache columns hold exactly its committed-and-verified tokens (the toy
model stores token ids as keys), its matcher equals a fresh one fed its output, and
each row's output equals the same request decoded alone.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from grammarspec.drafting.draft_model import DraftModelProposer
from grammarspec.engine.decoding import DecodeConfig, RowRequest, decode, decode_batch, sampling_processing
from grammarspec.engine.sampling import SamplingParams
from grammarspec.policy.adaptive import AdaptiveController
from proposers.base import Request
from tests.helpers import SCHEMAS, ImprobableProposer, assert_matches, batch_row, check_rows, exact_distribution
from tests.proposer_fakes import ScriptFollower as Noisy  # the next tokens of a script, wrong every n-th call
from tests.toy import toy_tokenizer, toy_vocab_size
from tests.toy_models import ToyCausalLM, tiny_llama

V = toy_vocab_size()
PROMPTS = [[2, 3], [2, 5, 9, 4, 7], [6]]


@pytest.mark.parametrize("every", [0, 2, 3])
def test_every_row_equals_its_batch_one_output(grammars, every):
    model = ToyCausalLM(V, seed=3)
    config = DecodeConfig(max_new_tokens=40, eos_token_ids=(0,))
    alone = [decode(model, p, config, matcher=g.matcher())[0] for p, g in zip(PROMPTS, grammars)]
    requests = [
        batch_row(p, g.matcher(), Noisy(out, every), k, config)
        for p, g, out, k in zip(PROMPTS, grammars, alone, (2, 4, 8))
    ]
    on_step, seen = check_rows(grammars)
    rows = decode_batch(model, requests, config, on_step=on_step)
    assert [row.generated for row in rows] == alone
    assert all(row.stats.finish_reason == "stop" for row in rows)
    assert seen[0][0] == {0, 1, 2}
    assert len(seen) == max(row.stats.target_forwards for row in rows)  # one target pass per step for the batch
    if not every:
        assert all(row.stats.target_forwards < len(out) for row, out in zip(rows, alone))


def test_rejected_columns_leave_no_trace_and_no_step_copies_the_cache(grammars):
    """Rows reject drafts at different steps: each keeps its own prefix, in place, and rows leave without a copy."""
    model = ToyCausalLM(V, seed=5)
    config = DecodeConfig(max_new_tokens=40, eos_token_ids=(0,))
    alone = [decode(model, p, config, matcher=g.matcher())[0] for p, g in zip(PROMPTS, grammars)]
    requests = [batch_row(p, g.matcher(), Noisy(out, 2), 5, config) for p, g, out in zip(PROMPTS, grammars, alone)]
    check, _ = check_rows(grammars)
    storage = []

    def on_step(rows, kv):
        check(rows, kv)
        storage.append((kv.storage_pointers(), kv.copied_bytes, kv.batch_size))

    rows = decode_batch(model, requests, config, on_step=on_step)
    assert [row.generated for row in rows] == alone
    assert len({str(pointers) for pointers, _, _ in storage}) == 1  # allocated once, written in place
    assert len({size for _, _, size in storage}) > 1  # rows left at different steps ...
    moved = [copied for _, copied, _ in storage]
    assert moved[0] == 0 and moved == sorted(moved)  # ... copying at most the rows that changed slots


def test_sampled_rows_follow_their_own_constrained_distributions(grammars):
    """A batch of rows under different schemas: each row's samples follow its exact distribution."""
    target = ToyCausalLM(V, seed=1, scale=1.0)
    other = ToyCausalLM(V, seed=7, scale=1.0)
    params = SamplingParams(True, 1.0, top_p=0.9)
    config = DecodeConfig(max_new_tokens=20, sampling=params, eos_token_ids=(0,))
    chosen = [grammars[0], grammars[2], grammars[0]]
    prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[1]]
    exact = [exact_distribution(target, g, params, prompt=p) for g, p in zip(chosen, prompts)]
    generator = torch.Generator().manual_seed(11)
    counts = [Counter() for _ in chosen]
    samples = 3000
    for _ in range(samples):
        proposers = [
            DraftModelProposer(other, sampling=params, generator=generator),
            ImprobableProposer(),
            DraftModelProposer(target, sampling=params, generator=generator),
        ]
        requests = [batch_row(p, g.matcher(), prop, 3, config) for p, g, prop in zip(prompts, chosen, proposers)]
        for row in decode_batch(target, requests, config, generator=generator):
            assert row.stats.finish_reason == "stop"
            counts[row.index][tuple(row.generated)] += 1
    for count, dist in zip(counts, exact):
        assert_matches(count, dist, samples=samples)


def test_left_padded_batch_through_generate_equals_each_row_alone():
    """Hugging Face style input: left padding and an attention mask; one schema per row."""
    import grammarspec

    tok = toy_tokenizer()
    model = tiny_llama(len(tok), seed=2)
    prompts = [[5, 6, 7, 8, 9], [4, 10], [12, 13, 14]]
    width = max(map(len, prompts))
    ids = torch.tensor([[1] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    schemas = [SCHEMAS[0], SCHEMAS[2], SCHEMAS[0]]
    common = {"tokenizer": tok, "max_new_tokens": 24, "eos_token_id": 0, "pad_token_id": 1}
    out = grammarspec.generate(
        model, ids, attention_mask=mask, schema=schemas, assistant="auto", return_dict_in_generate=True, **common
    )
    for i, (prompt, schema) in enumerate(zip(prompts, schemas)):
        alone = grammarspec.generate(model, torch.tensor([prompt]), schema=schema, **common)
        new = alone[0, len(prompt) :].tolist()
        assert out.sequences[i, width : width + len(new)].tolist() == new
        assert out.sequences[i, width + len(new) :].eq(1).all()  # right-padded with pad_token_id
        assert out.stats[i].finish_reason == "stop"


def test_a_schema_list_must_match_the_batch():
    import grammarspec

    tok = toy_tokenizer()
    with pytest.raises(ValueError, match="one schema per row"):
        grammarspec.generate(
            tiny_llama(len(tok)), torch.tensor([[5, 6], [7, 8]]), tokenizer=tok, schema=SCHEMAS, max_new_tokens=4
        )


class Costed(Noisy):
    """A scripted drafter that sizes its choices by a pass cost model, as the composite does; logs updates."""

    def __init__(self, script, every, own=None):
        from proposers.cost import PassCost

        super().__init__(script, every)
        self.cost_model = own if own is not None else PassCost()
        self.given = own is not None

    def use_cost_model(self, cost) -> None:
        if not self.given:
            self.cost_model = cost


def test_the_loop_hands_over_the_profiled_cost_model_and_never_teaches_wall_time(grammars, monkeypatch):
    from grammarspec.drafting.cost_model import ProfiledCost, batch_cost_model
    from proposers.compose import CompositeProposer
    from proposers.cost import PassCost

    model = ToyCausalLM(V, seed=3)
    config = DecodeConfig(max_new_tokens=40, eos_token_ids=(0,))
    log: list[int] = []
    monkeypatch.setattr(PassCost, "update", lambda self, rows, seconds: log.append(rows))  # must never be called
    own = PassCost(1.1, 0.01, 2)
    handed, kept = Costed([], 0), Costed([], 0, own=own)
    requests = [batch_row(PROMPTS[i], grammars[i].matcher(), p, 4, config) for i, p in enumerate((handed, kept))]
    profiled = ProfiledCost(model)  # what generate hands the loop
    decode_batch(model, requests, config, pass_cost=profiled)
    alone = [batch_row(PROMPTS[2], grammars[2].matcher(), Costed([], 0), 4, config)]
    decode_batch(model, alone, config, pass_cost=profiled)
    assert handed.cost_model is batch_cost_model(model) and kept.cost_model is own
    assert log == []  # no measured pass moved any cost model, at batch 1 or 2
    composite = CompositeProposer([Noisy([], 0)])
    assert composite.cost_model is not batch_cost_model(model)
    composite.use_cost_model(batch_cost_model(model))
    assert composite.cost_model is batch_cost_model(model)
    fixed = CompositeProposer([Noisy([], 0)], cost_model=own)
    fixed.use_cost_model(batch_cost_model(model))
    assert fixed.cost_model is own
    replayed = Costed([], 0)  # a replay's modelled step cost: its own prior stays
    decode_batch(
        model,
        [batch_row(PROMPTS[0], grammars[0].matcher(), replayed, 4, config)],
        config,
        step_cost=lambda rows: 1.0,
        pass_cost=profiled,
    )
    assert replayed.cost_model is not batch_cost_model(model)


@pytest.mark.parametrize("every", [0, 3])
def test_waiting_requests_join_as_rows_finish(grammars, every):
    model = ToyCausalLM(V, seed=3)
    config = DecodeConfig(max_new_tokens=40, eos_token_ids=(0,))
    prompts = PROMPTS + [[9, 8]]
    chosen = grammars + [grammars[1]]
    alone = [decode(model, p, config, matcher=g.matcher())[0] for p, g in zip(prompts, chosen)]
    requests = [batch_row(p, g.matcher(), Noisy(out, every), 3, config) for p, g, out in zip(prompts, chosen, alone)]
    on_step, seen = check_rows(chosen)
    rows = decode_batch(model, requests, config, max_batch_size=2, on_step=on_step)
    assert [row.generated for row in rows] == alone
    assert max(len(indices) for indices, _ in seen) <= 2
    late = [i for i, (indices, _) in enumerate(seen) if 3 in indices]
    assert late and any(len(seen[i][0]) == 2 for i in late)  # the last request decoded beside an earlier one


def test_max_batch_size_must_be_positive(grammars):
    with pytest.raises(ValueError, match="max_batch_size"):
        decode_batch(ToyCausalLM(V), [RowRequest([2, 3])], DecodeConfig(max_new_tokens=3), max_batch_size=0)


def test_alike_prefix_free_pipelines_run_once_per_step_over_every_row(grammars, monkeypatch):
    """Rows whose processing reads no prefix and is alike (sampling warpers) are processed in one call a step."""
    from grammarspec.engine.processing import LogitsPipeline

    model = ToyCausalLM(V, seed=3)
    params = SamplingParams(True, 0.8, top_k=6, top_p=0.9)
    config = DecodeConfig(max_new_tokens=12, sampling=params, eos_token_ids=(0,))

    def run(batched: bool) -> tuple[list[list[int]], list[int]]:
        calls: list[int] = []
        real = LogitsPipeline.__call__

        def spy(self, scores, prefixes):
            calls.append(scores.shape[0])
            return real(self, scores, prefixes)

        monkeypatch.setattr(LogitsPipeline, "__call__", spy)
        if not batched:  # every pipeline its own key: the row-by-row path
            monkeypatch.setattr(LogitsPipeline, "batch_key", property(lambda self: None))
        requests = [
            RowRequest(p, g.matcher(), None, None, sampling_processing(config, (), len(p)))
            for p, g in zip(PROMPTS, grammars)
        ]
        rows = decode_batch(model, requests, config, generator=torch.Generator().manual_seed(11))
        monkeypatch.undo()
        return [row.generated for row in rows], calls

    together, batched_calls = run(True)
    alone, row_calls = run(False)
    assert together == alone  # the same scores, so the same draws
    assert len(row_calls) > len(batched_calls) and max(batched_calls) == len(PROMPTS)


def test_prefix_readers_get_views_of_one_tensor_per_step_and_decode_as_alone(grammars, monkeypatch):
    """repetition_penalty reads each row's prefix: one host-to-device copy a step serves every row's."""
    from transformers.generation import logits_process as lp

    from grammarspec.engine.processing import LogitsPipeline

    model = ToyCausalLM(V, seed=3)
    config = DecodeConfig(max_new_tokens=16, eos_token_ids=(0,))
    pipeline = LogitsPipeline(defaults=(lp.RepetitionPenaltyLogitsProcessor(1.7),))
    alone = [
        decode_batch(model, [RowRequest(p, g.matcher(), None, None, pipeline)], config)[0].generated
        for p, g in zip(PROMPTS, grammars)
    ]
    storages: list[set[int]] = [set()]
    real = lp.RepetitionPenaltyLogitsProcessor.__call__

    def spy(self, input_ids, scores):
        storages[-1].add(input_ids.untyped_storage().data_ptr())
        return real(self, input_ids, scores)

    monkeypatch.setattr(lp.RepetitionPenaltyLogitsProcessor, "__call__", spy)
    requests = []
    for p, g, script in zip(PROMPTS, grammars, alone):  # drafts from the plain outputs, every 3rd one spoiled
        proposer = Noisy(script, 3)
        proposer.start(Request(prompt_ids=tuple(p), tokenizer=None))
        requests.append(RowRequest(p, g.matcher(), proposer, AdaptiveController(3, 3, adaptive=False), pipeline))
    rows = decode_batch(model, requests, config, on_step=lambda rows, kv: storages.append(set()))
    assert [row.generated for row in rows] == alone
    steps = [s for s in storages if s]
    assert steps and all(len(s) == 1 for s in steps)  # one tensor a step, however many rows read it


class _NoMoreRequests:
    """A feed that never brings a request: the loop then values tokens as a server does."""

    def more(self, free):
        return ()

    def cancelled(self, index):
        return False

    def joined(self, row, kv, slot):
        pass

    def finished(self, row, kv, slot):
        pass


def test_a_static_batch_drafts_where_its_end_is_decided():
    """Free-text rows of one call, nothing waiting: the batch ends with its last row, whose tokens shorten the
    call; the rows that end sooner are worth only their own row of the pass.  The same rows where a freed slot
    would serve a waiting request value every token at one: the long row's unproven drafts wait until it is
    alone.  Every output is the same."""
    from grammarspec.engine.rows import RowSettings
    from proposers.cost import PassCost

    model = tiny_llama(V, seed=3)  # a packed pass: each draft token adds one row, as the curve prices it
    config = DecodeConfig(max_new_tokens=24)
    budgets = [24, 6, 6, 6]
    prompts = PROMPTS + [[9, 8]]
    alone = [
        decode(model, p, DecodeConfig(max_new_tokens=budget))[0] for p, budget in zip(prompts, budgets, strict=True)
    ]

    def requests():
        out = []
        for prompt, budget, script in zip(prompts, budgets, alone, strict=True):
            proposer = Noisy(script)
            proposer.start(Request(prompt_ids=tuple(prompt), tokenizer=None))
            controller = AdaptiveController(k_min=1, k_max=4)
            processing = sampling_processing(config, (), len(prompt))
            out.append(RowRequest(prompt, None, proposer, controller, processing, RowSettings(budget)))
        return out

    cost = PassCost(1.0, 0.1, 1)  # a modelled curve: each row a tenth of a step, the rest shared
    static = decode_batch(model, requests(), config, step_cost=cost)
    served = decode_batch(model, requests(), config, step_cost=cost, feed=_NoMoreRequests(), max_batch_size=4)
    assert [row.generated for row in static] == [row.generated for row in served] == alone
    assert [sum(row.stats.proposed.values()) for row in static[1:]] == [0, 0, 0]
    beside = len(static[1].stats.steps)  # the passes the long row shared with the others
    assert any(k for k, _ in static[0].stats.steps[1:beside]) and not any(k for k, _ in served[0].stats.steps[1:beside])
    assert static[0].stats.target_forwards < served[0].stats.target_forwards < len(alone[0])
