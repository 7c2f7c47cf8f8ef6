"""The one acceptance estimator (Calibration) and the composite's hold-back schedule."""

from __future__ import annotations

import doctest

import pytest

import proposers.track
from proposers.base import Draft
from proposers.track import Calibration, HoldBack

LOOKUP = Draft(tokens=(1, 2, 3, 4), sources=("lookup",) * 4)


def test_docstring_examples_hold():
    result = doctest.testmod(proposers.track)
    assert result.attempted > 0 and result.failed == 0


def test_a_new_record_expects_little_of_a_guess_and_learns_from_each_verified_token():
    c = Calibration()
    assert c.estimate(LOOKUP) == pytest.approx([0.2, 0.8, 0.8, 0.8])  # a guess is a long shot until shown otherwise
    assert c.expected(LOOKUP) == pytest.approx(0.2 + 0.16 + 0.128 + 0.1024)
    for _ in range(30):
        c.update(LOOKUP, 4)
    assert c.estimate(LOOKUP)[0] > 0.9 and c.expected(LOOKUP) > 3.5
    for _ in range(60):
        c.update(LOOKUP, 0)  # only the first token reached the target: the followers learn nothing
    assert c.estimate(LOOKUP)[0] < 0.15 and c.estimate(LOOKUP)[1] > 0.9


def test_a_seeded_record_starts_from_the_traffic_and_its_own_evidence_soon_wins():
    recent = Calibration()
    for _ in range(100):
        recent.update(LOOKUP, 4)  # this kind of traffic keeps its lookups
    fresh = Calibration.seeded_from(recent)
    assert fresh.estimate(LOOKUP)[0] > 0.75 > Calibration().estimate(LOOKUP)[0]
    assert recent.estimate(LOOKUP)[0] > 0.95  # the seed was copied, not moved
    for _ in range(40):
        fresh.update(LOOKUP, 0)  # this request's lookups never survive
    assert fresh.estimate(LOOKUP)[0] < 0.15
    with pytest.raises(ValueError, match="weight > 0"):
        Calibration.seeded_from(recent, weight=0)


def test_absorb_gathers_requests_own_evidence_never_their_seed():
    server = Calibration()
    seeded = Calibration.seeded_from(server)
    for _ in range(10):
        seeded.update(LOOKUP, 0)
    server.absorb(seeded)
    assert server.estimate(LOOKUP)[0] < 0.05
    good = Calibration.seeded_from(server)  # starts low: the traffic's lookups failed
    assert good.estimate(LOOKUP)[0] < 0.1
    for _ in range(40):
        good.update(LOOKUP, 4)
    before = server.estimate(LOOKUP)[0]
    server.absorb(good)  # 40 recent hits outweigh 10 older misses; good's low seed is not passed on
    assert server.estimate(LOOKUP)[0] > 0.75 > before


def test_hold_back_backs_off_after_failed_probes_and_resets_after_a_hit():
    h = HoldBack(wait=2, max_wait=8)
    assert [h.admit() for _ in range(3)] == [False, False, True]
    h.verified(accepted=False)  # a failed probe: the wait doubles
    assert [h.admit() for _ in range(5)] == [False] * 4 + [True]
    h.verified(accepted=False)
    assert h.wait == 8
    h.verified(accepted=False)  # not a probe: the wait stays
    assert h.wait == 8 and [h.admit() for _ in range(9)][-1] is True
    h.verified(accepted=True)  # a successful probe resets it
    assert h.wait == 2
    with pytest.raises(ValueError, match="wait"):
        HoldBack(wait=9, max_wait=8)
