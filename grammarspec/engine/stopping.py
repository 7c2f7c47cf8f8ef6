"""When a request is finished: grammar end, EOS, a stop string, or the token limit.

The loop ends a row with :func:`stop_reason`; :func:`before_stop` is where an
OpenAI client's text ends (the stop string itself is not returned).  Both read
the same stop strings, so the server never cuts a row of its own accord.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grammars.base import Matcher

__all__ = ["before_stop", "stop_reason"]


def stop_reason(
    generated: Sequence[int],
    matcher: Matcher | None,
    eos: frozenset[int],
    max_new_tokens: int,
    stop_strings: tuple[str, ...],
    tokenizer: Any,
) -> str | None:
    """Why generation ends after the last token of ``generated`` (``None``: it goes on).  Pure.

    ``stop``: the grammar completed (or EOS under a grammar); ``eos``: EOS without a
    grammar; ``stop_string``: a stop string was completed by the last token;
    ``length``: ``max_new_tokens`` reached.
    """
    token = generated[-1]
    if matcher is not None and matcher.is_terminated():
        return "stop"
    if token in eos:
        return "eos" if matcher is None else "stop"
    if stop_strings and _ends_with_stop_string(generated, stop_strings, tokenizer):
        return "stop_string"
    if len(generated) >= max_new_tokens:
        return "length"
    return None


def _ends_with_stop_string(generated: Sequence[int], stop_strings: tuple[str, ...], tokenizer: Any) -> bool:
    """Whether a stop string is completed by the last generated token."""
    window = max(len(s) for s in stop_strings) + 1  # every token holds at least one character
    tail = list(generated[-window:])
    text = tokenizer.decode(tail, skip_special_tokens=False)
    before = tokenizer.decode(tail[:-1], skip_special_tokens=False)
    return any(s in text and s not in before for s in stop_strings)


def before_stop(text: str, stop_strings: Sequence[str]) -> tuple[str, bool]:
    """``(text up to the first stop string, whether one was found)``, as the OpenAI API returns it.  Pure.

    >>> before_stop("a, b. c.", [".", "b"])
    ('a, ', True)
    >>> before_stop("abc", ["x"])
    ('abc', False)
    """
    hits = [text.find(s) for s in stop_strings if s and s in text]
    return (text[: min(hits)], True) if hits else (text, False)
