"""The bounded rollback window shared by every matcher adapter.

Semantics (those of outlines-core's ``Guide``): each accepted token stores one
state, at most ``max_rollback`` states are kept (the oldest is dropped), and
rolling back ``n`` tokens pops ``n`` of them.  Both adapters count with this
class so that the same calls succeed or fail on every backend.

Worked example with ``max_rollback=3``: accept 5 tokens -> 3 stored;
rollback(2) -> 1 stored; rollback(2) raises.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import GrammarError, Matcher


class RollbackWindow:
    """How many tokens can be rolled back right now.  A plain counter."""

    __slots__ = ("max_rollback", "stored")

    def __init__(self, max_rollback: int, stored: int = 0) -> None:
        if not isinstance(max_rollback, int) or max_rollback < 0:
            raise GrammarError(f"max_rollback must be a non-negative int, got {max_rollback!r}")
        self.max_rollback = max_rollback
        self.stored = stored

    def push(self) -> None:
        """One token was accepted."""
        self.stored = min(self.stored + 1, self.max_rollback)

    def pop(self, n: int, backend: str) -> None:
        """Check that ``n`` tokens can be undone, then forget them."""
        if not isinstance(n, int) or n < 0:
            raise GrammarError(f"rollback needs a non-negative int, got {n!r}")
        if n > self.stored:
            raise GrammarError(
                f"Cannot roll back {n} tokens: only {self.stored} stored "
                f"({backend} matcher, max_rollback={self.max_rollback}). Roll back at most "
                f"{self.stored}, or create the matcher with matcher(max_rollback=...) of at least "
                "the longest proposal + 1."
            )
        self.stored -= n

    def clear(self) -> None:
        self.stored = 0

    def copy(self) -> RollbackWindow:
        return RollbackWindow(self.max_rollback, self.stored)


class WindowedMatcher(Matcher):
    """A matcher that counts its rollback window with a :class:`RollbackWindow`.

    Its :meth:`validate` also restores the window, so validating never
    shortens how far the matcher can roll back (backends must keep at least
    ``2 * max_rollback`` states for this).
    """

    _window: RollbackWindow

    def validate(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` are legal in sequence.  Does not change state."""
        tokens = list(tokens)
        if len(tokens) > self._window.max_rollback:
            return _count_legal(self.fork(), tokens)
        stored = self._window.stored
        n = _count_legal(self, tokens)
        if n:
            self.rollback(n)
        self._window.stored = stored
        return n


def _count_legal(matcher: Matcher, tokens: Sequence[int]) -> int:
    """Accept ``tokens`` until one is illegal; how many were accepted.  Changes state."""
    n = 0
    for token in tokens:
        if not matcher.accept(int(token)):
            break
        n += 1
    return n
