"""The decoding loop on tiny models: rollback leaves no trace, stops land exactly,
a terminated grammar is never touched, caches that cannot roll back are refused."""

from __future__ import annotations

import pytest
import torch

from tests.toy import toy_tokenizer, toy_vocab_size

V = toy_vocab_size()
from grammars import compile_grammar, grammar_spec
from grammars.base import allocate_bitmask
from grammarspec.drafting.draft_model import DraftModelProposer
from grammarspec.engine.decoding import DecodeConfig, decode
from grammarspec.engine.sampling import SamplingParams
from grammarspec.kv.cache import CacheError
from grammarspec.policy.adaptive import AdaptiveController
from proposers.base import Request
from tests.proposer_fakes import ScriptFollower
from tests.toy_models import ToyCausalLM

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "array", "items": {"enum": ["x", "yy", "z"]}, "maxItems": 4}},
    "required": ["a"],
    "additionalProperties": False,
}
PROMPT = [2, 5, 9]


@pytest.fixture(scope="module")
def compiled(tok):
    return compile_grammar(grammar_spec(schema=SCHEMA), tok, vocab_size=len(tok), stop_token_ids=(0,))


def run(model, prompt, *, matcher=None, proposer=None, k=4, params=None, config=None, **kw):
    params = params or SamplingParams()
    config = config or DecodeConfig(max_new_tokens=40, sampling=params, eos_token_ids=(0,))
    if proposer is not None:
        proposer.start(Request(prompt_ids=tuple(prompt), tokenizer=None))
    controller = AdaptiveController(k_min=k, k_max=k, adaptive=False) if proposer is not None else None
    return decode(model, prompt, config, matcher=matcher, proposer=proposer, controller=controller, **kw)


def masks_equal(a, b, vocab):
    if a.is_terminated() or b.is_terminated():
        return a.is_terminated() == b.is_terminated()
    ma, mb = allocate_bitmask(1, vocab), allocate_bitmask(1, vocab)
    a.fill_mask(ma, 0)
    b.fill_mask(mb, 0)
    return torch.equal(ma, mb)


class RecordingLM(ToyCausalLM):
    """A toy model that remembers the cache it last ran on (a draft model's own cache, seen from outside)."""

    def forward(self, input_ids, cache=None, **kwargs):
        self.last_cache = cache
        return super().forward(input_ids, cache=cache, **kwargs)


@pytest.mark.parametrize("seed", range(4))
def test_rollback_leaves_no_trace(compiled, seed):
    """After every step: the matcher equals a fresh one fed the committed tokens, the
    target cache holds exactly the committed-and-verified prefix, and the draft
    model's cache holds only committed tokens."""
    model, draft_model = ToyCausalLM(V, seed=seed), RecordingLM(V, seed=seed + 100)
    matcher = compiled.matcher(max_rollback=8)
    generator = torch.Generator().manual_seed(seed)
    proposer = DraftModelProposer(draft_model, sampling=SamplingParams(True, 1.0), generator=generator)
    checked = []

    def on_step(state):
        fresh = compiled.matcher()
        for token in state.generated:
            assert fresh.accept(token)
        assert masks_equal(matcher, fresh, compiled.vocab_size)
        assert state.cache.get_seq_length() == state.cached <= len(state.tokens)
        stored = state.cache.layers[0].keys[0, 0, :, 0].long().tolist()
        assert stored == state.tokens[: state.cached]  # no rejected position in the target cache
        draft_cache = draft_model.last_cache
        draft_len = draft_cache.get_seq_length()
        assert draft_cache.layers[0].keys[0, 0, :, 0].long().tolist() == state.tokens[:draft_len]
        checked.append(len(state.generated))

    new, stats = run(
        model,
        PROMPT,
        matcher=matcher,
        proposer=proposer,
        params=SamplingParams(True, 1.0),
        generator=generator,
        on_step=on_step,
    )
    assert len(checked) == stats.target_forwards and checked
    assert stats.finish_reason == "stop"


def test_speculative_greedy_equals_plain_greedy(compiled):
    model = ToyCausalLM(V, seed=3)
    plain, _ = run(model, PROMPT, matcher=compiled.matcher())
    for noise in (0, 2, 3):
        spec, stats = run(model, PROMPT, matcher=compiled.matcher(), proposer=ScriptFollower(plain, noise))
        assert spec == plain
        assert stats.target_forwards < len(plain) or noise


class SpyMatcher:
    """Wraps a matcher and fails the test if a terminated grammar is touched."""

    def __init__(self, inner):
        self.inner = inner
        self.vocab_size, self.stop_token_ids, self.max_rollback = (
            inner.vocab_size,
            inner.stop_token_ids,
            inner.max_rollback,
        )

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def fill_mask(self, bitmask, row=0):
        assert not self.inner.is_terminated(), "mask asked of a terminated grammar"
        return self.inner.fill_mask(bitmask, row)

    def accept(self, token):
        assert not self.inner.is_terminated(), "token fed to a terminated grammar"
        return self.inner.accept(token)

    def fork(self):
        return SpyMatcher(self.inner.fork())


@pytest.mark.parametrize("extra", range(0, 5))
def test_termination_inside_the_draft_window(compiled, extra):
    """The document ends (EOS) at every offset of a draft window, with junk after it."""
    model = ToyCausalLM(V, seed=11)
    plain, _ = run(model, PROMPT, matcher=compiled.matcher())
    assert plain[-1] == 0
    script = plain + [7] * extra
    spy = SpyMatcher(compiled.matcher())
    for k in (1, 2, 3, 5, 8):
        spy = SpyMatcher(compiled.matcher())
        new, stats = run(model, PROMPT, matcher=spy, proposer=ScriptFollower(script), k=k)
        assert new == plain and stats.finish_reason == "stop"
        assert spy.inner.is_terminated()


@pytest.mark.parametrize("offset", range(0, 6))
def test_eos_and_stop_strings_at_every_offset(tok, offset):
    """Unconstrained: stopping exactly where plain decoding stops, whatever the draft window."""
    model = ToyCausalLM(V, seed=5)
    base, _ = run(model, PROMPT, config=DecodeConfig(max_new_tokens=12, eos_token_ids=()))
    stop_at = 3 + offset  # stop on the token generated at this position
    eos_token = base[stop_at]
    first = base.index(eos_token)  # the first occurrence is where plain decoding stops
    for k in (2, 3, 4, 7):
        cfg = DecodeConfig(max_new_tokens=12, eos_token_ids=(eos_token,))
        new, stats = run(model, PROMPT, proposer=ScriptFollower(base), k=k, config=cfg)
        assert new == base[: first + 1] and stats.finish_reason == "eos"
    text = tok.decode(base[: stop_at + 1])
    stop = text[-2:]
    plain_cfg = DecodeConfig(max_new_tokens=12, stop_strings=(stop,))
    plain, _ = run(model, PROMPT, config=plain_cfg, tokenizer=tok)
    assert stop in tok.decode(plain) and plain_cfg.stop_strings
    for k in (2, 3, 5):
        new, stats = run(model, PROMPT, proposer=ScriptFollower(base), k=k, config=plain_cfg, tokenizer=tok)
        assert new == plain and stats.finish_reason == "stop_string"


def test_max_new_tokens_is_exact(compiled):
    model = ToyCausalLM(V, seed=2)
    for limit in range(0, 7):
        cfg = DecodeConfig(max_new_tokens=limit, eos_token_ids=(0,))
        plain, _ = run(model, PROMPT, matcher=compiled.matcher(), config=cfg)
        script, _ = run(model, PROMPT, matcher=compiled.matcher())
        spec, stats = run(model, PROMPT, matcher=compiled.matcher(), proposer=ScriptFollower(script), config=cfg)
        assert spec == plain and len(spec) == min(limit, len(script))
        assert stats.finish_reason == ("length" if limit < len(script) else "stop")


def test_forced_tokens_skip_the_target():
    """Where the grammar allows exactly one token it is committed without a forward pass."""
    tok = toy_tokenizer()
    compiled = compile_grammar(grammar_spec(regex="abcdefgh(x|y)"), tok, vocab_size=len(tok), stop_token_ids=(0,))
    model = ToyCausalLM(V, seed=4)
    new, stats = run(model, PROMPT, matcher=compiled.matcher())
    assert tok.decode(new[:-1]) in ("abcdefghx", "abcdefghy") and new[-1] == 0
    assert stats.forced_tokens >= 9  # eight letters and the final EOS
    assert stats.target_forwards == 1  # only the x/y choice needs the model
    # The first step -- the prompt pass -- committed the forced letters before it and its own choice.
    assert stats.first_step_tokens == 9 and 0 < stats.first_step_seconds <= stats.total_seconds


class RecordingProposer(ScriptFollower):
    """A scripted proposer that records every ``propose`` (with what it had heard by then) and ``commit``."""

    def __init__(self, script: list[int], noise_every: int = 0) -> None:
        super().__init__(script, noise_every)
        self.commits: list[tuple[tuple[int, ...], int, tuple[int, ...]]] = []
        self.proposed: list[tuple[int, ...]] = []
        self.heard: list[int] = []  # every committed token, in the order commits told them
        self.unheard_at_propose: list[int] = []  # context tokens the proposer had not been told when asked

    def start(self, request):
        super().start(request)
        self.heard = list(request.prompt_ids)

    def propose(self, context, grammar, k):
        self.unheard_at_propose.append(len(context) - len(self.heard))
        draft = super().propose(context, grammar, k)
        self.proposed.append(draft.tokens)
        return draft

    def commit(self, draft, num_accepted, committed):
        self.commits.append((draft.tokens, num_accepted, tuple(committed)))
        self.heard += committed


@pytest.mark.parametrize("noise", [0, 2])
def test_the_proposer_hears_every_committed_token_before_it_drafts_and_by_the_end(noise):
    """A step whose draft was verified commits it (accepted tokens, then the target's own unless the draft
    ended it); tokens committed without a draft of its own -- forced, or after a cut or rested ask -- reach it
    in one commit before its next draft.  The commits spell the output, and every ask sees a told context."""
    tok = toy_tokenizer()
    compiled = compile_grammar(grammar_spec(regex="abc(x|yy)de(f|g)h"), tok, vocab_size=len(tok), stop_token_ids=(0,))
    model = ToyCausalLM(V, seed=4)
    plain, _ = run(model, PROMPT, matcher=compiled.matcher())
    proposer = RecordingProposer(plain, noise)
    new, stats = run(model, PROMPT, matcher=compiled.matcher(), proposer=proposer, k=3)
    assert new == plain
    assert [t for _, _, committed in proposer.commits for t in committed] == new  # told once each, in order
    assert proposer.unheard_at_propose and set(proposer.unheard_at_propose) == {0}
    drafted = [c for c in proposer.commits if c[0]]
    assert len(drafted) == sum(1 for k, _ in stats.steps if k) > 0
    assert len(proposer.commits) < stats.target_forwards + stats.forced_tokens  # runs without a draft: one call
    for draft, accepted, committed in proposer.commits:
        if draft:
            assert accepted <= len(draft) and committed[:accepted] == draft[:accepted]
            assert len(committed) in (accepted, accepted + 1)  # + the target's own token unless the draft ended it
            assert any(p[: len(draft)] == draft for p in proposer.proposed)
        else:
            assert accepted == 0 and committed


class NoCropCache:
    def __init__(self, inner):
        self.inner = inner
        self.is_croppable = False

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_uncroppable_cache_is_refused(compiled, monkeypatch):
    import grammarspec.kv.batch as kv

    real = kv.new_cache
    monkeypatch.setattr(kv, "new_cache", lambda model: NoCropCache(real(model)))
    model = ToyCausalLM(V, seed=3)
    script = [6] * 5  # rejected: forces a rollback
    with pytest.raises(CacheError, match="cannot be rolled back"):
        run(model, PROMPT, matcher=compiled.matcher(), proposer=ScriptFollower(script))


def test_draft_row_without_legal_token_emits_nothing(compiled, monkeypatch):
    proposer = DraftModelProposer(ToyCausalLM(V, seed=1), sampling=SamplingParams(True, 1.0))
    proposer.start(Request(prompt_ids=tuple(PROMPT), tokenizer=None))
    monkeypatch.setattr(proposer, "_forward", lambda ids: torch.full((1, V), float("-inf")))
    from proposers.base import GrammarView

    assert len(proposer.propose(PROMPT, GrammarView(compiled.matcher()), 4)) == 0


def test_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="prompt is empty"):
        decode(ToyCausalLM(V), [], DecodeConfig(max_new_tokens=3))
