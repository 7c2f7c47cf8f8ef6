"""The commit path (:func:`grammarspec.engine.commit.commit`): what a step commits moves every part together.

One row over a tiny random Llama and a real batch cache, stepped by hand as
:func:`grammarspec.engine.step.run_step` steps it: forward the pending tokens
and the draft, then commit the accepted path and the target's token.  After
each commit the row's tokens, its matcher's history, what its proposer heard,
its ``cached`` count and its columns of the cache agree; a rejected draft
leaves no trace in any of them, and a row whose commit fails moves none.
"""

from __future__ import annotations

import time

import pytest
import torch

from grammars.base import allocate_bitmask
from grammarspec.engine.commit import commit, tell
from grammarspec.engine.decoding import DecodeConfig
from grammarspec.engine.rows import Row, RowSettings, Step, StepResources
from grammarspec.kv.batch import BatchKV
from grammarspec.policy.cost import FixedCost
from proposers.base import Draft
from proposers.tree import DraftTree
from tests.proposer_fakes import RuleMatcher, fixed
from tests.toy_models import tiny_llama

V = 64
PROMPT = [5, 6, 7]
ILLEGAL = 13  # the grammar never allows it


@pytest.fixture(autouse=True)
def _inference_mode():
    """As the loop runs (``decode_batch`` is under inference mode): the cache is made and written there."""
    with torch.inference_mode():
        yield


def _setup(max_new_tokens: int = 20):
    model = tiny_llama(V, seed=1)
    matcher = RuleMatcher(lambda history, token: token != ILLEGAL, vocab_size=V)
    proposer = fixed("scripted", [])
    row = Row(0, list(PROMPT), len(PROMPT), matcher, proposer, None, lambda s, p: s, RowSettings(max_new_tokens))
    kv = BatchKV(model, 1, columns=64)
    kv.packed = False
    shared = StepResources(
        DecodeConfig(max_new_tokens=max_new_tokens, eos_token_ids=(0,)),
        None,
        None,
        frozenset({0}),
        allocate_bitmask(8, V),
        time.perf_counter(),
        None,
        FixedCost(),
        None,
        None,
    )
    return model, row, kv, shared


def _chain(tokens: list[int]) -> Step:
    draft = Draft(tuple(tokens), sources=("scripted",) * len(tokens))
    tree = DraftTree(draft.tokens, tuple(range(-1, len(tokens) - 1)), draft.sources, draft.kind)
    return Step(draft=draft, offered=draft, tree=tree)


def _step(row: Row, kv: BatchKV, shared: StepResources, step: Step, path: list[int], token: int | None) -> int:
    """One step of the row: the forward over its pending tokens and draft, then the commit."""
    tell(row)  # as the step does before the proposer drafts
    kv.forward([row.pending + list(step.tree.tokens)], [step.tree.parents])
    (count,) = commit([row], [step], [(path, token)], kv, shared)
    return count


def _assert_together(model: torch.nn.Module, row: Row, kv: BatchKV) -> None:
    """Tokens, matcher, cached count and cache columns describe the same committed tokens."""
    assert row.matcher is not None
    assert row.matcher.history == row.generated
    assert kv.lengths == [row.cached]
    assert row.pending == row.tokens[row.cached :]
    # the cached columns are exactly the committed tokens': the next logits equal a fresh pass over them all
    got = kv.forward([row.pending], [()])[-1]
    kv.keep([[]])  # keep none of the probe's columns: the cache stays as the commit left it
    want = model(torch.tensor([row.tokens])).logits[0, -1].float()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_step_commits_its_accepted_tokens_everywhere_at_once():
    model, row, kv, shared = _setup()
    assert _step(row, kv, shared, Step(), [], 9) == 1  # the prompt's pass and the target's first token
    assert row.tokens == PROMPT + [9] and row.cached == len(PROMPT)
    assert row.untold == [9]  # no draft of its own: the proposer hears it before it next drafts
    _assert_together(model, row, kv)

    assert _step(row, kv, shared, _chain([10, 11, 12]), [0, 1], 20) == 3  # two of three accepted, then 20
    assert row.generated == [9, 10, 11, 20]
    assert row.cached == len(row.tokens) - 1  # 20 is pending: the next pass feeds it
    assert row.proposer.commits == [((), 0, (9,)), ((10, 11, 12), 2, (10, 11, 20))]
    assert row.untold == []
    _assert_together(model, row, kv)


def test_a_rejected_draft_rolls_back_everywhere_at_once():
    model, row, kv, shared = _setup()
    _step(row, kv, shared, Step(), [], 9)
    before = row.cached
    assert _step(row, kv, shared, _chain([30, 31, 32]), [], 40) == 1  # every draft token rejected
    assert row.generated == [9, 40]
    assert row.cached == before + 1  # the pending 9 only: the draft's three columns are gone
    assert row.proposer.commits[-1] == ((30, 31, 32), 0, (40,))
    _assert_together(model, row, kv)


def test_a_stop_inside_the_path_ends_the_row_there():
    model, row, kv, shared = _setup()
    _step(row, kv, shared, Step(), [], 9)
    _step(row, kv, shared, _chain([50, 0]), [0, 1], None)  # the grammar's stop token inside the accepted path
    assert row.generated == [9, 50, 0] and row.finish_reason == "stop"
    assert row.matcher is not None and row.matcher.is_terminated()
    assert kv.lengths == [row.cached] and row.cached == len(row.tokens)


def test_a_commit_that_fails_moves_nothing():
    """A token its grammar refuses: the row fails alone; its tokens, matcher, proposer and cache stay put."""
    model, row, kv, shared = _setup()
    _step(row, kv, shared, Step(), [], 9)
    tell(row)
    tokens, cached, heard = list(row.tokens), row.cached, list(row.proposer.commits)
    assert _step(row, kv, shared, _chain([ILLEGAL]), [0], 22) == 0
    assert row.finish_reason == "error" and row.failure is not None
    assert row.tokens == tokens and row.cached == cached == kv.lengths[0]
    assert row.matcher is not None and row.matcher.history == row.generated
    assert row.proposer.commits == heard


def test_a_forced_token_commits_without_a_pass_and_a_prompt_chunk_keeps_its_columns():
    model, row, kv, shared = _setup()
    kv.forward([PROMPT[:2]], [()])
    assert commit([row], [Step()], [([], None)], kv, shared, fed=[2]) == [0]  # a chunk of the prompt: kept
    assert row.cached == 2 == kv.lengths[0] and row.tokens == PROMPT
    assert commit([row], [Step()], [([], 9)], None, shared) == [1]  # a forced token: no pass, nothing cached
    assert row.tokens == PROMPT + [9] and row.cached == 2 == kv.lengths[0]
    assert row.matcher is not None and row.matcher.history == [9]
    _assert_together(model, row, kv)
