"""Per-request settings are row settings: one batch mixes greedy and sampled rows, budgets and stop strings.

Rows are built by :func:`grammarspec.engine.row_requests.row_request`, the one
function ``grammarspec.generate`` and the server build rows with.  A greedy
row's output equals the row alone; a sampled row follows its exact
constrained distribution (Pearson's chi-square, tests/helpers.py's harness);
no draft reaches past a row's remaining tokens.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from grammars import compile_grammar, grammar_spec
from grammarspec.engine.decoding import DecodeConfig, decode_batch
from grammarspec.engine.row_requests import row_request
from grammarspec.engine.sampling import SamplingParams
from grammarspec.engine.stopping import before_stop
from grammarspec.settings import resolve_config
from proposers.base import Draft, GrammarView, Request
from tests.helpers import PROMPT, SCHEMA, TARGET, assert_matches, exact_distribution, legal_walk, single_thread
from tests.toy import toy_tokenizer, toy_vocab_size

V = toy_vocab_size()
MODEL = TARGET
SAMPLES = 2000


class BudgetProbe:
    """Drafts ``k`` tokens every step (the highest legal non-stop ids) and records each ``k`` it is asked for."""

    name = "probe"

    def __init__(self, asked: list[tuple[int, int]]) -> None:
        self.asked, self.prompt = asked, 0

    def start(self, request: Request) -> None:
        self.prompt = len(request.prompt_ids)

    def propose(self, context, grammar: GrammarView | None, k: int) -> Draft:
        self.asked.append((len(context) - self.prompt, k))
        tokens = [5] * k if grammar is None else legal_walk(grammar, k, lambda allowed: allowed[-1])
        return Draft(tokens=tuple(tokens), sources=(self.name,) * len(tokens))

    def commit(self, draft: Draft, num_accepted: int, committed) -> None:
        pass


def _row(temperature: float, max_new: int, *, stop=(), compiled=None, asked=None, tokenizer=None):
    overrides = {"do_sample": temperature > 0, "max_new_tokens": max_new, "top_k": 0}
    if temperature > 0:
        overrides["temperature"] = temperature
    config, _, _ = resolve_config(MODEL, None, overrides)
    proposer = BudgetProbe(asked) if asked is not None else None
    return row_request(
        MODEL,
        PROMPT,
        config,
        max_new_tokens=max_new,
        eos=(0,),
        stop_strings=stop,
        compiled=compiled,
        tokenizer=tokenizer,
        assistant=proposer,
        max_draft_tokens=6,
        adaptive=False,
    )


one_thread = pytest.fixture(autouse=True)(single_thread)  # one torch thread per test: helpers.single_thread says why


def test_a_mixed_batch_gives_each_greedy_row_its_output_alone_and_drafts_fit_each_budget():
    tok = toy_tokenizer()
    config = DecodeConfig(max_new_tokens=99)  # no EOS: rows end by their own budget or stop string
    asked: list[tuple[int, int]] = []
    plain = decode_batch(MODEL, [_row(0.0, 12, tokenizer=tok)], config, tokenizer=tok)[0].generated
    stop = tok.decode(plain[5:7])
    specs = [  # (temperature, max_new_tokens, stop strings)
        (0.0, 7, ()),
        (0.7, 12, ()),
        (0.0, 12, (stop,)),
        (1.2, 5, ()),
        (0.0, 10, ()),
    ]

    def rows(probe: list | None) -> list:
        return [_row(t, n, stop=s, asked=probe, tokenizer=tok) for t, n, s in specs]

    batch = decode_batch(MODEL, rows(asked), config, tokenizer=tok, generator=torch.Generator().manual_seed(0))
    for i, (temperature, max_new, stops) in enumerate(specs):
        row = batch[i]
        if stops:
            assert row.finish_reason == "stop_string"
            assert row.generated == plain[: len(row.generated)] and len(row.generated) <= 7
            text = tok.decode(row.generated)
            assert before_stop(text, stops)[1] and not before_stop(tok.decode(row.generated[:-1]), stops)[1]
        else:
            assert row.finish_reason == "length" and len(row.generated) == max_new
        if temperature == 0:
            alone = decode_batch(
                MODEL, [_row(0.0, max_new, stop=stops, asked=[], tokenizer=tok)], config, tokenizer=tok
            )[0]
            assert row.generated == alone.generated, f"row {i}"
    assert any(k > 1 for _, k in asked), "the rows drafted"


def test_each_row_of_a_mixed_batch_is_asked_for_no_more_than_its_remaining_tokens():
    tok = toy_tokenizer()
    config = DecodeConfig(max_new_tokens=99)
    probes: list[list[tuple[int, int]]] = [[], [], []]
    budgets = [3, 8, 13]
    rows = [_row(t, n, asked=probe, tokenizer=tok) for t, n, probe in zip((0.0, 0.7, 1.2), budgets, probes)]
    out = decode_batch(MODEL, rows, config, tokenizer=tok, generator=torch.Generator().manual_seed(1))
    for budget, probe, row in zip(budgets, probes, out):
        assert len(row.generated) == budget
        assert all(generated + k + 1 <= budget for generated, k in probe), (budget, probe)
        assert all(k == min(6, budget - generated - 1) for generated, k in probe), (budget, probe)


def test_sampled_rows_of_a_mixed_batch_follow_their_exact_distributions():
    tok = toy_tokenizer()
    compiled = compile_grammar(grammar_spec(schema=SCHEMA), tok, vocab_size=V, stop_token_ids=(0,))
    config = DecodeConfig(max_new_tokens=99, eos_token_ids=(0,))
    generator = torch.Generator().manual_seed(33)
    counts = {0.7: Counter(), 1.2: Counter()}
    greedy_alone = decode_batch(MODEL, [_row(0.0, 20, compiled=compiled, tokenizer=tok)], config)[0].generated
    for _ in range(SAMPLES):
        rows = [
            _row(0.0, 20, compiled=compiled, asked=[]),
            _row(0.7, 20, compiled=compiled, asked=[]),
            _row(0.0, 2, compiled=compiled),
            _row(1.2, 20, compiled=compiled, asked=[]),
        ]
        out = decode_batch(MODEL, rows, config, generator=generator)
        assert out[0].generated == greedy_alone
        assert out[2].generated == greedy_alone[:2] and out[2].finish_reason == "length"
        counts[0.7][tuple(out[1].generated)] += 1
        counts[1.2][tuple(out[3].generated)] += 1
    for temperature, seen in counts.items():
        exact = exact_distribution(MODEL, compiled, SamplingParams(True, temperature))
        assert len(exact) > 5
        assert_matches(seen, exact, SAMPLES, label=f"T={temperature}: ")


def test_a_greedy_row_beside_sampled_rows_is_detected_if_it_samples(monkeypatch):
    """Sanity of the method: treat every row as sampled and the greedy rows stop matching their output alone."""
    import grammarspec.engine.step as step

    tok = toy_tokenizer()
    config = DecodeConfig(max_new_tokens=99)
    alone = decode_batch(MODEL, [_row(0.0, 12, tokenizer=tok)], config)[0].generated
    monkeypatch.setattr(step, "_greedy_rows", lambda active, steps: False)
    generator = torch.Generator().manual_seed(0)
    differs = 0
    for _ in range(5):
        out = decode_batch(MODEL, [_row(0.0, 12), _row(1.2, 12)], config, generator=generator)
        differs += out[0].generated != alone
    assert differs > 0
