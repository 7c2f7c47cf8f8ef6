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
import types
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig

from grammars import compile_grammar, grammar_spec
from proposers.base import Request
from proposers.presets import resolve_assistant

from .adaptive import AdaptiveController
from .decoding import DecodeConfig, decode, logits_width
from .sampling import SamplingParams
from .stats import GenerationStats

__all__ = ["generate", "enable", "GenerationOutput", "DEFAULT_MAX_DRAFT"]

#: Longest proposal by default: verifying 16 tokens costs ~1.7x one step on CPU.
DEFAULT_MAX_DRAFT = 16

_OUR_KWARGS = (
    "schema", "tools", "grammar", "regex", "json_object", "parallel_tool_calls",
    "assistant", "assistant_model", "grammar_backend",
)  # fmt: skip


@dataclass
class GenerationOutput:
    """``return_dict_in_generate=True``: the sequences and what it took to make them."""

    sequences: torch.LongTensor  # [batch, prompt + new]
    stats: list[GenerationStats]  # one per row

    @property
    def finish_reasons(self) -> list[str]:
        return [s.finish_reason for s in self.stats]


def generate(
    model: torch.nn.Module,
    input_ids: torch.LongTensor | list[int] | None = None,
    *,
    tokenizer: Any = None,
    schema: Any = None,
    tools: list[dict[str, Any]] | None = None,
    grammar: str | None = None,
    regex: str | None = None,
    json_object: bool = False,
    parallel_tool_calls: bool = False,
    any_whitespace: bool = False,
    grammar_backend: str = "xgrammar",
    assistant: Any = None,
    assistant_model: torch.nn.Module | None = None,
    max_draft_tokens: int = DEFAULT_MAX_DRAFT,
    adaptive: bool = True,
    generation_config: GenerationConfig | None = None,
    streamer: Any = None,
    logits_processor: list[Any] | None = None,
    attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    return_dict_in_generate: bool | None = None,
    past_key_values: Any = None,
    update_cache: bool = False,
    **generation_kwargs: Any,
) -> torch.LongTensor | GenerationOutput:
    """Constrained (optionally speculative) generation, ``model.generate``-style.

    ``assistant``: a draft model, a proposer, a list of proposers, or a preset
    name (``"auto"``, ``"prompt_lookup"``, ``"schema_ngram"``, ``"jump_forward"``,
    ``"draft_model"``, ``"none"``).  Without a constraint this is plain exact
    speculative decoding.  Batches are decoded row by row, each with its own
    grammar state and acceptance; outputs are right-padded with ``pad_token_id``.
    ``past_key_values``: a prompt cache (``DynamicCache``) holding the first
    tokens of ``input_ids`` (batch 1); only the rest is prefilled.  It is
    copied unless ``update_cache=True`` (then it is extended in place).
    """
    config = _generation_config(model, generation_config, generation_kwargs)
    rows = _prompt_rows(input_ids, attention_mask)
    sampling = _sampling_params(config)
    eos = _eos_ids(config, tokenizer)
    max_new = _max_new_tokens(config, max(len(r) for r in rows))
    spec = grammar_spec(
        schema=schema, tools=tools, grammar=grammar, regex=regex, json_object=json_object,
        parallel_tool_calls=parallel_tool_calls, any_whitespace=any_whitespace,
    )  # fmt: skip
    vocab = logits_width(model)
    compiled = None
    if spec is not None:
        if tokenizer is None:
            raise ValueError("a constrained generate needs the tokenizer: pass tokenizer=...")
        compiled = compile_grammar(spec, tokenizer, vocab_size=vocab, stop_token_ids=eos, backend=grammar_backend)
    probe = resolve_assistant(assistant, draft_model=assistant_model)
    for member in getattr(probe, "proposers", None) or [probe]:
        _check_assistant(model, getattr(member, "model", None), tokenizer)
    if max_draft_tokens < 1:
        raise ValueError(f"max_draft_tokens must be >= 1, got {max_draft_tokens}")
    decode_config = DecodeConfig(
        max_new_tokens=max_new,
        sampling=sampling,
        eos_token_ids=eos,
        min_new_tokens=int(config.min_new_tokens or 0),
        stop_strings=_stop_strings(config),
    )
    if streamer is not None and len(rows) > 1:
        raise ValueError("streamers support batch size 1 only, as in Hugging Face generate")
    if past_key_values is not None and len(rows) > 1:  # conv17: a user's prompt cache
        raise ValueError("past_key_values supports batch size 1 only: pass one prompt row per call")
    outputs: list[list[int]] = []
    all_stats: list[GenerationStats] = []
    for prompt in rows:
        proposer = resolve_assistant(assistant, draft_model=assistant_model)
        controller = None
        if proposer is not None:
            controller = AdaptiveController(k_min=_k_min(proposer, max_draft_tokens), k_max=max_draft_tokens, adaptive=adaptive)
            proposer.start(
                Request(
                    prompt_ids=tuple(prompt),
                    tokenizer=tokenizer,
                    schema=spec.schema if spec is not None else None,
                    sampling=sampling,
                    generator=generator,
                    extra={"target_vocab_size": vocab},
                )
            )
        on_commit = None
        if streamer is not None:
            streamer.put(torch.tensor([prompt], dtype=torch.long))
            on_commit = lambda toks: streamer.put(torch.tensor(toks, dtype=torch.long))  # noqa: E731
        new, stats = decode(
            model,
            prompt,
            decode_config,
            matcher=compiled.matcher(max_rollback=max_draft_tokens + 1) if compiled is not None else None,
            proposer=proposer,
            controller=controller,
            tokenizer=tokenizer,
            generator=generator,
            processors=list(logits_processor or ()),
            on_commit=on_commit,
            cache=past_key_values if update_cache or past_key_values is None else copy.deepcopy(past_key_values),
        )
        if streamer is not None:
            streamer.end()
        outputs.append(new)
        all_stats.append(stats)
    sequences = _assemble(input_ids, rows, outputs, config, eos)
    if return_dict_in_generate if return_dict_in_generate is not None else config.return_dict_in_generate:
        return GenerationOutput(sequences=sequences, stats=all_stats)
    return sequences


def enable(model: torch.nn.Module) -> torch.nn.Module:
    """Route ``model.generate(...)`` through grammarspec when asked to.

    After ``enable(model)``, a call with ``schema=``, ``tools=``, ``grammar=``,
    ``regex=``, ``json_object=``, ``assistant=`` or ``assistant_model=`` runs
    :func:`generate`; any other call goes to the original ``generate``.
    Returns ``model`` (changed in place; idempotent).
    """
    if getattr(model, "_grammarspec_original_generate", None) is not None:
        return model
    original = model.generate

    def patched(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if any(kwargs.get(name) not in (None, False) for name in _OUR_KWARGS):
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

    model._grammarspec_original_generate = original  # type: ignore[attr-defined]
    model.generate = types.MethodType(patched, model)  # type: ignore[method-assign]
    return model


# --- input handling -----------------------------------------------------------------


def _generation_config(
    model: torch.nn.Module, base: GenerationConfig | None, overrides: dict[str, Any]
) -> GenerationConfig:
    config = copy.deepcopy(base if base is not None else getattr(model, "generation_config", None) or GenerationConfig())
    overrides = dict(overrides)
    max_new = overrides.pop("max_new_tokens", config.max_new_tokens)  # 0 is valid here: return the prompt
    try:
        unknown = config.update(**overrides)
    except ValueError as exc:
        raise ValueError(f"invalid generation settings: {exc}") from None
    config.max_new_tokens = max_new
    unknown = {k: v for k, v in unknown.items() if k not in ("use_cache", "output_scores")}
    if unknown:
        raise TypeError(
            f"generate() got unknown arguments: {', '.join(sorted(unknown))}. Pass GenerationConfig fields "
            "(max_new_tokens, do_sample, temperature, top_k, top_p, stop_strings, ...) or grammarspec's own "
            "(schema, tools, grammar, regex, json_object, assistant, ...)."
        )
    return config


def _prompt_rows(input_ids: Any, attention_mask: torch.Tensor | None) -> list[list[int]]:
    if input_ids is None:
        raise ValueError("generate() needs input_ids (the tokenized prompt)")
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(
            f"input_ids must be a non-empty [batch, length] tensor, got shape {tuple(ids.shape)}; an empty "
            "prompt gives the model nothing to condition on (use at least a BOS token or a chat template)"
        )
    mask = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(attention_mask).reshape(ids.shape)
    rows = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    if any(not r for r in rows):
        raise ValueError("a batch row has no unmasked token: every prompt needs at least one token")
    return rows


def _sampling_params(config: GenerationConfig) -> SamplingParams:
    if not config.do_sample:
        return SamplingParams(do_sample=False)
    return SamplingParams(
        do_sample=True,
        temperature=float(config.temperature if config.temperature is not None else 1.0),
        top_k=int(config.top_k or 0),
        top_p=float(config.top_p if config.top_p is not None else 1.0),
    )


def _eos_ids(config: GenerationConfig, tokenizer: Any) -> tuple[int, ...]:
    eos = config.eos_token_id
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return ()
    return tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))


def _max_new_tokens(config: GenerationConfig, prompt_length: int) -> int:
    if config.max_new_tokens is not None:
        if config.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {config.max_new_tokens}")
        return int(config.max_new_tokens)
    return max(0, int(config.max_length or 20) - prompt_length)


def _stop_strings(config: GenerationConfig) -> tuple[str, ...]:
    stops = getattr(config, "stop_strings", None)
    if not stops:
        return ()
    return (stops,) if isinstance(stops, str) else tuple(stops)


def _k_min(proposer: Any, k_max: int) -> int:
    """Floor of the adaptive proposal length.

    Cheap deterministic drafters stop on their own when they run out of
    evidence, so ``k`` is only a cap for them and they get the full
    ``k_max``: a verification pass of 4-16 rows costs about 1.5-1.7 plain
    steps on CPU (each row past 8 about 0.03), so cutting a copied run short
    costs more than the extra rows (replayed on SmolLM2's benchmark outputs:
    4.49 tokens per pass on extraction with a floor of 8, 4.66 with 16; a
    floor of 1 gave 2.5x where 8 gave 2.9x).  A draft model pays a draft
    forward pass per drafted token, so its ``k`` may shrink all the way to 1.
    """
    from proposers.compose import is_model_proposer

    members = getattr(proposer, "proposers", None) or [proposer]
    if any(is_model_proposer(p) for p in members):
        return 1
    return k_max


def _check_assistant(model: torch.nn.Module, assistant: Any, tokenizer: Any) -> None:
    """Refuse a draft model whose tokenizer cannot be the target's."""
    if not isinstance(assistant, torch.nn.Module):
        return
    target_cfg, draft_cfg = model.config, assistant.config
    problems = []
    n_tokens = len(tokenizer) if tokenizer is not None else None
    if n_tokens is not None and draft_cfg.vocab_size < n_tokens:
        problems.append(f"its vocabulary has {draft_cfg.vocab_size} entries but the tokenizer has {n_tokens}")
    for attr in ("bos_token_id", "eos_token_id"):
        a, b = getattr(target_cfg, attr, None), getattr(draft_cfg, attr, None)
        if a is not None and b is not None and a != b:
            problems.append(f"{attr} is {b} for the draft but {a} for the target")
    if problems:
        raise ValueError(
            "the assistant model does not share the target's tokenizer ("
            + "; ".join(problems)
            + "). grammarspec verifies draft tokens by id, so the draft must use the same tokenizer "
            "(a padded vocabulary is fine). Use a draft model from the same family, or a cheap proposer "
            "such as assistant='auto'."
        )


def _assemble(
    input_ids: Any, rows: list[list[int]], outputs: list[list[int]], config: GenerationConfig, eos: tuple[int, ...]
) -> torch.LongTensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    pad = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else 0)
    width = max(len(o) for o in outputs)
    new = torch.full((ids.shape[0], width), int(pad), dtype=torch.long)
    for i, out in enumerate(outputs):
        new[i, : len(out)] = torch.tensor(out, dtype=torch.long)
    return torch.cat([ids, new], dim=1)
