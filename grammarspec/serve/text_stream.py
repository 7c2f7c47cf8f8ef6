"""A choice's text as its tokens arrive, without decoding the whole answer again at every commit.

The server needs each choice's text after every commit: to find a stop
string, and to stream what is new.  Decoding all the tokens each time costs a
row a pass over its whole answer per commit (quadratic in the answer, on the
engine thread, for every row of the batch).  :class:`TextStream` keeps the
text and extends it with the tokenizers library's own incremental decoder
(``tokenizers.decoders.DecodeStream``, which holds back a character until its
bytes are complete), where that decoder and ``tokenizer.decode`` agree by
construction: a Hugging Face tokenizer backed by ``tokenizers`` whose
``_decode`` is the backend's own and which cleans up no spaces.  Any other
tokenizer is decoded whole at every commit, as before.  Either way the text is
a prefix of ``tokenizer.decode(tokens, skip_special_tokens=True)``, and the
caller takes the whole decode once when the choice ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["TextStream", "streams_exactly"]


def streams_exactly(tokenizer: Any) -> bool:
    """Whether ``tokenizer.decode(ids, skip_special_tokens=True)`` is its backend's ``decode`` and nothing more, so
    the backend's incremental decoder reproduces it.  Pure."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # an older transformers: no backend class to compare with
        return False
    backend = getattr(tokenizer, "_tokenizer", None)
    return (
        isinstance(tokenizer, TokenizersBackend)
        and type(tokenizer)._decode is TokenizersBackend._decode
        and hasattr(backend, "decode")
        and not getattr(tokenizer, "clean_up_tokenization_spaces", False)
    )


class TextStream:
    """The text of the tokens :meth:`add` has been given (special tokens skipped), kept as they arrive."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._tokens: list[int] = []
        self._stream: Any = None
        if streams_exactly(tokenizer):
            from tokenizers.decoders import DecodeStream

            self._stream = DecodeStream(skip_special_tokens=True)
        self.text = ""

    @property
    def incremental(self) -> bool:
        """Whether tokens are decoded as they come (else the whole answer is decoded at every :meth:`add`)."""
        return self._stream is not None

    def add(self, tokens: Sequence[int]) -> str:
        """The text with ``tokens`` appended (an incomplete character's bytes wait for the rest).  Changes state."""
        if self._stream is None:
            self._tokens += tokens
            self.text = self._tokenizer.decode(self._tokens, skip_special_tokens=True)
            return self.text
        backend = self._tokenizer._tokenizer
        for token in tokens:
            piece = self._stream.step(backend, token)
            if piece:
                self.text += piece
        return self.text
