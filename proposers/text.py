"""Text -> tokens in the tokenizer's own canonical split.

Deterministic drafters think in text (a forced JSON span, a value copied from
the prompt, a key seen earlier).  The target only accepts what it would have
produced itself, and a model produces the canonical tokenisation of a text;
a draft in any other split is rejected by verification (never injected, but
wasted).  :func:`continuation_tokens` therefore re-encodes a few committed
tokens together with the new text and keeps only the part after them, so that
the seam between committed and proposed tokens is split the way the tokenizer
itself would split it.

Byte-exactness is checked with the tokenizer's per-token byte strings (from
xgrammar's ``TokenizerInfo``, which knows byte-level, sentencepiece and
tiktoken vocabularies): the returned tokens always spell exactly ``text``.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

__all__ = ["TokenText", "token_text", "continuation_tokens"]

_ENCODE_CACHE_SIZE = 4096


class TokenText:
    """Per-tokenizer helper: token bytes and a small encode cache.

    Build it with :func:`token_text`, which keeps one per tokenizer.  Nothing
    here changes the tokenizer.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        # The raw ``tokenizers.Tokenizer`` is ~2x faster than the HF wrapper.
        self._backend = getattr(tokenizer, "_tokenizer", None)
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._bytes: list[bytes] | None = None
        self.special_ids: frozenset[int] = frozenset(int(t) for t in (tokenizer.all_special_ids or ()))

    @property
    def vocab_bytes(self) -> list[bytes]:
        """The byte string of every token id (special tokens: their text)."""
        if self._bytes is None:
            self._bytes = _decoded_vocab(self._tokenizer)
        return self._bytes

    def bytes_of(self, ids: Sequence[int]) -> bytes:
        """The bytes ``ids`` spell (ids outside the vocabulary spell nothing)."""
        table = self.vocab_bytes
        n = len(table)
        return b"".join(table[i] for i in ids if 0 <= i < n)

    def encode(self, text: str) -> tuple[int, ...]:
        """Canonical token ids of ``text`` without special tokens (cached)."""
        ids = self._cache.get(text)
        if ids is not None:
            self._cache.move_to_end(text)
            return ids
        if self._backend is not None:
            ids = tuple(self._backend.encode(text, add_special_tokens=False).ids)
        else:
            ids = tuple(self._tokenizer.encode(text, add_special_tokens=False))
        self._cache[text] = ids
        if len(self._cache) > _ENCODE_CACHE_SIZE:
            self._cache.popitem(last=False)
        return ids


def _decoded_vocab(tokenizer: Any) -> list[bytes]:
    """Bytes of each token, via xgrammar (the library that knows vocabulary types)."""
    try:
        import xgrammar as xgr

        return list(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer)).decoded_vocab)
    except Exception:  # an unusual tokenizer: fall back to decoding each token alone
        out = []
        for i in range(len(tokenizer)):
            try:
                out.append(tokenizer.decode([i], clean_up_tokenization_spaces=False).encode("utf-8"))
            except Exception:
                out.append(b"")
        return out


_REGISTRY: "weakref.WeakKeyDictionary[Any, TokenText]" = weakref.WeakKeyDictionary()
_BY_ID: dict[int, TokenText] = {}


def token_text(tokenizer: Any) -> TokenText:
    """The shared :class:`TokenText` of ``tokenizer`` (built once)."""
    try:
        helper = _REGISTRY.get(tokenizer)
        if helper is None:
            helper = _REGISTRY[tokenizer] = TokenText(tokenizer)
        return helper
    except TypeError:  # not weak-referenceable or not hashable
        helper = _BY_ID.get(id(tokenizer))
        if helper is None or helper._tokenizer is not tokenizer:
            helper = _BY_ID[id(tokenizer)] = TokenText(tokenizer)
        return helper


def continuation_tokens(
    tokenizer: Any, context_ids: Sequence[int], text: str, lookback: int = 4
) -> list[int]:
    """Tokens that spell ``text`` after ``context_ids``, split canonically.

    Re-encodes the decoded last ``lookback`` context tokens together with
    ``text``; when the re-encoding starts with exactly those context tokens,
    the tokens after them are the answer.  When it does not (the seam would
    re-split committed text), it backs off to fewer context tokens, down to
    ``text`` alone.  A tail that is not whole UTF-8 characters, or that holds a
    special token, is skipped the same way.  Returns ``[]`` when no
    tokenisation spells ``text`` exactly.

    Worked example (SmolLM2's byte-level BPE; ``Ġ`` is a space)::

        context tokens  ... '","'  'name'  '":"'          text 'John Smith","age":'
        re-encode  '","name":"John Smith","age":'
               ->  '","' 'name' '":"' | 'John' 'ĠSmith' '","' 'age' '":'
        returned:  ['John', 'ĠSmith', '","', 'age', '":']

        context tokens  ... '"'  (a lone quote)       text ',"age":'
        re-encode  '",' '"age":' ... starts with '",' , not '"': the seam would
        re-split the committed quote, so back off to ',"age":' alone.

    Does not change anything (tokenisations are cached per tokenizer).
    """
    if not text:
        return []
    helper = token_text(tokenizer)
    target = text.encode("utf-8")
    specials = helper.special_ids
    n = len(context_ids)
    for lb in range(min(lookback, n), -1, -1):
        tail = [int(t) for t in context_ids[n - lb :]] if lb else []
        if any(t in specials for t in tail):
            continue
        try:
            tail_text = helper.bytes_of(tail).decode("utf-8")
        except UnicodeDecodeError:
            continue
        encoded = helper.encode(tail_text + text)
        if list(encoded[:lb]) == tail:
            rest = list(encoded[lb:])
            if helper.bytes_of(rest) == target:
                return rest
    return []
