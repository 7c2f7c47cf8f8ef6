"""A bounded index of what earlier generations wrote: token n-gram -> the tokens that followed it, with counts.

Structured traffic repeats across requests: an agent calls the same tools turn
after turn, a pipeline fills the same schema for thousands of documents.  What
one request wrote (the keys, the punctuation, the recurring values) is a good
guess for the next request of the same kind.  This index remembers it
(SuffixDecoding, arXiv 2411.04975, keeps a suffix tree over earlier outputs for
the same reason; here every draft it yields is still cut by the row's grammar
and verified exactly, so it only changes how many target passes a request takes).

What it holds, per *scope* (a canonical hash of the schema or tool set, or
``"text"``: :func:`scope_of`): for each n-gram of an earlier output (n in
``orders``, longest first: 8, 4 and 2 tokens by default) the tokens that
followed it and how often -- a variable-order Markov model of this server's
outputs.  A continuation is drawn by walking it: at each step the longest
n-gram of the context that the index knows picks its most frequent next token
(:meth:`SuffixIndex.walk`); where several next tokens were seen, the walk
branches (:meth:`SuffixIndex.paths`: a token tree).  An output's first key
reaches into the prompt's last tokens (the chat template's assistant opener),
so a whole answer can be drafted from its first token.

Memory: every output is kept as a 4-byte-per-token array beside the counts (so
that evicting it can take its counts back out exactly), and the whole index is
bounded by ``max_bytes``; past it the oldest outputs are evicted first, with
their counts.  The accounting is conservative: ``sys.getsizeof`` of every
container (dicts, bytes keys, arrays, per-output records) plus :data:`INT_BYTES` for
every token id and count stored, whether or not CPython shares the int object
(tests/proposers/test_suffix_index.py checks it against ``tracemalloc``).  About 400
bytes per distinct n-gram of an order (three orders by default); repeated
outputs share their keys and add only their 4-byte tokens.

Why not arctic-inference's C++ suffix tree (vLLM's ``suffix`` method, Apache-2.0):
``tools/suffix_eval.py`` feeds both the same outputs.  They draft equally well
(tokens per pass within 1%); arctic adds and looks up a few microseconds faster
per token, under 1% of a target pass.  But it bounds memory by a number of
requests, not bytes (its memory figure is a debug walk of the whole tree), it
has one tree for all traffic (a scope per kind of traffic would need a tree
each, with nothing bounding their total), and it ships only as a source
package whose build needs cmake, nanobind and a torch in the build
environment.  So the index is plain Python, bounded by its own byte accounting.

Not thread-safe: one decoding loop's thread uses an index (the server's engine
thread, a ``Conversation``, one ``generate`` call).
"""

from __future__ import annotations

import hashlib
import json
import sys
from array import array
from collections import deque
from collections.abc import Sequence
from typing import Any

__all__ = ["INT_BYTES", "Output", "SuffixIndex", "resolve_index", "scope_of"]

#: What one int object costs in CPython (``sys.getsizeof(2**20)``); charged for every id and count stored.
INT_BYTES = sys.getsizeof(1 << 20)


def scope_of(schema: Any) -> str:
    """The scope of a request's drafts: ``"text"`` without a schema, else a hash of its canonical JSON.  Pure.

    A tool set is a schema too (the request's tools become one), so every tool
    set and every response format gets its own scope; key order does not matter.
    """
    if schema is None:
        return "text"
    canonical = json.dumps(schema, sort_keys=True, separators=(",", ":"), default=str)
    return "schema:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


class Output:
    """One earlier output in the index: its tokens (the prompt's last tokens first) and which counts it added.

    ``tokens[:head]`` is the prompt's tail: keys only, never counted as a
    continuation.  ``counted[p]``: bit ``i`` set when order ``orders[i]`` counted
    token ``p`` (a key already holding ``branches`` other tokens does not count
    a new one), so eviction takes back exactly what was added.
    """

    __slots__ = ("scope", "tokens", "counted", "head", "evicted", "cost")

    def __init__(self, scope: str, head: Sequence[int]) -> None:
        self.scope = scope
        self.tokens = array("i", head)
        self.counted = bytearray(len(head))
        self.head = len(head)
        self.evicted = False
        self.cost = 0  # bytes charged for this record, its tokens and flags

    def charge(self) -> int:
        """What this record costs now (the object, its array and flags).  Pure."""
        return sys.getsizeof(self) + sys.getsizeof(self.tokens) + sys.getsizeof(self.counted)


class SuffixIndex:
    """Earlier outputs as n-gram -> next-token counts, per scope, in at most ``max_bytes``.

    ``orders``: the n-gram lengths, longest first; ``branches``: most distinct
    next tokens one n-gram keeps (the rest are not counted); ``min_prob``: a walk
    stops at a token less likely than this after its n-gram.
    """

    def __init__(
        self,
        max_bytes: int,
        *,
        orders: Sequence[int] = (8, 4, 2),
        branches: int = 8,
        min_prob: float = 0.2,
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"SuffixIndex needs max_bytes >= 0, got {max_bytes}")
        if not orders or any(n < 1 for n in orders) or len(orders) > 8:
            raise ValueError(f"SuffixIndex needs 1 to 8 n-gram orders of at least 1 token, got {tuple(orders)}")
        if branches < 1 or not 0.0 <= min_prob <= 1.0:
            raise ValueError(f"SuffixIndex needs branches >= 1 and 0 <= min_prob <= 1, got {branches}, {min_prob}")
        self.max_bytes = max_bytes
        self.orders = tuple(sorted(set(orders), reverse=True))
        self.branches = branches
        self.min_prob = min_prob
        self.evictions = 0  # outputs evicted so far
        # scope -> n-gram -> next token -> count
        self._counts: dict[str, dict[bytes, dict[int, int]]] = {}  # n-grams as the bytes of 4-byte ints
        self._peak: dict[str, int] = {}  # scope -> most keys its dict held since it was last compacted
        self._outputs: deque[Output] = deque()  # oldest first
        self._held = 0  # bytes of the outputs, tables, keys and counts (the top-level containers: ``bytes``)

    @property
    def bytes(self) -> int:
        """What the index holds now, by its own accounting (see the module docstring).  Pure."""
        return self._held + sys.getsizeof(self._counts) + sys.getsizeof(self._peak) + sys.getsizeof(self._outputs)

    # -- adding ----------------------------------------------------------------------------------

    def open(self, scope: str, head: Sequence[int] = ()) -> Output:
        """A new output of ``scope``, after ``head`` (the prompt's last tokens: keys for its first tokens)."""
        out = Output(scope, list(head)[-self.orders[0] :])
        out.cost = out.charge()
        self._held += out.cost
        self._outputs.append(out)
        self._fit()
        return out

    def extend(self, out: Output, tokens: Sequence[int]) -> Output:
        """Append ``tokens`` to ``out`` and count them.  Returns the output to extend next time.

        If ``out`` was evicted meanwhile, a new output of its scope continues
        from its last tokens (the ones it still needs as keys).  Changes state.
        """
        if not tokens or self.max_bytes == 0:
            return out
        if out.evicted:
            out = self.open(out.scope, out.tokens)
        table = self._counts.get(out.scope)
        if table is None:
            table = self._counts[out.scope] = {}
            self._held += sys.getsizeof(table) + INT_BYTES  # the dict and its scope key's share
            self._peak[out.scope] = 0
        before = sys.getsizeof(table)
        for token in tokens:
            token = int(token)
            flags = 0
            length = len(out.tokens)
            for bit, n in enumerate(self.orders):
                if n > length:
                    continue
                key = out.tokens[length - n :].tobytes()
                nexts = table.get(key)
                if nexts is None:
                    nexts = table[key] = {}
                    self._held += sys.getsizeof(key) + sys.getsizeof(nexts)
                if token in nexts:
                    nexts[token] += 1
                elif len(nexts) < self.branches:
                    size = sys.getsizeof(nexts)
                    nexts[token] = 1
                    self._held += sys.getsizeof(nexts) - size + 2 * INT_BYTES
                else:
                    continue
                flags |= 1 << bit
            out.tokens.append(token)
            out.counted.append(flags)
        self._peak[out.scope] = max(self._peak[out.scope], len(table))
        self._held += sys.getsizeof(table) - before
        cost = out.charge()
        self._held += cost - out.cost
        out.cost = cost
        self._fit()
        return out

    # -- evicting --------------------------------------------------------------------------------

    def _fit(self) -> None:
        """Evict the oldest outputs until the index fits ``max_bytes``.  Changes state."""
        while self.bytes > self.max_bytes and self._outputs:
            self._evict(self._outputs.popleft())
        if not self._outputs:  # every count is gone: fresh top-level dicts (a dict never shrinks)
            self._counts, self._peak = {}, {}

    def _evict(self, out: Output) -> None:
        """Take ``out``'s counts back out of the index.  Changes state."""
        self.evictions += 1
        out.evicted = True
        table = self._counts.get(out.scope)
        if table is not None:
            before = sys.getsizeof(table)
            tokens = out.tokens
            for p in range(out.head, len(tokens)):
                flags = out.counted[p]
                for bit, n in enumerate(self.orders):
                    if not flags & (1 << bit):
                        continue
                    key = tokens[p - n : p].tobytes()
                    nexts = table[key]
                    token = tokens[p]
                    if nexts[token] > 1:
                        nexts[token] -= 1
                        continue
                    size = sys.getsizeof(nexts)
                    del nexts[token]
                    self._held -= size - sys.getsizeof(nexts) + 2 * INT_BYTES
                    if not nexts:
                        del table[key]
                        self._held -= sys.getsizeof(key) + sys.getsizeof(nexts)
            self._held -= before - sys.getsizeof(table)
            if not table:
                self._held -= sys.getsizeof(table) + INT_BYTES
                del self._counts[out.scope], self._peak[out.scope]
            elif len(table) * 4 < self._peak[out.scope]:  # a dict never shrinks on deletes: compact it
                size = sys.getsizeof(table)
                table = self._counts[out.scope] = dict(table)
                self._held -= size - sys.getsizeof(table)
                self._peak[out.scope] = len(table)
        self._held -= out.cost
        out.tokens, out.counted, out.cost = array("i", out.tokens[-self.orders[0] :]), bytearray(), 0

    # -- drafting --------------------------------------------------------------------------------

    def candidates(self, scope: str, context: Sequence[int]) -> tuple[int, list[tuple[int, float]]]:
        """``(n, [(token, probability), ...])``: what followed the longest known n-gram ending ``context``.

        Most frequent first; ``(0, [])`` when no n-gram of the context is known.  Pure.
        """
        table = self._counts.get(scope)
        if not table:
            return 0, []
        tail = array("i", context[-self.orders[0] :]).tobytes()
        for n in self.orders:
            if 4 * n > len(tail):
                continue
            nexts = table.get(tail[len(tail) - 4 * n :])
            if nexts:
                total = sum(nexts.values())
                ranked = sorted(nexts.items(), key=lambda item: -item[1])
                return n, [(token, count / total) for token, count in ranked]
        return 0, []

    def walk(self, scope: str, context: Sequence[int], k: int) -> tuple[list[int], list[float], int]:
        """Up to ``k`` tokens: from ``context`` on, the most frequent next token each time.  Pure.

        Returns the tokens, each one's probability after its n-gram, and the
        order of the first step's n-gram (0: nothing known).  Stops where the
        best next token's probability is below ``min_prob``.
        """
        ctx = list(context[-self.orders[0] :])
        tokens: list[int] = []
        probs: list[float] = []
        first = 0
        while len(tokens) < k:
            n, ranked = self.candidates(scope, ctx)
            if not ranked or ranked[0][1] < self.min_prob:
                break
            first = first or n
            token, p = ranked[0]
            tokens.append(token)
            probs.append(p)
            ctx.append(token)
        return tokens, probs, first

    def paths(self, scope: str, context: Sequence[int], k: int, width: int) -> list[list[int]]:
        """Up to ``width`` continuations of at most ``k`` tokens: the walk, then branches off it.  Pure.

        Each branch leaves the first path where another next token was seen
        (the most probable such points first) and then walks on.  Paths are
        distinct; the first is :meth:`walk`'s.
        """
        first, _, _ = self.walk(scope, context, k)
        if not first:
            return []
        forks: list[tuple[float, int, int]] = []  # (-probability, depth, token)
        ctx = list(context[-self.orders[0] :])
        for depth, token in enumerate(first):
            _, ranked = self.candidates(scope, ctx)
            forks += [(-p, depth, t) for t, p in ranked if t != token and p >= self.min_prob]
            ctx.append(token)
        out = [first]
        for _, depth, token in sorted(forks):
            if len(out) >= width:
                break
            prefix = first[:depth] + [token]
            rest, _, _ = self.walk(scope, list(context) + prefix, k - len(prefix))
            out.append(prefix + rest)
        return out

    # -- reporting -------------------------------------------------------------------------------

    def as_dict(self) -> dict[str, int]:
        """What the index holds: bytes (its accounting), the cap, outputs, n-grams and evictions.  Pure."""
        return {
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
            "outputs": len(self._outputs),
            "ngrams": sum(len(t) for t in self._counts.values()),
            "scopes": len(self._counts),
            "evictions": self.evictions,
        }


def resolve_index(value: Any, default_bytes: int, where: str) -> SuffixIndex | None:
    """The index ``value`` names: ``None`` -> a fresh one of ``default_bytes`` (``None`` if that is 0), ``False``
    -> none, a :class:`SuffixIndex` -> itself (shared with whoever else holds it).  Pure but for the new index.

    Raises ``TypeError`` for anything else, naming ``where`` and what it takes.
    """
    if isinstance(value, SuffixIndex):
        return value
    if value is None:
        return SuffixIndex(default_bytes) if default_bytes > 0 else None
    if value is False:
        return None
    raise TypeError(
        f"{where} got draft_index={value!r}; pass a proposers.SuffixIndex to share one, None for a fresh one "
        "or False to draft without earlier outputs"
    )
