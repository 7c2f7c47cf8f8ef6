"""Hugging Face's logits processing, applied to the target's and every draft's rows alike.

:func:`build_pipeline` turns a (fully resolved) ``GenerationConfig`` and the
user's ``logits_processor=`` list into a :class:`LogitsPipeline` made of
transformers' own processor classes, in the order
``GenerationMixin._get_logits_processor`` builds them (transformers 5.24)::

    sequence_bias, repetition_penalty, no_repeat_ngram_size, bad_words_ids,
    min_length, min_new_tokens, forced_bos_token_id, forced_eos_token_id,
    remove_invalid_values, exponential_decay_length_penalty, suppress_tokens,
    begin_suppress_tokens                      -- "default" processors
    <grammar mask>                             -- where HF runs a grammar processor
    user logits_processor= entries             -- a user entry of a default's type replaces it
    temperature, top_h, top_k, top_p, min_p, typical_p, epsilon_cutoff,
    eta_cutoff                                 -- warpers, only when sampling
    renormalize_logits                         -- always last

The loop hands the pipeline rows that are already grammar-masked; the mask is
re-applied after the default processors, which is where Hugging Face applies a
grammar ``LogitsProcessor`` passed by the user.  Every default processor maps a
masked (``-inf``) entry to ``-inf`` except ``remove_invalid_values`` (and the
``NaN`` an ``-inf`` EOS logit can turn into), so the result equals Hugging Face's.

Prefix-dependent processors (repetition penalty, n-grams, bad words, lengths,
user processors) are called once per row with that row's exact prefix --
prompt + committed + ``draft[:i]`` for verification row ``i``; warpers, which
read only the scores, run on all rows at once.

One deliberate difference: the processors never leave a row with no legal
token.  When they would (``min_new_tokens`` where the grammar allows only EOS,
``no_repeat_ngram_size`` or ``bad_words_ids`` banning the one token the grammar
allows), the row falls back to its grammar-masked scores before the warpers.
Hugging Face has no defined behaviour there: it picks token 0 greedily (which the
grammar then rejects) or fails to sample.  The fallback also makes a
grammar-forced token (committed without processing) agree with the same token
verified inside a draft.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import GenerationConfig
from transformers.generation import logits_process as lp

from grammarspec.kv.host_values import to_device

__all__ = ["PREFIX_FREE", "LogitsPipeline", "build_pipeline", "check_stateless", "prefix_tensors"]

#: Processor classes that read only the scores (never ``input_ids``): run on all rows at once.
PREFIX_FREE: tuple[type[lp.LogitsProcessor], ...] = (
    lp.TemperatureLogitsWarper,
    lp.TopHLogitsWarper,
    lp.TopKLogitsWarper,
    lp.TopPLogitsWarper,
    lp.MinPLogitsWarper,
    lp.TypicalLogitsWarper,
    lp.EpsilonLogitsWarper,
    lp.EtaLogitsWarper,
    lp.SuppressTokensLogitsProcessor,
    lp.InfNanRemoveLogitsProcessor,
    lp.LogitNormalization,
)

#: Modules whose logits processors keep grammar state between calls.
_STATEFUL_MODULES = ("xgrammar", "outlines", "lmformatenforcer", "llguidance", "guidance", "transformers_cfg")


@dataclass(frozen=True)
class LogitsPipeline:
    """Processing shared by the target and every draft model (immutable; holds no per-step state).

    ``defaults``: HF's default processors (before the grammar position);
    ``custom``: the user's processors; ``warpers``: applied only when sampling;
    ``final``: ``LogitNormalization`` when asked.  ``greedy``: callers take the
    argmax of the result instead of sampling from its softmax.
    """

    defaults: tuple[Any, ...] = ()
    custom: tuple[Any, ...] = ()
    warpers: tuple[Any, ...] = ()
    final: tuple[Any, ...] = ()
    greedy: bool = True

    def __call__(
        self, scores: torch.Tensor, prefixes: Sequence[Sequence[int]] | Sequence[torch.Tensor]
    ) -> torch.Tensor:
        """Process grammar-masked ``scores`` ``[N, V]``; returns float32 ``[N, V]``.

        ``prefixes[i]``: the token ids row ``i`` conditions on (prompt +
        committed + ``draft[:i]``), as ints or as a ``[1, L]`` tensor on the
        scores' device (:func:`prefix_tensors`: views of one tensor, one copy
        to the device for many rows).  Does not modify ``scores``.  Example: with
        ``repetition_penalty=2`` a row whose prefix holds token 5 gets
        ``scores[i, 5] / 2`` (or ``* 2`` when negative); other rows are untouched.
        """
        assert scores.dim() == 2, f"scores must be [N, V], got {tuple(scores.shape)}"
        out = scores.float().clone()
        if not (self.defaults or self.custom or self.warpers or self.final):
            return out
        assert len(prefixes) == out.shape[0], f"{len(prefixes)} prefixes for {out.shape[0]} rows"
        if not self.reads_prefixes:  # warpers only: no prefix is read
            ids = [torch.zeros((1, 1), dtype=torch.long, device=out.device)] * out.shape[0]
        elif all(isinstance(p, torch.Tensor) for p in prefixes):
            ids = [cast(torch.Tensor, p) for p in prefixes]
        else:
            ids = prefix_tensors([cast(Sequence[int], p) for p in prefixes], out.device)
        if self.defaults or self.custom:
            entry, out = out, out.clone()  # a processor that writes in place must not change the fallback rows
            if self.defaults:
                masked = torch.isneginf(entry)
                out = self._run(self.defaults, ids, out)
                out = out.masked_fill(masked, float("-inf"))  # HF applies the grammar after its defaults
            out = self._run(self.custom, ids, out)
            empty = torch.isneginf(out).all(dim=-1, keepdim=True) & ~torch.isneginf(entry).all(dim=-1, keepdim=True)
            out = torch.where(empty, entry, out)  # never leave a row with no legal token (no host sync to ask)
        if not self.greedy:
            out = self._run(self.warpers, ids, out)
        return self._run(self.final, ids, out)

    @property
    def is_identity(self) -> bool:
        """Whether the pipeline leaves float32 scores as they are (greedy, no processor): callers may skip it."""
        return self.greedy and not (self.defaults or self.custom or self.final)

    @property
    def reads_prefixes(self) -> bool:
        """Whether any processor reads the rows' prefixes (else callers may pass empty ones)."""
        everything = (*self.defaults, *self.custom, *self.warpers, *self.final)
        return not all(isinstance(p, PREFIX_FREE) for p in everything)

    @functools.cached_property
    def batch_key(self) -> tuple[Any, ...] | None:
        """Equal for pipelines that process any row alike, so one call may serve all their rows; ``None``
        when a processor reads prefixes.

        Every processor here then works row by row on the scores alone
        (:data:`PREFIX_FREE`), so equal settings give equal rows.  A processor
        counts by its type and its plain attributes; a tensor attribute by the
        tensor object itself (reading its values would wait for the device).
        Computed once per pipeline; does not change state.
        """
        if self.reads_prefixes:
            return None

        def settings(processor: Any) -> tuple[Any, ...]:
            fields = []
            for name, value in sorted(vars(processor).items()):
                plain = value is None or isinstance(value, (bool, int, float, str))
                fields.append((name, value if plain else ("object", id(value))))
            return (type(processor), tuple(fields))

        return (self.greedy,) + tuple(
            tuple(settings(p) for p in group) for group in (self.defaults, self.custom, self.warpers, self.final)
        )

    @classmethod
    def from_sampling(
        cls,
        params: Any,
        processors: Sequence[Any] = (),
        *,
        min_new_tokens: int = 0,
        eos_token_ids: Sequence[int] = (),
        prompt_length: int = 0,
        device: str | torch.device = "cpu",
    ) -> LogitsPipeline:
        """The pipeline for a :class:`grammarspec.engine.sampling.SamplingParams` (tests, old callers).

        ``device``: where the logits live (the processors' own tensors are built there).
        """
        if not processors:  # pipelines are immutable and their processors stateless: share them
            return _from_sampling_cached(
                params, min_new_tokens, tuple(eos_token_ids), prompt_length, torch.device(device)
            )
        return build_pipeline(
            _sampling_config(params, min_new_tokens),
            prompt_length=prompt_length,
            eos_token_ids=eos_token_ids,
            processors=processors,
            device=device,
        )

    @staticmethod
    def _run(processors: Sequence[Any], ids: list[torch.Tensor], scores: torch.Tensor) -> torch.Tensor:
        for proc in processors:
            if isinstance(proc, PREFIX_FREE):
                # transformers annotates input_ids as the legacy LongTensor class; torch's ops return Tensor
                scores = proc(cast(torch.LongTensor, ids[0].expand(scores.shape[0], -1)), scores)
            else:
                scores = torch.cat([proc(ids[i], scores[i : i + 1]) for i in range(scores.shape[0])])
        return scores.float()


def prefix_tensors(prefixes: Sequence[Sequence[int]], device: torch.device | str) -> list[torch.Tensor]:
    """Each prefix as a ``[1, L_i]`` int64 view of one right-padded ``[N, max L]`` tensor: one copy to ``device``
    (:func:`grammarspec.kv.host_values.to_device`: it does not wait for the device).

    A processor reading ``ids[i]`` sees exactly row ``i``'s tokens (the
    padding lies outside its view).  Pure.

    >>> [t.tolist() for t in prefix_tensors([[5, 6, 7], [5]], "cpu")]
    [[[5, 6, 7]], [[5]]]
    """
    width = max((len(p) for p in prefixes), default=0)
    (flat,) = to_device([[t for p in prefixes for t in [*p, *[0] * (width - len(p))]]], device)
    padded = flat.view(len(prefixes), width)
    return [padded[i : i + 1, : len(p)] for i, p in enumerate(prefixes)]


def _sampling_config(params: Any, min_new_tokens: int) -> GenerationConfig:
    """The ``GenerationConfig`` of ``params``: greedy leaves the sampling-only fields unset.

    A greedy config that sets ``top_k``/``top_p``/``temperature`` makes transformers warn that they are
    ignored, about settings the user never gave (greedy draft models use this path by default).
    """
    if params.greedy:
        return GenerationConfig(do_sample=False, min_new_tokens=min_new_tokens or None)
    return GenerationConfig(
        do_sample=True,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        min_new_tokens=min_new_tokens or None,
    )


@functools.lru_cache(maxsize=256)
def _from_sampling_cached(
    params: Any, min_new_tokens: int, eos_token_ids: tuple[int, ...], prompt_length: int, device: torch.device
) -> LogitsPipeline:
    config = _sampling_config(params, min_new_tokens)
    return build_pipeline(config, prompt_length=prompt_length, eos_token_ids=eos_token_ids, device=device)


def build_pipeline(
    config: GenerationConfig,
    *,
    prompt_length: int,
    eos_token_ids: Sequence[int] = (),
    processors: Sequence[Any] = (),
    max_length: int | None = None,
    device: str | torch.device = "cpu",
) -> LogitsPipeline:
    """transformers' processors for ``config`` in ``_get_logits_processor``'s order.

    ``config`` must already hold Hugging Face's defaults (see
    :func:`grammarspec.api` config handling); ``prompt_length`` is the row's
    prompt length (min_new_tokens, begin_suppress_tokens and the length
    penalty count from it); ``max_length`` its total length limit (for
    ``forced_eos_token_id``; default ``config.max_length``).  Settings speculation cannot honour are refused
    before this is called.  Pure: builds new processor objects every call.
    """
    check_stateless(processors)
    # on the logits' device: the length processors torch.isin() the scores' vocabulary against it
    eos = torch.tensor(list(eos_token_ids), dtype=torch.long, device=device) if eos_token_ids else None
    eos_ids = list(eos_token_ids) or None  # host ids: bad words reads them as a list, the length penalty moves them
    device_name = str(device)  # transformers annotates its processors' device as str (they hand it to torch.tensor)
    d: list[Any] = []
    if config.sequence_bias is not None:
        d.append(lp.SequenceBiasLogitsProcessor(sequence_bias=config.sequence_bias))
    if config.repetition_penalty is not None and config.repetition_penalty != 1.0:
        d.append(lp.RepetitionPenaltyLogitsProcessor(config.repetition_penalty))
    if config.no_repeat_ngram_size is not None and config.no_repeat_ngram_size > 0:
        d.append(lp.NoRepeatNGramLogitsProcessor(config.no_repeat_ngram_size))
    if config.bad_words_ids is not None:
        d.append(lp.NoBadWordsLogitsProcessor(config.bad_words_ids, eos_ids))
    if config.min_length is not None and eos is not None and config.min_length > 0:
        d.append(lp.MinLengthLogitsProcessor(config.min_length, eos, device=device_name))
    if config.min_new_tokens is not None and eos is not None and config.min_new_tokens > 0:
        d.append(lp.MinNewTokensLengthLogitsProcessor(prompt_length, config.min_new_tokens, eos, device=device_name))
    if config.forced_bos_token_id is not None:
        d.append(lp.ForcedBOSTokenLogitsProcessor(config.forced_bos_token_id))
    if config.forced_eos_token_id is not None:
        d.append(
            lp.ForcedEOSTokenLogitsProcessor(
                max_length or config.max_length, config.forced_eos_token_id, device=device_name
            )
        )
    if config.remove_invalid_values is True:
        d.append(lp.InfNanRemoveLogitsProcessor())
    if config.exponential_decay_length_penalty is not None:
        # no EOS (None) fails inside transformers, as in Hugging Face's own generate (it passes None there too)
        penalty = lp.ExponentialDecayLengthPenalty(
            config.exponential_decay_length_penalty,
            eos_ids,  # type: ignore[arg-type]
            prompt_length,
        )
        d.append(penalty)
    if config.suppress_tokens is not None:
        d.append(lp.SuppressTokensLogitsProcessor(config.suppress_tokens, device=device_name))
    if config.begin_suppress_tokens is not None:
        begin = prompt_length if (prompt_length > 1 or config.forced_bos_token_id is None) else prompt_length + 1
        d.append(lp.SuppressTokensAtBeginLogitsProcessor(config.begin_suppress_tokens, begin, device=device_name))
    defaults, custom = _merge(d, list(processors))
    w: list[Any] = []
    if config.do_sample:
        if config.temperature is not None and config.temperature != 1.0:
            w.append(lp.TemperatureLogitsWarper(config.temperature))
        if config.top_h is not None:
            w.append(lp.TopHLogitsWarper(top_h=config.top_h))
        if config.top_k is not None and config.top_k != 0:
            w.append(lp.TopKLogitsWarper(top_k=config.top_k, min_tokens_to_keep=1))
        if config.top_p is not None and config.top_p < 1.0:
            w.append(lp.TopPLogitsWarper(top_p=config.top_p, min_tokens_to_keep=1))
        if config.min_p is not None:
            w.append(lp.MinPLogitsWarper(min_p=config.min_p, min_tokens_to_keep=1))
        if config.typical_p is not None and config.typical_p < 1.0:
            w.append(lp.TypicalLogitsWarper(mass=config.typical_p, min_tokens_to_keep=1))
        if config.epsilon_cutoff is not None and 0.0 < config.epsilon_cutoff < 1.0:
            w.append(lp.EpsilonLogitsWarper(epsilon=config.epsilon_cutoff, min_tokens_to_keep=1))
        if config.eta_cutoff is not None and 0.0 < config.eta_cutoff < 1.0:
            w.append(lp.EtaLogitsWarper(epsilon=config.eta_cutoff, min_tokens_to_keep=1, device=device_name))
    final = (lp.LogitNormalization(),) if config.renormalize_logits is True else ()
    return LogitsPipeline(tuple(defaults), tuple(custom), tuple(w), final, greedy=not config.do_sample)


def _merge(defaults: list[Any], custom: list[Any]) -> tuple[list[Any], list[Any]]:
    """``_merge_criteria_processor_list``: a user processor of a default's type takes its place.

    Returns (defaults with replacements, the remaining user processors in order).
    """
    merged = []
    for default in defaults:
        replacement = next((c for c in custom if type(c) is type(default)), None)
        merged.append(replacement if replacement is not None else default)
    rest = [c for c in custom if not any(c is m for m in merged)]
    return merged, rest


def check_stateless(processors: Sequence[Any]) -> None:
    """Refuse logits processors that keep state between calls (grammar processors first).

    Speculative decoding calls every processor on draft prefixes that may be
    rejected, and on the draft model's rows as well as the target's; a stateful
    processor (xgrammar's / outlines' Hugging Face processors, or anything with
    ``stateful = True``) would be advanced by tokens that are never committed.
    """
    for proc in processors:
        module = type(proc).__module__.split(".")[0]
        if module in _STATEFUL_MODULES and module != "transformers":
            raise ValueError(
                f"logits_processor= got {type(proc).__module__}.{type(proc).__name__}, a grammar processor that "
                "keeps state between calls; speculative decoding calls processors on draft tokens that may be "
                "rejected, which would corrupt its state. Drop it and pass the constraint itself instead: "
                "schema=..., grammar=..., regex=... or json_object=True (grammarspec keeps the grammar in lockstep)."
            )
        if getattr(proc, "stateful", False) is True:
            raise ValueError(
                f"logits_processor= got {type(proc).__name__}, which says it is stateful (stateful = True); "
                "speculative decoding needs stateless processors (a function of input_ids and scores only). "
                "For a grammar, pass schema=..., grammar=... or regex=... instead."
            )
        if not callable(proc):
            raise TypeError(f"logits_processor= entries must be callables (input_ids, scores) -> scores, got {proc!r}")
