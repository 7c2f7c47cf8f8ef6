"""The pass cost profile: a few timed rounds of passes at first use, cached per model, device, dtype and threads.

Fake targets advance a fake clock by what a pass costs on a simulated machine
(tests/clocks.py) and the profiler reads that clock, so every curve here is
exact and no test depends on the machine's speed or load.
"""

from __future__ import annotations

import doctest
import json
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig

import grammarspec.drafting.cost_model
import grammarspec.drafting.pass_profile
from grammarspec.drafting.cost_model import batch_cost_model
from grammarspec.drafting.pass_profile import profile_or_prior
from grammarspec.drafting.profile_fit import fit_pass_cost
from grammarspec.drafting.profile_store import profile_file, stored_profile
from grammarspec.policy.allocation import allocate
from proposers.cost import PassCost
from tests.clocks import FakeClock
from tests.helpers import single_thread
from tests.toy_models import ToyCausalLM, tiny_llama

ESTIMATES = [[0.6] * 16] * 16  # 16 rows, each offering 16 tokens of 0.6


class SleepyTarget(torch.nn.Module):
    """Speaks the HF forward protocol; a pass of ``n`` new tokens advances ``clock`` by ``fixed + per_token * n``
    seconds."""

    def __init__(self, name: str, fixed: float, per_token: float, fail: bool = False) -> None:
        super().__init__()
        self.config = LlamaConfig(
            vocab_size=32,
            hidden_size=8,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
            intermediate_size=8,
            max_position_embeddings=512,
        )
        self.config.name_or_path = name
        self.fixed, self.per_token, self.fail, self.calls = fixed, per_token, fail, 0
        self.clock = FakeClock()
        self.weight = torch.nn.Parameter(torch.zeros(1))  # a device and a dtype, as a real model has

    def forward(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep=0, position_ids=None):
        self.calls += 1
        if self.fail:
            raise RuntimeError("this target refuses extra rows")
        n = input_ids.shape[1]
        self.clock.advance(self.fixed + self.per_token * n)
        states = torch.zeros(1, 1, n, 1)
        past_key_values.update(states, states, 0)
        return SimpleNamespace(logits=torch.zeros(1, logits_to_keep or n, 32))


one_thread = pytest.fixture(autouse=True)(single_thread)  # one torch thread per test: helpers.single_thread says why


@pytest.fixture
def profile_mode(monkeypatch, tmp_path):
    """``GRAMMARSPEC_PASS_COST=profile`` (the suite runs with ``prior``), an empty cache of cost models, and
    profiles stored under ``tmp_path``."""
    monkeypatch.setenv("GRAMMARSPEC_PASS_COST", "profile")
    monkeypatch.setenv("GRAMMARSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(grammarspec.drafting.cost_model, "_COST_MODELS", {})


def drafted(cost: PassCost) -> int:
    return sum(allocate(ESTIMATES, cost.cost, base_rows=16))


def test_docstring_examples_hold():
    assert doctest.testmod(grammarspec.drafting.pass_profile).failed == 0


def test_a_flat_target_profiles_flat_and_drafts_longer_than_the_cpu_prior():
    flat = SleepyTarget("flat", fixed=0.005, per_token=0.0)
    gpu_like = profile_or_prior(flat, context=16, repeats=5, clock=flat.clock).cost
    assert gpu_like.cost(32) == gpu_like.cost(64) == 1.0  # every pass took 5 ms
    assert drafted(gpu_like) > drafted(PassCost()) == 32  # the prior takes 2 tokens a row here


def test_a_target_paying_per_row_profiles_steep_and_drafts_shorter():
    target = SleepyTarget("steep", fixed=0.002, per_token=0.002)
    steep = profile_or_prior(target, context=16, rows=(1, 2, 4, 8, 16, 32), repeats=5, clock=target.clock).cost
    assert steep.per_row == 0.5 and steep.cost(16) == 8.5  # (1 + n) / 2 plain steps
    assert steep.cost(64) == 32.0  # beyond the table (16.5 at 32 rows, kept to two digits: 16), 0.5 a row
    assert drafted(steep) < drafted(PassCost())


def test_the_fit_recovers_known_curves_and_is_coarse():
    prior = PassCost()
    cpu = fit_pass_cost({n: 0.1 * prior.cost(n) for n in (1, 2, 4, 8, 16, 32, 64)})
    assert (cpu.base, cpu.per_row, cpu.min_rows) == (1.3, 0.03, 4)
    noisy = fit_pass_cost({n: 0.1 * prior.cost(n) * (1.001 if n % 3 else 0.999) for n in (1, 2, 4, 8, 16, 32, 64)})
    assert (noisy.base, noisy.per_row, noisy.min_rows) == (1.3, 0.03, 4)  # 0.1% noise does not move it
    flat = fit_pass_cost({n: 0.02 for n in (1, 2, 4, 8, 16, 32, 64)})
    assert flat.per_row == 0.001 and flat.cost(64) == 1.0  # as measured
    assert flat.cost(128) == pytest.approx(1.064)  # beyond the table: the line's slope, never quite free


def test_the_curve_reads_the_measured_points_where_a_line_cannot_follow_them():
    # A CPU-shaped step: 2 and 3 rows cost about one row, 4 rows much more; a line over 1..64 rows cannot bend there.
    medians = {1: 0.06, 2: 0.063, 3: 0.058, 4: 0.1, 8: 0.13, 16: 0.2, 32: 0.22, 64: 0.21}
    cost = fit_pass_cost(medians)
    assert cost.cost(2) == cost.cost(3) == pytest.approx(1.05)  # 0.058 pooled with 0.063: the curve never falls
    assert cost.cost(4) == pytest.approx(1.7) and cost.cost(6) == pytest.approx(1.95)  # read between points
    assert cost.base + cost.per_row * max(2, cost.min_rows) > 1.5  # what the line alone would charge for 2 rows
    assert [cost.cost(n) for n in (32, 64)] == pytest.approx([3.6, 3.6])  # 0.22 and 0.21 pooled
    # A lone row's short draft pays here and not on the line: a 2-token draft expected to keep 0.3 token.
    assert allocate([[0.2, 0.5]], cost, base_rows=1) == [2]
    assert allocate([[0.2, 0.5]], PassCost(cost.base, cost.per_row, cost.min_rows), base_rows=1) == [0]


def test_profiling_leaves_the_model_as_it_was():
    model = tiny_llama(64, seed=0)
    ids = torch.tensor([[5, 9, 11, 3]])
    before = model(ids).logits
    state = {k: v.clone() for k, v in model.state_dict().items()}
    profile_or_prior(model, context=24, rows=(1, 2, 8), repeats=1, clock=FakeClock(tick=0.001))
    assert torch.equal(model(ids).logits, before) and not model.training
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_batch_cost_model_profiles_once_per_model(profile_mode):
    fake = SleepyTarget("cached", fixed=0.002, per_token=0.0)
    profiled = batch_cost_model(fake, clock=fake.clock)
    calls = fake.calls
    assert calls > 0 and batch_cost_model(fake) is profiled and fake.calls == calls  # cached: no re-timing


def test_prior_mode_times_nothing(monkeypatch):
    monkeypatch.setenv("GRAMMARSPEC_PASS_COST", "prior")
    monkeypatch.setattr(grammarspec.drafting.cost_model, "_COST_MODELS", {})
    fake = SleepyTarget("prior", fixed=0.0, per_token=0.0)
    cost = batch_cost_model(fake)
    assert fake.calls == 0 and (cost.base, cost.per_row, cost.min_rows) == (1.3, 0.03, 4)


def test_a_bad_mode_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("GRAMMARSPEC_PASS_COST", "fastest")
    with pytest.raises(ValueError, match="GRAMMARSPEC_PASS_COST.*profile, prior"):
        batch_cost_model(SleepyTarget("bad", fixed=0.0, per_token=0.0))


def test_a_target_that_refuses_falls_back_to_the_prior_with_a_warning(profile_mode):
    with pytest.warns(RuntimeWarning, match="refuses extra rows"):
        cost = batch_cost_model(SleepyTarget("refuses", fixed=0.0, per_token=0.0, fail=True))
    assert (cost.base, cost.per_row, cost.min_rows) == (1.3, 0.03, 4)


def test_the_toy_models_profile_to_a_valid_curve():
    for model in (ToyCausalLM(40, seed=1), tiny_llama(40, seed=1)):
        cost = profile_or_prior(model, context=24, rows=(1, 4, 16), repeats=1, clock=FakeClock(tick=0.001)).cost
        assert cost.base > 0 and cost.per_row >= 0.001 and cost.min_rows in (1, 4, 16)
        assert cost.cost(1) == 1.0 and cost.cost(64) >= cost.cost(2) >= 1.0


def test_a_profile_is_kept_on_disk_for_the_next_process(profile_mode, monkeypatch):
    fake = SleepyTarget("kept", fixed=0.003, per_token=0.0)
    first = batch_cost_model(fake, clock=fake.clock)
    stored = json.loads(profile_file().read_text())
    (label,) = stored
    assert label.startswith("kept|cpu|torch.float32|threads=") and stored[label]["min_rows"] == first.min_rows
    monkeypatch.setattr(grammarspec.drafting.cost_model, "_COST_MODELS", {})  # a new process: nothing in memory
    calls = fake.calls
    again = batch_cost_model(fake)
    assert fake.calls == calls  # read from the file, no pass timed
    assert (again.base, again.per_row, again.min_rows) == (first.base, first.per_row, first.min_rows)


def test_a_failed_profile_is_not_stored_and_a_broken_file_is_ignored(profile_mode):
    with pytest.warns(RuntimeWarning, match="refuses extra rows"):
        stored_profile(SleepyTarget("refuses", fixed=0.0, per_token=0.0, fail=True), "refuses-key")
    assert not profile_file().exists()  # the next process tries again
    profile_file().write_text("{not json")
    after = SleepyTarget("after", fixed=0.002, per_token=0.0)
    cost = stored_profile(after, "after-key", clock=after.clock)
    assert json.loads(profile_file().read_text())["after-key"]["min_rows"] == cost.min_rows


def test_an_unnamed_model_is_profiled_for_itself_and_never_stored(profile_mode):
    first, second = SleepyTarget("", fixed=0.002, per_token=0.0), SleepyTarget("", fixed=0.002, per_token=0.0)
    assert batch_cost_model(first, clock=first.clock) is not batch_cost_model(
        second, clock=second.clock
    )  # two models built in code: two profiles
    assert not profile_file().exists()  # a class name is no identity to keep on disk


def test_a_profile_prices_the_masked_path_and_the_host_work_of_a_draft_token(monkeypatch):
    import warnings

    from grammarspec.drafting import pass_profile

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # both terms are timed on a real model: no fallback
        cost = profile_or_prior(
            tiny_llama(64, seed=0), context=24, rows=(1, 2, 8), repeats=1, clock=FakeClock(0.001)
        ).cost
    assert cost.per_token > 0.0
    assert cost.drafted(8, 4, batch=4) == pytest.approx(cost.cost(8) + 4 * cost.per_token + cost.switch)
    # each term is its measured difference in plain steps (the spread shared out over the rows beyond the first),
    # and a difference measured below 0 (noise) is priced at 0
    measured = {("plain", "one"): 0.003, ("chain", "spread"): 0.015}
    monkeypatch.setattr(pass_profile, "_ragged_seconds", lambda *args, **kwargs: measured[args[4], args[5]])
    monkeypatch.setattr(pass_profile, "_host_seconds_per_token", lambda *args: 0.0005)
    assert pass_profile.profile_extra_terms(object(), 0.01) == (0.3, 0.05, 0.1)
    measured = {("plain", "one"): -0.002, ("chain", "spread"): -0.001}
    assert pass_profile.profile_extra_terms(object(), 0.01) == (0.0, 0.05, 0.0)


def test_spreading_drafts_over_rows_is_timed_against_the_same_tokens_in_one_chain(monkeypatch):
    """``per_draft_row``: every row verifying one token against row 0 verifying as many, on the packed path only."""
    from grammarspec.drafting import pass_profile
    from grammarspec.kv.batch import BatchKV

    shapes = pass_profile.ragged_shapes(8)
    drafted = {name: sum(len(chunk) - 1 for chunk in chunks) for name, (chunks, _) in shapes.items()}
    assert drafted == {"plain": 0, "one": 1, "chain": 8, "spread": 8}  # chain and spread: the same tokens
    assert [sum(len(c) > 1 for c in chunks) for chunks, _ in shapes.values()] == [0, 1, 1, 8]  # drafting rows
    assert all(len(parents) == len(chunk) - 1 for chunks, p in shapes.values() for chunk, parents in zip(chunks, p))
    model = tiny_llama(64, seed=0)
    assert BatchKV(model, 4).packed  # the tiny llama runs packed, as the embedded model does
    timed = []
    forward = BatchKV.forward
    monkeypatch.setattr(BatchKV, "forward", lambda self, *a, **k: timed.append(a[0]) or forward(self, *a, **k))
    pass_profile._ragged_seconds(model, 24, 2, 4, "chain", "spread", packed_only=True, clock=FakeClock(0.001))
    steps = timed[2:]  # after the prompt and the step that makes the rows ragged: chain, spread, in turn
    assert steps == [pass_profile.ragged_shapes(4)[name][0] for name in ("chain", "spread")] * 3
    import grammarspec.kv.batch

    monkeypatch.setattr(grammarspec.kv.batch, "supports_packing", lambda model: False)  # padded: the curve prices width
    assert pass_profile._ragged_seconds(model, 24, 2, 4, "chain", "spread", packed_only=True, clock=FakeClock()) == 0.0


def test_a_stored_entry_that_is_not_a_whole_curve_is_profiled_again_and_kept_whole(profile_mode):
    profile_file().parent.mkdir(parents=True, exist_ok=True)
    line_only = {"base": 1.5, "per_row": 0.05, "min_rows": 8, "switch": 0.0, "per_token": 0.01}  # no table
    profile_file().write_text(json.dumps({"old-key": line_only}))
    cost = stored_profile(tiny_llama(64, seed=0), "old-key", clock=FakeClock(tick=0.001))
    assert cost.table is not None and cost.per_token > 0.0
    entry = json.loads(profile_file().read_text())["old-key"]
    assert entry["per_token"] == cost.per_token and entry["switch"] == cost.switch
    assert entry["per_draft_row"] == cost.per_draft_row
    assert {int(n) for n in entry["table"]} == {n for n, _ in cost.table if n > 1}
    again = stored_profile(
        tiny_llama(64, seed=0), "old-key", clock=FakeClock(tick=0.001)
    )  # read back whole: the same curve
    assert again.table == cost.table and again.cost(5) == cost.cost(5)


def test_a_whole_entry_measured_another_way_is_profiled_again(profile_mode):
    """An entry of an older format (its switch timed on another path) is replaced by a fresh profile."""
    from grammarspec.drafting.profile_store import PROFILE_FORMAT

    profile_file().parent.mkdir(parents=True, exist_ok=True)
    old = {"base": 1.5, "per_row": 0.05, "min_rows": 8, "switch": 9.0, "per_token": 0.01, "table": {"2": 1.1}}
    old["format"] = PROFILE_FORMAT - 1
    profile_file().write_text(json.dumps({"old-key": old}))
    cost = stored_profile(tiny_llama(64, seed=0), "old-key", clock=FakeClock(tick=0.001))
    entry = json.loads(profile_file().read_text())["old-key"]
    assert entry["format"] == PROFILE_FORMAT and entry["switch"] == cost.switch != 9.0
    assert (
        stored_profile(tiny_llama(64, seed=0), "old-key", clock=FakeClock(0.001)).switch == cost.switch
    )  # the current format is kept


def test_the_loop_s_step_overhead_is_part_of_the_unit(monkeypatch):
    """A plain step also spends host time whatever its rows; counted in the unit, wide passes cost fewer steps."""
    import grammarspec.drafting.pass_profile as profiling

    fake = SleepyTarget("overhead", fixed=0.002, per_token=0.002)  # 4 ms at 1 row, 34 ms at 16
    monkeypatch.setattr(profiling, "_loop_step_seconds", lambda *args: 0.004)  # the loop's step: the pass alone
    bare = profile_or_prior(fake, context=16, rows=(1, 8, 16), repeats=3, clock=fake.clock).cost
    monkeypatch.setattr(profiling, "_loop_step_seconds", lambda *args: 0.014)  # 10 ms of host work besides
    with_overhead = profile_or_prior(fake, context=16, rows=(1, 8, 16), repeats=3, clock=fake.clock).cost
    assert bare.cost(16) == 8.5 and with_overhead.cost(16) == pytest.approx(3.1)  # (0.034 + 0.01) / (0.004 + 0.01)
    monkeypatch.undo()
    clock = FakeClock(tick=0.001)  # a step between two reads of the clock: the real loop runs and is timed by it
    assert profiling.step_overhead_seconds(tiny_llama(64, seed=0), 24, 0.0, repeats=1, clock=clock) == pytest.approx(
        0.001
    )
