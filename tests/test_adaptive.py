"""The adaptive controller on synthetic traces (costs are simulated, never measured)."""

from __future__ import annotations

import pytest

from grammarspec.adaptive import AdaptiveController

PLAIN = 1.0  # seconds per plain step in the simulated machine


def spec_cost(proposed: int) -> float:
    """A speculative step: drafting plus a verification a little dearer than a plain step."""
    return 0.02 * proposed + PLAIN * (1 + 0.05 * proposed)


def run(controller: AdaptiveController, accept_rate, steps: int) -> list[tuple[int, bool]]:
    """Drive the controller like the decoding loop; ``accept_rate(k)`` = drafts accepted for a proposal of k."""
    trace = []
    for _ in range(steps):
        if controller.speculate:
            k = controller.k
            controller.record_speculative_step(k, accept_rate(k), spec_cost(k))
        else:
            controller.record_plain_step(PLAIN)
        trace.append((controller.k, controller.speculate))
    return trace


def test_rule_k_is_ema_plus_one_clamped():
    c = AdaptiveController(1, 10, k_init=4, warmup=0, hysteresis=0.0, alpha=1.0)
    c.record_speculative_step(4, 4, 1.0)
    assert c.k == 5  # round(4) + 1
    c.record_speculative_step(5, 0, 1.0)
    assert c.k == 1
    c = AdaptiveController(2, 3, k_init=3, warmup=0, hysteresis=0.0, alpha=1.0)
    c.record_speculative_step(3, 3, 1.0)
    assert c.k == 3  # clamped to k_max
    c.record_speculative_step(3, 0, 1.0)
    assert c.k == 2  # clamped to k_min


def test_warmup_and_interval():
    c = AdaptiveController(1, 16, k_init=8, warmup=3, interval=2, hysteresis=0.0, alpha=1.0, min_samples=100)
    changed = [c.record_speculative_step(8, 0, 1.0) for _ in range(3)]
    assert changed == [False, False, False] and c.k == 8  # warm-up: the average only
    assert c.record_speculative_step(8, 0, 1.0) is False  # step 4: not on the interval
    assert c.record_speculative_step(8, 0, 1.0) is True and c.k == 1  # step 5: update


def test_hysteresis_keeps_k_steady_near_a_boundary():
    def changes(hysteresis):
        c = AdaptiveController(1, 16, k_init=3, warmup=0, hysteresis=hysteresis, alpha=0.5, min_samples=100)
        flips = 0
        for step in range(40):  # accepted 2, 3, 2, 3, ...: ema + 1 hovers around 3.5
            flips += c.record_speculative_step(c.k, 2 + step % 2, 1.0) and step >= 4
        return flips

    assert changes(0.0) >= 10  # plain rounding flips k between 3 and 4 nearly every step
    assert changes(0.3) == 0


def test_full_acceptance_grows_k_one_step_at_a_time():
    c = AdaptiveController(1, 12, k_init=2, warmup=0)
    ks = [k for k, _ in run(c, lambda k: k, 80)]
    assert ks[-1] == 12
    assert all(b - a <= 1 for a, b in zip(ks, ks[1:]))
    assert c.speculate


def test_low_acceptance_shrinks_k_then_switches_off_then_probes_and_recovers():
    c = AdaptiveController(1, 8, k_init=8, probe_after=10)
    good = {"on": False}

    def accept(k):
        return k if good["on"] else 0

    ks = []
    while True:  # until switched off by a judgement (not by the step that measures plain cost)
        known = c.cost_plain is not None
        ks.append(run(c, accept, 1)[-1][0])
        assert len(ks) < 100
        if known and not c.speculate:
            break
    assert ks[0] == 8 and min(ks) == 1  # k shrank first
    assert c.cost_speculative > c.cost_plain  # ... and the measured cost switched speculation off
    off_run = 0
    while not c.speculate:  # plain steps until the probe
        run(c, accept, 1)
        off_run += 1
    assert off_run == 10
    good["on"] = True  # acceptance is good again: the probe succeeds and k grows back
    trace = run(c, accept, 60)
    assert all(on for _, on in trace[-30:])
    assert c.k >= 6


def test_a_failed_probe_waits_longer():
    c = AdaptiveController(1, 8, k_init=1, probe_after=4, max_probe_after=16)
    while True:  # until switched off by a judgement (not by the calibration step)
        known = c.cost_plain is not None
        run(c, lambda k: 0, 1)
        if known and not c.speculate:
            break
    waits = []
    for _ in range(4):
        n = 0
        while not c.speculate:
            run(c, lambda k: 0, 1)
            n += 1
        waits.append(n)
        while c.speculate:  # the probe fails
            run(c, lambda k: 0, 1)
    assert waits == [4, 8, 16, 16]


def test_plain_cost_is_measured_before_switching_off():
    c = AdaptiveController(1, 8, k_init=4, min_samples=2)
    run(c, lambda k: 0, 3)
    assert c.cost_plain is not None  # a plain step was asked for to measure it
    assert c.plain_steps >= 1


def test_good_speculation_never_asks_for_a_plain_step():
    c = AdaptiveController(1, 8, k_init=4)
    run(c, lambda k: k, 50)
    assert c.plain_steps == 0 and c.speculate


def test_costs_decide_not_acceptance_alone():
    # Drafting is free and verification costs the same as a plain step: even
    # low acceptance pays, so speculation stays on.
    c = AdaptiveController(1, 8, k_init=4, min_samples=2)
    for _ in range(20):
        if c.speculate:
            c.record_speculative_step(c.k, 0, PLAIN * 0.99)
        else:
            c.record_plain_step(PLAIN)
    assert c.speculate


def test_not_adaptive_is_fixed():
    c = AdaptiveController(k_min=1, k_max=5, adaptive=False)
    assert c.k == 5
    for _ in range(20):
        assert c.record_speculative_step(5, 0, 100.0) is False
        assert c.record_plain_step(0.001) is False
    assert c.k == 5 and c.speculate


def test_bad_arguments():
    with pytest.raises(ValueError, match="k_min"):
        AdaptiveController(0, 4)
    with pytest.raises(ValueError, match="k_min"):
        AdaptiveController(5, 4)
    with pytest.raises(ValueError, match="alpha"):
        AdaptiveController(1, 4, alpha=0)
    with pytest.raises(ValueError, match="accepted"):
        AdaptiveController(1, 4).record_speculative_step(2, 3, 1.0)


def test_drafts_shorter_than_k_do_not_move_k():
    c = AdaptiveController(1, 16, k_init=8, warmup=0, alpha=1.0, min_samples=100)
    for _ in range(10):
        assert c.record_speculative_step(3, 0, 1.0) is False  # the proposer stopped at 3: not k's doing
    assert c.k == 8 and c.ema_accepted is None
    c.record_speculative_step(8, 0, 1.0)
    assert c.k == 1
