"""The index of earlier outputs that greedy ``generate`` calls on one model share by default, one per thread.

``generate`` drafts from what earlier outputs of the same schema or tool set
wrote (:class:`proposers.SuffixIndex`).  A program that asks the same kind of
question again and again (a pipeline filling one schema, a loop calling the
same tools) gains across calls only if the index outlives the call.  So a
greedy call given no ``draft_index`` drafts from, and adds to, one index per
model and thread, bounded by :data:`SHARED_DRAFT_BYTES` (the oldest outputs go
first).  Greedy outputs do not depend on the drafts, so sharing changes only how
many target passes a call takes.  A sampled call keeps an index of its own: its
draws would depend on what earlier calls drafted, and the same seed must give
the same answer.

One per thread because an index is not thread-safe; one per model because its
token ids mean something only in that model's vocabulary.  ``draft_index=False``
turns drafting from earlier outputs off for a call; :func:`forget_earlier_outputs`
empties this thread's indexes.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from proposers.suffix_index import SuffixIndex

__all__ = ["SHARED_DRAFT_BYTES", "forget_earlier_outputs", "shared_index"]

#: Bytes of the index that one thread's greedy calls on one model share (``draft_index=None``).
SHARED_DRAFT_BYTES = 64 << 20

_local = threading.local()


def _indexes() -> weakref.WeakKeyDictionary[Any, SuffixIndex]:
    table = getattr(_local, "indexes", None)
    if table is None:
        table = _local.indexes = weakref.WeakKeyDictionary()
    return table


def shared_index(model: Any) -> SuffixIndex:
    """This thread's index of earlier outputs for ``model`` (made on first use; gone with the model)."""
    table = _indexes()
    index = table.get(model)
    if index is None:
        index = table[model] = SuffixIndex(SHARED_DRAFT_BYTES)
    return index


def forget_earlier_outputs() -> None:
    """Empty this thread's shared indexes: later greedy calls draft as if nothing had been generated before."""
    _indexes().clear()
