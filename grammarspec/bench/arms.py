"""The arms of the benchmark and how each one generates.

* ``baseline`` -- plain constrained decoding as people run it today: Hugging
  Face ``model.generate`` with xgrammar's HF logits processor
  (``xgrammar.contrib.hf.LogitsProcessor``) over the same compiled grammar
  (``compile_json_schema(schema, any_whitespace=False, separators=(",", ":"))``).
* ``none`` -- grammarspec without speculation (``assistant=None``).
* ``jump_forward``, ``prompt_lookup``, ``schema_ngram`` -- each proposer alone.
* ``auto`` -- the ``"auto"`` preset.
* ``draft_model``, ``auto+draft`` -- a draft model alone, and ``"auto"`` plus
  the draft model (both need ``--draft-model``).
* ``vllm``, ``vllm-ngram``, ``vllm-suffix``, ``vllm-grammarspec``,
  ``vllm-grammarspec-noindex`` -- vLLM as the peer, run in its own
  environment after the other arms (:mod:`.vllm_arms`).

Every arm gets the same prompt ids, the same grammar, the same generation
settings and the same seed.  Timing is wall-clock around the generate call;
grammar compilation happens before (compiled grammars are cached).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

import grammarspec
from grammars import compile_grammar, grammar_spec
from grammarspec.engine.decoding import logits_width
from grammarspec.stats import GenerationStats
from grammarspec.vllm.engine import ARM_SPECULATION

__all__ = [
    "ARMS",
    "VLLM_ARMS",
    "DEFAULT_ARMS",
    "QUICK_ARMS",
    "DRAFT_ARMS",
    "RunResult",
    "GenerationSettings",
    "PreparedTask",
    "check_arms",
    "prepare_grammars",
    "run_arm",
    "BaselineGrammars",
]

#: Arms run by vLLM in its own environment (:mod:`.vllm_arms`; opt-in with ``--arms``).
VLLM_ARMS = ARM_SPECULATION
#: Every arm the bench knows, in report order.
ARMS = (
    "baseline",
    "none",
    "jump_forward",
    "prompt_lookup",
    "schema_ngram",
    "auto",
    "draft_model",
    "auto+draft",
    *VLLM_ARMS,
)
#: Arms that need a draft model (``--draft-model``).
DRAFT_ARMS = ("draft_model", "auto+draft")
#: Arms of a full run (the draft arms are added when a draft model is given).
DEFAULT_ARMS = ("baseline", "none", "jump_forward", "prompt_lookup", "schema_ngram", "auto")
#: Arms of ``--quick``.
QUICK_ARMS = ("baseline", "none", "auto")


def check_arms(names: list[str], draft_model_given: bool) -> list[str]:
    """The arms to run, in report order, with ``baseline`` always first.

    Raises ``ValueError`` naming an unknown arm, or a draft arm without a draft model.
    """
    unknown = [n for n in names if n not in ARMS]
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        raise ValueError(f"unknown arm{plural} {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    needs_draft = [n for n in names if n in DRAFT_ARMS]
    if needs_draft and not draft_model_given:
        raise ValueError(f"arm {needs_draft[0]} needs a draft model: pass --draft-model DIR")
    if any(n in VLLM_ARMS for n in names):
        from grammarspec.bench.vllm_env import vllm_python

        vllm_python()  # raises ValueError saying how to build the vLLM environment
    wanted = set(names) | {"baseline"}
    return [n for n in ARMS if n in wanted]


@dataclass(frozen=True)
class GenerationSettings:
    """The generation settings every arm shares."""

    max_new_tokens: int
    temperature: float = 0.0  # 0: greedy

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def kwargs(self) -> dict[str, Any]:
        """``generate`` keyword arguments (the same for HF and grammarspec)."""
        if self.greedy:
            return {"max_new_tokens": self.max_new_tokens, "do_sample": False}
        # pure temperature sampling: no top-k / top-p on either side
        return {
            "max_new_tokens": self.max_new_tokens,
            "do_sample": True,
            "temperature": self.temperature,
            "top_k": 0,
            "top_p": 1.0,
        }


class BaselineGrammars:
    """xgrammar's own compiler for the baseline arm (one per tokenizer and logits width)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_id: int) -> None:
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=[eos_token_id])
        self._compiler = xgr.GrammarCompiler(info)

    def compile(self, schema_source: str) -> Any:
        return self._compiler.compile_json_schema(schema_source, any_whitespace=False, separators=(",", ":"))


@dataclass
class PreparedTask:
    """A task ready to run: prompt ids and the grammars, compiled before timing."""

    prompt_ids: list[int]
    schema: dict[str, Any]
    xgr_grammar: Any  # xgrammar.CompiledGrammar for the baseline


def prepare_grammars(model: torch.nn.Module, tokenizer: Any, baseline: BaselineGrammars, schema: dict[str, Any]) -> Any:
    """Compile ``schema`` for grammarspec (filling its cache) and for the baseline.

    Raises :class:`grammarspec.GrammarError` when the schema cannot be compiled.
    """
    spec = grammar_spec(schema=schema)
    assert spec is not None  # a schema always gives a spec
    compile_grammar(spec, tokenizer, vocab_size=logits_width(model), stop_token_ids=(tokenizer.eos_token_id,))
    try:
        return baseline.compile(spec.source)
    except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError from C++
        reason = str(e).strip()[:300]
        raise grammarspec.GrammarError(f"xgrammar (baseline) cannot compile the schema: {reason}") from None


@dataclass
class RunResult:
    """One generation by one arm."""

    tokens: list[int]  # new tokens, the stop token included
    seconds: float  # wall clock around the generate call
    finish_reason: str  # "stop" (the grammar completed) or "length"
    stats: GenerationStats | None = None  # grammarspec arms only
    grammar_seconds: float = 0.0  # baseline: time inside the logits processor
    first_step_seconds: float = 0.0  # from the call to the end of the prompt pass (and its commit)
    first_step_tokens: int = 0  # tokens committed by then
    extra: dict[str, Any] = field(default_factory=dict)


class _TimedProcessor:
    """Wraps a logits processor and adds up the time spent in it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seconds = 0.0
        self.first_call: float | None = None  # perf_counter at the first call: the prompt pass is done

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        t0 = time.perf_counter()
        if self.first_call is None:
            self.first_call = t0
        out = self.inner(input_ids, scores)
        self.seconds += time.perf_counter() - t0
        return out


def _assistant(arm: str, draft_model: Any) -> Any:
    if arm == "none":
        return None
    if arm == "draft_model":
        return draft_model
    if arm == "auto+draft":
        return ["auto", draft_model]
    return arm


def generate_rows(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: list[list[int]],
    schemas: list[Any],
    assistant: Any,
    pad: int = 0,
    **settings: Any,
) -> tuple[list[list[int]], list[GenerationStats], float]:
    """One ``grammarspec.generate`` call over ``prompts`` (left-padded with ``pad`` when there are several).

    Returns each row's new tokens, each row's ``GenerationStats`` and the call's seconds.
    """
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], dtype=torch.long)
    if len(prompts) > 1:
        settings["attention_mask"] = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    t0 = time.perf_counter()
    out = grammarspec.generate(
        model,
        ids,
        tokenizer=tokenizer,
        schema=schemas if len(prompts) > 1 else schemas[0],
        assistant=assistant,
        return_dict_in_generate=True,
        **settings,
    )
    seconds = time.perf_counter() - t0
    assert isinstance(out, grammarspec.GenerationOutput) and out.stats is not None  # return_dict_in_generate=True
    outputs = [out.sequences[i, width:].tolist()[: s.new_tokens] for i, s in enumerate(out.stats)]
    return outputs, list(out.stats), seconds


def generate_one(
    model: torch.nn.Module, tokenizer: Any, prompt: list[int], schema: Any, assistant: Any, **settings: Any
) -> tuple[list[int], GenerationStats, float]:
    """:func:`generate_rows` on one prompt -> its new tokens, its ``GenerationStats`` and the seconds."""
    (tokens,), (stats,), seconds = generate_rows(model, tokenizer, [list(prompt)], [schema], assistant, **settings)
    return tokens, stats, seconds


def run_arm(
    arm: str,
    model: torch.nn.Module,
    tokenizer: Any,
    task: PreparedTask,
    settings: GenerationSettings,
    *,
    seed: int,
    draft_model: Any = None,
    max_new_tokens: int | None = None,
    draft_index: Any = None,
) -> RunResult:
    """Generate once with ``arm``; ``max_new_tokens`` overrides the settings (warm-ups); ``draft_index`` as for
    ``generate`` (``None``: its default)."""
    kwargs = settings.kwargs()
    if max_new_tokens is not None:
        kwargs["max_new_tokens"] = max_new_tokens
    eos = tokenizer.eos_token_id
    input_ids = torch.tensor([task.prompt_ids], dtype=torch.long)
    torch.manual_seed(seed)
    if arm == "baseline":
        return _run_baseline(model, input_ids, task.xgr_grammar, eos, kwargs)
    if draft_index is not None:
        kwargs["draft_index"] = draft_index
    tokens, stats, seconds = generate_one(
        model, tokenizer, task.prompt_ids, task.schema, _assistant(arm, draft_model), **kwargs
    )
    finish = "stop" if stats.finish_reason in ("stop", "eos") else stats.finish_reason
    setup = seconds - stats.total_seconds  # grammar lookup and proposer start, before decoding
    return RunResult(
        tokens=tokens,
        seconds=seconds,
        finish_reason=finish,
        stats=stats,
        grammar_seconds=stats.grammar_seconds,
        first_step_seconds=setup + stats.first_step_seconds,
        first_step_tokens=stats.first_step_tokens,
    )


def _run_baseline(
    model: torch.nn.Module, input_ids: torch.Tensor, compiled: Any, eos: int, kwargs: dict[str, Any]
) -> RunResult:
    from transformers import LogitsProcessorList
    from xgrammar.contrib.hf import LogitsProcessor

    processor = _TimedProcessor(LogitsProcessor(compiled))  # single use: one per generate call
    hf: Any = model  # a Hugging Face model: its generate is no nn.Module attribute
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            logits_processor=LogitsProcessorList([processor]),
            eos_token_id=eos,
            pad_token_id=eos,
            **kwargs,
        )
    seconds = time.perf_counter() - t0
    tokens = out[0, input_ids.shape[1] :].tolist()
    if eos in tokens:
        tokens = tokens[: tokens.index(eos) + 1]
    finish = "stop" if tokens and tokens[-1] == eos else "length"
    first = (processor.first_call - t0) if processor.first_call is not None else 0.0
    return RunResult(
        tokens=tokens,
        seconds=seconds,
        finish_reason=finish,
        grammar_seconds=processor.seconds,
        first_step_seconds=first,
        first_step_tokens=1 if tokens else 0,
    )
