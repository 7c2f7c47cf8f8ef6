"""What one target pass costs by the rows it verifies, measured in a few timed passes on this machine.

The rule.  Prefill a ``DynamicCache`` with ``context`` tokens; run one
untimed pass of each row count ``n``, then ``repeats`` timed rounds: each
round times one pass of every ``n`` in turn (ascending, then descending on
the next round, so a burst of load lands on every width alike and not on a
run of one width's repeats) and a few plain steps of the loop.  Each pass
runs ``n`` new tokens over the cache (the device synchronized before it, the
cache cropped back after it).  A timed pass is what a step spends on its
rows: the forward, then the verification's device work on the ``n`` rows of
logits (float32, a bitmask applied, each row's best token, one host read,
which waits for the device).  ``t[n]`` is the lowest of its rounds: another
process only ever slows a pass, so the fastest round is the one least
disturbed.  The curve is fitted to those points
(:mod:`grammarspec.drafting.profile_fit`: made rising, a line and its table
in plain steps, 2 significant digits).  The rows measured are dense where
drafts of a lone request fall (2 to 8) and reach the widest padded pass of a
full batch (16 rows of 16 tokens).

The unit is a plain step of the decoding loop, not the bare pass: a step
also spends host time whatever its rows (the loop's bookkeeping, the
sampler, the cache's bookkeeping), ``h`` seconds: each round times
:data:`STEP_TOKENS` plain steps of :func:`grammarspec.engine.decoding.decode` (the
median step of the run), and ``h`` is the lowest round's plain step less
``t[1]`` (never below 0); every point is ``y[n] = (t[n] + h) / (t[1] + h)``,
and the extra terms below are in that
unit too.  Without ``h`` a small model on a CPU, whose bare 1-row pass is
short, would have its wide passes priced several times too high against the
steps they replace.

On a CPU extra rows cost real time (a steep ``per_row``); on a GPU a pass of
tens of rows costs about one plain step (``per_row`` near 0.001, ``min_rows``
at the knee), and the goodput policy (:mod:`grammarspec.policy.allocation`) drafts longer.

More terms, in the same unit (:meth:`proposers.cost.PassCost.drafted`):

* ``switch``: what drafting changes in a step of ``SWITCH_BATCH`` rows of
  different lengths through :meth:`grammarspec.kv.batch.BatchKV.forward`: the step
  with one row verifying a one-token draft (the path a drafted pass takes:
  packed where the model allows it, else padded under a 4-D mask) against the
  same rows' plain step, paired repeat by repeat; the median difference.  A
  model whose batch pass cannot be built this way prices no switch (and says
  why).
* ``per_token``: the host work one draft token adds beyond its row of the
  forward, timed on stand-ins for what the loop runs: a cheap drafter
  (:class:`proposers.prompt_lookup.PromptLookupProposer` over a repetitive
  context), the grammar walk's mask fill, accept and rollback (xgrammar's
  JSON grammar over a vocabulary of the model's size, through keys, values
  and punctuation) and the verification's mask on the token's scored row
  (:func:`grammarspec.engine.masking.apply_masks`); the median per token;
* ``per_draft_row``, on the packed path only (a padded pass is as wide as its
  widest row, which the curve prices): in a step of :data:`SPREAD_BATCH`
  ragged rows, every row verifying a one-token draft against row 0
  verifying a chain of as many tokens (the same tokens, on one row), paired
  repeat by repeat; the median difference per further drafting row (each
  attends in a call of its own in every layer).

All are rounded like the line (2 significant digits; 0 stays 0).

The profile is kept on disk per model and machine
(:mod:`grammarspec.drafting.profile_store`), handed to the loop by
:mod:`grammarspec.drafting.cost_model`, and checked against the passes the loop
times (:mod:`grammarspec.drafting.profile_check`).

Every timing reads ``clock`` (``time.perf_counter`` unless given): tests
give a fake clock that their fake models advance, so no test depends on the
machine's speed or load.
"""

from __future__ import annotations

import os
import statistics
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import torch

from grammarspec.drafting.profile_fit import fit_pass_cost, rising, two_digits, with_terms
from grammarspec.engine.sampling import row_max
from grammarspec.kv.cache import cache_argument, crop_cache, input_device, new_cache
from grammarspec.kv.grouped_attention import grouped_model
from grammarspec.policy.cost import Clock
from proposers.cost import PassCost

__all__ = [
    "Measured",
    "measure_profile",
    "profile_or_prior",
    "profile_extra_terms",
    "ragged_shapes",
    "step_overhead_seconds",
]


DEFAULT_CONTEXT = 128
DEFAULT_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
#: Timed rounds of a profile (each times every width once and a run of plain steps).
DEFAULT_REPEATS = 5


@dataclass(frozen=True)
class Measured:
    """A profile and what it was fitted from.

    ``step_seconds``: a plain step of the loop (the unit, ``t[1] + h``);
    ``overhead_seconds``: ``h``; ``pass_seconds``: rows -> ``t[n]``, rising.
    ``step_seconds`` is ``None`` for the prior that stands in where the model
    could not be profiled (nothing to check it against).  How it was measured:
    ``measured_at`` (UTC, ISO 8601), ``rounds``, ``load_average`` (the 1-minute
    load average before and after, where the system reports one),
    ``measure_seconds`` (how long it took) and ``why`` (a later measurement's
    reason).  Pure data.
    """

    cost: PassCost
    step_seconds: float | None = None
    overhead_seconds: float = 0.0
    pass_seconds: dict[int, float] = field(default_factory=dict)
    measured_at: str = ""
    rounds: int = 0
    load_average: tuple[float, float] | None = None
    measure_seconds: float = 0.0
    why: str = ""

    def predicted_pass_seconds(self, rows: int) -> float | None:
        """What the profile says the forward and verification of a pass of ``rows`` rows take (``t[rows]``, read
        from the curve), or ``None`` without a measured unit.  Pure."""
        if self.step_seconds is None:
            return None
        return self.step_seconds * self.cost.cost(rows) - self.overhead_seconds


def profile_or_prior(model: Any, *, why: str = "", **settings: Any) -> Measured:
    """:func:`measure_profile` (``settings``: its ``context``, ``rows``, ``repeats`` and ``clock``), or, where the
    model refuses, the prior :class:`PassCost` (no ``step_seconds``) with a warning saying why.  Raises
    ``ValueError`` for settings :func:`measure_profile` refuses."""
    _check_settings(
        settings.get("rows", DEFAULT_ROWS),
        settings.get("repeats", DEFAULT_REPEATS),
        settings.get("context", DEFAULT_CONTEXT),
    )
    try:
        return measure_profile(model, why=why, **settings)
    except Exception as error:  # the model refused: draft as before rather than fail the request
        return Measured(_fallback(model, error))


STEP_TOKENS = 12


def step_overhead_seconds(
    model: Any, context: int, pass_seconds: float, repeats: int = DEFAULT_REPEATS, *, clock: Clock | None = None
) -> float:
    """``h``: the seconds a plain step of the decoding loop spends beyond its 1-row pass of ``pass_seconds``.

    The lowest of ``repeats`` runs' median plain step (:func:`_loop_step_seconds`;
    an untimed run first), less ``pass_seconds``; never below 0.  Does not
    change the model.
    """
    clock = clock or time.perf_counter
    _loop_step_seconds(model, context, clock)  # warms up, not counted
    step = min(_loop_step_seconds(model, context, clock) for _ in range(max(repeats, 1)))
    return max(0.0, step - pass_seconds)


def _loop_step_seconds(model: Any, context: int, clock: Clock) -> float:
    """The median seconds between the ends of :data:`STEP_TOKENS` plain, unconstrained steps of
    :func:`grammarspec.engine.decoding.decode` after a ``context``-token prompt (its pass not counted).  Does not change
    the model."""
    from grammarspec.engine.decoding import DecodeConfig, decode

    config = getattr(model, "config", None)
    vocab = int(getattr(config, "vocab_size", 2))
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int):
        context = max(1, min(context, limit - STEP_TOKENS - 2))
    prompt = [(7 * i + 3) % vocab for i in range(context)]
    ends: list[float] = []
    with torch.inference_mode():
        decode(model, prompt, DecodeConfig(max_new_tokens=STEP_TOKENS + 1), on_step=lambda state: ends.append(clock()))
    steps = [later - earlier for earlier, later in zip(ends, ends[1:])]  # the first end is the prompt pass's
    if not steps:
        raise RuntimeError("the loop took no plain step to time")
    return statistics.median(steps)


def _check_settings(rows: Sequence[int], repeats: int, context: int) -> None:
    if 1 not in rows or max(rows) < 2 or repeats < 1 or context < 1:
        raise ValueError(
            "a profile needs 1 and a larger count in rows, repeats >= 1 and context >= 1; "
            f"got {rows}, {repeats}, {context}"
        )


def measure_profile(
    model: Any,
    *,
    context: int = DEFAULT_CONTEXT,
    rows: Sequence[int] = DEFAULT_ROWS,
    repeats: int = DEFAULT_REPEATS,
    clock: Clock | None = None,
    why: str = "",
) -> Measured:
    """Time ``model``'s passes (the module's rule) and fit them: the :class:`Measured` profile.

    ``rows`` must include 1 and a larger count.  Does not change the model (a
    cache of its own, under ``torch.inference_mode()``).  Raises what the
    model's forward raises; a term that cannot be timed is priced at 0 with a
    warning instead.
    """
    _check_settings(rows, repeats, context)
    clock = clock or time.perf_counter
    load_before, began = _load_average(), time.monotonic()
    measured_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    passes, step = _timed_rounds(model, context, sorted(set(rows)), repeats, clock)
    overhead = max(0.0, step - passes[1]) if step is not None else 0.0
    line = fit_pass_cost(passes, overhead)
    unit = passes[1] + overhead
    cost = with_terms(line, *profile_extra_terms(model, unit, context=context, repeats=repeats, clock=clock))
    load_after = _load_average()
    load = (load_before, load_after) if load_before is not None and load_after is not None else None
    return Measured(cost, unit, overhead, passes, measured_at, repeats, load, time.monotonic() - began, why)


def _load_average() -> float | None:
    """The system's 1-minute load average, or ``None`` where it reports none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _fallback(model: Any, error: Exception) -> PassCost:
    """The prior :class:`PassCost`, with a warning saying why the profile failed."""
    name = getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__
    warnings.warn(
        f"grammarspec could not profile the pass cost of {name} ({type(error).__name__}: {error}); "
        "sizing drafts with the CPU prior PassCost() instead",
        RuntimeWarning,
        stacklevel=3,
    )
    return PassCost()


def _timed_rounds(
    model: Any, context: int, rows: list[int], repeats: int, clock: Clock
) -> tuple[dict[int, float], float | None]:
    """``rows -> t[n]`` (the lowest of ``repeats`` rounds, made rising) of a pass of that many new tokens over a
    ``context``-token cache, and the lowest round's plain step of the loop (``None``, with a warning, where the
    loop cannot run the model).  Each round times every width once, in turn, then the loop's steps."""
    config = getattr(model, "config", None)
    vocab = int(getattr(config, "vocab_size", 2))
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int):  # the context and the widest pass must fit the model's positions
        rows = [n for n in rows if n < limit]
        context = max(1, min(context, limit - max(rows)))
    device = input_device(model)
    backend = getattr(torch, device.type, None)
    synchronize = getattr(backend, "synchronize", None) if device.type != "cpu" else None

    def ids(start: int, n: int) -> torch.Tensor:
        return torch.tensor([[(7 * i + 3) % vocab for i in range(start, start + n)]], dtype=torch.long, device=device)

    cache = new_cache(model)
    argument = cache_argument(model)

    def timed(n: int) -> float:
        new, positions = ids(context, n), torch.arange(context, context + n, device=device).unsqueeze(0)
        if synchronize is not None:
            synchronize()
        start = clock()
        out = model(input_ids=new, **{argument: cache}, position_ids=positions, use_cache=True, logits_to_keep=n)
        _verify_rows(out.logits[0])
        seconds = clock() - start
        crop_cache(cache, context, "target model")
        return seconds

    seconds: dict[int, list[float]] = {n: [] for n in rows}
    steps: list[float] = []
    loop_runs = True
    with torch.inference_mode():
        with grouped_model(model):  # the attention the loop's forwards run
            model(input_ids=ids(0, context), **{argument: cache}, use_cache=True, logits_to_keep=1)
            for n in rows:  # warm-up, not timed
                timed(n)
        for round_ in range(repeats):
            with grouped_model(model):
                for n in rows if round_ % 2 == 0 else rows[::-1]:
                    seconds[n].append(timed(n))
            if loop_runs:
                try:
                    if round_ == 0:
                        _loop_step_seconds(model, context, clock)  # warms the loop up, not counted
                    steps.append(_loop_step_seconds(model, context, clock))
                except Exception as error:
                    _warn(model, "the decoding loop's step overhead", error)
                    loop_runs = False
    return rising({n: min(s) for n, s in seconds.items()}), min(steps) if steps else None


SWITCH_BATCH = 4
SPREAD_BATCH = 16
HOST_TOKENS = 16
EXTRA_REPEATS = 5


def profile_extra_terms(
    model: Any,
    unit: float,
    *,
    context: int = DEFAULT_CONTEXT,
    repeats: int = DEFAULT_REPEATS,
    clock: Clock | None = None,
) -> tuple[float, float, float]:
    """``(switch, per_token, per_draft_row)`` of ``model`` in plain steps of ``unit`` seconds (the module's rule).

    A term that cannot be timed here is 0, with a warning saying why.  Each is
    a median over at least :data:`EXTRA_REPEATS` repeats (``per_draft_row``,
    a smaller difference, twice as many): a difference of two timings is
    noisier than either.  Does not change the model.
    """
    repeats, clock = max(repeats, EXTRA_REPEATS), clock or time.perf_counter
    try:
        switch = max(0.0, _ragged_seconds(model, context, repeats, SWITCH_BATCH, "plain", "one", clock=clock)) / unit
    except Exception as error:  # e.g. a model that takes no attention mask: it has no masked path to switch to
        _warn(model, "the masked path", error)
        switch = 0.0
    try:
        vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0)) or 32
        per_token = _host_seconds_per_token(vocab, repeats, clock) / unit
    except Exception as error:
        _warn(model, "the host work per draft token", error)
        per_token = 0.0
    try:
        spread = _ragged_seconds(
            model, context, 2 * repeats, SPREAD_BATCH, "chain", "spread", packed_only=True, clock=clock
        )
        per_draft_row = max(0.0, spread) / (SPREAD_BATCH - 1) / unit
    except Exception as error:
        _warn(model, "drafts spread over rows", error)
        per_draft_row = 0.0
    return two_digits(switch), two_digits(per_token), two_digits(per_draft_row)


def _warn(model: Any, what: str, error: Exception) -> None:
    name = getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__
    warnings.warn(
        f"grammarspec could not time {what} for {name} ({type(error).__name__}: {error}); pricing it at 0",
        RuntimeWarning,
        stacklevel=3,
    )


Shape = tuple[list[list[int]], list[list[int]]]  # one step's (chunks, parents), as BatchKV.forward takes them


def ragged_shapes(batch: int) -> dict[str, Shape]:
    """Steps of ``batch`` rows, by what drafts: ``plain`` (one token a row), ``one`` (row 0 verifies a one-token
    draft), ``chain`` (row 0 verifies ``batch`` draft tokens) and ``spread`` (every row verifies one: as many
    tokens as ``chain``, on ``batch`` rows).  Pure."""
    rest: Shape = ([[9]] * (batch - 1), [[]] * (batch - 1))
    return {
        "plain": ([[9]] * batch, [[]] * batch),
        "one": ([[9, 10]] + rest[0], [[-1]] + rest[1]),
        "chain": ([[9, *range(10, 10 + batch)]] + rest[0], [list(range(-1, batch - 1))] + rest[1]),
        "spread": ([[9, 10]] * batch, [[-1]] * batch),
    }


def _ragged_seconds(
    model: Any,
    context: int,
    repeats: int,
    batch: int,
    before: str,
    after: str,
    *,
    packed_only: bool = False,
    clock: Clock = time.perf_counter,
) -> float:
    """Median over paired repeats of (step ``after`` - step ``before``) of :func:`ragged_shapes`, seconds.

    Both run ``batch`` rows of about ``context`` cached tokens (row 0 one
    longer: ragged) through :meth:`grammarspec.kv.batch.BatchKV.forward`, each
    followed by the verification's device work; neither keeps its columns.
    ``packed_only``: 0 where ragged steps run padded (a padded step is as wide
    as its widest row, which the curve prices).
    """
    from grammarspec.kv.batch import BatchKV

    config = getattr(model, "config", None)
    vocab = int(getattr(config, "vocab_size", 2))
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int):
        context = max(2, min(context, limit - batch - 4))
    device = input_device(model)
    backend = getattr(torch, device.type, None)
    synchronize = getattr(backend, "synchronize", None) if device.type != "cpu" else None
    prompt = [(7 * i + 3) % vocab for i in range(context)]
    ragged = BatchKV(model, batch)
    if packed_only and not ragged.packed:
        return 0.0
    shapes = ragged_shapes(batch)
    with torch.inference_mode():
        ragged.forward([prompt] * batch, [[]] * batch)
        ragged.keep([list(range(context))] * batch)
        ragged.forward([[5, 6]] * batch, [[]] * batch)
        ragged.keep([[0, 1]] + [[0]] * (batch - 1))  # row 0 one token longer: the rows are ragged from here on

        def timed(shape: Shape) -> float:
            if synchronize is not None:
                synchronize()
            start = clock()
            _verify_rows(ragged.forward(*shape))
            seconds = clock() - start
            ragged.keep([[]] * batch)
            return seconds

        differences = []
        for i in range(repeats + 1):  # the first pair warms up and is not counted
            first = timed(shapes[before])
            second = timed(shapes[after])
            if i:
                differences.append(second - first)
    return statistics.median(differences)


def _host_seconds_per_token(vocab: int, repeats: int, clock: Clock = time.perf_counter) -> float:
    """Median seconds of the stand-in host work of one draft token: drafting it, the grammar walk's mask fill and
    accept, and its scored row's mask applied as the loop applies it (the rollback shared out)."""
    import xgrammar

    from grammarspec.engine.masking import apply_masks
    from proposers.prompt_lookup import PromptLookupProposer

    if vocab < 24:
        raise RuntimeError(f"a vocabulary of {vocab} tokens is too small for the stand-in walk (24 at least)")
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = []
    for i in range(vocab):  # distinct lowercase words; JSON punctuation and digits first
        word, j = "", i
        while True:
            word, j = word + letters[j % 26], j // 26
            if j == 0:
                break
        words.append(word)
    for i, text in enumerate('{}[]:,"0123456789 '):
        words[i] = text
    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo(words, vocab_size=vocab), max_threads=1)
    matcher = xgrammar.GrammarMatcher(compiler.compile_builtin_json_grammar())
    # {"u":1,"v":2,"w" -- keys, values and punctuation: masks both dense (in a key) and sparse (after '{' or ':')
    drafted = [0, 6, 20, 6, 4, 8, 5, 6, 21, 6, 4, 9, 5, 6, 22, 6][:HOST_TOKENS]
    context = (list(range(100, 164)) + drafted) * 8 + list(range(100, 164))  # a lookup that finds its run
    lookup = PromptLookupProposer()
    masks = xgrammar.allocate_token_bitmask(len(drafted), vocab)
    scores = torch.zeros((len(drafted), vocab), dtype=torch.float32, device="cpu")
    seconds = []
    for _ in range(repeats + 1):  # the first round warms up and is not counted
        start = clock()
        draft = lookup.propose(context, None, HOST_TOKENS)
        walked = 0
        for token in draft.tokens:
            matcher.fill_next_token_bitmask(masks, walked)
            if not matcher.accept_token(token):
                break
            walked += 1
        matcher.rollback(walked)
        apply_masks(scores, masks)  # one call for the step's rows, as the loop makes it
        if walked < len(drafted):
            raise RuntimeError(f"the stand-in walk took {walked} of {len(drafted)} tokens")
        seconds.append((clock() - start) / walked)
    return statistics.median(seconds[1:])


def _verify_rows(logits: torch.Tensor) -> None:
    """What the loop does with a pass's ``[n, V]`` logits besides the forward: float32, a grammar bitmask
    applied on their device (every token allowed here), the best token of every row, one host read."""
    import xgrammar

    scores = logits.float()
    vocab = scores.shape[-1]
    masks = torch.full((scores.shape[0], (vocab + 31) // 32), -1, dtype=torch.int32, device="cpu")  # host
    xgrammar.apply_token_bitmask_inplace(scores, masks.to(scores.device), vocab_size=vocab)
    row_max(scores)[1].tolist()  # the loop's argmax and one host transfer (it waits for the device)
