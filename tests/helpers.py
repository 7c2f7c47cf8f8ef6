"""Shared test helpers: the chi-square exactness harness and the scripted drafters the exactness tests use.

The harness enumerates every token sequence a small JSON grammar allows with
its exact probability under plain constrained sampling (mask -> temperature
-> top-k -> top-p, the shared pipeline), then compares sampled counts with it
by Pearson's chi-square (bins with expected count < 5 pooled) at p > 1e-4.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import grammarspec
from grammars.base import allocate_bitmask
from grammarspec.engine.decoding import RowRequest, sampling_processing
from grammarspec.engine.processing import LogitsPipeline
from grammarspec.engine.sampling import apply_bitmask
from grammarspec.policy.adaptive import AdaptiveController
from proposers.base import Draft, GrammarView, Request
from proposers.tree import DraftTree
from tests.scipy_free_stats import chi_square_pvalue
from tests.toy import toy_vocab_size
from tests.toy_models import ToyCausalLM

V = toy_vocab_size()
SCHEMA = {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2}
PROMPT = [2, 3]  # "{" "}" -- any prefix will do for a random model
P_THRESHOLD = 1e-4
#: The target of the exactness tests (its logits hash the whole visible context, so a leak would show) and another.
TARGET = ToyCausalLM(V, seed=1, scale=1.0)
OTHER = ToyCausalLM(V, seed=7, scale=1.0)


def exact_distribution(
    model, compiled, params=None, prompt=PROMPT, pipeline=None, tolerance: float = 1e-6
) -> dict[tuple[int, ...], float]:
    """Every complete sequence -> its probability under plain constrained sampling (``params`` or ``pipeline``)."""
    out: dict[tuple[int, ...], float] = {}
    vocab = compiled.vocab_size
    pipeline = pipeline if pipeline is not None else LogitsPipeline.from_sampling(params)

    def walk(context, matcher, prob):
        if matcher.is_terminated():
            out[tuple(context[len(prompt) :])] = prob
            return
        mask = allocate_bitmask(1, vocab)
        matcher.fill_mask(mask, 0)
        probs = pipeline(apply_bitmask(model.next_logits(context)[None], mask), [context]).softmax(-1)[0]
        for token in probs.nonzero().flatten().tolist():
            child = matcher.fork()
            assert child.accept(token)
            walk(context + [token], child, prob * float(probs[token]))

    walk(list(prompt), compiled.matcher(), 1.0)
    assert abs(sum(out.values()) - 1.0) < tolerance
    return out


def assert_matches(counts, exact, samples: int, label: str = "") -> None:
    """``counts`` (sequence -> samples) follow ``exact``: no sequence outside it, and chi-square p > 1e-4."""
    unknown = [key for key in counts if key not in exact]
    assert not unknown, f"{label}sequences the grammar/target never produce: {unknown[:3]}"
    keys = sorted(set(exact) | set(counts))
    observed = torch.tensor([counts.get(key, 0) for key in keys], dtype=torch.float64)
    expected = torch.tensor([exact.get(key, 0.0) * samples for key in keys], dtype=torch.float64)
    p = chi_square_pvalue(observed, expected)
    assert p > P_THRESHOLD, f"{label}chi-square p = {p:.2e} over {len(keys)} sequences"


def legal_walk(grammar: GrammarView, k: int, pick: Callable[[list[int]], int]) -> list[int]:
    """Up to ``k`` tokens, each ``pick``ed among the legal non-stop ids (the stop token when none), on a fork."""
    matcher, out = grammar.fork(), []
    for _ in range(k):
        allowed = [t for t in matcher.allowed_tokens().tolist() if t != 0] or [0]
        token = pick(allowed)
        out.append(token)
        if not matcher.accept(token) or matcher.is_terminated():
            break
    return out


class ImprobableProposer:
    """Deterministic drafts that are legal but unlikely: the highest legal non-stop id."""

    name = "improbable"

    def start(self, request: Request) -> None:
        pass

    def propose(self, context, grammar: GrammarView | None, k: int) -> Draft:
        tokens = legal_walk(grammar, k, lambda allowed: allowed[-1])
        return Draft(tokens=tuple(tokens), sources=(self.name,) * len(tokens))

    def commit(self, draft: Draft, num_accepted: int, committed) -> None:
        pass


class BranchyTreeProposer:
    """Deterministic trees of three branches: improbable (highest legal id), probable-ish (lowest legal
    id) and random tokens (mostly illegal).  Its own RNG, never the target's."""

    name = "branchy"

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.trees: list[DraftTree] = []

    def start(self, request: Request) -> None:
        pass

    def propose_tree(self, context, grammar: GrammarView | None, k: int) -> DraftTree:
        paths = [
            legal_walk(grammar, k, lambda a: a[-1]),
            legal_walk(grammar, k, lambda a: a[0]),
            [self.rng.randrange(V) for _ in range(k)],
        ]
        tree = DraftTree.from_paths(paths, sources=[self.name] * 3)
        self.trees.append(tree)
        return tree

    def commit_tree(self, tree: DraftTree, committed) -> None:
        pass

    def propose(self, context, grammar, k) -> Draft:  # pragma: no cover - the loop asks for trees
        raise AssertionError("the loop must call propose_tree")

    def commit(self, draft: Draft, num_accepted: int, committed) -> None:
        pass


#: The batch tests' schemas, one per row (tests/conftest.py's ``grammars`` compiles them).
SCHEMAS = [
    {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2},
    {
        "type": "object",
        "properties": {"a": {"type": "array", "items": {"enum": ["x", "yy", "z"]}, "maxItems": 4}},
        "required": ["a"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"enum": ["ab", "ba", "b"]}, "minItems": 2, "maxItems": 3},
]


def batch_row(prompt, matcher, proposer, k, config) -> RowRequest:
    """A decode_batch row: ``proposer`` (if any) started on ``prompt`` and drafting exactly ``k`` tokens."""
    controller = AdaptiveController(k_min=k, k_max=k, adaptive=False) if proposer is not None else None
    if proposer is not None:
        proposer.start(Request(prompt_ids=tuple(prompt), tokenizer=None))
    return RowRequest(prompt, matcher, proposer, controller, sampling_processing(config, (), len(prompt)))


def check_rows(grammars_by_row):
    """An on_step hook asserting the rollback invariants for every row of the batch."""
    seen = []

    def on_step(rows, kv):
        assert kv.batch_size == len(rows)
        for slot, row in enumerate(rows):
            fresh = grammars_by_row[row.index].matcher()
            for token in row.generated:
                assert fresh.accept(token)
            assert row.matcher.is_terminated() == fresh.is_terminated()
            assert kv.lengths[slot] == row.cached <= len(row.tokens)
            columns = kv.valid[slot].nonzero().flatten()
            stored = kv.cache.layers[0].keys[slot, 0, columns, 0].long().tolist()
            assert stored == row.tokens[: row.cached]  # no rejected position of any row in the cache
        if seen:  # a row that had finished has left the batch
            assert not {row.index for row in rows} & seen[-1][1]
        seen.append(({row.index for row in rows}, {row.index for row in rows if row.finish_reason}))

    return on_step, seen


def single_thread():
    """One torch thread for a test (a generator for ``pytest.fixture``): tiny tensors, where OpenMP hand-offs, or a
    parallel region waiting for a busy second core, cost more than the work or blur a timed fake's curve."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


ROOT = Path(__file__).resolve().parents[1]  # the repository

#: An object the toy vocabulary spells in a few tokens: a short array of enum strings and a boolean.
OBJECT_SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "array", "items": {"enum": ["x", "yy", "z"]}, "maxItems": 3},
        "b": {"type": "boolean"},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
#: The JSON answer the server, chat and vLLM tests ask for: a trip's city and length.
TRIP_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
#: The tools the server tests offer the real model: one with a string argument, one with integers.
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]


def corpus_records(category: str | None = None) -> list[dict]:
    """Records of the schema corpus (``data/schemas`` or ``$GRAMMARSPEC_SCHEMAS``): one category or all."""
    from grammarspec.bench.tasks import read_schema_records

    return read_schema_records(categories=[category] if category else None)


def load_tool(name: str):
    """The script ``tools/<name>.py`` imported as a module (registered, so its dataclasses resolve)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def generate_one(model, tok, prompt, **kwargs):
    """``grammarspec.generate`` of one row with statistics: (new token ids, their text, the row's stats)."""
    kwargs.setdefault("max_new_tokens", 40)
    out = grammarspec.generate(model, prompt, tokenizer=tok, return_dict_in_generate=True, **kwargs)
    new = out.sequences[0, prompt.shape[1] :].tolist()[: out.stats[0].new_tokens]
    return new, tok.decode(new, skip_special_tokens=True), out.stats[0]
