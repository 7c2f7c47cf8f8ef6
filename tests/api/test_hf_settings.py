"""Faithful to ``model.generate``: every GenerationConfig field honoured (same processors, same order,
same result as Hugging Face) or refused; HF defaults; HF-shaped outputs.  Tiny random Llamas."""

from __future__ import annotations

import warnings

import pytest
import torch
import xgrammar as xgr
from transformers import GenerationConfig, LogitsProcessorList
from transformers.generation import logits_process as lp
from transformers.generation.utils import GenerateDecoderOnlyOutput
from xgrammar.contrib.hf import LogitsProcessor as XgrammarHFProcessor

import grammarspec
from grammarspec.engine.processing import build_pipeline
from grammarspec.engine.sampling import apply_bitmask
from tests.toy import toy_vocab, toy_vocab_size
from tests.toy_models import tiny_llama

V = toy_vocab_size()
VOC = toy_vocab()
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    },
    "required": ["name", "tags"],
    "additionalProperties": False,
}
PROMPTS = ["{b:1}", "name x", "hello"]
#: the prompt holds the key "name", so the no-repeat rule bans the grammar-forced key: Hugging Face then masks
#: every token and emits token 0 (a grammar-illegal EOS); see test_processors_never_leave_a_row_without_a_token
UNDEFINED_IN_HF = {("no_repeat_ngram_size", "name x")}

#: one entry per honoured processor field (values chosen so that Hugging Face's own run stays legal:
#: banned tokens never appear in the grammar-forced keys)
SETTINGS = {
    "repetition_penalty>1": {"repetition_penalty": 1.3},
    "repetition_penalty<1": {"repetition_penalty": 0.6},
    "no_repeat_ngram_size": {"no_repeat_ngram_size": 2},
    "sequence_bias": {"sequence_bias": {(VOC["x"],): 4.0}},
    "bad_words_ids": {"bad_words_ids": [[VOC["z"]], [VOC["9"], VOC["8"]]]},
    "suppress_tokens": {"suppress_tokens": [VOC["0"]]},
    "begin_suppress_tokens": {"begin_suppress_tokens": [VOC['{"']]},
    "min_new_tokens": {"min_new_tokens": 30},
    "min_length": {"min_length": 30},
    "exponential_decay_length_penalty": {"exponential_decay_length_penalty": (5, 1.5)},
    "remove_invalid_values": {"remove_invalid_values": True},
    "renormalize_logits": {"renormalize_logits": True},
    "custom_processor": {"logits_processor": [lp.RepetitionPenaltyLogitsProcessor(1.4)]},
}


@pytest.fixture(scope="module")
def compiled_xgr(tok):
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=V, stop_token_ids=[0])
    return xgr.GrammarCompiler(info).compile_json_schema(SCHEMA, any_whitespace=False, separators=(",", ":"))


def ids_of(tok, text):
    return torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])


def hf_generate(model, prompt, compiled_xgr, **kw):
    """Hugging Face generate + xgrammar's HF processor (after any user processor), greedy."""
    user = list(kw.pop("logits_processor", []))
    grammar = [XgrammarHFProcessor(compiled_xgr)] if compiled_xgr is not None else []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(prompt, do_sample=False, logits_processor=user + grammar, **kw)


# --- the pipeline is Hugging Face's ------------------------------------------------------------

FULL = dict(
    do_sample=True,
    temperature=0.7,
    top_k=20,
    top_p=0.9,
    min_p=0.05,
    typical_p=0.95,
    epsilon_cutoff=1e-4,
    eta_cutoff=1e-3,
    top_h=0.9,
    repetition_penalty=1.2,
    no_repeat_ngram_size=3,
    sequence_bias={(5,): 1.0},
    bad_words_ids=[[7, 8]],
    min_length=3,
    min_new_tokens=2,
    forced_bos_token_id=None,
    forced_eos_token_id=None,
    remove_invalid_values=True,
    exponential_decay_length_penalty=(2, 1.1),
    suppress_tokens=[9],
    begin_suppress_tokens=[10],
    renormalize_logits=True,
    max_length=40,
)


def test_processors_and_order_are_hf_own(model):
    """The same processor classes in the same order as GenerationMixin._get_logits_processor."""
    config = GenerationConfig(**FULL, eos_token_id=0)
    config._eos_token_tensor = torch.tensor([0])
    custom = lp.SuppressTokensLogitsProcessor([11])  # same type as a default: takes its place, as in HF
    extra = lp.NoRepeatNGramLogitsProcessor(5)  # replaces the default no-repeat processor
    hf = model._get_logits_processor(
        generation_config=config,
        input_ids_seq_length=4,
        logits_processor=LogitsProcessorList([custom, extra]),
        device="cpu",
        model_kwargs={},
    )
    ours = build_pipeline(config, prompt_length=4, eos_token_ids=[0], processors=[custom, extra])
    flat = [*ours.defaults, *ours.custom, *ours.warpers, *ours.final]
    assert [type(p) for p in flat] == [type(p) for p in hf]
    assert custom in flat and extra in flat


def test_pipeline_rows_equal_hf_processing_with_the_grammar_where_hf_puts_it(model):
    """Every row, with its own prefix, equals HF's list applied with a grammar mask as a custom processor."""
    g = torch.Generator().manual_seed(0)
    config = GenerationConfig(**FULL, eos_token_id=0)
    config._eos_token_tensor = torch.tensor([0])
    prompt = [3, 5, 7, 8, 5, 12]
    prefixes = [prompt + [5, 9, 7][:i] for i in range(4)]
    logits = 3 * torch.randn(4, V, generator=g)
    allowed = torch.rand(4, V, generator=g) < 0.6
    allowed[:, 0] = True  # EOS legal (the length processors act on it)

    class Mask(lp.LogitsProcessor):
        def __init__(self, row):
            self.row = row

        def __call__(self, input_ids, scores):
            return scores.masked_fill(~allowed[self.row], float("-inf"))

    bitmask = torch.zeros(4, (V + 31) // 32, dtype=torch.int32)
    for r in range(4):
        for t in allowed[r].nonzero().flatten().tolist():
            bitmask[r, t // 32] |= 1 << (t % 32)
    pipeline = build_pipeline(config, prompt_length=len(prompt), eos_token_ids=[0])
    ours = pipeline(apply_bitmask(logits, bitmask), prefixes)
    for r in range(4):
        hf = model._get_logits_processor(
            generation_config=config,
            input_ids_seq_length=len(prompt),
            logits_processor=LogitsProcessorList([Mask(r)]),
            device="cpu",
            model_kwargs={},
        )
        expected = hf(torch.tensor([prefixes[r]]), logits[r : r + 1].clone())[0]
        assert torch.equal(torch.isneginf(ours[r]), torch.isneginf(expected)), f"row {r}: different tokens kept"
        finite = torch.isfinite(expected)
        assert torch.allclose(ours[r][finite], expected[finite], atol=1e-5), f"row {r}"


# --- greedy parity with model.generate, per honoured setting, every assistant --------------------


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_greedy_parity_with_hf_generate_per_setting(model, tok, compiled_xgr, setting):
    draft = tiny_llama(V, seed=3)
    for text in PROMPTS:
        if (setting, text) in UNDEFINED_IN_HF:
            continue
        prompt = ids_of(tok, text)
        hf = hf_generate(model, prompt, compiled_xgr, max_new_tokens=40, **SETTINGS[setting])
        for assistant in (None, "auto", draft):
            ours = grammarspec.generate(
                model, prompt, tokenizer=tok, schema=SCHEMA, max_new_tokens=40, assistant=assistant, **SETTINGS[setting]
            )
            assert ours[0].tolist()[: hf.shape[1]] == hf[0].tolist(), f"{text!r}, assistant={assistant!r}"


@pytest.mark.parametrize(
    "setting",
    [
        "repetition_penalty>1",
        "no_repeat_ngram_size",
        "min_new_tokens",
        "exponential_decay_length_penalty",
        "bad_words_ids",
    ],
)
def test_unconstrained_greedy_parity_with_hf_generate(model, tok, setting):
    draft = tiny_llama(V, seed=3)
    for text in PROMPTS:
        prompt = ids_of(tok, text)
        hf = hf_generate(model, prompt, None, max_new_tokens=30, eos_token_id=0, **SETTINGS[setting])
        for assistant in (None, "prompt_lookup", draft):
            ours = grammarspec.generate(
                model, prompt, max_new_tokens=30, eos_token_id=0, assistant=assistant, **SETTINGS[setting]
            )
            assert ours[0].tolist()[: hf.shape[1]] == hf[0].tolist(), f"{text!r}, assistant={assistant!r}"


def test_processors_never_leave_a_row_without_a_token(model, tok, compiled_xgr):
    """Where HF's processors ban every token the grammar allows, HF emits token 0; grammarspec keeps the
    grammar-masked row, so every assistant gives the same valid document."""
    import json

    prompt = ids_of(tok, "name x")
    hf = hf_generate(model, prompt, compiled_xgr, max_new_tokens=60, no_repeat_ngram_size=2)
    assert 0 in hf[0, prompt.shape[1] :].tolist()[:5]  # HF's undefined case (a premature, illegal EOS)
    outs = [
        grammarspec.generate(
            model,
            prompt,
            tokenizer=tok,
            schema=SCHEMA,
            max_new_tokens=60,
            assistant=a,
            no_repeat_ngram_size=2,
            return_dict_in_generate=True,
        )
        for a in (None, "auto", tiny_llama(V, seed=3))
    ]
    assert all(torch.equal(o.sequences, outs[0].sequences) for o in outs)
    if outs[0].stats[0].finish_reason == "stop":
        json.loads(tok.decode(outs[0].sequences[0, prompt.shape[1] :].tolist(), skip_special_tokens=True))


def test_settings_change_the_output(model, tok):
    """The parity above is not vacuous: each setting changes the output on at least one prompt."""
    for setting, kw in SETTINGS.items():
        if setting in (
            "remove_invalid_values",
            "renormalize_logits",
            "min_length",
            "min_new_tokens",
            "begin_suppress_tokens",
            "exponential_decay_length_penalty",
        ):
            continue  # no visible effect on these prompts (checked in the pipeline test instead)
        changed = False
        for text in PROMPTS:
            prompt = ids_of(tok, text)
            base = grammarspec.generate(model, prompt, tokenizer=tok, schema=SCHEMA, max_new_tokens=40)
            out = grammarspec.generate(model, prompt, tokenizer=tok, schema=SCHEMA, max_new_tokens=40, **kw)
            changed |= not torch.equal(base, out)
        assert changed, setting


def test_min_new_tokens_and_length_penalty_act_on_eos(model, tok):
    """An integer can end after any digit: min_new_tokens delays EOS, the length penalty hastens it (as HF)."""
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=V, stop_token_ids=[0])
    integer = xgr.GrammarCompiler(info).compile_json_schema({"type": "integer"})
    prompt = ids_of(tok, "n")
    lengths = {}
    for name, kw in {
        "plain": {},
        "min_new": {"min_new_tokens": 6},
        "decay": {"exponential_decay_length_penalty": (0, 4.0)},
    }.items():
        hf = hf_generate(model, prompt, integer, max_new_tokens=12, **kw)
        ours = grammarspec.generate(
            model,
            prompt,
            tokenizer=tok,
            schema={"type": "integer"},
            max_new_tokens=12,
            assistant="auto",
            return_dict_in_generate=True,
            **kw,
        )
        assert ours.sequences[0].tolist()[: hf.shape[1]] == hf[0].tolist(), name
        lengths[name] = ours.stats[0].new_tokens
    assert lengths["min_new"] >= 6 and lengths["min_new"] != lengths["plain"] or lengths["plain"] >= 6
    assert lengths["decay"] <= lengths["plain"]


# --- defaults and the model's own generation_config ------------------------------------------------


def test_default_length_is_hf_default_with_its_warning(model, tok):
    prompt = ids_of(tok, "hello")
    with pytest.warns(UserWarning, match="max_length"):
        ours = grammarspec.generate(model, prompt, eos_token_id=0, assistant="prompt_lookup")
    hf = hf_generate(model, prompt, None, eos_token_id=0)
    assert ours.shape[1] > prompt.shape[1]  # the 20-token default writes new tokens
    assert torch.equal(ours, hf)
    with pytest.raises(ValueError, match="max_length"):
        grammarspec.generate(model, prompt, max_length=prompt.shape[1])  # an explicit max_length counts the prompt


def test_model_generation_config_is_applied(tok):
    model = tiny_llama(V, seed=0)
    prompt = ids_of(tok, "{b:1}")
    base = grammarspec.generate(model, prompt, tokenizer=tok, schema=SCHEMA, max_new_tokens=40)
    model.generation_config.repetition_penalty = 1.3  # many released models ship one
    hf = model.generate(prompt, max_new_tokens=40, logits_processor=[])  # unconstrained reference below
    ours = grammarspec.generate(model, prompt, tokenizer=tok, schema=SCHEMA, max_new_tokens=40, assistant="auto")
    assert not torch.equal(ours, base)
    explicit = grammarspec.generate(
        tiny_llama(V, seed=0), prompt, tokenizer=tok, schema=SCHEMA, max_new_tokens=40, repetition_penalty=1.3
    )
    assert torch.equal(ours, explicit)
    assert torch.equal(grammarspec.generate(model, prompt, max_new_tokens=40), hf)


def test_sampling_default_top_k_is_hf_50(model, tok):
    """do_sample=True alone samples with HF's top_k=50 (the global default), not the full vocabulary."""
    from grammarspec.settings import resolve_config

    config, _, _ = resolve_config(model, None, {"do_sample": True})
    pipeline = build_pipeline(config, prompt_length=3)
    assert any(isinstance(w, lp.TopKLogitsWarper) and w.top_k == 50 for w in pipeline.warpers)


# --- refused settings ---------------------------------------------------------------------------

REFUSED = {
    "num_beams": {"num_beams": 3},
    "num_beam_groups": {"num_beams": 4, "num_beam_groups": 2, "diversity_penalty": 0.5},
    "penalty_alpha": {"penalty_alpha": 0.6, "top_k": 4},
    "guidance_scale": {"guidance_scale": 1.5},
    "force_words_ids": {"force_words_ids": [[5]], "num_beams": 2},
    "dola_layers": {"dola_layers": "high"},
    "prompt_lookup_num_tokens": {"prompt_lookup_num_tokens": 5},
    "num_assistant_tokens": {"num_assistant_tokens": 7},
    "assistant_confidence_threshold": {"assistant_confidence_threshold": 0.2},
    "watermarking_config": {"watermarking_config": {"bias": 2.0}},
    "output_attentions": {"output_attentions": True},
    "max_time": {"max_time": 1.0},
    "cache_implementation": {"cache_implementation": "static"},
    "negative_prompt_ids": {"negative_prompt_ids": torch.tensor([[1]])},
    "prefix_allowed_tokens_fn": {"prefix_allowed_tokens_fn": lambda b, ids: [0]},
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_settings_speculation_cannot_honour_are_refused(model, tok, name):
    with pytest.raises(ValueError, match=f"cannot honour.*{name}"):
        grammarspec.generate(
            model,
            ids_of(tok, "{b:1}"),
            tokenizer=tok,
            schema=SCHEMA,
            max_new_tokens=5,
            assistant="auto",
            **REFUSED[name],
        )


def test_refused_setting_from_the_model_config_is_refused_too(tok):
    model = tiny_llama(V, seed=0)
    model.generation_config.num_beams = 2
    with pytest.raises(ValueError, match="num_beams"):
        grammarspec.generate(model, ids_of(tok, "{b:1}"), tokenizer=tok, schema=SCHEMA, max_new_tokens=5)


def test_stateful_grammar_processor_is_refused(model, tok, compiled_xgr):
    with pytest.raises(ValueError, match="schema="):
        grammarspec.generate(
            model,
            ids_of(tok, "{b:1}"),
            tokenizer=tok,
            max_new_tokens=5,
            assistant="auto",
            logits_processor=[XgrammarHFProcessor(compiled_xgr)],
        )

    class Marked:
        stateful = True

        def __call__(self, input_ids, scores):
            return scores

    with pytest.raises(ValueError, match="stateful"):
        grammarspec.generate(model, ids_of(tok, "{b:1}"), max_new_tokens=5, logits_processor=[Marked()])


# --- num_return_sequences, scores, HF-shaped results -------------------------------------------------


def test_num_return_sequences_samples_independent_rows(model, tok):
    import json

    prompt = ids_of(tok, "{b:1}")
    out = grammarspec.generate(
        model,
        prompt,
        tokenizer=tok,
        schema=SCHEMA,
        max_new_tokens=60,
        do_sample=True,
        num_return_sequences=3,
        assistant="auto",
        return_dict_in_generate=True,
        generator=torch.Generator().manual_seed(1),
    )
    assert out.sequences.shape[0] == 3 and len(out.stats) == 3
    texts = []
    for row, stats in zip(out.sequences, out.stats):
        assert row[: prompt.shape[1]].tolist() == prompt[0].tolist()
        text = tok.decode(row[prompt.shape[1] :][: stats.new_tokens].tolist(), skip_special_tokens=True)
        if stats.finish_reason == "stop":
            json.loads(text)
        texts.append(text)
    assert len(set(texts)) > 1, texts
    with pytest.raises(ValueError, match="num_return_sequences"):
        grammarspec.generate(model, prompt, tokenizer=tok, schema=SCHEMA, max_new_tokens=5, num_return_sequences=2)


@pytest.mark.parametrize("assistant", [None, "auto"])
def test_output_scores_and_logits_are_hf_ones(model, tok, compiled_xgr, assistant):
    prompt = ids_of(tok, "name x")
    kw = dict(
        max_new_tokens=30, repetition_penalty=1.3, return_dict_in_generate=True, output_scores=True, output_logits=True
    )
    hf = hf_generate(model, prompt, compiled_xgr, **kw)
    ours = grammarspec.generate(model, prompt, tokenizer=tok, schema=SCHEMA, assistant=assistant, **kw)
    assert isinstance(ours, GenerateDecoderOnlyOutput)
    assert torch.equal(ours["sequences"], ours.sequences) and ours["stats"] is ours.stats
    n = ours.stats[0].new_tokens
    assert len(ours.scores) == len(ours.logits) == n
    assert ours.sequences[0].tolist()[: hf.sequences.shape[1]] == hf.sequences[0].tolist()
    for step in range(min(n, len(hf.scores))):
        a, b = ours.scores[step][0], hf.scores[step][0]
        assert ours.scores[step].shape == (1, V)
        assert torch.equal(torch.isneginf(a), torch.isneginf(b)), step
        assert torch.allclose(a[torch.isfinite(b)], b[torch.isfinite(b)], atol=1e-4), step
        assert torch.allclose(ours.logits[step][0], hf.logits[step][0].float(), atol=1e-4), step


# --- inputs as Hugging Face accepts them --------------------------------------------------------


def test_enable_never_forwards_grammarspec_keywords(tok):
    model = grammarspec.enable(tiny_llama(V, seed=0))
    prompt = ids_of(tok, "hello")
    plain = grammarspec.generate(model, prompt, max_new_tokens=6)
    for kw in (
        {"json_object": False},
        {"any_whitespace": True},
        {"max_draft_tokens": 4},
        {"adaptive": False},
        {"grammar_backend": "xgrammar"},
        {"parallel_tool_calls": False},
    ):
        assert torch.equal(model.generate(prompt, max_new_tokens=6, **kw), plain), kw


def test_token_type_ids_from_the_tokenizer_are_accepted(tok):
    """``model.generate(**tokenizer(...))``: all-zero token_type_ids (one segment) carry nothing and are
    accepted (Hugging Face refuses them for a model whose forward ignores them)."""
    model = grammarspec.enable(tiny_llama(V, seed=0))
    enc = {"input_ids": ids_of(tok, "hello")}
    enc["attention_mask"] = torch.ones_like(enc["input_ids"])
    hf = model._grammarspec_original_generate(**enc, max_new_tokens=6, do_sample=False)
    enc["token_type_ids"] = torch.zeros_like(enc["input_ids"])
    assert torch.equal(model.generate(**enc, max_new_tokens=6, assistant="prompt_lookup"), hf)
    assert torch.equal(grammarspec.generate(model, **enc, max_new_tokens=6), hf)
    with pytest.raises(ValueError, match="token_type_ids"):
        grammarspec.generate(model, **dict(enc, token_type_ids=torch.ones_like(enc["input_ids"])), max_new_tokens=6)


def test_default_settings_with_a_draft_model_log_no_transformers_warning(model, tok):
    """A greedy draft model builds its processing from default ``SamplingParams``: no ``top_k`` the user never set."""
    import logging

    from transformers.utils import logging as hf_logging

    class Records(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    hf_logging.warning_once.cache_clear()  # a warning an earlier test logged would otherwise not come again
    records = Records()
    root = hf_logging.get_logger("transformers")
    root.addHandler(records)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            grammarspec.generate(
                model,
                tok("hello", return_tensors="pt").input_ids,
                tokenizer=tok,
                schema=SCHEMA,
                assistant=tiny_llama(V, seed=1),
                max_new_tokens=8,
            )
    finally:
        root.removeHandler(records)
    flagged = [m for m in records.messages + [str(w.message) for w in caught] if "top_k" in m or "top_p" in m]
    assert not flagged, flagged
