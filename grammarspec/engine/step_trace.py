"""Where a decoding loop's time goes, step by step: an optional recorder, off by default.

Pass a :class:`StepTrace` as ``decode_batch(..., trace=...)`` (``Engine(...,
trace_steps=True)`` does; ``bench-serve --sweep`` reads it) and every step appends one :class:`StepRecord`:
how many rows stepped and how many read a prompt chunk, the draft tokens
offered, admitted (verified) and accepted, the forward's shape (batch rows
after folding, width, and whether it took the ragged path (packed, or padded under a mask) or the
mask-free decode path) and the step's phase times (``forced``, ``propose``,
``walk``, ``forward``, ``verify``, ``commit``).  Joins record their rows and
time.  With no trace the loop does no extra work.  Bookkeeping only: outputs
are unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["JoinRecord", "PHASES", "StepRecord", "StepTrace", "summarize"]

#: The step's phases in order (:class:`grammarspec.engine.step.Phases` laps).
PHASES = ("forced", "propose", "walk", "forward", "verify", "commit")


@dataclass(frozen=True)
class StepRecord:
    """One step: its rows, drafts and forward, and the seconds of each phase."""

    rows: int  # rows that stepped (sampled a token)
    reading: int  # rows that read a prompt chunk instead
    prompt_tokens: int  # tokens fed by rows whose prompt was not yet in the cache (whole prompts and chunks)
    offered: int  # draft tokens the proposers offered
    admitted: int  # draft tokens the policy admitted (verified by the forward)
    accepted: int  # admitted tokens the target accepted
    forward_rows: int  # batch rows of the forward (folded prompt pieces included)
    forward_width: int  # tokens per batch row of the forward
    masked: bool  # the forward took the ragged path, packed or padded (else the mask-free decode path)
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class JoinRecord:
    """Requests taking slots of the batch's cache: how many, and the seconds it took."""

    rows: int
    seconds: float


class StepTrace:
    """The records of every step and join of the loops it is passed to.  Thread-safe appends."""

    def __init__(self) -> None:
        self.steps: list[StepRecord] = []
        self.joins: list[JoinRecord] = []
        self._lock = threading.Lock()

    def step(
        self,
        steps: Sequence[Any],
        results: Sequence[tuple[Sequence[int], Any]],
        prompt_tokens: int,
        reading: int,
        seconds: dict[str, float],
        forward: tuple[int, int, bool],
    ) -> None:
        """Record one step.  Changes the trace.

        ``steps`` / ``results``: the stepping rows' :class:`~grammarspec.engine.rows.Step`
        and ``(path, next token)``; ``prompt_tokens``: tokens fed by rows whose
        prompt was not yet in the cache; ``reading``: rows that read a prompt chunk; ``seconds``: the
        phase laps; ``forward``: ``(batch rows, width, masked)`` of the forward.
        """
        admitted = sum(len(s.tree) for s in steps)
        record = StepRecord(
            rows=len(steps),
            reading=reading,
            prompt_tokens=prompt_tokens,
            offered=sum(len(s.offered) if not s.is_tree else len(s.tree) for s in steps),
            admitted=admitted,
            accepted=sum(len(path) for path, _ in results),
            forward_rows=forward[0],
            forward_width=forward[1],
            masked=forward[2],
            seconds=dict(seconds),
        )
        with self._lock:
            self.steps.append(record)

    def join(self, rows: int, seconds: float) -> None:
        """Record a join of ``rows`` requests.  Changes the trace."""
        with self._lock:
            self.joins.append(JoinRecord(rows, seconds))

    def take(self) -> tuple[list[StepRecord], list[JoinRecord]]:
        """The records so far, and forget them (a bench reads one arm's at a time).  Changes the trace."""
        with self._lock:
            steps, joins, self.steps, self.joins = self.steps, self.joins, [], []
        return steps, joins


def summarize(steps: Sequence[StepRecord], joins: Sequence[JoinRecord] = ()) -> dict[str, Any]:
    """Totals and per-step means of ``steps`` and ``joins``: where the time went.  Pure.

    ``seconds``: each phase's total; ``prefill_seconds``: the total time of steps
    that fed prompt tokens (a whole prompt, or a chunk of one, beside the decoding rows); ``join_seconds``: of joins; ``forward_ms``: the mean
    forward time of steps without and with draft tokens, on the mask-free and
    the masked path (``None`` where no step took it); ``survival``: accepted /
    admitted draft tokens.

    >>> s = StepRecord(2, 0, 0, 4, 3, 2, 2, 4, True, {"forward": 0.01, "propose": 0.001})
    >>> out = summarize([s, s], [JoinRecord(1, 0.002)])
    >>> out["steps"], out["rows"], out["admitted"], round(out["survival"], 2), out["forward_ms"]["drafted_masked"]
    (2, 2.0, 3.0, 0.67, 10.0)
    """
    n = len(steps)
    totals = {name: sum(s.seconds.get(name, 0.0) for s in steps) for name in PHASES}
    groups: dict[str, list[float]] = {}
    for s in steps:
        key = ("drafted" if s.admitted else "plain") + ("_masked" if s.masked else "_maskfree")
        groups.setdefault(key, []).append(s.seconds.get("forward", 0.0))
    keys = ("plain_maskfree", "plain_masked", "drafted_maskfree", "drafted_masked")
    admitted = sum(s.admitted for s in steps)
    return {
        "steps": n,
        "rows": sum(s.rows for s in steps) / max(n, 1),
        "offered": sum(s.offered for s in steps) / max(n, 1),
        "admitted": admitted / max(n, 1),
        "survival": sum(s.accepted for s in steps) / admitted if admitted else None,
        "forward_rows": sum(s.forward_rows for s in steps) / max(n, 1),
        "forward_width": sum(s.forward_width for s in steps) / max(n, 1),
        "masked_share": sum(s.masked for s in steps) / max(n, 1),
        "seconds": totals,
        "forward_ms": {k: 1000 * sum(groups[k]) / len(groups[k]) if groups.get(k) else None for k in keys},
        "steps_by_path": {k: len(groups.get(k, ())) for k in keys},
        "prefill_steps": sum(1 for s in steps if s.prompt_tokens),
        "prefill_seconds": sum(sum(s.seconds.values()) for s in steps if s.prompt_tokens),
        "prompt_tokens": sum(s.prompt_tokens for s in steps),
        "joins": len(joins),
        "join_seconds": sum(j.seconds for j in joins),
    }
