"""Repeated structured traffic for ``tools/suffix_eval.py``: seeded JSON answers for the task file's schemas, as
token streams.

Each request's answer is a variation of its task's reference answer: the same
keys and shape, new values (words swapped, digits, dates and times redrawn,
numbers drawn within the schema's bounds, enums drawn from the schema, lists a
little longer or shorter, optional keys now and then left out; a string whose
schema has a ``pattern`` keeps matching it).  For a tool set, now and then a
call of another of its tools is drawn from the schema alone.  The requests of
all schemas are interleaved, the way a server's traffic arrives, so a
structure that learns across requests sees each kind many times.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grammarspec.bench.tasks import BenchTask
from proposers.suffix_index import scope_of

__all__ = ["Stream", "documents", "streams", "vary", "vary_text", "vocabulary"]

WORD = re.compile(r"[A-Za-z]+")
IDENTIFIER = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)+$")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
TIME = re.compile(r"(?<!\d)\d{2}:\d{2}(?!\d)")
#: Attempts at a new string that still matches its schema's pattern (the first ones also swap words).
ATTEMPTS, WORD_ATTEMPTS = 6, 3


def vocabulary(tasks: Sequence[BenchTask]) -> list[str]:
    """Every word (letters only, three or more) of the reference answers, lower-cased and sorted.  Pure."""
    found = (WORD.findall(json.dumps(t.reference, ensure_ascii=False)) for t in tasks)
    return sorted({w.lower() for words in found for w in words if len(w) >= 3})


def random_date(rng: random.Random) -> str:
    """A valid ``YYYY-MM-DD`` date in the 2020s.  Pure given ``rng``'s state."""
    return f"20{rng.randint(20, 29)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _redraw(text: str, rng: random.Random, words: Sequence[str] | None) -> str:
    """``text`` with its digits redrawn (dates and times kept valid) and, given ``words``, most words swapped
    (case kept; short upper-case codes such as ``INV`` stay).  Pure given ``rng``'s state."""

    def word(match: re.Match[str]) -> str:
        w = match.group(0)
        if words is None or (w.isupper() and len(w) <= 4) or rng.random() < 0.3:
            return w
        new = rng.choice(words)
        return new.upper() if w.isupper() else new.capitalize() if w[0].isupper() else new

    text = re.sub(r"\d", lambda _: str(rng.randrange(10)), WORD.sub(word, text))
    text = DATE.sub(lambda _: random_date(rng), text)
    return TIME.sub(lambda _: f"{rng.randint(0, 23):02d}:{rng.randrange(0, 60, 5):02d}", text)


def vary_text(text: str, rng: random.Random, words: Sequence[str], pattern: str | None = None) -> str:
    """A new string of ``text``'s shape (:func:`_redraw`); ``snake_case`` identifiers stay.  With ``pattern``,
    one that matches it (digits only after a few tries, else ``text`` itself).  Pure given ``rng``'s state."""
    if IDENTIFIER.match(text):
        return text
    for attempt in range(ATTEMPTS):
        new = _redraw(text, rng, words if attempt < WORD_ATTEMPTS else None)
        if pattern is None or re.search(pattern, new):
            return new
    return text


def bounds(schema: dict[str, Any], value: float) -> tuple[float, float]:
    """The range a number like ``value`` is drawn from: the schema's bounds, else 0 (or ``2 * value`` when
    negative) to ``max(10, 2 * value)``.  Pure."""
    low = schema.get("minimum", schema.get("exclusiveMinimum", min(0, 2 * value)))
    high = schema.get("maximum", schema.get("exclusiveMaximum", max(10, 2 * value)))
    step = 1 if isinstance(value, int) else 0.01
    low += step if "minimum" not in schema and "exclusiveMinimum" in schema else 0
    high -= step if "maximum" not in schema and "exclusiveMaximum" in schema else 0
    return low, max(low, high)


def number(schema: dict[str, Any], value: float, rng: random.Random) -> float | int:
    """A new number within :func:`bounds` (a multiple of ``multipleOf``); an int when ``value`` (or the schema) is one.  Pure given ``rng``."""
    low, high = bounds(schema, value)
    if isinstance(value, int) or schema.get("type") == "integer":
        return rng.randint(math.ceil(low), max(math.ceil(low), math.floor(high)))
    step = schema.get("multipleOf")
    if step:  # a multiple of ``step`` within the bounds
        return round(step * rng.randint(math.ceil(low / step), max(math.ceil(low / step), math.floor(high / step))), 6)
    return round(rng.uniform(low, high), 2)


def branch(schema: dict[str, Any], value: Any) -> dict[str, Any]:
    """The ``anyOf``/``oneOf`` branch of ``schema`` that ``value`` follows (its consts match), else it.  Pure."""
    for option in (schema.get("anyOf") or schema.get("oneOf") or []) if isinstance(value, dict) else []:
        props = option.get("properties", {})
        consts = {k: p["const"] for k, p in props.items() if "const" in p}
        if set(value) <= set(props) and all(value.get(k) == c for k, c in consts.items()):
            return option
    return schema


def item_count(schema: dict[str, Any], around: int, rng: random.Random) -> int:
    """How many items a list of about ``around`` gets: one more or fewer, within the schema's bounds (at least
    one).  Pure given ``rng``'s state."""
    count = max(1, around + rng.randint(-1, 1), schema.get("minItems", 1))
    return min(count, schema.get("maxItems", count))


def synth(schema: dict[str, Any], rng: random.Random, words: Sequence[str], depth: int = 0) -> Any:
    """A random document of ``schema`` (its types, enums, consts, bounds, formats and required keys), for the
    parts of a schema no reference answer shows.  Pure given ``rng``'s state."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return synth(rng.choice(options), rng, words, depth)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if kind == "object":
        required = set(schema.get("required", []))
        props = schema.get("properties", {})
        return {k: synth(s, rng, words, depth + 1) for k, s in props.items() if k in required or rng.random() < 0.5}
    if kind == "array":
        count = item_count(schema, rng.randint(1, 3) if depth < 4 else 1, rng)
        return [synth(schema.get("items", {}), rng, words, depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        return number(schema, 50 if kind == "integer" else 50.0, rng)
    if kind == "boolean":
        return rng.random() < 0.5
    if schema.get("format") == "date":
        return random_date(rng)
    if schema.get("format") == "email":
        return f"{rng.choice(words)}.{rng.choice(words)}@example.com"
    return " ".join(rng.choice(words) for _ in range(rng.randint(1, 4))).capitalize()


def vary(value: Any, schema: dict[str, Any], rng: random.Random, words: Sequence[str]) -> Any:
    """Another document like ``value`` under ``schema`` (see the module docstring).  Pure given ``rng``'s state."""
    schema = branch(schema, value) if isinstance(schema, dict) else {}
    if isinstance(value, dict):
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        kept = [k for k in value if k in required or not props or rng.random() < 0.85]
        return {k: vary(value[k], props.get(k, {}), rng, words) for k in kept}
    if isinstance(value, list) and value:
        items = schema.get("items", {})
        return [vary(rng.choice(value), items, rng, words) for _ in range(item_count(schema, len(value), rng))]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if isinstance(value, bool):
        return value if "const" in schema else rng.random() < 0.5
    if isinstance(value, (int, float)) and "const" not in schema:
        return number(schema, value, rng)
    if isinstance(value, str) and "const" not in schema:
        return vary_text(value, rng, words, schema.get("pattern"))
    return value


def request_document(task: BenchTask, rng: random.Random, words: Sequence[str]) -> Any:
    """One request's answer for ``task``'s schema: mostly a variation of its reference; for a tool set, now and
    then a call of another of its tools, drawn from the schema.  Pure given ``rng``'s state."""
    options = task.schema.get("anyOf") or task.schema.get("oneOf")
    if options and rng.random() < 0.3:
        return synth(rng.choice(options), rng, words)
    return vary(task.reference, task.schema, rng, words)


def documents(tasks: Sequence[BenchTask], count: int, seed: int) -> list[tuple[int, str]]:
    """``count`` requests as ``(task index, JSON text)``, the schemas interleaved in a seeded order (each task
    ``count / len(tasks)`` times, give or take one).  Pure."""
    rng = random.Random(seed)
    words = vocabulary(tasks) or ["value"]
    usable = [i for i, t in enumerate(tasks) if t.reference is not None]
    if not usable:
        raise ValueError("the task file has no reference answers to vary")
    order = [usable[j % len(usable)] for j in range(count)]
    rng.shuffle(order)
    return [(i, json.dumps(request_document(tasks[i], rng, words), ensure_ascii=False)) for i in order]


@dataclass(frozen=True)
class Stream:
    """One request: its scope (the schema's), the prompt's last tokens, and the output's tokens."""

    scope: str
    prompt: tuple[int, ...]
    tokens: tuple[int, ...]


def streams(
    tasks: Sequence[BenchTask], docs: Sequence[tuple[int, str]], tokenizer: Any, prompt_tail: int
) -> list[Stream]:
    """The requests ``docs`` as token streams of ``tokenizer``: the last ``prompt_tail`` tokens of their task's
    chat prompt, and the answer followed by the end-of-turn token.  Pure."""
    from grammarspec.completion import build_prompt

    prompts: dict[int, tuple[int, ...]] = {}
    eos = (tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ()
    ids = tokenizer([text for _, text in docs], add_special_tokens=False)["input_ids"]
    out = []
    for (i, _), tokens in zip(docs, ids, strict=True):
        if i not in prompts:
            t = tasks[i]
            full = build_prompt(tokenizer, t.prompt, system=t.system, schema=t.schema, tools=t.tools)
            prompts[i] = tuple(full[-prompt_tail:])
        out.append(Stream(scope_of(tasks[i].schema), prompts[i], tuple(tokens) + eos))
    return out
