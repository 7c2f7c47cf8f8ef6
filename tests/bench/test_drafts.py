"""``bench-serve --drafts``: the ``none`` arm (plain decoding through the same server), rounds, and the ratios.

The workloads run through the server's engine on a tiny random Llama over the embedded model's tokenizer
(fast; its outputs are whatever greedy gives, the same in every arm); the ratio arithmetic is checked on
given records.  Nothing here reads a wall-clock value.
"""

from __future__ import annotations

import pytest

from grammarspec.bench.agent_tasks import ModelTurn
from grammarspec.bench.drafts import SERVER_ARMS, drafts_markdown, repeat_requests, run_drafts_bench
from grammarspec.bench.drafts_report import ratios_over, replay_arm, same_outputs, split_totals
from grammarspec.bench.tasks import BenchTask

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _tasks():
    return [
        BenchTask(id=f"t{i}", category="extraction", prompt=f"Read: {who}.", schema=SCHEMA, system="Answer in JSON.")
        for i, who in enumerate(("Ada is 36", "Alan is 41"))
    ]


def _record(name, round_, tokens, passes, seconds, output=(1,)):
    return {
        "id": name,
        "round": round_,
        "tokens": tokens,
        "target_forwards": passes,
        "seconds": seconds,
        "proposed": {},
        "accepted": {},
        "output": list(output),
    }


def test_the_ratios_over_none_are_per_split_quotients_of_tokens_per_second_and_per_pass():
    none = [_record("a#0", 0, 10, 10, 1.0), _record("a#1", 1, 10, 10, 1.0), _record("a#2", 2, 20, 20, 2.0)]
    on = [_record("a#0", 0, 10, 10, 1.0), _record("a#1", 1, 10, 2, 0.25), _record("a#2", 2, 20, 4, 0.5)]
    splits = {"none": split_totals(none), "on": split_totals(on)}
    assert splits["on"]["all"] == {
        "requests": 3,
        "tokens": 40,
        "passes": 16,
        "tokens_per_pass": 2.5,
        "tokens_per_second": 40 / 1.75,
    }
    assert (splits["on"]["warm"]["requests"], splits["on"]["warm"]["passes"]) == (2, 6)  # round 0 left out
    ratios = ratios_over(splits)
    assert list(ratios) == ["on"]  # the base is no ratio of its own
    assert ratios["on"]["all"] == {"tokens_per_second": pytest.approx((40 / 1.75) / 10.0), "tokens_per_pass": 2.5}
    assert ratios["on"]["warm"] == {"tokens_per_second": pytest.approx(4.0), "tokens_per_pass": 5.0}
    assert ratios_over({"on": splits["on"]}) == {}  # no none arm: nothing to divide by
    empty = {"none": split_totals([_record("a#0", 0, 10, 10, 1.0)]), "on": splits["on"]}
    assert ratios_over(empty)["on"]["warm"] == {"tokens_per_second": None, "tokens_per_pass": None}


def test_outputs_are_compared_by_id_and_the_replay_arm_prefers_on_then_off_then_none():
    a = [_record("x#0", 0, 2, 2, 1.0, [1, 2]), _record("x#1", 1, 2, 2, 1.0, [3, 4])]
    b = [_record("x#1", 1, 2, 2, 1.0, [3, 4]), _record("x#0", 0, 2, 2, 1.0, [1, 5]), _record("y#0", 0, 1, 1, 1, [])]
    assert same_outputs(a, b) == (1, 2)
    assert [replay_arm(arms) for arms in (SERVER_ARMS, ["none", "off"], ["none"], ["on", "none"])] == [
        "on",
        "off",
        "none",
        "on",
    ]


def test_the_markdown_has_a_ratio_row_per_drafting_arm_over_none():
    records = {
        "none": [_record("a#0", 0, 10, 10, 1.0), _record("a#1", 1, 10, 10, 1.0)],
        "on": [_record("a#0", 0, 10, 10, 1.0), _record("a#1", 1, 10, 2, 0.25)],
    }
    arms = {
        arm: {
            "records": rs,
            "splits": split_totals(rs),
            "index": None,
            "proposed": {},
            "accepted": {},
            **split_totals(rs)["all"],
        }
        for arm, rs in records.items()
    }
    arms["on"]["identical"] = same_outputs(records["none"], records["on"])
    result = {
        "workload": "repeat",
        "concurrency": 1,
        "arms": arms,
        "ratios": ratios_over({arm: data["splits"] for arm, data in arms.items()}),
        "identical": arms["on"]["identical"],
    }
    text = drafts_markdown(result, "grammarspec bench-serve --drafts repeat")
    row = next(line for line in text.splitlines() if line.startswith("| on | 2 (1) |"))
    # tok/s all, warm; tokens/pass all, warm
    assert row == "| on | 2 (1) | 1.60x | 4.00x | 1.67x | 5.00x |"
    assert "| none | 2 | 20 | 20 | 1.000 | 10.0 | 0/0 | - |" in text  # the reference arm
    assert text.count("x `none`") == 4 and "outputs identical to `none`'s: 2/2" in text


@pytest.fixture(scope="module")
def repeat_result(smol_chat):
    model, tok = smol_chat
    return run_drafts_bench(model, tok, "repeat", concurrency=1, repeat=3, max_tokens=16, tasks=_tasks())


def test_the_none_arm_drafts_nothing_and_every_arm_gives_its_outputs(repeat_result):
    arms = repeat_result["arms"]
    assert list(arms) == ["none", "off", "on"]  # the default arms, in order
    none = arms["none"]
    assert len(none["records"]) == 6
    for record in none["records"]:  # one pass a token, but for those the grammar forces
        assert record["target_forwards"] == record["tokens"] - record["forced_tokens"]
        assert record["proposed"] == record["accepted"] == {}
    assert any(record["forced_tokens"] for record in none["records"])
    assert none["index"]["outputs"] == 0  # plain decoding never reads nor feeds the index
    assert sum(arms["off"]["proposed"].values()) > 0  # auto drafts in the others (the tiny model's own drafts)
    assert "identical" not in none  # the reference
    assert arms["off"]["identical"] == arms["on"]["identical"] == (6, 6)
    assert repeat_result["identical"] == (12, 12)


def test_rounds_are_the_requests_repeat_and_warm_is_round_one_on(repeat_result):
    expected = [r["round"] for r in repeat_requests(_tasks(), 3, 16)]
    assert expected == [0, 0, 1, 1, 2, 2]
    for data in repeat_result["arms"].values():
        records = data["records"]
        assert [r["round"] for r in records] == expected
        assert all(r["id"].endswith(f"#{r['round']}") for r in records)
        warm = [r for r in records if r["round"] >= 1]
        assert data["splits"]["warm"]["requests"] == 4 and data["splits"]["all"]["requests"] == 6
        assert data["splits"]["warm"]["tokens"] == sum(r["tokens"] for r in warm)
        assert data["splits"]["warm"]["passes"] == sum(r["target_forwards"] for r in warm)
        seconds = sum(r["seconds"] for r in records)  # the requests' own times, not the arm's wall time
        assert data["splits"]["all"]["tokens_per_second"] == pytest.approx(data["tokens"] / seconds)
    ratios = repeat_result["ratios"]
    assert list(ratios) == ["off", "on"] and set(ratios["on"]) == {"all", "warm"}
    splits = {arm: data["splits"] for arm, data in repeat_result["arms"].items()}
    assert ratios["on"]["warm"]["tokens_per_pass"] == pytest.approx(
        splits["on"]["warm"]["tokens_per_pass"] / splits["none"]["warm"]["tokens_per_pass"]
    )
    text = drafts_markdown(repeat_result, "grammarspec bench-serve --drafts repeat")
    assert [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| o") and "(4) |" in line] == [
        "| off",
        "| on",
    ]


def test_arms_select_and_a_single_none_arm_compares_nothing(smol_chat):
    model, tok = smol_chat
    result = run_drafts_bench(
        model, tok, "repeat", concurrency=1, repeat=1, max_tokens=8, tasks=_tasks(), arms=["none"]
    )
    assert list(result["arms"]) == ["none"] and result["ratios"] == {} and result["identical"] == (0, 0)
    text = drafts_markdown(result, "grammarspec bench-serve --drafts repeat --arms none")
    assert "x `none`" not in text and "outputs identical" not in text


def test_the_agent_workload_sends_none_too_and_each_conversations_first_turn_is_cold(smol_chat):
    model, tok = smol_chat
    script = {"weather": ["What is the weather in Oslo?", ModelTurn("required", 24), ModelTurn("none", 8)]}
    result = run_drafts_bench(model, tok, "agent", concurrency=1, max_tokens=24, conversations=script)
    arms = result["arms"]
    assert [r["round"] for r in arms["none"]["records"]] == [0, 1]
    assert [r["id"] for r in arms["none"]["records"]] == ["weather#0/0", "weather#0/1"]
    none = arms["none"]["records"]
    assert all(r["target_forwards"] == r["tokens"] - r["forced_tokens"] and r["proposed"] == {} for r in none)
    assert arms["on"]["identical"] == arms["off"]["identical"] == (2, 2)
    assert arms["on"]["splits"]["warm"]["requests"] == 1 and set(result["ratios"]) == {"off", "on"}
