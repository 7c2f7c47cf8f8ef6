"""The bench's record of one run: what every arm's result is turned into (the runner's and the vLLM arms').

A leaf the runner (:mod:`grammarspec.bench.runner`) and the vLLM arms
(:mod:`grammarspec.bench.vllm_arms`) both build their records with; the reports
(:mod:`grammarspec.bench.report`, :mod:`grammarspec.bench.drafts`) sum their per-source counts with
:func:`source_totals`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from grammarspec.bench.scoring import calls_field_accuracy, field_accuracy, parse_and_validate
from grammarspec.bench.tasks import BenchTask

if TYPE_CHECKING:
    from grammarspec.bench.arms import PreparedTask

__all__ = ["TEXT_CHARS", "make_record", "rates", "source_totals"]

#: Characters of output text kept per run in the results.
TEXT_CHARS = 4000


def make_record(
    task: BenchTask,
    prepared: PreparedTask,
    arm: str,
    repeat: int,
    tokenizer: Any,
    run: Any,
) -> dict[str, Any]:
    """The bench's record of one run of ``arm`` on ``task``: ``run`` is a :class:`~grammarspec.bench.arms.RunResult`,
    or the error text of a run that failed.  Pure (decodes the tokens)."""
    base = {"task": task.id, "category": task.category, "arm": arm, "repeat": repeat}
    if isinstance(run, str):
        return {**base, "error": run}
    eos = tokenizer.eos_token_id
    body = [t for t in run.tokens if t != eos]
    text = tokenizer.decode(body, skip_special_tokens=True)
    value, valid, errors = parse_and_validate(text, task.schema, run.finish_reason == "stop")
    accuracy = None
    if task.scored:
        if isinstance(task.reference, list):
            accuracy = calls_field_accuracy(value, task.reference)
        else:
            accuracy = field_accuracy(value, task.reference)
    new = len(run.tokens)
    record: dict[str, Any] = {
        **base,
        "prompt_tokens": len(prepared.prompt_ids),
        "new_tokens": new,
        "seconds": run.seconds,
        "tokens_per_second": new / run.seconds if run.seconds > 0 else 0.0,
        "first_step_seconds": run.first_step_seconds,
        "decode_tokens_per_second": _decode_rate(new, run),
        "finish_reason": run.finish_reason,
        "valid": valid,
        "errors": errors,
        "field_accuracy": accuracy,
        "grammar_seconds": run.grammar_seconds,
        "tokens": run.tokens,
        "text": text[:TEXT_CHARS],
    }
    stats = run.stats
    if stats is None:  # the baseline: one forward pass per token, no drafts
        record.update(
            target_forwards=new,
            forced_tokens=0,
            proposed={},
            accepted={},
            draft_seconds=0.0,
            verify_seconds=None,
            steps=[],
        )
    else:
        record.update(
            target_forwards=stats.target_forwards,
            forced_tokens=stats.forced_tokens,
            proposed=dict(stats.proposed),
            accepted=dict(stats.accepted),
            draft_seconds=stats.draft_seconds,
            verify_seconds=stats.verify_seconds,
            steps=[list(s) for s in stats.steps],
            final_k=stats.final_k,
            speculating=stats.speculating,
        )
    return record


def _decode_rate(new: int, run: Any) -> float | None:
    """Tokens per second after the prompt pass (``None`` when nothing came after it)."""
    tokens, seconds = new - run.first_step_tokens, run.seconds - run.first_step_seconds
    return tokens / seconds if tokens > 0 and seconds > 0 else None


def source_totals(records: Iterable[dict[str, Any]], key: str) -> dict[str, int]:
    """The per-source counts ``record[key]`` (``"proposed"`` or ``"accepted"``: source -> draft tokens) summed over
    ``records``, sources in the order first met.  Pure.

    >>> source_totals([{"proposed": {"lookup": 3}}, {"proposed": {"lookup": 1, "schema": 2}}], "proposed")
    {'lookup': 4, 'schema': 2}
    """
    totals: dict[str, int] = {}
    for record in records:
        for name, n in record[key].items():
            totals[name] = totals.get(name, 0) + n
    return totals


def rates(requests: int, tokens: int, passes: int, seconds: float) -> dict[str, Any]:
    """A workload's counts with tokens per target pass and per second (0 where undefined).  Pure.

    >>> rates(2, 12, 4, 3.0)["tokens_per_pass"], rates(2, 12, 0, 0.0)["tokens_per_second"]
    (3.0, 0.0)
    """
    return {
        "requests": requests,
        "tokens": tokens,
        "passes": passes,
        "tokens_per_pass": tokens / passes if passes else 0.0,
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
    }
