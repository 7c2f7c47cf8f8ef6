"""The bounded rollback window shared by every matcher adapter.

Semantics (those of outlines-core's ``Guide``): each accepted token stores one
state, at most ``max_rollback`` states are kept (the oldest is dropped), and
rolling back ``n`` tokens pops ``n`` of them.  Both adapters count with this
class so that the same calls succeed or fail on every backend.

Worked example with ``max_rollback=3``: accept 5 tokens -> 3 stored;
rollback(2) -> 1 stored; rollback(2) raises.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from .base import CompiledGrammar, GrammarError, Matcher


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


class StopMarkingMatcher(WindowedMatcher):
    """A windowed matcher whose backend never sees a stop token: accepting one, where the grammar may end, only
    marks the matcher terminated, and rolling it back only clears the mark.

    A backend module's matcher gives :attr:`backend` (its name), starts with this class's ``__init__``, and
    gives the hooks over its own state: :meth:`_can_stop`, :meth:`_advance`, :meth:`_undo` and :meth:`_restart`.
    """

    backend: str

    def __init__(self, compiled: CompiledGrammar, window: RollbackWindow, terminated: bool = False) -> None:
        """The state every such matcher keeps: the window, the stop mark, and ``compiled``'s vocabulary."""
        self._window = window
        self._terminated = terminated
        self.vocab_size = compiled.vocab_size
        self.stop_token_ids = compiled.stop_token_ids
        self.max_rollback = window.max_rollback
        self._stops = frozenset(self.stop_token_ids)

    def accept(self, token: int) -> bool:
        """Advance by ``token`` if legal; changes state only when it returns ``True``."""
        token = operator.index(token)
        if self._terminated or not 0 <= token < self.vocab_size:
            return False
        if token in self._stops:
            if not self._can_stop():
                return False
            self._terminated = True
        elif not self._advance(token):
            return False
        self._window.push()
        self._accepted(token)
        return True

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens.  Changes state."""
        self._window.pop(n, self.backend)
        if n and self._terminated:
            self._terminated = False
            self._undo(n, n - 1)
        elif n:
            self._undo(n, n)

    def is_terminated(self) -> bool:
        """Whether a stop token was accepted.  Does not change state."""
        return self._terminated

    def reset(self) -> None:
        """Return to the initial state.  Changes state."""
        self._restart()
        self._terminated = False
        self._window.clear()

    def _check_open(self) -> None:
        """Refuse to say what comes next after a stop token."""
        if self._terminated:
            raise GrammarError(
                f"the {self.backend} matcher is terminated (a stop token was accepted) and has no next "
                "token; stop generating, or roll back the stop token first"
            )

    def _can_stop(self) -> bool:
        """Whether the grammar may end here.  Does not change state."""
        raise NotImplementedError

    def _advance(self, token: int) -> bool:
        """Advance the backend by the non-stop ``token`` if legal; changes state only when it returns ``True``."""
        raise NotImplementedError

    def _accepted(self, token: int) -> None:
        """Called after each accepted token (stop tokens included)."""

    def _undo(self, tokens: int, in_backend: int) -> None:
        """Undo the last ``tokens`` accepted tokens, of which the last ``in_backend`` reached the backend."""
        raise NotImplementedError

    def _restart(self) -> None:
        """Return the backend to its initial state."""
        raise NotImplementedError
