"""The fuzz checks of one corpus record with one backend: compile, examples, generation.

Each check ends in one outcome (see :mod:`tools.fuzz`); :data:`BUG_OUTCOMES`
are bugs.  Pure functions of a :class:`FuzzContext` (tokenizer, model) and a
record, except that they run the backends and the model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .corpus import compact, fuzz_prompt
from .enforced import is_enforced

__all__ = [
    "BUG_OUTCOMES",
    "Check",
    "GenConfig",
    "GENERATION_CONFIGS",
    "configs_for",
    "FuzzContext",
    "schema_errors",
    "compile_check",
    "grammar_checks",
    "walk",
    "generation_checks",
    "classify_completion",
    "fuzz_record",
]

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
    def create(cls, tokenizer: Any, model: Any = None) -> FuzzContext:
        """Logits width and stop tokens as :func:`grammarspec.generate` derives them."""
        vocab = None
        stops: tuple[int, ...] = ()
        if model is not None:
            from grammarspec.engine.decoding import logits_width

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
    text = compact(value)
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
    from grammarspec.completion import complete

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
