"""The agent benchmark: its tools, the CLI's argument checks, and a short run of every arm (embedded model)."""

from __future__ import annotations

import pytest

from grammarspec.bench.agent import agent_markdown, run_agent_bench
from grammarspec.bench.agent_tasks import CONVERSATIONS, TOOLS, ModelTurn, run_tool
from grammarspec.cli import common as cli_common
from grammarspec.cli import main as cli


def test_the_conversations_have_four_model_turns_and_real_tools():
    for name, script in CONVERSATIONS.items():
        assert sum(isinstance(s, ModelTurn) for s in script) >= 4, name
    assert run_tool("calculator", {"expression": "74.5 * 2 + 39.9"})["result"] == 188.9
    assert "error" in run_tool("calculator", {"expression": "__import__('os')"})
    assert run_tool("lookup_order", {"order_id": "a-1042"})["status"] == "shipped"
    assert run_tool("get_weather", {"city": "Lima", "unit": "fahrenheit"})["temperature"] == 69.8
    assert "error" in run_tool("find_product", {"name": "unicorn"})
    assert {t["function"]["name"] for t in TOOLS} == {"get_weather", "calculator", "lookup_order", "find_product"}


def test_unknown_conversations_are_refused_before_the_model_loads(capsys, monkeypatch):
    monkeypatch.setattr(cli_common, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    assert cli.main(["bench-agent", "--conversations", "weather,nope"]) == 2
    assert "unknown nope" in capsys.readouterr().err


@pytest.mark.slow
def test_every_arm_makes_the_same_calls(smol):
    model, tok = smol
    script = [
        "What is 12 * 11?",
        ModelTurn({"type": "function", "function": {"name": "calculator"}}, 32),
        ModelTurn("none", 8),
    ]
    runs = run_agent_bench(model, tok, conversations={"tiny": script})
    assert sorted(r.arm for r in runs) == ["conversation", "hf_cache", "hf_resend"]
    tokens = {r.arm: [t.tokens for t in r.turns] for r in runs}
    assert tokens["hf_resend"] == tokens["hf_cache"] == tokens["conversation"]
    by = {r.arm: r for r in runs}
    assert by["conversation"].turns[0].calls[0][0] == "calculator"
    second = {arm: by[arm].turns[1] for arm in by}  # the prompt cache reads only the new tokens
    assert second["hf_cache"].prefilled == second["conversation"].prefilled < second["hf_resend"].prefilled
    table = agent_markdown(runs, "grammarspec bench-agent")
    assert "| tiny | 2 | 1 |" in table and "| yes |" in table


@pytest.mark.slow
def test_bench_serve_answers_equal_hf_resending_call_by_call(smol):
    """grammarspec serve and HF re-sending read the same prompts (tool_choice="none" included): identical calls."""
    from grammarspec.bench.serve import run_serve_bench, serve_markdown

    model, tok = smol
    script = ["How much is the desk lamp?", ModelTurn("required", 32), ModelTurn("none", 12)]
    result = run_serve_bench(model, tok, "smollm2-135m", {"tiny": script}, ["serve", "hf_resend"], concurrency=1)
    by = {r["arm"]: r for r in result["runs"]}
    assert by["serve"]["outputs"] == [
        dict(o, finish_reason=by["serve"]["outputs"][i]["finish_reason"])
        for i, o in enumerate(by["hf_resend"]["outputs"])
    ]
    assert "| 2/2 |" in serve_markdown(result, "cmd")
