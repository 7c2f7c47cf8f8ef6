"""Hugging Face-compatible entry points: ``generate`` and ``enable``.

``generate`` takes what ``model.generate`` takes (``input_ids``, a
``GenerationConfig`` or its fields as keyword arguments, ``streamer``,
``return_dict_in_generate``) plus the constraint (``schema=``, ``tools=``,
``grammar=``, ``regex=``, ``json_object=``) and the drafter (``assistant=`` or
Hugging Face's ``assistant_model=``).  The result equals ordinary constrained
decoding in distribution; greedy output equals constrained greedy decoding.
"""

from __future__ import annotations

import copy
import inspect
import types
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import GenerationConfig
from transformers.generation.utils import GenerateDecoderOnlyOutput

from grammars import compile_grammar
from grammars.registry import DEFAULT as DEFAULT_BACKEND
from grammarspec.constraint import Constraint
from grammarspec.drafting.assistant import draft_maker
from grammarspec.drafting.cost_model import ProfiledCost
from grammarspec.drafting.earlier_outputs import shared_index
from grammarspec.engine.decoding import DecodeConfig, decode_batch, logits_width
from grammarspec.engine.isolation import GenerationError
from grammarspec.engine.processing import check_stateless
from grammarspec.engine.row_requests import DEFAULT_MAX_DRAFT, row_request
from grammarspec.engine.row_requests import k_min as _k_min  # noqa: F401  (tools/replay_bench.py reads it here)
from grammarspec.engine.sampling import SamplingParams
from grammarspec.inputs import (
    REFUSED_ARGUMENTS,
    check_arguments,
    check_assistant,
    check_model_inputs,
    check_prompt,
    check_prompt_cache,
    eos_ids,
    needs_tokenizer,
    prompt_rows,
    refuse_arguments,
    warn_unmasked_padding,
)
from grammarspec.policy.allocation import Calibration
from grammarspec.settings import ACCEPTED_MODEL_INPUTS, max_new_tokens, resolve_config
from grammarspec.stats import GenerationStats
from grammarspec.vocabulary import check_vocabulary
from proposers.base import members
from proposers.presets import resolve_assistant
from proposers.suffix_index import SuffixIndex, resolve_index

__all__ = ["DEFAULT_MAX_DRAFT", "GenerationOutput", "enable", "check_options", "generate", "run_generate"]

#: Bytes of the index of earlier outputs that the rows of one sampled batched call share (``draft_index=None``).
GENERATE_DRAFT_BYTES = 16 << 20

#: grammarspec's own keywords: after ``enable``, a call with any of them (whatever its value) is ours.
_OUR_KWARGS = Constraint.keywords() + (
    "assistant",
    "draft_index",
    "grammar_backend",
    "max_draft_tokens",
    "adaptive",
    "generator",
    "strict",
    "compile_timeout",
    "max_batch_size",
    "update_cache",
)


@dataclass
class GenerationOutput(GenerateDecoderOnlyOutput):
    """``return_dict_in_generate=True``: Hugging Face's ``GenerateDecoderOnlyOutput`` plus ``stats``.

    Attribute and key access both work (``out.sequences``, ``out["sequences"]``).
    ``scores`` / ``logits`` (``output_scores`` / ``output_logits``): one
    ``[batch, V]`` float32 tensor per generated position, processed / raw, as
    Hugging Face returns them; positions past a row's end are ``-inf``.
    """

    stats: list[GenerationStats] | None = None  # one per row (ModelOutput fields must default to None)

    @property
    def finish_reasons(self) -> list[str]:
        return [s.finish_reason for s in self.stats or ()]


def generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor | list[int] | None = None,
    *,
    tokenizer: Any = None,
    schema: Any = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: Any = None,
    grammar: str | None = None,
    regex: str | None = None,
    json_object: bool = False,
    parallel_tool_calls: bool = False,
    any_whitespace: bool = False,
    grammar_backend: str = DEFAULT_BACKEND,
    strict: bool = False,
    compile_timeout: float | None = None,
    assistant: Any = None,
    assistant_model: torch.nn.Module | None = None,
    max_draft_tokens: int = DEFAULT_MAX_DRAFT,
    adaptive: bool = True,
    max_batch_size: int | None = None,
    generation_config: GenerationConfig | None = None,
    streamer: Any = None,
    logits_processor: list[Any] | None = None,
    attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    return_dict_in_generate: bool | None = None,
    past_key_values: Any = None,
    update_cache: bool = False,
    draft_index: Any = None,
    **generation_kwargs: Any,
) -> torch.LongTensor | GenerationOutput:
    """Constrained (optionally speculative) generation, ``model.generate``-style.

    ``assistant``: a draft model, a proposer, a list of proposers, or a preset
    name (``"auto"``, ``"prompt_lookup"``, ``"schema_ngram"``, ``"jump_forward"``,
    ``"draft_model"``, ``"none"``).  Without a constraint this is plain exact
    speculative decoding.  Generation settings are resolved as Hugging Face
    resolves them (the model's ``generation_config`` included) and applied with
    transformers' own processors to target and draft rows alike; settings that
    speculation cannot honour raise ``ValueError``.  A batch is decoded together,
    one target pass per step for every unfinished row; each row has its own grammar
    state (``schema=[...]`` gives one schema per row), draft, acceptance and finish,
    and outputs are right-padded with ``pad_token_id``.  Left-padded ``input_ids``
    with an ``attention_mask`` work as in Hugging Face.  ``max_batch_size``: at most
    that many rows decode together; the others wait and join as rows finish.
    ``past_key_values``: a prompt cache (``DynamicCache``) holding the first tokens
    of ``input_ids`` (batch 1; the transformers "re-use a prompt cache" recipe):
    only the rest is prefilled.  It is copied unless ``update_cache=True`` (then it
    is extended in place and ends holding a prefix of prompt + output).  ``num_return_sequences=n`` (sampling) repeats each prompt n times.
    ``draft_index``: with ``assistant="auto"``, rows draft from what earlier outputs of their schema wrote
    (:class:`proposers.SuffixIndex`).  ``None`` (the default): a greedy call drafts from, and adds to, the index
    its thread's greedy calls on this model share (:mod:`grammarspec.drafting.earlier_outputs`, at most
    64 MB); a sampled call's rows share a fresh one, so a seed gives the same answer whatever came before.  An
    index passed in is shared with every call given it; ``False`` turns it off.  Outputs are unchanged.
    ``tool_choice`` (with ``tools=``): ``"required"`` (the default: one call),
    ``"auto"`` (text or a call), ``"none"`` (the tools are not used) or
    ``{"type": "function", "function": {"name": ...}}``; read the calls with
    :func:`grammarspec.tool_calls.parse_tool_reply` (``complete`` does).

    A row whose own work fails (its grammar matcher or its drafter raises) ends
    alone: the other rows finish exactly as they would without it, then
    :class:`grammarspec.GenerationError` is raised naming each failed row and its
    cause (the first cause is its ``__cause__``); its ``output`` is what this call
    would have returned, each failed row holding the tokens it committed before
    it failed (``stats.finish_reason == "error"``, ``valid`` False).  Nothing is
    returned as if complete.
    """
    call = locals()
    internal = sorted({"calibration", "documents"} & set(generation_kwargs))  # Conversation's and serve's carry
    if internal:
        raise TypeError(
            f"generate() got unknown arguments: {', '.join(internal)}. Drafting records and earlier documents "
            "carry between turns inside grammarspec.Conversation and grammarspec serve; use those for a conversation."
        )
    options = {name: call[name] for name in _GENERATE_DEFAULTS}
    return run_generate(model, input_ids, Constraint.among(call), **options, **generation_kwargs)


def run_generate(
    model: torch.nn.Module, input_ids: Any, constraint: Constraint, *, streamer: Any = None, **options: Any
) -> torch.LongTensor | GenerationOutput:
    """:func:`generate` with the constraint given as one :class:`Constraint` (``complete`` and ``Conversation`` call this)."""
    try:
        return _generate(model, input_ids, constraint, streamer=streamer, **options)
    finally:
        if streamer is not None:
            streamer.end()  # always: a TextIteratorStreamer consumer would otherwise block forever


def _generate(
    model: torch.nn.Module,
    input_ids: Any,
    constraint: Constraint,
    *,
    calibration: Calibration | None = None,
    documents: Sequence[str] = (),
    **options: Any,
) -> torch.LongTensor | GenerationOutput:
    # options: generate's own keyword arguments (its defaults fill the rest) and GenerationConfig fields.
    # calibration / documents (Conversation's carry): the row starts from these survival records, updated in
    # place, and its proposer gets these earlier JSON documents (Request.documents).  Drafting policy only.
    o = types.SimpleNamespace(**{name: options.pop(name, default) for name, default in _GENERATE_DEFAULTS.items()})
    generation_kwargs = options
    refuse_arguments(generation_kwargs)
    check_arguments(
        {
            **generation_kwargs,
            "strict": o.strict,
            "adaptive": o.adaptive,
            "update_cache": o.update_cache,
            "max_draft_tokens": o.max_draft_tokens,
            "max_batch_size": o.max_batch_size,
            "compile_timeout": o.compile_timeout,
            "generator": o.generator,
            "json_object": constraint.json_object,
            "parallel_tool_calls": constraint.parallel_tool_calls,
            "any_whitespace": constraint.any_whitespace,
            "regex": constraint.regex,
        },
        o.generation_config,
    )
    if o.generation_config is not None and not isinstance(o.generation_config, GenerationConfig):
        raise ValueError(
            f"generation_config must be a transformers GenerationConfig, got {type(o.generation_config).__name__}"
        )
    check_prompt_cache(o.past_key_values)
    constraint = constraint.resolve()
    model_inputs = {k: generation_kwargs.pop(k) for k in ACCEPTED_MODEL_INPUTS if k in generation_kwargs}
    if o.return_dict_in_generate is not None:  # set beside output_scores, so transformers' flag check sees both
        generation_kwargs["return_dict_in_generate"] = o.return_dict_in_generate
    config, unknown, default_length = resolve_config(model, o.generation_config, generation_kwargs)
    unknown = {k: v for k, v in unknown.items() if k not in ("output_scores", "output_logits")}
    _refuse_unknown("generate()", unknown, "schema, tools, grammar, regex, json_object, assistant")
    check_model_inputs(model, model_inputs)
    processors = list(o.logits_processor or ())
    check_stateless(processors)
    rows, width = prompt_rows(input_ids, o.attention_mask)
    vocab = logits_width(model)
    check_prompt(model, rows, vocab)
    check_vocabulary(vocab, o.tokenizer)
    eos = eos_ids(config, o.tokenizer)
    pad_id = config.pad_token_id if config.pad_token_id is not None else getattr(o.tokenizer, "pad_token_id", None)
    warn_unmasked_padding(rows, o.attention_mask, pad_id)
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    max_new = max_new_tokens(config, width, context, default_length)
    if context is not None and width + max_new > context:
        warnings.warn(
            f"the prompt ({width} tokens) plus max_new_tokens ({max_new}) exceeds the model's context "
            f"(max_position_embeddings={context}); output past the context is unreliable",
            UserWarning,
            stacklevel=3,
        )
    repeat = int(config.num_return_sequences or 1)
    specs = [spec for spec in constraint.specs(len(rows)) for _ in range(repeat)]
    rows = [row for row in rows for _ in range(repeat)]  # HF: input_ids.repeat_interleave(n)
    compiled = _compile_rows(specs, o.tokenizer, vocab, eos, o.grammar_backend, o.strict, o.compile_timeout)
    probe = resolve_assistant(o.assistant, o.assistant_model, make_draft=draft_maker())
    for member in members(probe) if probe is not None else []:
        check_assistant(model, getattr(member, "model", None), o.tokenizer)
    if probe is not None and o.tokenizer is None and needs_tokenizer(probe):
        raise ValueError(
            f"assistant={o.assistant!r} drafts text and needs the tokenizer: pass tokenizer=... "
            "(or use assistant='none' / a draft model)"
        )
    want_dict = o.return_dict_in_generate if o.return_dict_in_generate is not None else config.return_dict_in_generate
    want_scores, want_logits = bool(want_dict and config.output_scores), bool(want_dict and config.output_logits)
    if o.streamer is not None and len(rows) > 1:
        raise ValueError("streamers support batch size 1 only, as in Hugging Face generate")
    if o.past_key_values is not None and len(rows) > 1:
        raise ValueError("past_key_values (a prompt cache) supports batch size 1 only: pass one prompt row per call")
    if calibration is not None and len(rows) > 1:  # rows decoding at once never share one
        raise ValueError("a carried calibration serves one row: pass one prompt row per call")
    # Greedy calls share one index per model and thread across calls; a sampled call's rows share a fresh one.
    if o.draft_index is None and not config.do_sample:
        suffix_index: SuffixIndex | None = shared_index(model)
    else:
        suffix_index = resolve_index(o.draft_index, GENERATE_DRAFT_BYTES if len(rows) > 1 else 0, "generate()")
    prompt_cache = (
        o.past_key_values if o.update_cache or o.past_key_values is None else copy.deepcopy(o.past_key_values)
    )
    stop_strings = _stop_strings(config)
    decode_config = DecodeConfig(
        max_new_tokens=max_new,
        sampling=SamplingParams(do_sample=bool(config.do_sample)),
        eos_token_ids=eos,
        stop_strings=stop_strings,
        record_scores=want_scores or want_logits,  # forced tokens then take a target pass: HF has a row for each
    )
    requests = [
        row_request(
            model,
            prompt,
            config,
            max_new_tokens=max_new,
            eos=eos,
            stop_strings=stop_strings,
            compiled=grammar_,
            schema=spec.schema if spec is not None else None,
            tokenizer=o.tokenizer,
            assistant=o.assistant,
            assistant_model=o.assistant_model,
            processors=processors,
            generator=o.generator,
            max_draft_tokens=o.max_draft_tokens,
            adaptive=o.adaptive,
            calibration=calibration,
            documents=documents,
            suffix_index=suffix_index,
        )
        for prompt, spec, grammar_ in zip(rows, specs, compiled)
    ]
    on_commit = None
    if o.streamer is not None:
        o.streamer.put(torch.tensor([rows[0]], dtype=torch.long, device="cpu"))  # streamers decode on the host
        on_commit = lambda index, toks: o.streamer.put(torch.tensor(toks, dtype=torch.long, device="cpu"))  # noqa: E731
    pad = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else 0)
    finished = decode_batch(
        model,
        requests,
        decode_config,
        tokenizer=o.tokenizer,
        generator=o.generator,
        pad_token_id=int(pad),
        max_batch_size=o.max_batch_size,
        prompt_cache=prompt_cache,
        on_commit=on_commit,
        pass_cost=ProfiledCost(model),  # profiled at first need, checked against this call's passes
    )
    outputs = [row.generated for row in finished]
    all_stats = [row.stats for row in finished]
    for stats, grammar_, spec, new in zip(all_stats, compiled, specs, outputs):
        if grammar_ is not None:
            grammar_stats(stats, grammar_, spec, o.tokenizer.decode(new, skip_special_tokens=True))
    scores = [row.scores for row in finished]
    raw = [row.logits for row in finished]
    sequences = _assemble(input_ids, rows, outputs, config, eos, repeat)
    result: torch.LongTensor | GenerationOutput = sequences
    if want_dict:
        # transformers annotates scores/logits as tuple[Tensor] (one entry); they hold one tensor per step, as in HF
        result = GenerationOutput(
            sequences=sequences,
            scores=_per_step(scores, vocab) if want_scores else None,  # type: ignore[arg-type]
            logits=_per_step(raw, vocab) if want_logits else None,  # type: ignore[arg-type]
            stats=all_stats,
        )
    failures = {row.index: row.failure for row in finished if row.failure is not None}
    if failures:  # never returned as if complete: the error carries the whole result
        first = failures[min(failures)]
        raise GenerationError(failures, result, rows=len(finished)) from first.error
    return result


#: generate's own keyword arguments besides the constraint, with their defaults (read off its signature).
_GENERATE_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(generate).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name not in Constraint.keywords()
}


def check_options(model: torch.nn.Module, options: dict[str, Any], where: str = "generate()") -> None:
    """Refuse ``generate`` options (not the constraint) that a call would refuse, without running it.  Pure.

    Unknown names raise ``TypeError``; bad values ``ValueError`` (see :func:`check_arguments`).
    """
    settings = {k: v for k, v in options.items() if k not in _GENERATE_DEFAULTS}
    refuse_arguments(dict(settings))
    config = options.get("generation_config")
    check_arguments(dict(options), config)
    for name in ACCEPTED_MODEL_INPUTS:
        settings.pop(name, None)
    settings = {k: v for k, v in settings.items() if k not in REFUSED_ARGUMENTS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the call itself warns where Hugging Face would
        _, unknown, _ = resolve_config(model, config, settings)
    unknown = {k: v for k, v in unknown.items() if k not in ("output_scores", "output_logits")}
    _refuse_unknown(where, unknown, "assistant, max_draft_tokens, grammar_backend")


def _refuse_unknown(where: str, unknown: Mapping[str, Any], ours: str) -> None:
    """A ``TypeError`` naming ``unknown`` arguments and what ``where`` takes instead (``ours``: our own examples)."""
    if unknown:
        raise TypeError(
            f"{where} got unknown arguments: {', '.join(sorted(unknown))}. Pass GenerationConfig fields "
            f"(max_new_tokens, do_sample, temperature, top_k, top_p, stop_strings, ...) or grammarspec's own "
            f"({ours}, ...)."
        )


def enable(model: torch.nn.Module) -> torch.nn.Module:
    """Route ``model.generate(...)`` through grammarspec when asked to.

    After ``enable(model)``, a call with any of grammarspec's own keywords
    (``schema=``, ``tools=``, ``grammar=``, ``regex=``, ``json_object=``,
    ``any_whitespace=``, ``assistant=``, ``max_draft_tokens=``, ... -- whatever
    their value, so none ever reaches Hugging Face) or with ``assistant_model=``
    runs :func:`generate`; any other call goes to the original ``generate``.
    Returns ``model`` (changed in place; idempotent).
    """
    if getattr(model, "_grammarspec_original_generate", None) is not None:
        return model
    hf: Any = model  # a Hugging Face model: its generate is no nn.Module attribute
    original = hf.generate

    def patched(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if any(name in kwargs for name in _OUR_KWARGS) or kwargs.get("assistant_model") is not None:
            if args:
                if "input_ids" in kwargs or "inputs" in kwargs:
                    raise TypeError("generate() got input_ids both positionally and by keyword")
                kwargs["input_ids"] = args[0]
                if len(args) > 1:
                    raise TypeError("pass generate's options by keyword when using grammarspec")
            if "inputs" in kwargs:
                kwargs["input_ids"] = kwargs.pop("inputs")
            return generate(self, **kwargs)
        return original(*args, **kwargs)

    hf._grammarspec_original_generate = original
    hf.generate = types.MethodType(patched, model)
    return model


# --- outputs and helpers -----------------------------------------------------------


def grammar_stats(stats: GenerationStats, compiled: Any, spec: Any, text: str) -> None:
    """Record the backend, its reason and what it leaves unenforced, and whether ``text`` is valid.  Changes ``stats``."""
    from grammars.validation import output_errors

    stats.grammar_backend = compiled.backend
    stats.backend_reason = compiled.backend_reason
    stats.unenforced_keywords = list(compiled.unenforced)
    if stats.finish_reason == "stop":
        stats.schema_errors = output_errors(spec, text)
        stats.valid = not stats.schema_errors
    else:
        stats.valid = False
        stats.schema_errors = [
            f"the output ended with finish_reason {stats.finish_reason!r} before the grammar completed"
        ]


def _compile_rows(
    specs: list[Any],
    tokenizer: Any,
    vocab: int,
    eos: tuple[int, ...],
    backend: str,
    strict: bool,
    compile_timeout: float | None,
) -> list[Any]:
    """One compiled grammar per row (rows with the same constraint share it); ``None`` for unconstrained rows."""
    if all(spec is None for spec in specs):
        return [None] * len(specs)
    if tokenizer is None:
        raise ValueError("a constrained generate needs the tokenizer: pass tokenizer=...")
    compiled: list[Any] = []
    for i, spec in enumerate(specs):
        same = next(j for j in range(i + 1) if specs[j] == spec)
        compiled.append(
            compiled[same]
            if same < i
            else compile_grammar(
                spec,
                tokenizer,
                vocab_size=vocab,
                stop_token_ids=eos,
                backend=backend,
                strict=strict,
                compile_timeout=compile_timeout,
            )
            if spec is not None
            else None
        )
    return compiled


def _per_step(rows: list[list[torch.Tensor]], vocab: int) -> tuple[torch.Tensor, ...]:
    """Per-row lists of ``[V]`` rows -> one ``[batch, V]`` tensor per generated position (``-inf`` past a row's end)."""
    steps = max((len(r) for r in rows), default=0)
    out = []
    for j in range(steps):
        step = torch.full((len(rows), vocab), float("-inf"), device="cpu")  # scores are returned on the host
        for i, r in enumerate(rows):
            if j < len(r):
                step[i, : r[j].shape[-1]] = r[j].cpu()
        out.append(step)
    return tuple(out)


def _stop_strings(config: GenerationConfig) -> tuple[str, ...]:
    stops = getattr(config, "stop_strings", None)
    if not stops:
        return ()
    return (stops,) if isinstance(stops, str) else tuple(stops)


def _assemble(
    input_ids: Any,
    rows: list[list[int]],
    outputs: list[list[int]],
    config: GenerationConfig,
    eos: tuple[int, ...],
    repeat: int = 1,
) -> torch.LongTensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    ids = ids.repeat_interleave(repeat, dim=0)
    pad = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else 0)
    width = max(len(o) for o in outputs)
    new = torch.full((ids.shape[0], width), int(pad), dtype=torch.long, device="cpu")
    for i, out in enumerate(outputs):
        new[i, : len(out)] = torch.tensor(out, dtype=torch.long, device="cpu")
    # on the caller's device, as they passed input_ids; a long tensor (torch's ops are typed as returning Tensor)
    return cast(torch.LongTensor, torch.cat([ids, new.to(ids.device)], dim=1))
