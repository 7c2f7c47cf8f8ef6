"""Fuzz grammarspec over a corpus of production JSON schemas.

    python -m grammarspec.fuzz --out FUZZ.md                     # the whole corpus, both backends
    python -m grammarspec.fuzz --per-category 2 --out /tmp/f.md  # a stratified slice

For every record of ``../shared/schemas/*.jsonl`` (see its README) and every
backend, four kinds of check, each ending in one *outcome*:

* ``compile``: the schema compiles (``compiled``), or the backend refuses it
  with a :class:`~grammars.GrammarError` that gives a reason (``unsupported``).
  Any other exception is a bug (``crash``).
* ``example``: each valid example, serialised compactly
  (``json.dumps(x, separators=(",", ":"), ensure_ascii=False)``) and
  tokenized with the model's tokenizer, is accepted token by token and the
  matcher terminates on EOS (``accepted``).  Where the corpus records that
  xgrammar itself rejects the example (``meta.xgrammar_accepts_examples``),
  a rejection is ``rejected_flagged``; outlines-core has no such flags and is
  known to be stricter than the schema in places, so its rejections are
  ``rejected_stricter`` (a completeness gap, never unsafe).
  ``Matcher.validate`` must count the same legal tokens as the walk.
* ``invalid_example``: each invalid example is ``rejected``, or, when every
  violation is of a keyword the backend does not enforce (see
  :data:`ENFORCED` and :func:`is_enforced`), ``accepted_unenforced``.
* ``generate``: :func:`grammarspec.complete` with the model, greedy or
  sampled, with a rotating proposer and a short ``max_new_tokens``.  A
  finished output (``stop``) is JSON and validates (``stop_valid``), or its
  every violation is of an unenforced keyword and the completion does not
  claim to be valid (``stop_unenforced``).  An output cut by the token limit
  reports ``length``, has exactly ``max_new_tokens`` tokens and is never
  claimed valid.

Outcomes in :data:`BUG_OUTCOMES` are bugs; the others are expected
behaviour and are counted in the summary.  The CLI runs each (record,
backend) job in a worker process with a timeout (outlines-core can take
minutes on some schemas; ``timeout`` is an outcome, not a crash) and writes
every check to a JSONL file and a markdown summary.  The CI slice
(``tests/test_fuzz_corpus.py``) runs the same checks in-process.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from grammars.outlines_backend import FORMATS as OUTLINES_FORMATS
from grammars.outlines_backend import length_yields_to_shape

__all__ = [
    "Check",
    "GenConfig",
    "GENERATION_CONFIGS",
    "BUG_OUTCOMES",
    "ENFORCED",
    "FORMATS",
    "is_enforced",
    "load_corpus",
    "stratified_slice",
    "fuzz_prompt",
    "grammar_checks",
    "generation_checks",
    "fuzz_record",
    "classify_completion",
    "run_isolated",
    "RunOptions",
    "Job",
    "configs_for",
    "FuzzContext",
    "summarize",
    "read_results",
    "main",
]

BACKENDS = ("xgrammar", "outlines")

#: Outcomes that are bugs in grammarspec (or a backend it must guard against).
BUG_OUTCOMES = frozenset(
    {
        "crash",  # an exception other than GrammarError, or a worker process that died
        "rejected_valid",  # xgrammar rejected a valid example that the corpus says it accepts
        "validate_mismatch",  # Matcher.validate disagrees with accepting token by token
        "accepted_invalid",  # an invalid example accepted although a violated keyword is enforced
        "stop_invalid",  # a finished output violates an enforced keyword
        "not_json",  # a finished output is not JSON
        "claimed_valid",  # Completion.valid is True for an output that is not valid
        "length_wrong",  # finish "length" without max_new_tokens tokens
    }
)

# --- what each backend enforces -------------------------------------------------------

#: Keywords whose violation the backend's grammar rejects, wherever they stand outside
#: the contexts in :data:`UNENFORCED_CONTEXTS` (with the exceptions of
#: :func:`_step_enforced` and :func:`_keyword_enforced`).  Measured on xgrammar 0.2.9 and outlines-core 0.2.14 in
#: grammarspec's default (compact, strict) mode; tests/test_fuzz_corpus.py pins every
#: entry with a violating instance on a toy vocabulary.
ENFORCED: dict[str, frozenset[str]] = {
    "xgrammar": frozenset(
        {
            "type", "enum", "const", "required", "additionalProperties", "items", "prefixItems",
            "minItems", "maxItems", "minLength", "maxLength", "pattern", "minimum", "maximum",
            "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minProperties", "maxProperties",
            "propertyNames", "anyOf", "oneOf",
        }
    ),  # fmt: skip
    "outlines": frozenset(
        {
            "type", "enum", "const", "required", "additionalProperties", "items", "prefixItems",
            "minItems", "maxItems", "minLength", "maxLength", "pattern", "minProperties", "anyOf",
            "oneOf",
        }
    ),  # fmt: skip
}

#: ``format`` values each backend turns into a grammar (others are ignored or refused).  A
#: format is only approximated by a regex (``2023-02-30`` has the shape of a date), so
#: ``format`` is not in :data:`ENFORCED`: a completion must check it, and does.
FORMATS: dict[str, frozenset[str]] = {
    "xgrammar": frozenset(
        {"date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uri-reference",
         "uri-template", "uuid", "json-pointer"}
    ),  # fmt: skip
    "outlines": OUTLINES_FORMATS,
}

#: Nothing below these keywords is enforced: the backends ignore them (``not``,
#: ``if``/``then``/``else``, ``dependencies``, ``contains``, ...) or only approximate
#: them (``allOf``, ``patternProperties``).
UNENFORCED_CONTEXTS = frozenset(
    {
        "not", "if", "then", "else", "allOf", "dependencies", "dependentSchemas", "dependentRequired",
        "contains", "patternProperties", "unevaluatedProperties", "unevaluatedItems", "additionalItems",
    }
)  # fmt: skip

#: Keywords that lead to subschemas without being enforced themselves.
_STRUCTURAL = frozenset({"properties", "definitions", "$defs", "$ref"})
#: Keywords whose next schema-path segment is a name (not a keyword).
_NAMED_CHILDREN = frozenset({"properties", "patternProperties", "definitions", "$defs", "dependencies", "dependentSchemas"})
#: Keywords whose next schema-path segment is an index.
_INDEXED_CHILDREN = frozenset({"anyOf", "oneOf", "allOf", "prefixItems", "items"})
#: Keywords that only constrain one JSON type; both backends ignore them unless ``type`` names it.
_TYPE_OF = {
    "pattern": "string", "minLength": "string", "maxLength": "string", "format": "string",
    "minimum": "number", "maximum": "number", "exclusiveMinimum": "number", "exclusiveMaximum": "number",
    "multipleOf": "number", "items": "array", "prefixItems": "array", "minItems": "array", "maxItems": "array",
}  # fmt: skip
_COMBINATORS = ("anyOf", "oneOf", "allOf")
_LOOKAROUND = re.compile(r"\(\?<?[=!]")


def is_enforced(error: Any, backend: str, root: Any) -> bool:
    """Whether ``backend``'s grammar must reject an instance that has this jsonschema error.

    ``error``: a ``jsonschema.ValidationError`` raised against the schema
    ``root``.  Every step of the error's schema path must be enforced (see
    :func:`_step_enforced`): what the backends ignore (``not``, siblings of
    ``$ref``/``anyOf``/``enum``, string keywords without ``"type": "string"``,
    ...) enforces nothing below it.  An ``anyOf``/``oneOf`` error is enforced
    when every branch fails on an enforced keyword; a ``oneOf`` error where
    some branch matches ("valid under each of") is not.  Pure.

    Worked example (xgrammar): ``{"type": "integer", "not": {"const": 1}}`` and
    the instance ``1`` give one error, keyword ``not``: not enforced.  The
    instance ``"x"`` gives a ``type`` error: enforced.
    """
    steps = _path_steps(root, list(error.absolute_schema_path))
    if not steps or not all(_step_enforced(node, keyword, backend) for node, keyword in steps):
        return False
    node, keyword = steps[-1]
    if keyword in ("anyOf", "oneOf"):
        if not isinstance(error.validator_value, list):
            return False
        failing: dict[Any, list[Any]] = defaultdict(list)
        for sub in error.context or ():
            failing[sub.relative_schema_path[0]].append(sub)
        if len(failing) < len(error.validator_value):  # some branch matches
            return False
        return all(any(is_enforced(sub, backend, root) for sub in subs) for subs in failing.values())
    return _keyword_enforced(keyword, node, backend)


def _path_steps(root: Any, path: Sequence[Any]) -> list[tuple[dict[str, Any], str]] | None:
    """``(schema node, keyword)`` for every keyword on a jsonschema schema path.

    jsonschema leaves ``$ref`` out of its paths; where the next segment is not
    in the node but the node has a local ``$ref``, the walk follows it (as the
    step ``(node, "$ref")``).  ``None`` when the path cannot be followed (a
    remote reference, say).  Pure.

    >>> _path_steps({"properties": {"a": {"type": "string"}}}, ["properties", "a", "type"])
    [({'properties': {'a': {'type': 'string'}}}, 'properties'), ({'type': 'string'}, 'type')]
    """
    steps: list[tuple[dict[str, Any], str]] = []
    node = root
    i = 0
    for _ in range(10_000):  # bounded: a $ref cycle without progress ends the walk
        if i >= len(path):
            return steps
        if not isinstance(node, dict):
            return None
        keyword = path[i]
        if keyword not in node:
            target = _resolve(root, node.get("$ref"))
            if target is None:
                return None
            steps.append((node, "$ref"))
            node = target
            continue
        steps.append((node, keyword))
        child = node[keyword]
        i += 1
        if keyword == "propertyNames" and isinstance(child, dict):
            child = {"type": "string", **child}  # property names are strings
        if keyword in _NAMED_CHILDREN or (keyword in _INDEXED_CHILDREN and isinstance(child, list)):
            if i >= len(path):
                return steps
            try:
                child = child[path[i]]
            except (KeyError, IndexError, TypeError):
                return None
            i += 1
        node = child
    return None


def _resolve(root: Any, ref: Any) -> Any:
    """The subschema a local ``$ref`` (``#`` or ``#/json/pointer``) points at, else ``None``."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            return None
    return node


def _step_enforced(node: dict[str, Any], keyword: str | None, backend: str) -> bool:
    """Whether the backend applies ``keyword`` of ``node`` at all (what it checks aside).

    Both backends drop the siblings of ``$ref``, of ``anyOf``/``oneOf``/``allOf``
    and of ``enum``/``const``, and ignore a type-specific keyword (``pattern``,
    ``maximum``, ``maxItems``, ...) when ``type`` does not name that type.
    """
    if keyword is None or keyword in UNENFORCED_CONTEXTS:
        return False
    if keyword not in ENFORCED[backend] and keyword not in _STRUCTURAL:
        return False
    if "$ref" in node and keyword != "$ref":
        return False
    if any(c in node for c in _COMBINATORS) and keyword not in _COMBINATORS:
        return False
    if ("enum" in node or "const" in node) and keyword not in ("enum", "const"):
        return False
    kind = _TYPE_OF.get(keyword)
    if kind is not None:
        declared = node.get("type")
        types = declared if isinstance(declared, list) else [declared]
        if kind not in types and not (kind == "number" and "integer" in types):
            return False
    return True


def _keyword_enforced(keyword: str | None, node: dict[str, Any], backend: str) -> bool:
    """Whether the backend checks ``keyword`` of ``node`` exactly (for the failing keyword)."""
    if keyword == "pattern":
        return _plain_pattern(node.get("pattern"))
    if keyword in ("minLength", "maxLength") and _shaped(node, backend):
        return False  # a pattern or format wins over length bounds (xgrammar; grammarspec's outlines adapter)
    if keyword == "multipleOf":
        return node.get("type") == "integer"  # xgrammar: "multipleOf is not supported for type:number"
    if keyword in ("minimum", "maximum") and any(
        isinstance(node.get(k), bool) for k in ("exclusiveMinimum", "exclusiveMaximum")
    ):
        return False  # draft-4 boolean exclusive bounds
    return keyword in ENFORCED[backend]


def _shaped(node: dict[str, Any], backend: str) -> bool:
    """Whether ``node``'s string shape comes from ``pattern`` or ``format`` rather than its length bounds."""
    if backend == "xgrammar":
        return "pattern" in node or "format" in node
    return length_yields_to_shape(node)


def _plain_pattern(pattern: Any) -> bool:
    """A regex without lookaround and without ``^``/``$`` in the middle (xgrammar ignores both)."""
    if not isinstance(pattern, str) or _LOOKAROUND.search(pattern):
        return False
    inner = pattern[1:] if pattern.startswith("^") else pattern
    inner = inner[:-1] if inner.endswith("$") and not inner.endswith("\\$") else inner
    in_class = escaped = False
    for char in inner:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "[":
            in_class = True
        elif char == "]":
            in_class = False
        elif char in "^$" and not in_class:
            return False
    return True


def schema_errors(schema: dict[str, Any], instance: Any, *, formats: bool, default: str = "draft7") -> list[Any]:
    """jsonschema errors of ``instance`` (validator from ``$schema``; ``default`` draft otherwise).

    ``formats=True`` asserts ``format`` as :class:`grammarspec.Completion` does;
    the corpus' examples were labelled without it (``formats=False``).
    """
    import jsonschema

    fallback = jsonschema.Draft7Validator if default == "draft7" else jsonschema.validators.validator_for({})
    cls = jsonschema.validators.validator_for(schema, default=fallback)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER if formats else None)
    return list(validator.iter_errors(instance))


# --- corpus ---------------------------------------------------------------------------


def default_corpus() -> Path:
    """``../shared/schemas`` beside the checkout."""
    return Path(__file__).resolve().parents[1].parent / "shared" / "schemas"


def load_corpus(folder: str | Path | None = None, categories: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Records of every ``*.jsonl`` in ``folder`` (sorted by file, then by line)."""
    folder = Path(folder) if folder is not None else default_corpus()
    files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else [folder]
    if not files or not all(f.is_file() for f in files):
        raise FileNotFoundError(f"no schema corpus (*.jsonl) at {folder}; pass --schemas DIR")
    wanted = set(categories) if categories else None
    records = []
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                if wanted is None or record.get("category") in wanted:
                    records.append(record)
    if wanted is not None:
        missing = wanted - {r.get("category") for r in records}
        if missing:
            raise ValueError(f"no records for categories {sorted(missing)} in {folder}")
    return records


def stratified_slice(
    records: Sequence[dict[str, Any]], per_category: int, *, max_bytes: int | None = None, salt: str = "fuzz"
) -> list[dict[str, Any]]:
    """``per_category`` records of each category, deterministic and spread over the corpus.

    Records are ranked by ``sha256(salt + ":" + id)`` within their category
    (ids, not file order, so the slice does not follow the corpus' own
    ranking); ``max_bytes`` skips schemas larger than that (compact UTF-8,
    ``meta.size_bytes``).  Pure.
    """
    by_category: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        size = record.get("meta", {}).get("size_bytes") or len(_compact(record["schema"]).encode())
        if max_bytes is None or size <= max_bytes:
            by_category[record["category"]].append(record)
    chosen = []
    for category in sorted(by_category):
        ranked = sorted(by_category[category], key=lambda r: hashlib.sha256(f"{salt}:{r['id']}".encode()).hexdigest())
        chosen += ranked[:per_category]
    return chosen


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# --- checks ---------------------------------------------------------------------------


@dataclass
class Check:
    """One check on one record with one backend."""

    record: str
    category: str
    backend: str
    kind: str  # "compile" | "example" | "invalid_example" | "generate"
    outcome: str
    detail: str = ""
    seconds: float = 0.0

    @property
    def is_bug(self) -> bool:
        return self.outcome in BUG_OUTCOMES


@dataclass(frozen=True)
class GenConfig:
    """One generation setting: the proposer (``assistant=``) and greedy or sampled."""

    name: str
    assistant: str | None
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def generate_kwargs(self) -> dict[str, Any]:
        if not self.do_sample:
            return {"do_sample": False}
        return {"do_sample": True, "temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}


#: The rotation of generation settings: greedy and sampled, every proposer preset
#: ("draft_model" drafts with the target model itself).
GENERATION_CONFIGS: tuple[GenConfig, ...] = (
    GenConfig("greedy/auto", "auto"),
    GenConfig("sample/prompt_lookup", "prompt_lookup", True, temperature=1.0),
    GenConfig("greedy/schema_ngram", "schema_ngram"),
    GenConfig("sample/jump_forward", "jump_forward", True, temperature=0.7, top_p=0.9),
    GenConfig("greedy/none", None),
    GenConfig("sample/auto", "auto", True, temperature=1.0, top_k=50),
    GenConfig("greedy/jump_forward", "jump_forward"),
    GenConfig("sample/draft_model", "draft_model", True, temperature=0.8),
    GenConfig("greedy/prompt_lookup", "prompt_lookup"),
    GenConfig("sample/schema_ngram", "schema_ngram", True, temperature=1.0, top_p=0.95),
)


def configs_for(index: int, count: int) -> list[GenConfig]:
    """``count`` consecutive settings of the rotation, starting at ``index`` (wraps).

    ``configs_for(0, 2)`` -> greedy/auto, sample/prompt_lookup.  Pure.
    """
    n = len(GENERATION_CONFIGS)
    return [GENERATION_CONFIGS[(index + i) % n] for i in range(min(count, n))]


@dataclass
class FuzzContext:
    """The tokenizer (and, for generation, the model) the checks run with."""

    tokenizer: Any
    model: Any = None
    vocab_size: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    @classmethod
    def create(cls, tokenizer: Any, model: Any = None) -> "FuzzContext":
        """Logits width and stop tokens as :func:`grammarspec.generate` derives them."""
        vocab = None
        stops: tuple[int, ...] = ()
        if model is not None:
            from .decoding import logits_width

            vocab = logits_width(model)
            eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
            if eos is not None:
                stops = tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))
        if not stops and tokenizer.eos_token_id is not None:
            stops = (int(tokenizer.eos_token_id),)
        return cls(tokenizer=tokenizer, model=model, vocab_size=vocab or len(tokenizer), stop_token_ids=stops)


def compile_check(ctx: FuzzContext, record: dict[str, Any], backend: str) -> tuple[Check, Any]:
    """Compile ``record``'s schema; returns the check and the compiled grammar (``None`` if it failed)."""
    from grammars import GrammarError, compile_grammar, grammar_spec

    check = Check(record["id"], record["category"], backend, "compile", "compiled")
    started = time.perf_counter()
    compiled = None
    with _captured_stderr() as warnings:
        try:
            spec = grammar_spec(schema=record["schema"])
            compiled = compile_grammar(
                spec, ctx.tokenizer, vocab_size=ctx.vocab_size, stop_token_ids=ctx.stop_token_ids, backend=backend
            )
        except GrammarError as e:
            check.outcome, check.detail = "unsupported", str(e)
        except Exception as e:  # noqa: BLE001 - anything else is the bug this check looks for
            check.outcome, check.detail = "crash", _describe_exception(e)
    check.seconds = time.perf_counter() - started
    notes = sorted(set(_backend_warnings(warnings())))
    if notes and check.outcome == "compiled":
        check.detail = "warnings: " + " | ".join(notes)
    return check, compiled


def grammar_checks(ctx: FuzzContext, record: dict[str, Any], backend: str) -> list[Check]:
    """Compile, then walk every valid and invalid example through a fresh matcher."""
    check, compiled = compile_check(ctx, record, backend)
    checks = [check]
    if compiled is None:
        return checks
    flags = record.get("meta", {}).get("xgrammar_accepts_examples") or []
    for i, example in enumerate(record.get("examples") or []):
        checks.append(_example_check(ctx, record, backend, compiled, example, i, flags[i] if i < len(flags) else None))
    for i, example in enumerate(record.get("invalid_examples") or []):
        checks.append(_invalid_example_check(ctx, record, backend, compiled, example, i))
    return checks


def walk(matcher: Any, tokens: Sequence[int], stop: int) -> tuple[int, bool]:
    """Accept ``tokens`` then ``stop``; returns (tokens accepted, whether it terminated).  Changes state."""
    for i, token in enumerate(tokens):
        if not matcher.accept(token):
            return i, False
    return len(tokens), matcher.accept(stop) and matcher.is_terminated()


def _tokens(ctx: FuzzContext, value: Any) -> tuple[str, list[int]]:
    text = _compact(value)
    return text, list(ctx.tokenizer(text, add_special_tokens=False)["input_ids"])


def _example_check(
    ctx: FuzzContext, record: dict[str, Any], backend: str, compiled: Any, example: Any, i: int, flag: bool | None
) -> Check:
    check = Check(record["id"], record["category"], backend, "example", "accepted")
    started = time.perf_counter()
    try:
        text, tokens = _tokens(ctx, example)
        stop = ctx.stop_token_ids[0]
        matched, terminated = walk(compiled.matcher(max_rollback=8), tokens, stop)
        legal = compiled.matcher(max_rollback=8).validate(tokens + [stop])
        if legal != matched + int(terminated):
            check.outcome = "validate_mismatch"
            walked = matched + int(terminated)
            check.detail = f"example {i}: validate() says {legal} legal tokens, accepting one by one gave {walked}"
        elif not terminated:
            where = _where(ctx, tokens, matched)
            if backend == "xgrammar" and flag is False:
                check.outcome = "rejected_flagged"
            elif backend == "xgrammar":
                check.outcome = "rejected_valid"
            else:
                check.outcome = "rejected_stricter"
            check.detail = f"example {i} rejected {where}: {text[:300]}"
    except Exception as e:  # noqa: BLE001
        check.outcome, check.detail = "crash", f"example {i}: {_describe_exception(e)}"
    check.seconds = time.perf_counter() - started
    return check


def _invalid_example_check(
    ctx: FuzzContext, record: dict[str, Any], backend: str, compiled: Any, example: Any, i: int
) -> Check:
    check = Check(record["id"], record["category"], backend, "invalid_example", "rejected")
    started = time.perf_counter()
    try:
        errors = schema_errors(record["schema"], example, formats=False)
        text, tokens = _tokens(ctx, example)
        matched, terminated = walk(compiled.matcher(max_rollback=8), tokens, ctx.stop_token_ids[0])
        if terminated:
            enforced = [e for e in errors if is_enforced(e, backend, record["schema"])]
            if enforced:
                check.outcome = "accepted_invalid"
                check.detail = f"invalid example {i} accepted; enforced violation: {_error_text(enforced[0])}"
            else:
                check.outcome = "accepted_unenforced"
                check.detail = f"invalid example {i}: " + "; ".join(_error_text(e) for e in errors[:3])
    except Exception as e:  # noqa: BLE001
        check.outcome, check.detail = "crash", f"invalid example {i}: {_describe_exception(e)}"
    check.seconds = time.perf_counter() - started
    return check


def _where(ctx: FuzzContext, tokens: Sequence[int], matched: int) -> str:
    if matched >= len(tokens):
        return "at the end (EOS not allowed)"
    done = ctx.tokenizer.decode(tokens[:matched])
    return f"at token {matched} {ctx.tokenizer.decode([tokens[matched]])!r} after {done[-40:]!r}"


def _error_text(error: Any) -> str:
    path = "/".join(str(p) for p in error.absolute_schema_path)
    return f"{error.validator} at {path or '(root)'}: {error.message[:150]}"


#: A schema quoted in the prompt when its compact JSON is at most this long (else summarised).
QUOTE_LIMIT = 1500


def fuzz_prompt(record: dict[str, Any]) -> tuple[str | list[dict[str, str]], str | None, bool]:
    """``(prompt, system, quote_schema)`` for one record.  Pure.

    function_calling records use their first stored user turn; others ask for
    one example document by title or description.  The schema is quoted (by
    :func:`grammarspec.build_prompt`) only when it is short, to keep prefill cheap.
    """
    schema = record["schema"]
    quote = len(_compact(schema)) <= QUOTE_LIMIT
    prompts = record.get("prompts") or []
    if prompts:
        tool = record.get("tool") or {}
        system = (
            f"You call the function {tool.get('name', 'the function')}: {str(tool.get('description', '')).strip()[:300]} "
            "Reply with the call's arguments as one JSON object."
        )
        return list(prompts[0]["messages"]), system, quote
    what = next((schema[k] for k in ("title", "description") if isinstance(schema.get(k), str) and schema[k].strip()), "")
    what = what.strip().rstrip(".")[:200] or "a document that follows the schema"
    return f"Write one realistic example of a JSON document: {what}. Reply with the JSON only.", None, quote


def generation_checks(
    ctx: FuzzContext,
    record: dict[str, Any],
    backend: str,
    configs: Sequence[GenConfig],
    *,
    max_new_tokens: int = 32,
    seed: int = 0,
) -> list[Check]:
    """Generate once per config and check what the completion claims.  Needs ``ctx.model``."""
    return [_generation_check(ctx, record, backend, c, max_new_tokens, seed) for c in configs]


def _generation_check(
    ctx: FuzzContext, record: dict[str, Any], backend: str, config: GenConfig, max_new_tokens: int, seed: int
) -> Check:
    import torch

    from grammars import GrammarError

    from .completion import complete

    check = Check(record["id"], record["category"], backend, "generate", "stop_valid")
    prompt, system, quote = fuzz_prompt(record)
    digest = int(hashlib.sha256(f"{seed}:{record['id']}:{config.name}".encode()).hexdigest()[:8], 16)
    started = time.perf_counter()
    try:
        completion = complete(
            ctx.model,
            ctx.tokenizer,
            prompt,
            system=system,
            schema=record["schema"],
            assistant=config.assistant,
            assistant_model=ctx.model if config.assistant == "draft_model" else None,
            max_new_tokens=max_new_tokens,
            describe=quote,
            grammar_backend=backend,
            generator=torch.Generator().manual_seed(digest),
            **config.generate_kwargs(),
        )
    except GrammarError as e:  # the backend refuses the schema: a defined outcome
        check.outcome, check.detail = "unsupported", f"{config.name}: {e}"
        check.seconds = time.perf_counter() - started
        return check
    except Exception as e:  # noqa: BLE001 - anything else is a bug
        check.outcome, check.detail = "crash", f"{config.name}: {_describe_exception(e)}"
        check.seconds = time.perf_counter() - started
        return check
    check.seconds = time.perf_counter() - started
    outcome, detail = classify_completion(completion, record["schema"], backend, max_new_tokens)
    check.outcome = outcome
    stats = completion.stats
    check.detail = (
        f"{config.name}: {detail}{'; ' if detail else ''}{stats.new_tokens} tokens, {stats.target_forwards} "
        f"forwards: {completion.text[:200]}"
    )
    return check


def classify_completion(completion: Any, schema: dict[str, Any], backend: str, max_new_tokens: int) -> tuple[str, str]:
    """The outcome of one :class:`grammarspec.Completion` (see the module docstring).  Pure."""
    if completion.finish_reason != "stop":
        if completion.valid or completion.value is not None:
            return "claimed_valid", f"finish {completion.finish_reason!r} but claimed valid/parsed"
        if completion.finish_reason != "length" or completion.stats.new_tokens != max_new_tokens:
            return "length_wrong", (
                f"finish {completion.finish_reason!r} after {completion.stats.new_tokens} of {max_new_tokens} tokens"
            )
        return "length", ""
    try:
        value = json.loads(completion.text)
    except json.JSONDecodeError as e:
        return "not_json", f"finished but not JSON ({e.msg} at {e.pos})"
    errors = schema_errors(schema, value, formats=True, default="latest")
    if not errors:
        if not completion.valid:
            return "stop_unenforced", "valid JSON reported as not valid: " + "; ".join(completion.errors[:2])
        return "stop_valid", ""
    enforced = [e for e in errors if is_enforced(e, backend, schema)]
    if enforced:
        return "stop_invalid", "enforced violation: " + _error_text(enforced[0])
    if completion.valid:
        return "claimed_valid", "claimed valid despite: " + _error_text(errors[0])
    return "stop_unenforced", "; ".join(_error_text(e) for e in errors[:2])


def fuzz_record(
    ctx: FuzzContext,
    record: dict[str, Any],
    backend: str,
    configs: Sequence[GenConfig] = (),
    *,
    max_new_tokens: int = 32,
    seed: int = 0,
) -> list[Check]:
    """Every check of one record with one backend (generation only if it compiled)."""
    checks = grammar_checks(ctx, record, backend)
    if configs and checks[0].outcome == "compiled":
        checks += generation_checks(ctx, record, backend, configs, max_new_tokens=max_new_tokens, seed=seed)
    return checks


def _describe_exception(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)[-3:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames))
    return f"{type(error).__name__}: {str(error)[:300]} [{where}]"


@contextlib.contextmanager
def _captured_stderr() -> Iterator[Any]:
    """Capture file descriptor 2 (where xgrammar's C++ code logs what it ignores).

    Yields a function returning the captured text (complete after the block).
    """
    captured: list[str] = []
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real fd 2 (embedded interpreters): capture nothing
        yield lambda: ""
        return
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lambda: "".join(captured)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.append(sink.read().decode("utf-8", "replace"))


_WARNING = re.compile(r"Warning: (.*)")


def _backend_warnings(text: str) -> list[str]:
    """The kinds of xgrammar warnings in ``text`` (the regex or value after ': ' left out)."""
    return [m.group(1).split(": ")[0].strip() for m in _WARNING.finditer(text)]


# --- the corpus run (worker processes with timeouts) ---------------------------------


@dataclass(frozen=True)
class Job:
    """One record with one backend; ``generations`` settings from the rotation at ``index``."""

    record: dict[str, Any]
    backend: str
    index: int = 0
    generations: int = 0


@dataclass(frozen=True)
class RunOptions:
    model: str = "smollm2-135m"
    max_new_tokens: int = 32
    seed: int = 0
    compile_timeout: float = 180.0
    job_timeout: float = 900.0
    threads: int = 0  # torch threads in the worker (0: torch's default)


def _worker_main(conn: Any, options: RunOptions) -> None:
    """Worker process: load the tokenizer (the model on first need), then run jobs."""
    import torch

    if options.threads:
        torch.set_num_threads(options.threads)
    from .loading import load_model, load_tokenizer

    ctx = FuzzContext.create(load_tokenizer(options.model))
    conn.send(("ready", None))
    while True:
        job = conn.recv()
        if job is None:
            return
        checks = grammar_checks(ctx, job.record, job.backend)
        conn.send(("checks", [asdict(c) for c in checks]))
        if job.generations and checks[0].outcome == "compiled":
            if ctx.model is None:
                model, tokenizer = load_model(options.model)
                ctx = FuzzContext.create(tokenizer, model)
            gen = generation_checks(
                ctx, job.record, job.backend, configs_for(job.index, job.generations),
                max_new_tokens=options.max_new_tokens, seed=options.seed,
            )  # fmt: skip
            conn.send(("checks", [asdict(c) for c in gen]))
        conn.send(("done", None))


class _Worker:
    """One worker process; replaced when a job times out or the process dies."""

    def __init__(self, options: RunOptions) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child, options), daemon=True)
        self.process.start()
        child.close()
        if not self.conn.poll(900):
            self.stop()
            raise RuntimeError("the fuzz worker did not start within 900 s")
        self.conn.recv()

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(30)
        self.stop()


def run_isolated(jobs: Sequence[Job], options: RunOptions, on_checks: Any = None) -> list[Check]:
    """Run jobs in a worker process, with timeouts; returns every check.

    The compile step of a job must finish within ``options.compile_timeout``
    and the whole job within ``options.job_timeout``; otherwise the job gets a
    ``timeout`` check and the worker is replaced.  A worker that dies gets a
    ``crash`` check.  ``on_checks(list[Check])`` sees checks as they arrive.
    """
    results: list[Check] = []
    worker: _Worker | None = None

    def emit(checks: list[Check]) -> None:
        results.extend(checks)
        if on_checks is not None:
            on_checks(checks)

    try:
        for job in jobs:
            if worker is None:
                worker = _Worker(options)
            worker.conn.send(job)
            started = time.monotonic()
            deadline = started + options.compile_timeout
            compiled = False
            while True:
                try:
                    ready = worker.conn.poll(max(0.0, deadline - time.monotonic()))
                    message = worker.conn.recv() if ready else ("timeout", None)
                except (EOFError, OSError):
                    message = ("died", None)
                if message[0] in ("timeout", "died"):
                    phase = "generate" if compiled else "compile"
                    if message[0] == "timeout":
                        limit = options.job_timeout if compiled else options.compile_timeout
                        outcome, why = "timeout", f"{phase} did not finish within {limit:.0f} s"
                    else:
                        outcome = "crash"
                        why = f"the worker process died during {phase} (exit code {worker.process.exitcode})"
                    record = job.record
                    emit([Check(record["id"], record["category"], job.backend, phase, outcome, why,
                                time.monotonic() - started)])  # fmt: skip
                    worker.stop()
                    worker = None
                    break
                kind, payload = message
                if kind == "checks":
                    if not compiled:
                        compiled = True
                        deadline = started + options.job_timeout
                    emit([Check(**c) for c in payload])
                elif kind == "done":
                    break
    finally:
        if worker is not None:
            worker.close()
    return results


# --- summary --------------------------------------------------------------------------

_KINDS = ("compile", "example", "invalid_example", "generate")


def summarize(checks: Sequence[Check], *, title: str = "Fuzz report", preamble: str = "") -> str:
    """A markdown report: counts per backend, check kind, category and outcome; bugs and findings."""
    lines = [f"# {title}", ""]
    if preamble:
        lines += [preamble.rstrip(), ""]
    records = {c.record for c in checks}
    bugs = [c for c in checks if c.is_bug]
    lines += [
        f"{len(records)} schemas, {len(checks)} checks, **{len(bugs)} bug outcome{'s' if len(bugs) != 1 else ''}**.",
        "",
    ]
    for backend in BACKENDS:
        mine = [c for c in checks if c.backend == backend]
        if not mine:
            continue
        lines += [f"## {backend}", ""]
        for kind in _KINDS:
            of_kind = [c for c in mine if c.kind == kind]
            if not of_kind:
                continue
            outcomes = _ordered_outcomes(of_kind)
            lines += [f"### {kind} ({len(of_kind)} checks)", ""]
            lines += ["| category | " + " | ".join(outcomes) + " |", "| --- |" + " ---: |" * len(outcomes)]
            categories = sorted({c.category for c in of_kind})
            for category in categories + ["**total**"]:
                rows = of_kind if category == "**total**" else [c for c in of_kind if c.category == category]
                counts = Counter(c.outcome for c in rows)
                lines.append(f"| {category} | " + " | ".join(str(counts.get(o, 0)) for o in outcomes) + " |")
            lines.append("")
        timing = [c.seconds for c in mine if c.kind == "compile" and c.outcome == "compiled"]
        if timing:
            timing.sort()
            lines += [
                f"Compile time ({len(timing)} schemas): median {timing[len(timing) // 2]:.2f} s, "
                f"max {timing[-1]:.2f} s.",
                "",
            ]
    lines += ["## Bugs", ""]
    lines += [f"- `{c.record}` {c.backend} {c.kind}: **{c.outcome}** -- {c.detail[:400]}" for c in bugs] or ["None."]
    lines += ["", "## Findings", ""]
    lines += _findings(checks)
    return "\n".join(lines) + "\n"


def _ordered_outcomes(checks: Sequence[Check]) -> list[str]:
    counts = Counter(c.outcome for c in checks)
    return sorted(counts, key=lambda o: (o in BUG_OUTCOMES, -counts[o], o))


def _findings(checks: Sequence[Check]) -> list[str]:
    out: list[str] = []
    warnings: Counter[str] = Counter()
    for c in checks:
        if c.kind == "compile" and c.detail.startswith("warnings: "):
            warnings.update(set(c.detail[len("warnings: ") :].split(" | ")))
    if warnings:
        out += ["xgrammar compile warnings (schemas; what its grammar relaxes):", ""]
        out += [f"- {n} x {w}" for w, n in warnings.most_common()] + [""]
    groups = [
        ("unsupported", "Refused with GrammarError (first line of the message)"),
        ("timeout", "Timeouts"),
        ("rejected_stricter", "Valid examples outlines-core rejects (stricter than the schema)"),
        ("rejected_flagged", "Valid examples xgrammar rejects, as the corpus' meta flags say"),
        ("accepted_unenforced", "Invalid examples accepted: every violation is of an unenforced keyword"),
        ("stop_unenforced", "Finished outputs that violate only unenforced keywords (never claimed valid)"),
    ]
    for outcome, heading in groups:
        found = [c for c in checks if c.outcome == outcome]
        if not found:
            continue
        out += [f"{heading}: {len(found)}", ""]
        out += [f"- `{c.record}` {c.backend}: {c.detail.splitlines()[0][:300] if c.detail else ''}" for c in found[:12]]
        if len(found) > 12:
            out.append(f"- ... and {len(found) - 12} more (see the results file)")
        out.append("")
    return out or ["None."]


# --- CLI ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m grammarspec.fuzz",
        description="Fuzz grammarspec over a schema corpus: compile, grammar soundness, generation.",
    )
    parser.add_argument("--schemas", default=None, help="corpus folder or .jsonl file (default: ../shared/schemas)")
    parser.add_argument("--categories", default=None, help="comma-separated categories (default: all)")
    parser.add_argument("--per-category", type=int, default=None, help="a stratified slice: N schemas per category")
    parser.add_argument("--max-bytes", type=int, default=None, help="skip schemas larger than this (compact bytes)")
    parser.add_argument("--backends", default="xgrammar,outlines", help="comma-separated (default: both)")
    parser.add_argument("--outlines-per-category", type=int, default=None,
                        help="run outlines only on a stratified slice of N per category (it compiles slowly)")  # fmt: skip
    parser.add_argument("--outlines-max-bytes", type=int, default=None, help="outlines only on schemas up to this size")
    parser.add_argument("--generations", type=int, default=2, help="generations per schema with xgrammar (default 2)")
    parser.add_argument("--outlines-generations", type=int, default=1, help="generations per schema with outlines")
    parser.add_argument("--outlines-generate-per-category", type=int, default=None,
                        help="generate with outlines only on a stratified slice of N per category")  # fmt: skip
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile-timeout", type=float, default=180.0, help="seconds per compile (default 180)")
    parser.add_argument("--job-timeout", type=float, default=900.0, help="seconds per schema and backend")
    parser.add_argument("--threads", type=int, default=0, help="torch threads in the worker (default: torch's)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--results", default="fuzz-results.jsonl", help="every check, one JSON per line")
    parser.add_argument("--out", default="FUZZ.md", help="the markdown summary")
    parser.add_argument("--from-results", nargs="+", default=None, metavar="JSONL",
                        help="only summarise existing results files (no run); a later file's run of a schema "
                             "and backend replaces an earlier one's")  # fmt: skip
    return parser


def _jobs(args: argparse.Namespace) -> list[Job]:
    categories = args.categories.split(",") if args.categories else None
    records = load_corpus(args.schemas, categories)
    if args.per_category is not None or args.max_bytes is not None:
        records = stratified_slice(records, args.per_category or len(records), max_bytes=args.max_bytes)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        raise SystemExit(f"error: unknown backend(s) {sorted(unknown)}; choose from {', '.join(BACKENDS)}")

    def ids(per_category: int | None, max_bytes: int | None) -> set[str] | None:
        if per_category is None and max_bytes is None:
            return None
        return {r["id"] for r in stratified_slice(records, per_category or len(records), max_bytes=max_bytes)}

    outlines_ids = ids(args.outlines_per_category, args.outlines_max_bytes)
    outlines_generate = ids(args.outlines_generate_per_category, None)
    index: Counter[str] = Counter()
    jobs = []
    for backend in backends:
        for record in records:
            if backend == "outlines" and outlines_ids is not None and record["id"] not in outlines_ids:
                continue
            if backend == "xgrammar":
                count = args.generations
            else:
                count = args.outlines_generations if outlines_generate is None or record["id"] in outlines_generate else 0
            key = record["category"] + backend
            jobs.append(Job(record, backend, index[key] * max(count, 1), count))
            index[key] += 1
    return jobs


def read_results(paths: Sequence[str | os.PathLike[str]]) -> list[Check]:
    """The checks of several results files, a later file's run of a schema replacing an earlier one's.

    A schema that was run again (after a fix, or alone after a timeout) keeps
    only its latest checks for that backend: a (record, backend) pair found in
    a later file drops every check of that pair from the earlier files.
    """
    merged: dict[tuple[str, str], list[Check]] = {}
    for path in paths:
        runs: dict[tuple[str, str], list[Check]] = defaultdict(list)
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if line.strip():
                check = Check(**json.loads(line))
                runs[(check.record, check.backend)].append(check)
        merged.update(runs)
    return [check for checks in merged.values() for check in checks]


def _preamble(args: argparse.Namespace, command: str, seconds: float | None) -> str:
    import importlib.metadata as md

    versions = []
    for package in ("xgrammar", "outlines-core", "transformers", "torch", "jsonschema"):
        try:
            versions.append(f"{package} {md.version(package)}")
        except md.PackageNotFoundError:
            pass
    text = f"Command: `{command}`\n\nVersions: {', '.join(versions)}."
    if seconds is not None:
        text += f" Wall time: {seconds / 60:.1f} min on {os.cpu_count()} CPU cores."
    return text


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = "python -m grammarspec.fuzz " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.from_results:
        checks = read_results(args.from_results)
        Path(args.out).write_text(summarize(checks, preamble=_preamble(args, command, None)), encoding="utf-8")
        print(f"wrote {args.out} ({len(checks)} checks)")
        return 1 if any(c.is_bug for c in checks) else 0
    jobs = _jobs(args)
    options = RunOptions(
        model=args.model, max_new_tokens=args.max_new_tokens, seed=args.seed,
        compile_timeout=args.compile_timeout, job_timeout=args.job_timeout, threads=args.threads,
    )  # fmt: skip
    results_path = Path(args.results)
    started = time.monotonic()
    done = Counter()
    with results_path.open("w", encoding="utf-8") as sink:

        def record_checks(checks: list[Check]) -> None:
            for c in checks:
                sink.write(json.dumps(asdict(c), ensure_ascii=False) + "\n")
                if c.is_bug or c.outcome == "timeout":
                    print(f"  !! {c.record} {c.backend} {c.kind}: {c.outcome} {c.detail[:200]}", file=sys.stderr)
            sink.flush()
            if checks and checks[0].kind == "compile":
                done[checks[0].backend] += 1
                n = sum(done.values())
                print(f"[{n}/{len(jobs)} {time.monotonic() - started:.0f}s] {checks[0].record} {checks[0].backend}: "
                      f"{checks[0].outcome} ({checks[0].seconds:.1f}s)", file=sys.stderr, flush=True)  # fmt: skip

        checks = run_isolated(jobs, options, record_checks)
    report = summarize(checks, preamble=_preamble(args, command, time.monotonic() - started))
    Path(args.out).write_text(report, encoding="utf-8")
    bugs = sum(c.is_bug for c in checks)
    print(f"wrote {args.out} and {results_path}: {len(checks)} checks, {bugs} bugs")
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
