"""Greedy parity with Hugging Face for generation settings, on the embedded SmolLM2:
grammarspec (assistant none, "auto", a draft model) == ``model.generate`` + xgrammar's HF processor + the
same setting, token for token.  (The tiny-model version of every setting is tests/api/test_hf_settings.py.)"""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch
import xgrammar as xgr
from xgrammar.contrib.hf import LogitsProcessor

import grammarspec
from grammars import grammar_spec
from tests.toy_models import tiny_llama

pytestmark = pytest.mark.slow

MAX_NEW = 32
SETTINGS = {
    "repetition_penalty": {"repetition_penalty": 1.5},
    "repetition_penalty_mild": {"repetition_penalty": 1.15},
    "sequence_bias": None,  # -3 on the most frequent token of the plain output (chosen per task)
}
# (no_repeat_ngram_size bans grammar-forced JSON keys here: Hugging Face then emits token 0 and xgrammar's
# processor fails; tests/api/test_hf_settings.py covers it where Hugging Face's run is defined)


def first_of_each_kind(tasks, n=2):
    seen, chosen = set(), []
    for task in tasks:
        if task["kind"] not in seen and task.get("schema"):
            seen.add(task["kind"])
            chosen.append(task)
    return chosen[:n]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_greedy_parity_with_hf_generate_on_smollm2(smol, tasks, setting):
    model, tokenizer = smol
    draft = tiny_llama(model.config.vocab_size, seed=5)
    draft.config.bos_token_id, draft.config.eos_token_id = model.config.bos_token_id, model.config.eos_token_id
    info = xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=model.config.vocab_size, stop_token_ids=[tokenizer.eos_token_id]
    )
    compiler = xgr.GrammarCompiler(info)
    differs = False
    for task in first_of_each_kind(tasks):
        schema = grammar_spec(schema=task["schema"]).schema
        prompt = grammarspec.build_prompt(tokenizer, task["prompt"], system=task.get("system"), schema=schema)
        ids = torch.tensor([prompt])
        compiled = compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"))
        plain = grammarspec.generate(model, ids, tokenizer=tokenizer, schema=schema, max_new_tokens=MAX_NEW)
        settings = SETTINGS[setting]
        if settings is None:
            frequent = Counter(plain[0, len(prompt) :].tolist()).most_common(1)[0][0]
            settings = {"sequence_bias": {(frequent,): -3.0}}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hf = model.generate(
                ids, max_new_tokens=MAX_NEW, do_sample=False, logits_processor=[LogitsProcessor(compiled)], **settings
            )[0, len(prompt) :].tolist()
        differs |= plain[0, len(prompt) :].tolist()[: len(hf)] != hf
        for assistant in (None, "auto", draft):
            out = grammarspec.generate(
                model, ids, tokenizer=tokenizer, schema=schema, max_new_tokens=MAX_NEW, assistant=assistant, **settings
            )
            assert out[0, len(prompt) :].tolist()[: len(hf)] == hf, f"{task['id']}: assistant={assistant!r}"
    assert differs, f"{setting} changed nothing on these tasks: the parity would be vacuous"
