"""Edge cases a user meets: bad inputs to complete() and reply(), tool_choice="none", schema=True/False, the docs' meanings.

Tiny random models with the toy tokenizer or the embedded model's tokenizer (no real model needed).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

import grammarspec
from grammars import GrammarError
from tests.toy_models import tiny_llama

ROOT = Path(__file__).resolve().parents[2]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 3}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]


@pytest.fixture(scope="module")
def chat(smol_tokenizer):
    """The embedded model's tokenizer (its chat template) over a tiny random model."""
    return tiny_llama(len(smol_tokenizer), seed=0), smol_tokenizer


# --- inputs accepted without effect / raw errors, through complete() and Conversation.reply() -------


def test_complete_and_reply_refuse_a_parallel_tool_calls_that_is_not_a_bool(chat):
    """The tools are resolved before generate's own checks run, so "yes" used to act as True."""
    model, tok = chat
    for bad in ("yes", 1):
        with pytest.raises(ValueError, match=f"parallel_tool_calls= must be True or False, got {bad!r}"):
            grammarspec.complete(
                model, tok, "Hi", tools=TOOLS, parallel_tool_calls=bad, assistant=None, max_new_tokens=4
            )
    conv = grammarspec.Conversation(model, tok, tools=TOOLS, assistant=None)
    conv.add_user("Hi")
    with pytest.raises(ValueError, match="parallel_tool_calls= must be True or False, got 'yes'"):
        conv.reply(parallel_tool_calls="yes", max_new_tokens=4)
    assert conv.messages == [{"role": "user", "content": "Hi"}] and conv.replies == []


@pytest.mark.parametrize("bad", ["8", 2.5, -1])
def test_reply_names_a_bad_max_new_tokens_and_keeps_the_conversation(chat, bad):
    model, tok = chat
    conv = grammarspec.Conversation(model, tok, assistant=None)
    conv.add_user("Hi")
    first = conv.reply(max_new_tokens=2)
    before, cached = copy.deepcopy(conv.messages), conv.cached_tokens
    with pytest.raises(ValueError, match=f"max_new_tokens must be an int >= 0, got {bad!r}"):
        conv.reply(max_new_tokens=bad)
    assert conv.messages == before and conv.cached_tokens == cached and conv.replies == [first]
    conv.add_user("Again")
    assert conv.reply(max_new_tokens=2).finish_reason in ("stop", "length")  # later turns still work


# --- tool_choice="none" in complete(): the tools are not described ------------------------------------


def test_complete_with_tool_choice_none_leaves_the_tools_out_of_the_prompt(chat, monkeypatch):
    import grammarspec.api as api

    model, tok = chat
    prompts: list[str] = []

    class Seen(Exception):
        pass

    def record(model, input_ids, constraint, **options):
        prompts.append(tok.decode(input_ids[0]))
        raise Seen

    monkeypatch.setattr(api, "run_generate", record)
    for choice in ("none", "auto"):
        with pytest.raises(Seen):
            grammarspec.complete(model, tok, "Weather?", tools=TOOLS, tool_choice=choice, assistant=None)
    none, auto = prompts
    assert "get_weather" in auto and "get_weather" not in none and "tool" not in none.lower()


# --- a schema too large to describe in the prompt ------------------------------------------------------


def test_a_schema_whose_description_fills_the_context_names_describe_false(chat):
    model, tok = chat
    context = model.config.max_position_embeddings
    schema = {"type": "object", "properties": {"code": {"enum": [f"value-{i:05d}" for i in range(20000)]}}}
    with pytest.raises(ValueError) as e:
        grammarspec.complete(model, tok, "Pick a code.", schema=schema, assistant=None, max_new_tokens=4)
    message = str(e.value)
    assert "schema's (or tools') description" in message and "describe=False" in message, message
    assert f"context is {context}" in message
    bare = grammarspec.build_prompt(tok, "Pick a code.", schema=schema, describe=False)
    assert len(bare) < 40  # without the description the prompt is the question alone
    assert "describe=False" in grammarspec.complete.__doc__ and "describe" in grammarspec.build_prompt.__doc__


# --- schema=True / schema=False end to end ------------------------------------------------------------


def test_schema_true_generates_any_json_and_schema_false_says_why(chat, model, tok):
    chat_model, chat_tok = chat
    result = grammarspec.complete(chat_model, chat_tok, "go", schema=True, assistant=None, max_new_tokens=16)
    assert result.finish_reason == "stop" and result.valid and result.has_value and result.stats.grammar_backend
    assert json.loads(result.text) == result.value
    prompt = torch.tensor([tok("{b:1}", add_special_tokens=False)["input_ids"]])
    with pytest.raises(GrammarError, match="schema=False .* no value matches.*schema=True means any JSON"):
        grammarspec.generate(model, prompt, tokenizer=tok, schema=False, max_new_tokens=4)


# --- the README: what "valid" means, and text streamers on compact JSON ------------------------------


def test_the_readme_says_what_valid_means_and_that_text_streamers_burst():
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert '**"Valid" means schema-valid**' in readme and "does not mean the values are right" in readme
    assert "TextIteratorStreamer" in readme and "arrives in bursts" in readme and "examples/streaming.py" in readme
    assert "class TokenPrinter(BaseStreamer)" in (ROOT / "examples" / "streaming.py").read_text()


# --- the tool agent's output says what "valid" means and its --quick answer is right --------------------


@pytest.mark.slow
def test_the_tool_agent_quick_run_is_right_and_says_valid_is_not_correct(smol, monkeypatch, capsys):
    import importlib.util
    import sys

    monkeypatch.setenv("GRAMMARSPEC_EXAMPLES_QUICK", "1")
    monkeypatch.setattr(grammarspec, "load_model", lambda *args, **kwargs: smol)
    spec = importlib.util.spec_from_file_location("example_tool_agent_gaps", ROOT / "examples" / "tool_agent.py")
    agent = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = agent
    spec.loader.exec_module(agent)
    assert agent.main([]) == 0
    out = capsys.readouterr().out
    assert "question: Calculate 17 * 23." in out and "calculator(" in out and "get_weather(" not in out
    assert "answer:" in out and "391" in out.split("answer:")[1]
    assert "schema-valid (right tool and right answer are another matter): the answer is right" in out
