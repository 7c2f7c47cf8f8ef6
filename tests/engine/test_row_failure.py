"""One request's failure is its own: a row whose grammar matcher or drafter raises ends alone.

A fault is planted in one row of four (its matcher or its proposer raises at
its n-th call): that row ends with ``finish_reason="error"`` and its cause,
every other row decodes exactly as it does alone (greedy), the batch cache
keeps only committed tokens throughout; ``generate`` then raises
``GenerationError`` carrying every row's result, and a ``Conversation`` turn
leaves the conversation as it was.
"""

from __future__ import annotations

import pytest
import torch

import grammarspec
from grammarspec import GenerationError
from grammarspec.engine.decoding import DecodeConfig, RowRequest, decode, decode_batch, sampling_processing
from grammarspec.policy.adaptive import AdaptiveController
from proposers.base import Request
from tests.helpers import check_rows
from tests.proposer_fakes import ScriptFollower
from tests.toy import toy_vocab_size
from tests.toy_models import ToyCausalLM

V = toy_vocab_size()
PROMPTS = [[2, 3], [2, 5, 9, 4, 7], [6], [4, 4, 2]]
FAULTY = 2  # the row that fails (its answer is one of the shorter: the others go on after it)


class Boom(RuntimeError):
    """The planted fault."""


class Faulty:
    """``inner`` (a matcher or a proposer) whose ``method`` raises :class:`Boom` at its ``at``-th call."""

    def __init__(self, inner, method: str, at: int) -> None:
        self.inner, self.method, self.at, self.count = inner, method, at, 0

    def __getattr__(self, name):
        attribute = getattr(self.inner, name)
        if name != self.method:
            return attribute

        def counted(*args, **kwargs):
            self.count += 1
            if self.count == self.at:
                raise Boom(f"planted fault in {self.method}, call {self.at}")
            return attribute(*args, **kwargs)

        return counted


def _row(prompt, grammar, script, config, fault=None):
    matcher, proposer = grammar.matcher(), ScriptFollower(script, 2)  # a wrong draft every second call
    if fault in ("accept", "fill_mask"):
        matcher = Faulty(matcher, fault, 3)
    if fault in ("propose", "commit"):
        proposer = Faulty(proposer, fault, 3)
    proposer.start(Request(prompt_ids=tuple(prompt), tokenizer=None))
    controller = AdaptiveController(k_min=1, k_max=1, adaptive=False)
    return RowRequest(prompt, matcher, proposer, controller, sampling_processing(config, (), len(prompt)))


@pytest.mark.parametrize("fault", ["accept", "fill_mask", "propose", "commit"])
def test_a_row_that_raises_ends_alone_and_the_others_decode_as_alone(grammars, fault):
    model = ToyCausalLM(V, seed=3)
    config = DecodeConfig(max_new_tokens=40, eos_token_ids=(0,))
    by_row = [grammars[2], grammars[1], grammars[0], grammars[2]]
    alone = [decode(model, p, config, matcher=g.matcher())[0] for p, g in zip(PROMPTS, by_row)]
    requests = [
        _row(p, g, out, config, fault if i == FAULTY else None)
        for i, (p, g, out) in enumerate(zip(PROMPTS, by_row, alone))
    ]
    on_step, seen = check_rows(by_row)  # every row's cache columns hold exactly its committed tokens, every step
    rows = decode_batch(model, requests, config, on_step=on_step)
    failed = rows[FAULTY]
    assert failed.finish_reason == failed.stats.finish_reason == "error"
    assert isinstance(failed.failure.error, Boom) and f"planted fault in {fault}" in str(failed.failure)
    assert failed.generated == alone[FAULTY][: len(failed.generated)]  # what it committed before, nothing else
    assert len(failed.generated) < len(alone[FAULTY])
    assert [row.generated for i, row in enumerate(rows) if i != FAULTY] == alone[:FAULTY] + alone[FAULTY + 1 :]
    assert all(row.finish_reason == "stop" and row.failure is None for i, row in enumerate(rows) if i != FAULTY)
    assert any(FAULTY not in indices for indices, _ in seen[1:])  # it left; the others went on without it


def test_decode_of_one_failing_row_raises_with_what_it_committed(grammars):
    model = ToyCausalLM(V, seed=3)
    config = DecodeConfig(max_new_tokens=40, eos_token_ids=(0,))
    alone = decode(model, PROMPTS[0], config, matcher=grammars[0].matcher())[0]
    with pytest.raises(GenerationError, match="row 0 of 1: committing its tokens raised Boom") as caught:
        decode(model, PROMPTS[0], config, matcher=Faulty(grammars[0].matcher(), "accept", 3))
    generated, stats = caught.value.output
    assert generated == alone[:2] and stats.finish_reason == "error"
    assert isinstance(caught.value.__cause__, Boom)


# --- generate and Conversation with the embedded model ------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
QUESTIONS = ["Describe a cat as JSON.", "A person named Ana, 31.", "Invent a pirate.", "A robot, age 3."]


def _plant(monkeypatch, rows: set[int], at: int = 5) -> None:
    """The matchers of the ``rows``-th rows ``generate`` builds raise at their ``at``-th accept."""
    import grammarspec.api as api

    real, built = api.row_request, []

    def row_request(*args, **kwargs):
        request = real(*args, **kwargs)
        if len(built) in rows:
            request.matcher = Faulty(request.matcher, "accept", at)
        built.append(request)
        return request

    monkeypatch.setattr(api, "row_request", row_request)


def _prompts(tok):
    texts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in QUESTIONS
    ]
    return [tok(text, add_special_tokens=False)["input_ids"] for text in texts]


def test_generate_finishes_the_other_rows_then_raises_naming_the_failed_one(smol, monkeypatch):
    model, tok = smol
    prompts = _prompts(tok)
    kwargs = dict(tokenizer=tok, schema=SCHEMA, max_new_tokens=24, assistant=None)
    alone = {
        row: grammarspec.generate(model, torch.tensor([p]), **kwargs)[0, len(p) :].tolist()
        for row, p in enumerate(prompts)
        if row != FAULTY
    }
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    _plant(monkeypatch, {FAULTY})
    with pytest.raises(GenerationError) as caught:
        grammarspec.generate(model, ids, attention_mask=mask, return_dict_in_generate=True, **kwargs)
    error = caught.value
    assert set(error.failures) == {FAULTY} and isinstance(error.__cause__, Boom)
    assert f"row {FAULTY} of 4: committing its tokens raised Boom: planted fault in accept" in str(error)
    assert "results are in this error's .output" in str(error)
    out = error.output
    for row, stats in enumerate(out.stats):
        got = out.sequences[row, width : width + stats.new_tokens].tolist()
        if row == FAULTY:  # the tokens its matcher accepted before it raised
            assert stats.finish_reason == "error" and stats.valid is False and len(got) == 4
        else:
            assert got == alone[row] and stats.finish_reason == "stop" and stats.valid is True


def test_a_failed_conversation_turn_leaves_the_conversation_as_it_was(smol, monkeypatch):
    model, tok = smol
    chat = grammarspec.Conversation(model, tok, assistant=None)
    chat.add_user(QUESTIONS[1])
    _plant(monkeypatch, {0})
    with pytest.raises(GenerationError, match="row 0 of 1: committing its tokens raised Boom"):
        chat.reply(schema=SCHEMA, max_new_tokens=24)
    assert chat.messages == [{"role": "user", "content": QUESTIONS[1]}] and not chat.replies
    monkeypatch.undo()
    again = chat.reply(schema=SCHEMA, max_new_tokens=24)
    fresh = grammarspec.Conversation(model, tok, assistant=None)
    fresh.add_user(QUESTIONS[1])
    assert again.tokens == fresh.reply(schema=SCHEMA, max_new_tokens=24).tokens
    assert again.finish_reason == "stop"


# --- a row whose grammar reaches a dead end, a row whose processing raises ------------------------


class DeadEnd:
    """``inner`` (a matcher) whose every state from the ``after``-th token on allows no token (an all-zero mask):
    a backend that reached a state it cannot finish."""

    def __init__(self, inner, after: int) -> None:
        self.inner, self.after, self.depth = inner, after, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def accept(self, token):
        accepted = self.inner.accept(token)
        self.depth += bool(accepted)
        return accepted

    def rollback(self, n):
        self.inner.rollback(n)
        self.depth -= n

    def fill_mask(self, bitmask, row):
        self.inner.fill_mask(bitmask, row)
        if self.depth >= self.after:
            bitmask[row] = 0


def test_a_row_whose_grammar_allows_no_token_ends_alone(grammars):
    model = ToyCausalLM(V, seed=3)
    config = DecodeConfig(max_new_tokens=40, eos_token_ids=(0,))
    by_row = [grammars[2], grammars[1], grammars[0], grammars[2]]
    alone = [decode(model, p, config, matcher=g.matcher())[0] for p, g in zip(PROMPTS, by_row)]
    requests = [_row(p, g, out, config) for p, g, out in zip(PROMPTS, by_row, alone)]
    requests[FAULTY].matcher = DeadEnd(requests[FAULTY].matcher, 3)
    on_step, seen = check_rows(by_row)
    rows = decode_batch(model, requests, config, on_step=on_step)
    failed = rows[FAULTY]
    assert failed.finish_reason == failed.stats.finish_reason == "error"
    assert "its grammar raised NoLegalTokenError: the grammar allows no token after 3 generated tokens" in str(
        failed.failure
    )
    assert "Try another grammar_backend" in str(failed.failure)
    assert failed.generated == alone[FAULTY][:3]  # every token up to the dead end, nothing after it
    assert [row.generated for i, row in enumerate(rows) if i != FAULTY] == alone[:FAULTY] + alone[FAULTY + 1 :]
    assert all(row.finish_reason == "stop" and row.failure is None for i, row in enumerate(rows) if i != FAULTY)
    assert any(FAULTY not in indices for indices, _ in seen[1:])


def test_a_dead_end_row_does_not_move_the_other_rows_draws():
    from grammarspec.engine.rejection import choices_and_dead_ends

    scores = torch.randn(3, 50)
    dead = scores.clone()
    dead[1] = float("-inf")
    for seed in range(20):
        alive, none_dead = choices_and_dead_ends(scores, False, (), torch.Generator().manual_seed(seed))
        stuck, marked = choices_and_dead_ends(dead, False, (), torch.Generator().manual_seed(seed))
        assert (alive[0], alive[2]) == (stuck[0], stuck[2]) and marked == [False, True, False]
        assert not any(none_dead)


class RaisingProcessor:
    """A stateless logits processor that raises on every call (a user's processor with a bug)."""

    def __call__(self, input_ids, scores):
        raise ValueError("planted fault in a logits processor")


def test_a_row_whose_processing_raises_ends_alone(grammars):
    model = ToyCausalLM(V, seed=3)
    config = DecodeConfig(max_new_tokens=40, eos_token_ids=(0,))
    by_row = [grammars[2], grammars[1], grammars[0], grammars[2]]
    alone = [decode(model, p, config, matcher=g.matcher())[0] for p, g in zip(PROMPTS, by_row)]
    requests = [_row(p, g, out, config) for p, g, out in zip(PROMPTS, by_row, alone)]
    requests[FAULTY].processing = sampling_processing(config, (RaisingProcessor(),), len(PROMPTS[FAULTY]))
    rows = decode_batch(model, requests, config)
    failed = rows[FAULTY]
    assert failed.finish_reason == "error"
    assert failed.generated == alone[FAULTY][: len(failed.generated)] < alone[FAULTY]  # forced tokens only
    assert "logits processing raised ValueError: planted fault in a logits processor" in str(failed.failure)
    assert [row.generated for i, row in enumerate(rows) if i != FAULTY] == alone[:FAULTY] + alone[FAULTY + 1 :]
