"""Which corpus records the fuzz runs, and the prompt it asks for each.

The records come from :func:`grammarspec.bench.tasks.read_schema_records`
(the one corpus loader; default the repository's ``data/schemas`` sample,
``--schemas DIR`` or ``$GRAMMARSPEC_SCHEMAS`` for the full corpus).
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["stratified_slice", "Slice", "CI_SLICES", "fuzz_prompt", "QUOTE_LIMIT", "compact"]


def compact(value: Any) -> str:
    """``value`` as compact JSON (the serialisation the checks tokenize).  Pure.

    >>> compact({"a": [1, "é"]})
    '{"a":[1,"é"]}'
    """
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def stratified_slice(
    records: Sequence[dict[str, Any]], per_category: int, *, max_bytes: int | None = None, salt: str = "fuzz"
) -> list[dict[str, Any]]:
    """``per_category`` records of each category, deterministic and spread over the corpus.

    Records are ranked by ``sha256(salt + ":" + id)`` within their category
    (ids, not file order, so the slice does not follow the corpus' own
    ranking); ``max_bytes`` skips schemas larger than that (compact UTF-8,
    ``meta.size_bytes``).  Pure.  A slice of a corpus is also the slice of
    any sub-corpus that holds it (which is how ``data/schemas`` was chosen).
    """
    by_category: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        size = record.get("meta", {}).get("size_bytes") or len(compact(record["schema"]).encode())
        if max_bytes is None or size <= max_bytes:
            by_category[record["category"]].append(record)
    chosen = []
    for category in sorted(by_category):
        ranked = sorted(by_category[category], key=lambda r: hashlib.sha256(f"{salt}:{r['id']}".encode()).hexdigest())
        chosen += ranked[:per_category]
    return chosen


@dataclass(frozen=True)
class Slice:
    """A named :func:`stratified_slice`: ``per_category`` records of at most ``max_bytes``, ranked with ``salt``."""

    per_category: int
    max_bytes: int
    salt: str

    def of(self, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The records of this slice (pure)."""
        return stratified_slice(records, self.per_category, max_bytes=self.max_bytes, salt=self.salt)


#: The slices ``tests/grammars/test_fuzz_corpus.py`` runs (about two minutes on two cores).  ``data/schemas``
#: holds their union over the full corpus (``tools/sample_corpus.py``), so the tests see the same
#: schemas whether they read the sample or the full corpus.
CI_SLICES: dict[str, Slice] = {
    "xgrammar": Slice(3, 6000, "ci"),  # grammar checks with xgrammar
    "outlines": Slice(1, 1500, "ci-outlines"),  # outlines-core compiles slowly: one small schema per category
    "generation": Slice(2, 3000, "ci-gen"),  # generation with the embedded model
}

#: A schema quoted in the prompt when its compact JSON is at most this long (else summarised).
QUOTE_LIMIT = 1500


def fuzz_prompt(record: dict[str, Any]) -> tuple[str | list[dict[str, str]], str | None, bool]:
    """``(prompt, system, quote_schema)`` for one record.  Pure.

    function_calling records use their first stored user turn; others ask for
    one example document by title or description.  The schema is quoted (by
    :func:`grammarspec.build_prompt`) only when it is short, to keep prefill cheap.

    >>> fuzz_prompt({"schema": {"title": "Point."}})
    ('Write one realistic example of a JSON document: Point. Reply with the JSON only.', None, True)
    """
    schema = record["schema"]
    quote = len(compact(schema)) <= QUOTE_LIMIT
    prompts = record.get("prompts") or []
    if prompts:
        tool = record.get("tool") or {}
        description = str(tool.get("description", "")).strip()[:300]
        system = (
            f"You call the function {tool.get('name', 'the function')}: {description} "
            "Reply with the call's arguments as one JSON object."
        )
        return list(prompts[0]["messages"]), system, quote
    what = next(
        (schema[k] for k in ("title", "description") if isinstance(schema.get(k), str) and schema[k].strip()), ""
    )
    what = what.strip().rstrip(".")[:200] or "a document that follows the schema"
    return f"Write one realistic example of a JSON document: {what}. Reply with the JSON only.", None, quote
