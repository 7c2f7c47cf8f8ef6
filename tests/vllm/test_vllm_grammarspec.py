"""grammarspec's proposer inside vLLM on the embedded model: valid JSON, greedy parity, vLLM's counters.

One module, two engines started once each: vLLM without speculation (the reference outputs), then
vLLM with ``speculative_config=grammarspec.vllm.speculative_config(8)``.  Five requests go in
together: three schemas, one cut by ``max_tokens`` and one by a stop string in the middle of a draft.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

import grammarspec.vllm as gsv
from grammarspec import build_prompt
from grammarspec.model.loading import load_tokenizer
from grammarspec.vllm.engine import make_llm, spec_decode_counts

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "born": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "born", "city"],
    "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                "required": ["sku", "qty"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["items"],
    "additionalProperties": False,
}
CALL = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}

PERSON_TEXT = "Ada Lovelace was born in 1815 in London. Extract name, born and city as JSON."
ORDER_TEXT = "Order: 3 x SKU-1182 (blue mugs), 12 x SKU-2209 (napkins). Extract the items as JSON."
CALL_TEXT = "What is the weather in Oslo, in celsius? Call get_weather."
#: (name, prompt, schema, max_tokens, stop strings)
REQUESTS = [
    ("person", PERSON_TEXT, PERSON, 64, None),
    ("order", ORDER_TEXT, ORDER, 96, None),
    ("call", CALL_TEXT, CALL, 64, None),
    ("person-cut", PERSON_TEXT, PERSON, 7, None),  # ends by length while a draft runs ahead
    ("order-stop", ORDER_TEXT, ORDER, 96, ['"qty"']),  # a stop string inside what a draft covers
]


def _generate(llm, tokenizer):
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    prompts, params = [], []
    for _, text, schema, max_tokens, stop in REQUESTS:
        prompts.append({"prompt_token_ids": build_prompt(tokenizer, text, schema=schema)})
        params.append(
            SamplingParams(
                temperature=0, max_tokens=max_tokens, stop=stop, structured_outputs=StructuredOutputsParams(json=schema)
            )
        )
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return {name: out.outputs[0] for (name, *_), out in zip(REQUESTS, outputs)}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def reference(tokenizer):
    """Outputs of vLLM without speculation (the engine is shut down afterwards)."""
    llm = make_llm(gsv.model_path(), None)
    try:
        return _generate(llm, tokenizer)
    finally:
        llm.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="module")
def speculative(reference, tokenizer):
    """``(llm, outputs, counters)`` with grammarspec's proposer."""
    llm = make_llm(gsv.model_path(), gsv.speculative_config(8))
    before = spec_decode_counts(llm)
    outputs = _generate(llm, tokenizer)
    after = spec_decode_counts(llm)
    yield llm, outputs, {k: after[k] - before[k] for k in after}
    llm.llm_engine.engine_core.shutdown()


def test_structured_outputs_with_our_proposer_are_valid_json(speculative):
    _, outputs, _ = speculative
    for name, _, schema, _, _ in REQUESTS[:3]:
        assert outputs[name].finish_reason == "stop", (name, outputs[name].text)
        jsonschema.validate(json.loads(outputs[name].text), schema)


def test_greedy_outputs_identical_to_vllm_without_speculation(speculative, reference):
    _, outputs, _ = speculative
    for name, *_ in REQUESTS:
        assert list(outputs[name].token_ids) == list(reference[name].token_ids), name
        assert outputs[name].finish_reason == reference[name].finish_reason, name


def test_requests_that_end_mid_draft(speculative, reference):
    _, outputs, _ = speculative
    assert outputs["person-cut"].finish_reason == "length" and len(outputs["person-cut"].token_ids) == 7
    stopped = outputs["order-stop"]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == '"qty"'
    assert '"qty"' not in stopped.text and stopped.text == reference["order-stop"].text


def test_vllm_counts_drafts_and_accepted_tokens_from_our_proposer(speculative):
    _, outputs, counts = speculative
    assert counts["drafts"] > 0 and counts["draft_tokens"] >= counts["drafts"]
    assert 0 < counts["accepted_tokens"] <= counts["draft_tokens"]
    new = sum(len(o.token_ids) for o in outputs.values())
    assert counts["accepted_tokens"] < new  # every step adds one token of the target's own


def test_per_request_states_dropped_when_requests_end(speculative, tokenizer):
    llm, _, _ = speculative
    drafter = _drafter(llm)
    assert isinstance(drafter, gsv.GrammarspecProposer)
    assert drafter.runner is not None  # found on the stack: states keyed by request id, schemas reachable
    assert drafter.drafts > 0 and drafter.grammar_drops == 0 and drafter.errors == 0
    # dropped at their last step (stop token, max_tokens); the stop-string request when it left the runner
    assert set(drafter.states) <= {req_id for req_id in drafter.states if req_id not in drafter.runner.requests}
    assert len(drafter.states) <= 1
    _generate_one(llm, tokenizer)
    assert drafter.states == {}


def test_a_repeated_request_drafts_from_earlier_outputs_and_ends_at_its_stop_token(speculative, reference, tokenizer):
    """The "call" request again: the index of earlier outputs (on unless GRAMMARSPEC_DRAFT_MEMORY_MB=0) drafts
    its answer, stop token included; vLLM appends a token of its own after an accepted stop token (no output)."""
    llm, _, _ = speculative
    drafter = _drafter(llm)
    output = _generate_one(llm, tokenizer)
    assert list(output.token_ids) == list(reference["call"].token_ids)
    assert drafter.grammar_drops == 0 and drafter.errors == 0 and drafter.states == {}


def _generate_one(llm, tokenizer):
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    prompt = {"prompt_token_ids": build_prompt(tokenizer, CALL_TEXT, schema=CALL)}
    params = SamplingParams(temperature=0, max_tokens=64, structured_outputs=StructuredOutputsParams(json=CALL))
    output = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    assert output.finish_reason == "stop"
    return output


def _drafter(llm):
    """The proposer vLLM built (in-process engine: VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    core = llm.llm_engine.engine_core
    core = getattr(core, "engine_core", core)
    executor = core.model_executor
    worker = getattr(executor, "driver_worker", None)
    worker = getattr(worker, "worker", worker)
    if worker is None:
        pytest.fail(f"cannot reach vLLM's worker through {type(executor).__name__}; is multiprocessing off?")
    return worker.model_runner.drafter
