"""Pure scoring functions: validity, field accuracy, agreement, pairwise speedup.

Each is a pure function with a worked example; the runner and the report
only call them.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "parse_and_validate",
    "leaf_fields",
    "field_accuracy",
    "calls_field_accuracy",
    "agreement",
    "pairwise_speedups",
    "median",
]

_MISSING = object()


def parse_and_validate(text: str, schema: dict[str, Any], complete: bool) -> tuple[Any, bool, list[str]]:
    """``(value, valid, errors)`` for a generated ``text``.

    ``valid``: the output is complete (the grammar finished, not cut by the
    token limit), parses as JSON and validates against ``schema`` with
    jsonschema's validator for the schema's draft and its FormatChecker
    (:func:`grammars.validation.schema_errors`, the one validator the runtime uses).

    >>> parse_and_validate('{"a":1}', {"type": "object", "required": ["a"]}, True)
    ({'a': 1}, True, [])
    >>> parse_and_validate('{"a":', {"type": "object"}, False)[1:]
    (False, ['incomplete: cut by the token limit'])
    """
    if not complete:
        return None, False, ["incomplete: cut by the token limit"]
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return None, False, [f"not JSON: {e.msg} at column {e.colno}"]
    from grammars.validation import schema_errors  # the one jsonschema validator (formats checked)

    errors = schema_errors(schema, value)
    return value, not errors, errors[:5]


def leaf_fields(value: Any, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], Any]:
    """Every leaf of a JSON value by its path (empty containers are leaves).

    >>> leaf_fields({"a": 1, "b": [{"c": "x"}, {"c": "y"}], "d": []})
    {('a',): 1, ('b', 0, 'c'): 'x', ('b', 1, 'c'): 'y', ('d',): []}
    """
    if isinstance(value, dict) and value:
        out: dict[tuple[Any, ...], Any] = {}
        for key, item in value.items():
            out.update(leaf_fields(item, path + (key,)))
        return out
    if isinstance(value, list) and value:
        out = {}
        for i, item in enumerate(value):
            out.update(leaf_fields(item, path + (i,)))
        return out
    return {path: value}


def _lookup(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        if isinstance(value, dict) and isinstance(step, str) and step in value:
            value = value[step]
        elif isinstance(value, list) and isinstance(step, int) and step < len(value):
            value = value[step]
        else:
            return _MISSING
    return value


def _same(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but True is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return type(a) is type(b) and a == b


def _matched(output: Any, reference: Any) -> tuple[int, int]:
    leaves = leaf_fields(reference)
    return sum(_same(_lookup(output, p), v) for p, v in leaves.items()), len(leaves)


def field_accuracy(output: Any, reference: Any) -> float:
    """Fraction of the reference's leaf fields that the output has, equal, at the same path.

    Worked example: reference ``{"a": 1, "b": {"c": "x", "d": true}}`` has 3
    leaves; an output ``{"a": 1.0, "b": {"c": "y", "d": true}}`` matches
    ``a`` and ``b.d``: 2/3.  Extra output fields cost nothing; a missing or
    unparsable output scores 0.

    >>> round(field_accuracy({"a": 1.0, "b": {"c": "y", "d": True}}, {"a": 1, "b": {"c": "x", "d": True}}), 3)
    0.667
    """
    if output is None:
        return 0.0
    matched, total = _matched(output, reference)
    return matched / total if total else float(_same(output, reference))


def calls_field_accuracy(output: Any, reference: Sequence[Any]) -> float:
    """Field accuracy of a list of calls against reference calls, without regard to order.

    Each reference call is paired with a distinct output call so that the
    total number of matched leaf fields is largest; the score is matched
    leaves / all reference leaves.  A missing call matches nothing.

    Worked example: reference ``[A, B]`` with 2 leaves each, output
    ``[B', A]`` where ``B'`` gets 1 of B's leaves: pairing A-A, B-B' gives
    (2 + 1) / 4 = 0.75.

    >>> A = {"name": "a", "arguments": {"x": 1}}
    >>> B = {"name": "b", "arguments": {"y": 2}}
    >>> calls_field_accuracy([{"name": "b", "arguments": {"y": 3}}, A], [A, B])
    0.75
    """
    if not isinstance(output, list):
        output = [] if output is None else [output]
    total = sum(len(leaf_fields(call)) for call in reference)
    if not total:
        return 0.0
    scores = [[_matched(out, ref)[0] for out in output] for ref in reference]
    n_ref, n_out = len(reference), len(output)
    if n_out == 0:
        return 0.0
    best = 0
    if math.perm(max(n_ref, n_out), min(n_ref, n_out)) <= 50_000:
        if n_ref <= n_out:
            for chosen in itertools.permutations(range(n_out), n_ref):
                best = max(best, sum(scores[r][o] for r, o in enumerate(chosen)))
        else:
            for chosen in itertools.permutations(range(n_ref), n_out):
                best = max(best, sum(scores[r][o] for o, r in enumerate(chosen)))
    else:  # many calls: greedy pairing, best pairs first
        pairs = sorted(((scores[r][o], r, o) for r in range(n_ref) for o in range(n_out)), reverse=True)
        used_r: set[int] = set()
        used_o: set[int] = set()
        for score, r, o in pairs:
            if r not in used_r and o not in used_o:
                used_r.add(r)
                used_o.add(o)
                best += score
    return best / total


def agreement(tokens: Sequence[int], baseline: Sequence[int]) -> tuple[bool, float]:
    """``(identical, prefix fraction)``: token-for-token agreement with the baseline.

    The prefix fraction is the common prefix over the longer sequence.

    >>> agreement([1, 2, 3], [1, 2, 3])
    (True, 1.0)
    >>> agreement([1, 2, 9, 9], [1, 2, 3])
    (False, 0.5)
    """
    n = 0
    for a, b in zip(tokens, baseline):
        if a != b:
            break
        n += 1
    longest = max(len(tokens), len(baseline))
    return list(tokens) == list(baseline), (n / longest if longest else 1.0)


def pairwise_speedups(arm_rate: dict[Any, float], baseline_rate: dict[Any, float]) -> dict[Any, float]:
    """Per key (a task, or a task and repeat), the arm's tokens/s over the baseline's.

    Only keys both sides measured (with a positive baseline rate) count.

    >>> pairwise_speedups({"t1": 30.0, "t2": 10.0, "t3": 5.0}, {"t1": 10.0, "t2": 20.0})
    {'t1': 3.0, 't2': 0.5}
    """
    return {
        key: rate / baseline_rate[key]
        for key, rate in arm_rate.items()
        if key in baseline_rate and baseline_rate[key] > 0
    }


def median(values: Iterable[float | None]) -> float | None:
    """Median of the values that are not ``None``; ``None`` if there are none.

    >>> median([3.0, None, 1.0, 2.0])
    2.0
    """
    kept = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(kept) if kept else None
