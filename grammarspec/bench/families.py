"""``grammarspec bench --tokenizers DIR``: how well the drafters predict each tokenizer family's split.

Drafting turns text into tokens (jump-forward's forced text, schema keys and
values, prompt spans); a draft is only worth its verification when it is the
split the target itself would write.  This benchmark measures that alone,
independent of what any model has learned: the target is a 1-layer random
Llama with the family's vocabulary whose logits put all mass on the
*canonical* next token of prompt + reference answer, by absolute position
(:class:`ScriptedLlama`).  The reference answer has its keys in schema order,
is compact JSON and is tokenized as a continuation of the prompt.  Greedy
constrained decoding then follows the script wherever the grammar allows it,
and tokens per target pass count how often ``assistant="auto"`` predicted the
family's canonical split.  Every figure is a count: the same on any machine
and under any load.

The vocabularies are llama.cpp's vocabulary-only GGUF files
(``ggml-vocab-*.gguf``, see ``data/tokenizers/README.md``); transformers
converts each once (seconds) into ``$XDG_CACHE_HOME/grammarspec/tokenizers``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaForCausalLM

from grammarspec.bench.arms import generate_one
from grammarspec.bench.tasks import BenchTask
from grammarspec.bench.tiny_llama import tiny_llama_config

__all__ = [
    "FamilyResult",
    "ScriptedLlama",
    "canonical_answer",
    "family_files",
    "load_family_tokenizer",
    "run_family",
    "schema_ordered",
    "to_markdown",
]

#: Logit of the scripted token (every other token has 0): a one-hot distribution in float32.
SCRIPT_LOGIT = 60.0


def family_files(folder: str | Path) -> list[Path]:
    """The ``*.gguf`` files in ``folder``, sorted by name (``ValueError`` naming the folder when none)."""
    path = Path(folder)
    files = sorted(path.glob("*.gguf")) if path.is_dir() else [path] if path.suffix == ".gguf" else []
    if not files:
        raise ValueError(
            f"--tokenizers {folder}: no *.gguf vocabulary files there (point it at a folder of vocabulary-only GGUFs)"
        )
    return files


def _cache_dir(gguf: Path) -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "grammarspec" / "tokenizers"
    digest = hashlib.sha256(f"{gguf.resolve()}:{gguf.stat().st_size}:{gguf.stat().st_mtime_ns}".encode()).hexdigest()
    return root / f"{gguf.stem}-{digest[:12]}"


def load_family_tokenizer(gguf: str | Path) -> Any:
    """The transformers tokenizer of a vocabulary-only GGUF file (converted once, then read from the cache)."""
    from transformers import AutoTokenizer

    gguf = Path(gguf)
    cached = _cache_dir(gguf)
    if (cached / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(cached)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    try:
        tokenizer.save_pretrained(cached)
    except OSError:  # a read-only cache: convert again next time
        pass
    return tokenizer


class ScriptedLlama(LlamaForCausalLM):
    """A random Llama whose next-token logits are one-hot on ``script[position + 1]`` (EOS past its end).

    The real model runs (its cache, masks and positions are the decoding
    loop's own); only its output logits are replaced.  The position of each
    kept logit row is its ``position_ids`` entry when the loop passes them
    (padded rows, draft trees), else the cache length plus its offset.
    """

    script: list[int]

    @classmethod
    def tiny(cls, vocab_size: int, eos_token_id: int, seed: int = 0) -> ScriptedLlama:
        config = tiny_llama_config(vocab_size, eos_token_id=eos_token_id, pad_token_id=eos_token_id)
        torch.manual_seed(seed)
        model = cls(config).eval()
        model.script = []
        return model

    def forward(
        self, input_ids: Any = None, cache: Any = None, position_ids: Any = None, logits_to_keep: Any = 0, **kwargs: Any
    ) -> Any:
        past = cache.get_seq_length() if cache is not None else 0
        out = super().forward(
            input_ids=input_ids, cache=cache, position_ids=position_ids, logits_to_keep=logits_to_keep, **kwargs
        )
        batch, n = input_ids.shape
        if position_ids is None:
            positions = past + torch.arange(n, device=input_ids.device).expand(batch, n)
        else:
            positions = position_ids.expand(batch, n)
        if isinstance(logits_to_keep, torch.Tensor) and logits_to_keep.dtype == torch.bool:
            kept = positions[logits_to_keep]
        else:
            keep = int(logits_to_keep)
            kept = positions[:, -keep:] if keep else positions
        kept = kept.reshape(out.logits.shape[:-1])
        eos = self.config.eos_token_id
        script = torch.tensor(self.script + [eos if isinstance(eos, int) else 0], device=kept.device)
        wanted = script[(kept + 1).clamp(max=len(self.script))]  # the logits at position p predict token p + 1
        logits = torch.zeros_like(out.logits)
        logits.scatter_(-1, wanted.unsqueeze(-1), SCRIPT_LOGIT)
        out.logits = logits
        return out


def schema_ordered(value: Any, schema: Any, root: Any = None) -> Any:
    """``value`` with every object's keys in its schema's ``properties`` order (others after, as they were).

    Follows local ``$ref``s (``#/...``), ``items`` and the first of
    ``anyOf``/``oneOf``/``allOf`` that lists the object's keys.  Pure.
    """
    root = schema if root is None else root
    schema = _resolve(schema, root)
    if isinstance(value, dict):
        properties: dict[str, Any] = {}
        for part in [schema] + [_resolve(s, root) for k in ("allOf", "anyOf", "oneOf") for s in schema.get(k, [])]:
            if isinstance(part, dict) and isinstance(part.get("properties"), dict):
                if not properties or set(value) <= set(part["properties"]):
                    properties = {**properties, **part["properties"]} if part is not schema else part["properties"]
        keys = [k for k in properties if k in value] + [k for k in value if k not in properties]
        return {k: schema_ordered(value[k], properties.get(k, {}), root) for k in keys}
    if isinstance(value, list):
        items = schema.get("items", {}) if isinstance(schema, dict) else {}
        return [schema_ordered(v, items, root) for v in value]
    return value


def _resolve(schema: Any, root: Any) -> dict[str, Any]:
    seen = 0
    while (
        isinstance(schema, dict)
        and isinstance(schema.get("$ref"), str)
        and schema["$ref"].startswith("#")
        and seen < 32
    ):
        node: Any = root
        for part in schema["$ref"][1:].split("/")[1:]:
            node = node.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(node, dict) else {}
        schema, seen = node, seen + 1
    return schema if isinstance(schema, dict) else {}


def canonical_answer(task: BenchTask) -> str | None:
    """The task's reference as compact JSON with keys in schema order (``None`` without a reference)."""
    if task.reference is None:
        return None
    return json.dumps(schema_ordered(task.reference, task.schema), separators=(",", ":"), ensure_ascii=False)


@dataclass
class FamilyResult:
    """One vocabulary's counts over the tasks."""

    name: str
    vocab: int
    tasks: int = 0
    new_tokens: int = 0
    target_passes: int = 0
    forced: int = 0
    followed: int = 0  # tasks whose output is the scripted answer
    proposed: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)  # per task: id, new tokens, passes, followed

    @property
    def tokens_per_pass(self) -> float:
        return self.new_tokens / self.target_passes if self.target_passes else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "tokens_per_pass": round(self.tokens_per_pass, 3)}


def run_family(name: str, tokenizer: Any, tasks: Sequence[BenchTask], *, assistant: str = "auto") -> FamilyResult:
    """Run every task with a reference against the scripted canonical target of ``tokenizer``."""
    import grammarspec
    from proposers.text import continuation_tokens

    eos = int(tokenizer.eos_token_id)
    vocab = max(len(tokenizer), int(getattr(tokenizer, "vocab_size", 0) or 0))
    model = ScriptedLlama.tiny(vocab, eos)
    result = FamilyResult(name=name, vocab=vocab)
    for task in tasks:
        answer = canonical_answer(task)
        if answer is None:
            result.skipped.append(f"{task.id}: no reference answer")
            continue
        prompt = grammarspec.build_prompt(
            tokenizer,
            task.prompt,
            system=task.system,
            schema=task.schema if task.describe_schema else None,
            tools=task.tools,
        )
        scripted = continuation_tokens(tokenizer, prompt, answer, lookback=16)
        if not scripted:
            result.skipped.append(f"{task.id}: the tokenizer cannot spell the reference answer")
            continue
        model.script = list(prompt) + scripted
        tokens, stats, _ = generate_one(
            model, tokenizer, list(prompt), task.schema, assistant, max_new_tokens=len(scripted) + 8
        )
        result.tasks += 1
        result.new_tokens += stats.new_tokens
        result.target_passes += stats.target_forwards
        result.forced += stats.forced_tokens
        followed = [t for t in tokens if t != eos] == scripted
        result.followed += int(followed)
        result.runs.append(
            {"task": task.id, "new_tokens": stats.new_tokens, "passes": stats.target_forwards, "followed": followed}
        )
        for source, count in stats.proposed.items():
            result.proposed[source] = result.proposed.get(source, 0) + count
            result.accepted[source] = result.accepted.get(source, 0) + stats.accepted.get(source, 0)
    return result


def to_markdown(results: Sequence[FamilyResult], reference: str | None = None) -> str:
    """The family table (tokens per pass, against ``reference``'s) and the per-drafter counts."""
    base = next((r for r in results if r.name == reference), results[0] if results else None)
    sources = sorted({s for r in results for s in r.proposed})
    lines = [
        "| tokenizer | vocab | tasks | followed | new tokens | target passes | tokens / pass | vs "
        + (base.name if base else "-")
        + " | grammar-forced | "
        + " | ".join(f"{s} proposed / accepted" for s in sources)
        + " |",
        "|---|---|---|---|---|---|---|---|---|" + "---|" * len(sources),
    ]
    for r in results:
        ratio = r.tokens_per_pass / base.tokens_per_pass if base and base.tokens_per_pass else 0.0
        counts = " | ".join(f"{r.proposed.get(s, 0):,} / {r.accepted.get(s, 0):,}" for s in sources)
        lines.append(
            f"| {r.name} | {r.vocab:,} | {r.tasks} | {r.followed} | {r.new_tokens:,} | {r.target_passes:,} | "
            f"{r.tokens_per_pass:.2f} | {ratio:.2f} | {r.forced:,} | {counts} |"
        )
    skipped = [f"- {r.name}: {s}" for r in results for s in r.skipped]
    return "\n".join(lines + ([""] + ["Skipped:"] + skipped if skipped else []))
