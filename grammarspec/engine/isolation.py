"""One row's failure is that row's alone: its own work runs contained, and an exception in it ends the row.

What belongs to one row -- its grammar matcher (mask fills, the draft walk,
accepting committed tokens), its proposer (proposing, being told what was
committed), its logits processing, its stop check and the caller's per-row
callback -- runs through :func:`contained`.  A row whose grammar allows no
token where it needs one (a dead end) fails the same way (:func:`fail`).  An exception there ends that row with
``finish_reason="error"`` and keeps the exception in ``row.failure``; the row
leaves the batch like a finished one (its slot of the cache is freed, the other
rows' columns and positions are not touched), so the other rows decode as they
would alone.  What the rows share -- the target forward, the batch cache, the
step's choice of tokens -- is not contained: an exception there still ends the
whole loop.  A processor that every row shares (a ``logits_processor=`` of one
``generate`` call) and that raises on every row fails every row, so the call fails.

Callers see the failure: ``generate`` raises :class:`GenerationError` after the
other rows finish, ``grammarspec serve`` answers the failed request with an
error and the others normally.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar

__all__ = ["RowFailure", "GenerationError", "contained", "fail"]

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True)
class RowFailure:
    """Why a row ended early: the part of its own work that raised (``work``) and the exception (``error``)."""

    work: str
    error: Exception

    def __str__(self) -> str:
        return f"{self.work} raised {type(self.error).__name__}: {self.error}"


class Failable(Protocol):
    """What a row's failure changes (a :class:`grammarspec.engine.rows.Row`, which holds a :class:`RowFailure`)."""

    failure: RowFailure | None
    finish_reason: str | None


class GenerationError(RuntimeError):
    """Some rows of a generation failed in their own work (their grammar matcher, their drafter); the others finished.

    ``failures``: row index -> :class:`RowFailure` (its ``error`` is the original exception; the first one is also
    this exception's ``__cause__``).  ``output``: what the call would have returned, with every row: the finished
    rows complete, each failed row holding the tokens it committed before it failed (its statistics say
    ``finish_reason="error"``, ``valid=False``).
    """

    def __init__(self, failures: Mapping[int, RowFailure], output: Any = None, rows: int | None = None) -> None:
        self.failures = dict(failures)
        self.output = output
        total = f" of {rows}" if rows is not None else ""
        named = "; ".join(f"row {index}{total}: {failure}" for index, failure in sorted(self.failures.items()))
        others = " The other rows finished: their results are in this error's .output." if rows != len(failures) else ""
        super().__init__(f"generation failed for {named}.{others}")


def contained(row: Failable, work: str, failed: T, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``call(*args, **kwargs)``: a part of ``row``'s own ``work``.  If it raises, ``row`` fails and ``failed`` is
    returned: ``row.finish_reason`` becomes ``"error"`` and ``row.failure`` names the work and keeps the exception
    (the first one, where a failed row raises again).  Changes the row on failure."""
    try:
        return call(*args, **kwargs)
    except Exception as error:
        fail(row, work, error)
        return failed


def fail(row: Failable, work: str, error: Exception) -> None:
    """``row`` fails in its own ``work`` with ``error``: ``finish_reason="error"``, and ``row.failure`` keeps the
    first failure.  Changes the row."""
    if row.failure is None:
        row.failure = RowFailure(work, error)
    row.finish_reason = "error"
