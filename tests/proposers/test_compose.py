"""Jump-forward, composition and the seam between a forced span and what follows it."""

from __future__ import annotations

import pytest
import torch

import proposers.compose as compose
from grammars import compile_grammar, grammar_spec
from proposers.base import EMPTY_DRAFT, Draft, GrammarView, Request
from proposers.compose import CompositeProposer, concat_drafts
from proposers.jump_forward import JumpForwardProposer, trim_ambiguous
from proposers.text import continuation_tokens, token_text
from tests.proposer_fakes import RuleMatcher, ScriptedProposer, commit_step, fixed


def toy_request(tok, prompt=(2,)):
    return Request(prompt_ids=tuple(prompt), tokenizer=tok)


def forced_at_start(text):
    return RuleMatcher(legal=lambda history, token: token != 1, forced=lambda history: text if not history else "")


# -- pure helpers ------------------------------------------------------------------


def test_concat_gives_deterministic_positions_point_masses():
    sampled = Draft(tokens=(3, 4), probs=torch.full((2, 6), 1 / 6), sources=("m", "m"))
    joined = concat_drafts(Draft(tokens=(5,), sources=("jf",)), sampled)
    assert joined.tokens == (5, 3, 4) and joined.sources == ("jf", "m", "m")
    assert torch.equal(joined.probs[0], torch.tensor([0, 0, 0, 0, 0, 1.0]))
    assert torch.equal(joined.probs[1:], sampled.probs)
    assert concat_drafts(Draft((1,)), Draft((2,))).probs is None


# -- composition ---------------------------------------------------------------------


def test_follower_continues_after_the_forced_span(tok):
    seen = {}

    def script(context, grammar, k):
        seen["context"], seen["k"], seen["history"] = list(context), k, grammar.fork().history
        return Draft(tokens=(10, 3), sources=("follower", "follower"))

    follower = ScriptedProposer("follower", script)
    composite = CompositeProposer([JumpForwardProposer(), follower])
    composite.start(toy_request(tok))
    matcher = forced_at_start('{"a":')
    draft = composite.propose([2], GrammarView(matcher), 6)
    forced = continuation_tokens(tok, [2], '{"a":')
    assert list(draft.tokens) == forced + [10, 3]
    assert draft.sources == ("jump_forward",) * len(forced) + ("follower", "follower")
    assert seen == {"context": [2] + forced, "k": 6 - len(forced), "history": forced}
    assert matcher.history == []  # the live grammar state is untouched


def test_longest_cheap_follower_wins_and_draft_model_is_only_a_fallback(tok, monkeypatch):
    model = fixed("draft_model", [7, 8, 9, 10], probs=torch.full((4, 57), 1 / 57))
    monkeypatch.setattr(compose, "is_model_proposer", lambda p: p is model)
    short, longer = fixed("a", [4]), fixed("b", [5, 6])
    composite = CompositeProposer([short, longer, model], short=2)
    composite.start(toy_request(tok))
    view = GrammarView(RuleMatcher(legal=lambda h, t: True))
    assert composite.propose([2], view, 8).tokens == (5, 6)
    assert model.calls == []  # the cheap draft was long enough
    composite = CompositeProposer([short, model], short=2)
    draft = composite.propose([2], view, 8)
    assert draft.tokens == (7, 8, 9, 10) and draft.probs.shape == (4, 57)
    assert len(model.calls) == 1


def test_mixed_draft_has_one_hot_rows_for_forced_tokens(tok, monkeypatch):
    model = fixed("draft_model", [10, 11], probs=torch.full((2, 57), 1 / 57))
    monkeypatch.setattr(compose, "is_model_proposer", lambda p: p is model)
    composite = CompositeProposer([JumpForwardProposer(), model])
    composite.start(toy_request(tok))
    draft = composite.propose([2], GrammarView(forced_at_start('{"')), 5)
    assert draft.tokens[-2:] == (10, 11) and draft.probs.shape == (len(draft), 57)
    assert draft.probs[0].sum() == 1 and draft.probs[0, draft.tokens[0]] == 1


def test_commit_is_shared_out_over_the_parts(tok):
    follower = fixed("follower", [10, 3, 10])
    composite = CompositeProposer([JumpForwardProposer(), follower])
    composite.start(toy_request(tok))
    draft = composite.propose([2], GrammarView(forced_at_start('{"')), 8)
    forced = len(continuation_tokens(tok, [2], '{"'))
    commit_step(composite, draft, forced + 2)
    assert follower.feedbacks == [((10, 3, 10), 2)]
    composite.propose([2], GrammarView(forced_at_start('{"')), 8)
    commit_step(composite, draft.truncate(forced + 1), 0)  # the loop may cut the draft
    assert follower.feedbacks[-1] == ((10,), 0)


def test_a_follower_with_a_better_record_beats_a_longer_one(tok):
    reliable, chatty = fixed("reliable", [4, 5]), fixed("chatty", [6, 7, 8, 9, 10])
    composite = CompositeProposer([chatty, reliable])
    composite.start(toy_request(tok))
    view = GrammarView(RuleMatcher(legal=lambda h, t: True))
    k = 5  # chatty fills the budget: no other follower continues after it
    draft = composite.propose([2], view, k)
    assert set(draft.sources) == {"chatty"}  # equal records: the longest
    commit_step(composite, draft, 0)
    commit_step(composite, composite.propose([2], view, k), 0)  # two misses outweigh the extra length
    draft = composite.propose([2], view, k)
    assert draft.sources[:2] == ("reliable", "reliable")  # leads now (chatty may still continue after it)
    commit_step(composite, draft, 2)  # reliable's part accepted
    assert composite.propose([2], view, k).sources[0] == "reliable"


def test_another_follower_goes_on_where_the_chosen_draft_stops(tok):
    """A value copied by one drafter, then the next key from another: one pass covers both."""
    value, keys = fixed("value", [4, 5]), fixed("keys", [6, 7, 8])  # '[' ']' and '"' ':' ','
    composite = CompositeProposer([value, keys])
    composite.start(toy_request(tok))
    view = GrammarView(RuleMatcher(legal=lambda h, t: True))
    draft = composite.propose([2], view, 8)
    helper = token_text(tok)
    assert helper.bytes_of(draft.tokens) == b'":,[]'  # re-split as one text
    assert draft.sources[0] == "keys" and draft.sources[-1] == "value"
    assert value.calls[-1] == ([2, 6, 7, 8], 5)  # it drafted after the first part, in the budget left
    accepted = len(draft) - 1  # everything but the last ']'
    commit_step(composite, draft, accepted)
    assert keys.feedbacks[-1] == ((6, 7, 8), 3) and value.feedbacks[-1] == ((4, 5), 1)
    assert set(composite.propose([2], view, 3).sources) == {"keys"}  # no budget left: no continuation


def test_a_failing_follower_is_held_back_then_probed(tok):
    """Without a forced span, a draft expected to bring little is not verified; probes follow a backoff."""
    wrong = fixed("wrong", [6, 7, 8, 9])
    composite = CompositeProposer([wrong], min_expected=0.6)
    composite.start(toy_request(tok))
    view = GrammarView(RuleMatcher(legal=lambda h, t: True))
    verified = []
    for _step in range(40):
        draft = composite.propose([2], view, 8)
        verified.append(bool(draft))
        if draft:
            commit_step(composite, draft, 0)
    first_gap = verified.index(False)
    assert first_gap >= 3  # the prior lets it try a few times
    probes = [i for i, v in enumerate(verified) if v and i > first_gap]
    assert probes, "a held-back follower must be probed again"
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0]  # each failed probe waits longer
    # A probe that is accepted brings it back at once.
    composite.propose([2], view, 8)
    while not (draft := composite.propose([2], view, 8)):
        pass
    commit_step(composite, draft, 4)
    assert composite.propose([2], view, 8)


def test_each_kind_of_guess_keeps_its_own_record(tok):
    """A drafter's failing guesses must not hold back its reliable copies (schema_ngram: guess vs prompt)."""
    copy = Draft(tokens=(4, 5, 6), sources=("mixed",) * 3, kind="copy")
    guess = Draft(tokens=(7, 8, 9), sources=("mixed",) * 3, kind="guess")
    mixed = ScriptedProposer("mixed", lambda context, grammar, k: guess if len(context) % 2 else copy)
    composite = CompositeProposer([mixed], min_expected=0.6)
    composite.start(toy_request(tok))
    view = GrammarView(RuleMatcher(legal=lambda h, t: True))
    verified = {"copy": 0, "guess": 0}
    for step in range(30):
        context = [2] * (1 + step % 2)  # odd length: a guess; even: a copy
        draft = composite.propose(context, view, 8)
        if draft:
            verified[draft.kind] += 1
            commit_step(composite, draft, len(draft) if draft.kind == "copy" else 0)
    assert verified["copy"] == 15  # never held back by the guesses' misses
    assert verified["guess"] < 10
    assert Draft(tokens=(1, 2), kind="copy").truncate(1).kind == "copy"
    assert concat_drafts(Draft(tokens=(1,), kind="forced"), copy).kind == "forced"


def test_a_forced_span_carries_a_held_back_follower(tok):
    wrong = fixed("wrong", [10, 3])
    composite = CompositeProposer([JumpForwardProposer(), wrong], min_expected=100.0)
    composite.start(toy_request(tok))
    draft = composite.propose([2], GrammarView(forced_at_start('{"a":')), 8)
    assert draft.tokens[-2:] == (10, 3)  # the pass happens anyway: the follower rides along
    assert not composite.propose([2], GrammarView(RuleMatcher(legal=lambda h, t: True)), 8)  # alone: held back


def test_members_are_started(tok):
    a, b = fixed("a", [1]), fixed("b", [2])
    CompositeProposer([a, b]).start(toy_request(tok))
    assert a.started == b.started == 1
    with pytest.raises(ValueError):
        CompositeProposer([])


# -- jump-forward and the seam, on the real tokenizer ----------------------------------

CALLS = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "properties": {
            "a": {
                "type": "object",
                "properties": {"b": {"type": "string", "enum": ["off", "on"]}},
                "required": ["b"],
                "additionalProperties": False,
            }
        },
        "required": ["a"],
        "additionalProperties": False,
    },
}


@pytest.fixture()
def at_seam(smol_tokenizer):
    """A matcher after '[{"a":{"b":"off' -- the grammar forces '"}}' and then has a choice."""
    tok = smol_tokenizer
    prompt = list(tok.encode("Turn it off, then on.", add_special_tokens=False))
    generated = list(tok.encode('[{"a":{"b":"off', add_special_tokens=False))
    matcher = compile_grammar(grammar_spec(schema=CALLS), tok).matcher()
    assert all(matcher.accept(t) for t in generated)
    assert matcher.forced_text() == '"}}'
    return tok, prompt + generated, matcher


def test_jump_forward_proposes_forced_text_in_canonical_tokens(smol_tokenizer):
    tok = smol_tokenizer
    matcher = compile_grammar(grammar_spec(schema=CALLS), tok).matcher()
    jf = JumpForwardProposer()
    jf.start(Request(prompt_ids=(1,), tokenizer=tok))
    draft = jf.propose([1], GrammarView(matcher), 16)
    assert tok.decode(list(draft.tokens)) == '[{"a":{"b":"'
    assert draft.probs is None and set(draft.sources) == {"jump_forward"}
    assert jf.propose([1], GrammarView(matcher), 2).tokens == draft.tokens[:2]
    assert not jf.propose([1], None, 16)


def test_jump_forward_drops_a_last_token_that_would_resplit(at_seam):
    tok, context, matcher = at_seam
    jf = JumpForwardProposer()
    jf.start(Request(prompt_ids=(1,), tokenizer=tok))
    view = GrammarView(matcher)
    whole = jf.forced(context, view, 16)
    assert tok.decode(list(whole.tokens)) == '"}}'
    # '"}},' is split '"}' '},': the '"}}' token would be rejected by the target.
    assert trim_ambiguous(tok, context, '"}}', whole.tokens, view) == len(whole) - 1
    assert jf.propose(context, view, 16).tokens == whole.tokens[:-1]


def test_jump_forward_keeps_a_last_token_nothing_can_extend(smol_tokenizer):
    tok = smol_tokenizer
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    matcher = compile_grammar(grammar_spec(schema=schema), tok).matcher()
    jf = JumpForwardProposer()
    jf.start(Request(prompt_ids=(1,), tokenizer=tok))
    draft = jf.propose([1], GrammarView(matcher), 16)
    assert tok.decode(list(draft.tokens)) == '{"n":'  # digits are single tokens: '":' cannot merge with them


def test_composite_resplits_the_seam_and_credits_by_bytes(at_seam):
    tok, context, matcher = at_seam
    helper = token_text(tok)

    def script(ctx, grammar, k):
        tokens = continuation_tokens(tok, ctx, ',{"a":{"b":"on"}}]')[:k]
        return Draft(tokens=tuple(tokens), sources=("follower",) * len(tokens))

    follower = ScriptedProposer("follower", script)
    composite = CompositeProposer([JumpForwardProposer(), follower])
    composite.start(Request(prompt_ids=(1,), tokenizer=tok))
    draft = composite.propose(context, GrammarView(matcher), 16)
    expected = continuation_tokens(tok, context, '"}},{"a":{"b":"on"}}]')
    assert list(draft.tokens) == expected  # one canonical split across the seam
    assert draft.sources[0] == "jump_forward" and draft.sources[-1] == "follower"
    # Accept '"}' '},' '{"': the forced '"}}' and the follower's ',{"'.
    assert helper.bytes_of(draft.tokens[:3]) == b'"}},{"'
    commit_step(composite, draft, 3)
    ((tokens, n),) = follower.feedbacks
    assert helper.bytes_of(tokens[:n]) == b',{"'


def test_text_drafts_are_resplit_but_a_draft_models_tokens_are_kept(tok, monkeypatch):
    quote, a = tok.convert_tokens_to_ids(['"', "a"])
    merged = tok.convert_tokens_to_ids('"a')
    model = fixed("draft_model", [quote, a])
    monkeypatch.setattr(compose, "is_model_proposer", lambda p: p is model)
    view = GrammarView(RuleMatcher(legal=lambda h, t: True))
    cheap = CompositeProposer([fixed("text", [quote, a])])
    cheap.start(toy_request(tok))
    assert cheap.propose([2], view, 4).tokens == (merged,)  # the canonical split of '"a'
    drafted = CompositeProposer([model])
    drafted.start(toy_request(tok))
    assert drafted.propose([2], view, 4).tokens == (quote, a)


def test_every_member_is_committed_every_step_with_what_was_appended(tok):
    """Members that did not draft (or lost) hear of the step too: an empty draft and the committed tokens."""
    winner, loser = fixed("winner", [4, 5, 6]), fixed("loser", [7])
    composite = CompositeProposer([JumpForwardProposer(), winner, loser])
    composite.start(toy_request(tok))
    view = GrammarView(RuleMatcher(legal=lambda h, t: True))
    draft = composite.propose([2], view, 3)  # the budget is filled: no continuation
    assert set(draft.sources) == {"winner"}
    composite.commit(draft, 2, (4, 5, 9))
    assert winner.commits == [((4, 5, 6), 2, (4, 5, 9))]
    assert loser.commits == [((), 0, (4, 5, 9))]
    composite.commit(EMPTY_DRAFT, 0, (3,))  # a forced step
    assert winner.commits[-1] == loser.commits[-1] == ((), 0, (3,))
