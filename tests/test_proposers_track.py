"""The per-request acceptance record that decides whether a cheap draft is worth verifying."""

from __future__ import annotations

import pytest

from proposers.track import Track


def test_expectation_is_hit_rate_times_capped_run():
    t = Track(hit=0.5, run=4.0)
    assert t.expected(0) == 0.0
    assert t.expected(2) == pytest.approx(1.0)
    assert t.expected(8) == pytest.approx(2.0)  # runs are about 4 long: a longer draft adds nothing


def test_rejections_lower_the_hit_rate_and_accepted_runs_set_the_run_length():
    t = Track(hit=0.5, run=4.0, alpha=0.5)
    t.update(shown=8, accepted=0)
    assert t.hit == pytest.approx(0.25) and t.run == pytest.approx(4.0)  # a miss says nothing about runs
    t.update(shown=8, accepted=6)
    assert t.hit == pytest.approx(0.625) and t.run == pytest.approx(5.0)
    t.update(shown=3, accepted=3)  # fully accepted: the draft's length cut the run, count one more
    assert t.run == pytest.approx(4.5)
    t.update(shown=0, accepted=0)  # nothing verified: nothing learned
    assert t.hit == pytest.approx(0.8125)


def test_probe_schedule_backs_off_and_resets():
    t = Track(wait=2, max_wait=8)
    assert [t.admit() for _ in range(3)] == [False, False, True]
    t.update(shown=4, accepted=0)  # failed probe: wait doubles
    assert [t.admit() for _ in range(5)] == [False] * 4 + [True]
    t.update(shown=4, accepted=0)
    t.update(shown=4, accepted=0)  # not a probe: the wait stays
    assert t.wait == 8
    assert [t.admit() for _ in range(9)][-1] is True
    t.update(shown=4, accepted=2)  # a successful probe resets the wait
    assert t.wait == 2
