"""How long a prompt may be before it is tokenized: a character bound that no prompt fitting the context passes.

Tokenizing is the first costly step of a request (a few seconds per million
characters, and memory to match), so a prompt that cannot fit the model's
context is refused by its length in characters first.  The bound
:func:`derived_max_prompt_chars` is the context (tokens) times the longest
vocabulary entry (characters): a token's text is never longer than its entry
(byte-level BPE writes one character per byte, SentencePiece one per
character, byte-fallback ``<0x0A>`` six for one), so a text of more characters
needs more tokens than the context holds.  The chat template only adds text
around the messages, so counting the messages' text alone (leading and
trailing whitespace left out, as templates that trim it do) keeps the bound
sound.  A tokenizer that collapses runs of whitespace inside a text (few do)
could fit a longer text; ``--max-prompt-chars`` raises the bound.
"""

from __future__ import annotations

from typing import Any

from grammarspec.serve.protocol import ChatRequest, RequestError

__all__ = ["derived_max_prompt_chars", "prompt_chars", "check_prompt_chars"]


def derived_max_prompt_chars(tokenizer: Any, context: int | None) -> int | None:
    """``context`` x the longest vocabulary entry's characters (``None`` without a known context)."""
    if not context:
        return None
    longest = max((len(entry) for entry in tokenizer.get_vocab()), default=1)
    return int(context) * max(longest, 1)


def prompt_chars(request: ChatRequest) -> int:
    """The characters of the messages' text (each stripped of outer whitespace).  Pure."""
    return sum(len(m["content"].strip()) for m in request.messages if isinstance(m.get("content"), str))


def check_prompt_chars(request: ChatRequest, limit: int | None, context: int | None) -> None:
    """Raise :class:`RequestError` (400) for messages longer than ``limit`` characters (``None``: no limit)."""
    if limit is None:
        return
    chars = prompt_chars(request)
    if chars > limit:
        fits = f": a prompt that long cannot fit the model's context of {context:,} tokens" if context else ""
        raise RequestError(
            f"the messages hold {chars:,} characters, more than this server tokenizes ({limit:,}: its "
            f"--max-prompt-chars){fits}; shorten or drop messages",
            param="messages",
            code="context_length_exceeded",
        )
