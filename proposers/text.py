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

import bisect
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from grammars.lru import LRU

__all__ = ["TokenText", "token_text", "continuation_tokens", "token_sources", "SplitPreferences", "SplitMemory"]

#: The most entries of each table a :class:`SplitMemory` keeps (the latest learned).
MEMORY_ENTRIES = 512

_ENCODE_CACHE_SIZE = 4096
_CONTINUATION_CACHE_SIZE = 4096


class TokenText:
    """Per-tokenizer helper: token bytes, a small encode cache and a cache of :func:`continuation_tokens`.

    Build it with :func:`token_text`, which keeps one per tokenizer.  Nothing
    here changes the tokenizer.  Safe to share between threads.
    """

    def __init__(self, tokenizer: Any) -> None:
        # A weak reference: the registry maps tokenizer -> helper weakly, so
        # the helper must not keep its tokenizer alive.
        try:
            self._ref: Callable[[], Any] = weakref.ref(tokenizer)
        except TypeError:
            self._ref = lambda: tokenizer
        # The raw ``tokenizers.Tokenizer`` is ~2x faster than the HF wrapper.
        self._backend = getattr(tokenizer, "_tokenizer", None)
        self._lock = threading.Lock()
        self._cache: LRU[str, tuple[int, ...]] = LRU(_ENCODE_CACHE_SIZE)
        # (context tail, text) -> continuation_tokens' answer: a pure function of them and the tokenizer.
        self._continuations: LRU[tuple[tuple[int, ...], str], tuple[int, ...]] = LRU(_CONTINUATION_CACHE_SIZE)
        self._bytes: list[bytes] | None = None
        self._sorted: tuple[list[bytes], list[int]] | None = None
        self._extensions: dict[int, tuple[int, ...]] = {}  # token -> extensions(token)
        self._adds_prefix: bool | None = None
        self.special_ids: frozenset[int] = frozenset(int(t) for t in (tokenizer.all_special_ids or ()))

    @property
    def vocab_bytes(self) -> list[bytes]:
        """The byte string of every token id (special tokens: their text)."""
        if self._bytes is None:
            with self._lock:
                if self._bytes is None:
                    self._bytes = _decoded_vocab(self._ref())
        return self._bytes

    def extensions(self, token: int) -> list[int]:
        """Ids of the tokens whose bytes start with ``token``'s bytes and are longer."""
        if self._sorted is None:
            table = self.vocab_bytes
            order = sorted((i for i in range(len(table)) if i not in self.special_ids), key=table.__getitem__)
            self._sorted = ([table[i] for i in order], order)  # a race builds it twice, harmlessly
        found = self._extensions.get(token)
        if found is not None:
            return list(found)
        keys, ids = self._sorted
        table = self.vocab_bytes
        prefix = table[token] if 0 <= token < len(table) else b""
        if not prefix:
            return []
        start = end = bisect.bisect_right(keys, prefix)  # the longer keys with this prefix follow it in order
        while end < len(keys) and keys[end].startswith(prefix):
            end += 1
        found = self._extensions[token] = tuple(ids[start:end])  # one entry per token at most
        return list(found)

    def bytes_of(self, ids: Sequence[int]) -> bytes:
        """The bytes ``ids`` spell (ids outside the vocabulary spell nothing)."""
        table = self.vocab_bytes
        n = len(table)
        return b"".join(table[i] for i in ids if 0 <= i < n)

    def encode(self, text: str) -> tuple[int, ...]:
        """Canonical token ids of ``text`` without special tokens (cached)."""
        with self._lock:
            ids = self._cache.get(text)
            if ids is not None:
                return ids
        if self._backend is not None:
            ids = tuple(self._backend.encode(text, add_special_tokens=False).ids)
        else:
            ids = tuple(self._ref().encode(text, add_special_tokens=False))
        with self._lock:
            self._cache.put(text, ids)
        return ids

    def continuation(self, tail: tuple[int, ...], text: str) -> list[int]:
        """:func:`continuation_tokens` after the context tail ``tail`` (its last ``lookback`` tokens), cached.

        The answer depends on nothing else (the tokenizer's encoding and bytes
        are fixed), so a cached one is exact.  A drafter tokenises the same
        candidate text after the same tail again within a step and across
        steps; at most ``_CONTINUATION_CACHE_SIZE`` answers (least recently
        used dropped).
        """
        key = (tail, text)
        with self._lock:
            found = self._continuations.get(key)
            if found is not None:
                return list(found)
        found = self._continuation(tail, text)
        with self._lock:
            self._continuations.put(key, found)
        return list(found)

    @property
    def adds_prefix(self) -> bool:
        """Whether encoding text alone adds to it (a SentencePiece dummy prefix: ``x`` encodes as ``▁x``).

        Such a tokenizer never encodes a text the way it continues a context,
        so :meth:`_continuation` reads continuations after an anchor instead.
        """
        if self._adds_prefix is None:
            probe = "x"
            self._adds_prefix = self.bytes_of(self.encode(probe)) != probe.encode("utf-8")
        return self._adds_prefix

    def _continuation(self, context: tuple[int, ...], text: str) -> tuple[int, ...]:
        """The uncached rule of :func:`continuation_tokens`, after the tail ``context``."""
        target = text.encode("utf-8")
        specials = self.special_ids
        anchored = self.adds_prefix
        n = len(context)
        for lb in range(n, -1, -1):
            tail = context[n - lb :]
            if any(t in specials for t in tail):
                continue
            tail_bytes = self.bytes_of(tail)
            try:
                tail_text = tail_bytes.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if anchored:
                found = self._after_anchor(tail, tail_bytes, tail_text, text, target)
                if found is not None:
                    return found
                continue
            encoded = self.encode(tail_text + text)
            if encoded[:lb] == tail:
                rest = encoded[lb:]
                if self.bytes_of(rest) == target:
                    return rest
        return ()

    def _after_anchor(
        self, tail: tuple[int, ...], tail_bytes: bytes, tail_text: str, text: str, target: bytes
    ) -> tuple[int, ...] | None:
        """The tokens of ``text`` after ``tail``, read from the encoding of ``ANCHOR + tail + text``.

        A SentencePiece tokenizer prefixes the first word of what it encodes
        with ``▁`` (the dummy prefix), so neither ``tail + text`` nor ``text``
        alone encodes as a continuation.  After a newline (a byte-fallback
        token that merges with nothing) the encoder sees the tail as a
        continuation, as in the model's context.  Accepted only when the
        encoding has token boundaries exactly where the tail and ``text``
        start, the tokens between are ``tail`` itself and the rest spells
        ``text``; otherwise ``None``.
        """
        encoded = self.encode(_ANCHOR + tail_text + text)
        table = self.vocab_bytes
        size = len(table)
        lengths = [len(table[t]) if 0 <= t < size else -1 for t in encoded]
        if min(lengths, default=0) < 0:
            return None
        total = sum(lengths)
        start = total - len(tail_bytes) - len(target)
        if start < 0 or self.bytes_of(encoded)[start:] != tail_bytes + target:
            return None
        i = position = 0
        while position < start:
            position += lengths[i]
            i += 1
        if position != start:
            return None
        j = i + len(tail)
        if tuple(encoded[i:j]) != tail or sum(lengths[i:j]) != len(tail_bytes):
            return None
        return tuple(encoded[j:])


#: What :meth:`TokenText._after_anchor` puts before a tail: a newline, which a
#: SentencePiece vocabulary spells with a byte-fallback or a lone token.
_ANCHOR = "\n"


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


_REGISTRY: weakref.WeakKeyDictionary[Any, TokenText] = weakref.WeakKeyDictionary()
_BY_ID: dict[int, TokenText] = {}
_REGISTRY_LOCK = threading.Lock()


def token_text(tokenizer: Any) -> TokenText:
    """The shared :class:`TokenText` of ``tokenizer`` (built once)."""
    with _REGISTRY_LOCK:
        return _lookup(tokenizer)


def _lookup(tokenizer: Any) -> TokenText:
    try:
        helper = _REGISTRY.get(tokenizer)
        if helper is None:
            helper = _REGISTRY[tokenizer] = TokenText(tokenizer)
        return helper
    except TypeError:  # not weak-referenceable or not hashable
        helper = _BY_ID.get(id(tokenizer))
        if helper is None or helper._ref() is not tokenizer:
            helper = _BY_ID[id(tokenizer)] = TokenText(tokenizer)
        return helper


def continuation_tokens(tokenizer: Any, context_ids: Sequence[int], text: str, lookback: int = 4) -> list[int]:
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
    n = len(context_ids)
    lb = min(lookback, n)
    if lb < 0:
        return []
    return token_text(tokenizer).continuation(tuple(int(t) for t in context_ids[n - lb :]), text)


def token_sources(
    tokens: Sequence[int], token_bytes: Sequence[bytes], segments: Sequence[tuple[str, int]], default: str = ""
) -> list[str]:
    """Which source produced each token: the segment that holds the token's first byte.

    ``segments``: ``(source, end byte)`` in order, covering the text the
    tokens spell (a token past the last end belongs to the last segment);
    ``default`` names every token when there are no segments.  Pure.

    Worked example (one byte per token)::

        token_sources([ord("a"), ord("b"), ord("c")], BYTES, [("key", 1), ("value", 3)])
        -> ["key", "value", "value"]

    A token that straddles a boundary belongs to the segment it starts in:
    ``ab`` then ``c`` over segments ``("x", 1), ("y", 3)`` is ``["x", "y"]``.
    """
    out, pos, seg = [], 0, 0
    for token in tokens:
        while seg < len(segments) - 1 and pos >= segments[seg][1]:
            seg += 1
        out.append(segments[seg][0] if segments else default)
        pos += len(token_bytes[token]) if 0 <= token < len(token_bytes) else 0
    return out


@dataclass(frozen=True)
class SplitMemory:
    """What a :class:`SplitPreferences` had learned, handed to a later request (:meth:`SplitPreferences.memory`,
    :meth:`SplitPreferences.recall`): the latest ``(previous, canonical) -> written`` and
    ``canonical -> written`` entries, oldest first, at most :data:`MEMORY_ENTRIES` of each.  Immutable, so one
    may start any number of requests."""

    by_context: tuple[tuple[tuple[int, int], int], ...] = ()
    by_token: tuple[tuple[int, int], ...] = ()


class SplitPreferences:
    """How the target splits text where it disagrees with the canonical split (learned per request).

    Models do not always write the canonical tokenisation of constrained
    text: SmolLM2 writes compact JSON as ``{`` ``"`` ``ticket`` ... ``":``
    ``"`` where the canonical split is ``{"`` ``ticket`` ... ``":"``.  What
    the target wrote instead of a canonical token ``a`` is remembered per
    (previous token, ``a``) -- and per ``a`` alone as a fallback -- when it
    spells a proper prefix of the draft's remaining text (same text, other
    split); a draft token the target accepted is remembered as kept, in both
    tables.  :meth:`resplit` uses the latest memory wherever the text allows
    it: the target's choice between two splits runs in streaks, so the latest
    sighting predicts it better than a majority does (replayed on SmolLM2's
    benchmark outputs: 4.49 against 4.34 tokens per pass on extraction).

    One object per request, with one owner that teaches it: the owner calls
    :meth:`start` with the request and :meth:`commit` with the tokens each
    loop step appended; whoever drafts text :meth:`remember`-s its draft, and
    each remembered draft is compared with what the target wrote there exactly
    once (at the first commit that reaches its start).  Anyone may
    :meth:`resplit`.  The ``auto`` preset builds one and hands it to the
    composite (the owner) and to the members that split text, so one table
    learns from every draft of the step, the composite's and the schema
    drafter's (replayed on 9 SmolLM2 bench outputs: 130 target passes as with
    one learner per drafter; 131 when only the composite's drafts taught it).
    :meth:`observe` learns from a whole context instead of one step's tokens.

    A model's habits outlive a request (SmolLM2 opens nearly every compact
    JSON answer with ``{`` ``"``), so a server hands what one request learned
    to the next of its kind of traffic: :meth:`memory` when a request ends,
    :meth:`recall` when the next one joins, after :meth:`start`.
    """

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer: Any = None
        self.by_context: dict[tuple[int, int], int] = {}  # (previous, canonical) -> token written last
        self.by_token: dict[int, int] = {}  # canonical -> token written last, in any context
        self._keys: dict[tuple[int, ...], list[int]] = {}  # resplit output -> canonical key per token
        # Drafts remembered since the last lesson: (start, fingerprint, tokens, canonical keys).
        self._pending: list[tuple[int, tuple[int, ...], tuple[int, ...], list[int]]] = []
        self._context: list[int] = []  # prompt + committed tokens, as told by commit
        if tokenizer is not None:
            self.start(tokenizer)

    def start(self, tokenizer: Any, prompt_ids: Sequence[int] = ()) -> None:
        """Forget everything learned; a new request with this tokenizer and prompt.  Changes state."""
        self.tokenizer = tokenizer
        self.helper = token_text(tokenizer)
        self.by_context.clear()
        self.by_token.clear()
        self._keys.clear()
        self._pending = []
        self._context = [int(t) for t in prompt_ids]

    def memory(self) -> SplitMemory:
        """The latest :data:`MEMORY_ENTRIES` entries of each table, for a later request.  Does not change state."""
        return SplitMemory(
            tuple(list(self.by_context.items())[-MEMORY_ENTRIES:]),
            tuple(list(self.by_token.items())[-MEMORY_ENTRIES:]),
        )

    def recall(self, memory: SplitMemory) -> None:
        """Start from what an earlier request learned: ``memory``'s entries, under whatever this request has
        learned itself (its own sightings are later, so they win).  Changes state."""
        self.by_context = {**dict(memory.by_context), **self.by_context}
        self.by_token = {**dict(memory.by_token), **self.by_token}

    def commit(self, committed: Sequence[int]) -> None:
        """The loop appended ``committed`` to the context: learn from the remembered draft.  Changes state.

        Called by the owner (the one that :meth:`remember`-s) whenever its proposer is told committed tokens.
        """
        self._context.extend(int(t) for t in committed)
        self.observe(self._context)

    def remember(self, context: Sequence[int], tokens: Sequence[int]) -> None:
        """The draft ``tokens`` proposed after ``context`` (compared with the next context)."""
        tokens = tuple(int(t) for t in tokens)
        keys = list(tokens)
        for split, split_keys in self._keys.items():  # the resplit this draft came from (maybe cut short)
            if split[: len(tokens)] == tokens:
                keys = split_keys[: len(tokens)]
                break
        start = len(context)
        if tokens:
            self._pending.append((start, tuple(context[max(0, start - 8) : start]), tokens, keys))
        self._keys.clear()

    def observe(self, context: Sequence[int]) -> None:
        """Learn from what the target committed where the remembered drafts stood (each draft once).

        A draft whose start the context has not reached yet stays remembered.
        """
        pending, self._pending = self._pending, []
        for entry in pending:
            if len(context) <= entry[0]:
                self._pending.append(entry)
            else:
                self._learn(context, *entry)

    def _learn(
        self, context: Sequence[int], start: int, fingerprint: tuple[int, ...], draft: tuple[int, ...], keys: list[int]
    ) -> None:
        if tuple(context[max(0, start - 8) : start]) != fingerprint:
            return
        n = 0
        while n < len(draft) and start + n < len(context) and context[start + n] == draft[n]:
            previous = int(context[start + n - 1]) if start + n > 0 else -1
            self._note(previous, keys[n], draft[n])  # kept as drafted
            n += 1
        if n == len(draft) or start + n >= len(context):
            return
        committed = int(context[start + n])
        spelled = self.helper.bytes_of([committed])
        rest = self.helper.bytes_of(draft[n:])
        if spelled and len(spelled) < len(rest) and rest.startswith(spelled):
            previous = int(context[start + n - 1]) if start + n > 0 else -1
            self._note(previous, keys[n], committed)

    def _note(self, previous: int, canonical: int, written: int) -> None:
        """The target wrote ``written`` where the canonical split has ``canonical`` (after ``previous``); each
        table keeps its entries in the order they were last seen (:meth:`memory` hands on the latest)."""
        self.by_context.pop((previous, canonical), None)
        self.by_token.pop(canonical, None)
        self.by_context[(previous, canonical)] = self.by_token[canonical] = written

    def resplit(self, context: Sequence[int], tokens: Sequence[int]) -> list[int]:
        """``tokens`` (a canonical split after ``context``) with the learned splits applied.

        Spells the same bytes.  Worked example: having seen the target write
        ``",`` where the canonical split has ``","``, the canonical
        ``['x', '","', 'b', '":']`` becomes ``['x', '",', '"', 'b', '":']``
        (the text after ``",`` is split canonically again).
        """
        out = [int(t) for t in tokens]
        keys = list(out)
        if self.by_context or self.by_token:
            i = 0
            while i < len(out):
                previous = out[i - 1] if i else (int(context[-1]) if len(context) else -1)
                choice = self.by_context.get((previous, keys[i]), self.by_token.get(keys[i]))
                if choice is not None and choice != out[i]:
                    replaced = self._replace(context, out, i, choice)
                    if replaced is not None:
                        out, keys = replaced[0], keys[:i] + [keys[i]] + replaced[0][i + 1 :]
                i += 1
        self._keys[tuple(out)] = keys
        return out

    def _replace(self, context: Sequence[int], out: list[int], i: int, choice: int) -> tuple[list[int]] | None:
        """``out`` with token ``i`` replaced by ``choice`` and the rest split canonically again."""
        rest = self.helper.bytes_of(out[i:])
        spelled = self.helper.bytes_of([choice])
        if not spelled or len(spelled) >= len(rest) or not rest.startswith(spelled):
            return None
        try:
            tail_text = rest[len(spelled) :].decode("utf-8")
        except UnicodeDecodeError:
            return None
        prefix = out[:i] + [choice]
        tail = continuation_tokens(self.tokenizer, list(context) + prefix, tail_text)
        return (prefix + tail,) if tail else None
