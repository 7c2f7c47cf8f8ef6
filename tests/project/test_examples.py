"""Smoke tests of examples/: each runs on the embedded model in its quick mode.

The examples load the model themselves; here ``grammarspec.load_model`` is
pointed at the session's model so that it is loaded once.  Quick mode is
switched on by ``GRAMMARSPEC_EXAMPLES_QUICK=1`` (the same as ``--quick``).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import jsonschema
import pytest

import grammarspec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def quick_examples(smol, monkeypatch):
    """Quick mode, and load_model() returns the session's model."""
    monkeypatch.setenv("GRAMMARSPEC_EXAMPLES_QUICK", "1")
    monkeypatch.setattr(grammarspec, "load_model", lambda *args, **kwargs: smol)
    return smol


# --- the tool agent ------------------------------------------------------------------------


def test_the_agent_tools_are_real_functions():
    agent = load_example("tool_agent")
    assert agent.calculator("(17 * 23) + 4 ** 2 % 5")["result"] == 17 * 23 + 4**2 % 5
    for hostile in ("__import__('os').system('true')", "().__class__", "9 ** 9999", "1 / 0"):
        assert "error" in agent.calculator(hostile)
    assert agent.get_weather("Oslo", "fahrenheit")["temperature"] == 39.2
    assert "error" in agent.get_weather("Atlantis", "celsius")
    calendar = agent.Calendar()
    assert calendar.add_event("Lunch", "2025-06-03", "12:30")["events_that_day"] == 1
    assert "error" in calendar.add_event("Never", "2025-02-30", "10:00")
    assert [e["title"] for e in calendar.list_events("2025-06-03")["events"]] == ["Lunch"]
    names = [t["function"]["name"] for t in agent.TOOLS]
    assert set(names) == {"get_weather", "calculator", "add_event", "list_events", "final_answer"}


@pytest.mark.slow
def test_the_agent_calls_tools_and_always_ends_with_an_answer(quick_examples):
    agent = load_example("tool_agent")
    model, tokenizer = quick_examples
    question = next(iter(agent.KNOWN_ANSWERS))  # the --quick question
    run = agent.run_agent(model, tokenizer, question, max_steps=2, max_new_tokens=64)
    assert run.answer is not None and run.steps[-1].call["name"] == "final_answer"  # forced on the last step
    assert run.steps[0].call["name"] == "calculator" and agent.is_right(question, run.answer), run.steps
    parameters = {t["function"]["name"]: t["function"]["parameters"] for t in agent.TOOLS}
    for step in run.steps:
        jsonschema.validate(step.call["arguments"], parameters[step.call["name"]])
        assert (step.result is None) == (step.call["name"] == "final_answer")
    roles = [m["role"] for m in run.messages]
    assert roles[0] == "user" and roles[1:] == ["assistant", "tool"] * (len(run.steps) - 1) + ["assistant"]
    for step, message in zip(run.steps, run.messages[2::2]):  # every result went back into the conversation
        assert json.loads(message["content"]) == step.result


# --- extraction, streaming, side by side -------------------------------------------------


@pytest.mark.slow
def test_extraction_into_pydantic(quick_examples, capsys):
    example = load_example("extract_pydantic")
    assert example.main([]) == 0  # a complete, valid Contact
    out = capsys.readouterr().out
    assert "Contact(name=" in out and "finish: stop" in out


@pytest.mark.slow
def test_streaming_delivers_every_committed_token(quick_examples):
    example = load_example("streaming")
    model, tokenizer = quick_examples
    seen: list[str] = []
    printer, text, stats = example.stream_tokens(model, tokenizer, max_new_tokens=48, write=seen.append)
    assert "".join(printer.pieces) == text and "".join(seen) == text + "\n"
    assert 2 <= len(printer.pieces) <= stats.new_tokens  # pieces arrive as tokens are committed
    chunks, chunk_stats = example.stream_chunks(model, tokenizer, max_new_tokens=48)
    assert "".join(chunks) == text and chunk_stats.new_tokens == stats.new_tokens  # greedy: the same output


@pytest.mark.slow
def test_side_by_side_outputs_are_identical(quick_examples, capsys):
    example = load_example("side_by_side")
    assert example.main([]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("tool call ")]
    assert [row[2] for row in rows] == ["plain", "auto"]
    assert all(row[-2] == "yes" for row in rows), out  # speculation changed nothing
    assert "diverged" not in out


# --- the demo (make demo) ----------------------------------------------------------------------


def test_demo_help_works(capsys):
    demo = load_example("demo")
    with pytest.raises(SystemExit) as exit_:
        demo.main(["--help"])
    assert exit_.value.code == 0 and "speedup" in capsys.readouterr().out


@pytest.mark.slow
def test_demo_shows_a_complete_valid_answer_and_the_speedup(quick_examples, capsys):
    demo = load_example("demo")
    assert demo.main([]) == 0
    out = capsys.readouterr().out
    assert "complete and schema-valid: True (finish: stop)" in out
    answer = json.loads(out.split("\n=== speculative (assistant='auto')\n", 1)[1].split("\ncomplete and")[0])
    jsonschema.validate(answer, demo.SCHEMA)
    assert answer == demo.EXPECTED  # right, not only schema-valid: the model reads this notice correctly
    assert "'schema-valid' means the JSON follows the schema, not that its values are right" in out
    assert "all 6 fields are right" in out
    assert "identical output: True" in out and "x faster" in out


# --- the README and the tool agent: what "valid" means -------------------------------------------------------------


def test_the_readme_says_what_valid_means_and_that_text_streamers_burst():
    readme = " ".join((EXAMPLES.parent / "README.md").read_text().split())
    assert '**"Valid" means schema-valid**' in readme and "does not mean the values are right" in readme
    assert "TextIteratorStreamer" in readme and "arrives in bursts" in readme and "examples/streaming.py" in readme
    assert "class TokenPrinter(BaseStreamer)" in (EXAMPLES / "streaming.py").read_text()


@pytest.mark.slow
def test_the_tool_agent_quick_run_is_right_and_says_valid_is_not_correct(quick_examples, capsys):
    agent = load_example("tool_agent")
    assert agent.main([]) == 0
    out = capsys.readouterr().out
    assert "question: Calculate 17 * 23." in out and "calculator(" in out and "get_weather(" not in out
    assert "answer:" in out and "391" in out.split("answer:")[1]
    assert "schema-valid (right tool and right answer are another matter): the answer is right" in out
