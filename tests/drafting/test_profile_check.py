"""A pass-cost profile measured on a busy machine does not stay: the loop's passes check it, and it is measured again.

Every time here is a fake clock's (tests/clocks.py): the profiled model advances
it by what a pass costs on a simulated machine, busy or quiet, and the profiler
and the loop read it, so the tests depend on no machine's speed or load.
"""

from __future__ import annotations

import doctest
import json
import random
import warnings

import pytest

import grammarspec.drafting.cost_model
import grammarspec.drafting.profile_check
from grammarspec.drafting.cost_model import ProfiledCost, batch_cost_model
from grammarspec.drafting.pass_profile import Measured, measure_profile
from grammarspec.drafting.profile_check import ProfileCheck
from grammarspec.drafting.profile_store import profile_file, stored_entries
from grammarspec.engine.decoding import DecodeConfig, decode
from grammarspec.policy.adaptive import AdaptiveController
from proposers.base import Request
from proposers.cost import PassCost
from tests.clocks import ClockedToy, FakeClock
from tests.helpers import single_thread
from tests.proposer_fakes import ScriptFollower

one_thread = pytest.fixture(autouse=True)(single_thread)

BUSY = (0.03, 0.02)  # seconds of a pass: fixed, and per token -- another process holds the cores
QUIET = (0.01, 0.0005)
PROMPT = [2, 5, 9, 4, 7]
CONFIG = DecodeConfig(max_new_tokens=120)
NOTICE = "disagrees with the passes this process timed"


@pytest.fixture
def profile_mode(monkeypatch, tmp_path):
    """``GRAMMARSPEC_PASS_COST=profile`` (the suite runs with ``prior``), profiles stored under ``tmp_path`` and no
    cost model, check or pending re-measure of an earlier test."""
    monkeypatch.setenv("GRAMMARSPEC_PASS_COST", "profile")
    monkeypatch.setenv("GRAMMARSPEC_CACHE", str(tmp_path))
    for name in ("_COST_MODELS", "_MEASURED", "_CHECKS", "_STALE", "_REMEASURED"):
        monkeypatch.setattr(grammarspec.drafting.cost_model, name, {})


def test_docstring_examples_hold():
    assert doctest.testmod(grammarspec.drafting.profile_check).failed == 0


def measured(table, unit=0.01):
    return Measured(PassCost(1.0, 0.1, 1, table=table), step_seconds=unit, overhead_seconds=0.0)


def test_noise_and_odd_slow_passes_never_disagree_and_a_busy_machine_now_does_not_either():
    """Passes within a third of the prediction, one in ten five times slower (another process's burst), all slower
    by a common factor (load now): no disagreement, however many passes come."""
    rng = random.Random(0)
    profile = measured({2: 1.1, 4: 1.2, 8: 1.5, 16: 2.0})
    for load in (1.0, 3.0):
        called = []
        check = ProfileCheck(profile, steps=16, on_disagree=called.append)
        for _ in range(2000):
            rows = rng.choice([1, 1, 2, 3, 5, 9])
            burst = 5.0 if rng.random() < 0.1 else 1.0
            check.observe(rows, load * burst * rng.uniform(0.75, 1.33) * profile.predicted_pass_seconds(rows))
        assert check.reason is None and called == [] and check.passes == 2000
        assert set(check.medians()) == {"1", "2-3", "4-7", "8-15"}


def test_a_wrong_shape_or_a_profile_measured_slow_disagrees_once():
    """Wide passes at a fifth of their profiled time beside 1-row passes as profiled: the shape; every pass at a
    third: the level.  Either is said once, naming the rows, and the check then stops."""
    profile = measured({4: 3.0, 8: 5.0})
    called = []
    check = ProfileCheck(profile, steps=16, on_disagree=called.append)
    for _ in range(40):
        check.observe(1, 0.01)
        check.observe(5, 0.2 * profile.predicted_pass_seconds(5))
    assert called == ["passes of 4-7 rows took 0.20x the profiled time, passes of 1 row 1.00x"]
    assert check.passes == 32  # it stopped once it disagreed
    level = ProfileCheck(profile, steps=16, on_disagree=called.append)
    for _ in range(20):
        level.observe(1, 0.01 / 3)
    assert level.reason == "every pass timed took at most 0.33x the profiled time (passes of 1 row)"
    assert len(called) == 2
    with pytest.raises(ValueError, match="measured profile"):
        ProfileCheck(Measured(PassCost()))
    with pytest.raises(ValueError, match="tolerance"):
        ProfileCheck(profile, tolerance=1.0)


def test_a_burst_of_load_while_profiling_does_not_move_the_curve():
    """Another process slows twenty passes in a row by five times: with every width timed once a round and the lowest
    round kept, the curve is the quiet machine's to the last digit.  (All repeats of a width back to back, as before,
    put that burst on every repeat of a few widths.)"""
    curves = []
    for burst in (1.0, 5.0):
        clock = FakeClock()
        model = ClockedToy(clock, "bursty", *QUIET)
        model.burst, model.bursty = burst, range(20, 40)  # past the warm-up: the first round's wider passes
        curves.append(measure_profile(model, clock=clock))
    quiet, bursty = curves
    assert bursty.cost.table == quiet.cost.table and bursty.pass_seconds == quiet.pass_seconds
    assert quiet.pass_seconds[12] == pytest.approx(QUIET[0] + 12 * QUIET[1], rel=1e-4)  # the machine's own time


def drafting_call(model, clock, alone):
    """One ``decode`` call as ``generate`` makes it (the profiled pass cost): a proposer that knows the text, an
    adaptive controller."""
    proposer = ScriptFollower(alone)
    proposer.start(Request(prompt_ids=tuple(PROMPT), tokenizer=None))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, stats = decode(
            model,
            PROMPT,
            CONFIG,
            proposer=proposer,
            controller=AdaptiveController(k_min=1, k_max=8),
            clock=clock,
            pass_cost=ProfiledCost(model),
        )
    assert out == alone  # drafting policy only: the output never changes
    return stats, [str(w.message) for w in caught if NOTICE in str(w.message)]


def test_a_profile_measured_busy_is_caught_by_the_loop_and_measured_again_before_the_next_call(profile_mode):
    """The first profile is measured while the machine is busy (a 12-row pass priced at 5.4 plain steps); then the
    machine is quiet.  The loop's passes disagree with it: one notice, the stored entry deleted, and the next call
    measures it again (quietly: 12 rows at 1.5) and stores it with the reason; no notice after that."""
    clock = FakeClock()
    model = ClockedToy(clock, "clocked", *BUSY)
    busy = batch_cost_model(model, clock=clock)  # first use while another process holds the cores
    assert busy.cost(12) == pytest.approx((BUSY[0] + 12 * BUSY[1]) / (BUSY[0] + BUSY[1]), rel=0.02)
    (label,) = stored_entries()
    model.fixed, model.per_token = QUIET
    alone = decode(model, PROMPT, CONFIG)[0]  # plain decoding: nothing drafts, nothing priced or checked
    notices, forwards = [], []
    for _ in range(2):
        stats, said = drafting_call(model, clock, alone)
        notices += said
        forwards.append(stats.target_forwards)
    assert len(notices) == 1 and "clocked" in notices[0] and "0.07x the profiled time" in notices[0]
    assert label not in stored_entries()  # a process that ended now would measure it again at first use
    assert batch_cost_model(model) is busy  # within the call (and until the next one), one curve
    before = model.forwards
    stats, said = drafting_call(model, clock, alone)  # measured again first, then decodes
    assert said == [] and model.forwards - before > stats.target_forwards  # the profile's passes, then the call's
    quiet = batch_cost_model(model)
    assert quiet is not busy and quiet.cost(12) == pytest.approx((QUIET[0] + 12 * QUIET[1]) / sum(QUIET), rel=0.02)
    entry = json.loads(profile_file().read_text())[label]
    assert entry["why"].startswith("the passes timed disagreed: every pass timed took at most 0.07x")
    assert entry["step_ms"] == pytest.approx(1000 * sum(QUIET)) and entry["rounds"] == 5
    for _ in range(3):  # the new curve holds: no notice, nothing measured again
        before = model.forwards
        stats, said = drafting_call(model, clock, alone)
        assert said == [] and model.forwards - before == stats.target_forwards
    assert grammarspec.drafting.cost_model._REMEASURED == {next(iter(grammarspec.drafting.cost_model._CHECKS)): 1}
    assert (
        grammarspec.drafting.cost_model._CHECKS[next(iter(grammarspec.drafting.cost_model._CHECKS))].steps == 32
    )  # twice the evidence now


def test_a_machine_busy_after_a_quiet_profile_keeps_the_profile(profile_mode):
    """Profiled quiet, then every pass three times slower (load now): the curve's ratios still hold, so nothing is
    measured again (a profile measured now would be the busy one)."""
    clock = FakeClock()
    model = ClockedToy(clock, "loaded-later", *QUIET)
    profile = batch_cost_model(model, clock=clock)
    model.fixed, model.per_token = 3 * QUIET[0], 3 * QUIET[1]
    alone = decode(model, PROMPT, CONFIG)[0]
    for _ in range(4):
        before = model.forwards
        stats, said = drafting_call(model, clock, alone)
        assert said == [] and model.forwards - before == stats.target_forwards
    assert batch_cost_model(model) is profile
    check = grammarspec.drafting.cost_model._CHECKS[next(iter(grammarspec.drafting.cost_model._CHECKS))]
    assert check.passes > 32 and all(m == pytest.approx(3.0, rel=0.05) for m in check.medians().values())


def test_the_cli_shows_resets_and_measures_the_stored_profiles(profile_mode, monkeypatch, capsys):
    """``grammarspec profile --show`` prints each stored curve (rows -> plain steps) and how it was measured,
    ``--reset`` deletes them (the next use measures again), ``--measure`` measures ``--model``'s now."""
    from grammarspec.cli import common as cli_common
    from grammarspec.cli import main as cli

    assert cli.main(["profile"]) == 0
    assert capsys.readouterr().out.startswith("no pass-cost profile stored")
    clock = FakeClock()
    model = ClockedToy(clock, "shown", *QUIET)
    batch_cost_model(model, clock=clock)
    assert cli.main(["profile", "--show"]) == 0
    out = capsys.readouterr().out
    (label,) = stored_entries()
    assert out.startswith(f"1 pass-cost profile in {profile_file()}:") and label in out
    assert "the lowest of 5 rounds" in out and "a plain step: 10.50 ms" in out
    rows, costs = [line.split()[1:] for line in out.splitlines() if line.startswith(("  rows", "  plain steps"))]
    costs = costs[1:]  # "plain steps": the second word is part of the name
    assert dict(zip(rows, costs))["12"] == "1.5" and rows[0] == "2" and rows[-1] == "256"
    assert cli.main(["profile", "--reset"]) == 0
    assert capsys.readouterr().out.startswith("deleted 1 stored pass-cost profile")
    assert not profile_file().exists() and stored_entries() == {}
    monkeypatch.setattr(cli_common, "load", lambda name, **placement: (ClockedToy(FakeClock(), name, *QUIET), None))
    assert cli.main(["profile", "--measure", "--model", "measured-now"]) == 0
    out = capsys.readouterr().out
    (label,) = stored_entries()
    assert label.startswith("measured-now|cpu|") and out.startswith(label)
    assert "measured again: grammarspec profile --measure" in out
    monkeypatch.setenv("GRAMMARSPEC_PASS_COST", "prior")
    assert cli.main(["profile", "--measure"]) == 2
    assert "GRAMMARSPEC_PASS_COST=prior" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["profile", "--show", "--reset"])
    assert "not allowed with" in capsys.readouterr().err
