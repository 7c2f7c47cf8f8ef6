"""The matcher contract, run on every backend with a toy and the real SmolLM2 vocabulary.

Every backend difference (raise vs. bool, EOS handling, bounded rollback,
padded vocabularies) must be absorbed by the adapters; these tests pin the
behaviour the decoding loop relies on.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from grammars import BACKENDS, GrammarError, allocate_bitmask, bitmask_to_ids, compile_grammar, grammar_spec
from tests.toy import toy_byte_fallback_tokenizer, toy_byte_level_tokenizer, toy_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0},
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "ab"]}},
        "ok": {"type": "boolean"},
    },
    "required": ["id", "name", "tags", "ok"],
    "additionalProperties": False,
}
DOC = {"id": 12, "name": "ba", "tags": ["a", "ab"], "ok": True}
TEXT = json.dumps(DOC, separators=(",", ":"))
#: The logits width used everywhere: wider than the tokenizer, as with many real models.
PADDING = 64
WINDOW = 6


class Case:
    """One (backend, vocabulary) combination: tokenizer, compiled grammar, reference tokens."""

    def __init__(self, backend: str, tokenizer) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer) + PADDING
        self.eos = tokenizer.eos_token_id
        self.compiled = compile_grammar(
            grammar_spec(schema=SCHEMA), tokenizer, vocab_size=self.vocab_size, backend=backend
        )
        self.doc = tokenizer.encode(TEXT, add_special_tokens=False)
        assert tokenizer.decode(self.doc) == TEXT

    def matcher(self, max_rollback: int = WINDOW):
        return self.compiled.matcher(max_rollback=max_rollback)

    def mask(self, matcher) -> torch.Tensor:
        mask = allocate_bitmask(1, self.vocab_size)
        matcher.fill_mask(mask, 0)
        return mask[0].clone()

    def legal(self, mask: torch.Tensor, token: int) -> bool:
        return bool((int(mask[token // 32]) >> (token % 32)) & 1)

    def illegal_token(self, mask: torch.Tensor) -> int:
        """A real (non-padding) token the mask forbids."""
        for token in range(len(self.tokenizer)):
            if not self.legal(mask, token) and token != self.eos:
                return token
        raise AssertionError("the mask allows every token")


@pytest.fixture(params=[(b, v) for v in ("toy", "smollm2") for b in BACKENDS], ids=lambda p: f"{p[0]}-{p[1]}")
def case(request, tok) -> Case:
    backend, vocab = request.param
    tokenizer = tok if vocab == "toy" else request.getfixturevalue("smol_tokenizer")
    return Case(backend, tokenizer)


def test_reference_document_then_eos(case):
    m = case.matcher()
    for token in case.doc:
        mask = case.mask(m)
        assert case.legal(mask, token), case.tokenizer.decode([token])
        assert not case.legal(mask, case.eos), "EOS must be illegal before the document is complete"
        assert not m.accept(case.eos)
        assert m.accept(token)
    assert case.legal(case.mask(m), case.eos)
    assert m.accept(case.eos)
    assert m.is_terminated()


def test_mask_agrees_with_accept(case):
    """A token's mask bit is set exactly when accept() takes it (sampled tokens, each position)."""
    generator = torch.Generator().manual_seed(0)
    m = case.matcher()
    for token in case.doc:
        mask = case.mask(m)
        allowed = bitmask_to_ids(mask, case.vocab_size).tolist()
        sample = torch.randint(0, len(case.tokenizer), (48,), generator=generator).tolist()
        sample += allowed[:: max(1, len(allowed) // 48)] + [case.eos]
        for t in sample:
            assert m.validate([t]) == int(case.legal(mask, t)), (t, case.tokenizer.decode([t]))
        assert torch.equal(case.mask(m), mask)
        assert m.accept(token)


def test_accept_rollback_replay_gives_identical_masks(case):
    m = case.matcher()
    reference = []  # mask before each token
    for token in case.doc:
        reference.append(case.mask(m))
        assert m.accept(token)
    final = case.mask(m)
    for start in range(0, len(case.doc) - WINDOW + 1, 2):
        replay = case.matcher()
        for token in case.doc[:start]:
            assert replay.accept(token)
        window = case.doc[start : start + WINDOW]
        for token in window:
            assert replay.accept(token)
        replay.rollback(len(window))
        assert torch.equal(case.mask(replay), reference[start])
        for i, token in enumerate(window):
            assert torch.equal(case.mask(replay), reference[start + i])
            assert replay.accept(token)
    m.rollback(WINDOW)
    for token in case.doc[-WINDOW:]:
        assert m.accept(token)
    assert torch.equal(case.mask(m), final)


def test_validate_leaves_state_unchanged(case):
    m = case.matcher()
    half = len(case.doc) // 2
    for token in case.doc[:half]:
        assert m.accept(token)
    before = case.mask(m)
    rest = case.doc[half:]
    bad = case.illegal_token(_mask_after(case, m, rest[:2]))
    assert m.validate(rest[:2] + [bad] + rest[3:]) == 2
    assert m.validate(rest[:WINDOW]) == min(WINDOW, len(rest))
    assert m.validate(rest + [case.eos]) == len(rest) + 1  # longer than the window: checked on a fork
    assert m.validate([]) == 0
    assert torch.equal(case.mask(m), before)
    assert not m.is_terminated()
    # validate() does not shrink the rollback window either
    m.rollback(WINDOW)
    for token in case.doc[half - WINDOW : half]:
        assert m.accept(token)
    assert torch.equal(case.mask(m), before)


def _mask_after(case: Case, m, tokens) -> torch.Tensor:
    fork = m.fork()
    for token in tokens:
        assert fork.accept(token)
    return case.mask(fork)


def test_illegal_token_is_false_and_leaves_state_unchanged(case):
    m = case.matcher()
    for i, token in enumerate(case.doc):
        mask = case.mask(m)
        forced = m.forced_text()
        for bad in (case.illegal_token(mask), len(case.tokenizer) + 3, case.vocab_size, case.vocab_size + 7, -1):
            assert m.accept(bad) is False
        assert torch.equal(case.mask(m), mask)
        assert m.forced_text() == forced
        assert m.accept(token)
        if i == 2:  # rollback still covers the tokens before the rejected ones
            m.rollback(3)
            for t in case.doc[:3]:
                assert m.accept(t)


def test_padding_ids_never_legal_and_mask_width(case):
    m = case.matcher()
    real = len(case.tokenizer)
    for token in case.doc:
        mask = case.mask(m)
        assert mask.shape == ((case.vocab_size + 31) // 32,)
        bits = ((mask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).reshape(-1)
        assert not bits[real:].any(), "ids past the tokenizer (padding and past vocab_size) must never be legal"
        assert m.accept(token)
    with pytest.raises(GrammarError, match="allocate_bitmask"):
        m.fill_mask(allocate_bitmask(1, case.vocab_size + 32), 0)
    with pytest.raises(GrammarError, match="int32"):
        m.fill_mask(torch.zeros(1, (case.vocab_size + 31) // 32, dtype=torch.int64), 0)
    with pytest.raises(GrammarError, match="row"):
        m.fill_mask(allocate_bitmask(2, case.vocab_size), 2)


def test_fill_mask_writes_only_its_row(case):
    m = case.matcher()
    masks = allocate_bitmask(3, case.vocab_size)
    m.fill_mask(masks, 1)
    assert (masks[0] == -1).all() and (masks[2] == -1).all()
    assert torch.equal(masks[1], case.mask(m))


def test_eos_inside_a_draft_window(case):
    m = case.matcher(max_rollback=4)
    *body, last = case.doc
    for token in body[:-1]:
        assert m.accept(token)
    mask_before_last2 = case.mask(m)
    # a draft window [t, last, EOS, x]: EOS only after the document is complete
    assert m.validate([body[-1], case.eos]) == 1
    assert m.validate([body[-1], last, case.eos, case.doc[0]]) == 3
    assert m.accept(body[-1]) and m.accept(last)
    complete = case.mask(m)
    assert case.legal(complete, case.eos)
    assert m.accept(case.eos) and m.is_terminated()
    m.rollback(1)  # rolling back over EOS un-terminates
    assert not m.is_terminated()
    assert torch.equal(case.mask(m), complete)
    assert m.accept(case.eos)
    m.rollback(3)  # EOS and the two tokens before it
    assert torch.equal(case.mask(m), mask_before_last2)
    for token in (body[-1], last, case.eos):
        assert m.accept(token)
    assert m.is_terminated()


def test_every_stop_token_ends_the_document(case):
    other = next(t for t in case.tokenizer.all_special_ids if t != case.eos)
    compiled = compile_grammar(
        grammar_spec(schema=SCHEMA),
        case.tokenizer,
        vocab_size=case.vocab_size,
        stop_token_ids=[case.eos, other],
        backend=case.backend,
    )
    assert compiled.matcher().stop_token_ids == (case.eos, other)
    m = compiled.matcher()
    for token in case.doc[:-1]:
        assert m.accept(token)
    mask = case.mask(m)
    assert not case.legal(mask, case.eos) and not case.legal(mask, other)
    assert m.accept(case.doc[-1])
    mask = case.mask(m)
    assert case.legal(mask, case.eos) and case.legal(mask, other)
    for stop in (other, case.eos):
        assert m.accept(stop) and m.is_terminated()
        m.rollback(1)
        assert torch.equal(case.mask(m), mask)


def test_termination(case):
    m = case.matcher()
    for token in case.doc + [case.eos]:
        assert m.accept(token)
    assert m.is_terminated()
    with pytest.raises(GrammarError, match="terminated"):
        m.fill_mask(allocate_bitmask(1, case.vocab_size), 0)
    assert all(m.accept(t) is False for t in (case.eos, case.doc[0], 0))
    assert m.validate([case.eos]) == 0
    assert m.forced_text() == ""
    assert m.allowed_tokens().numel() == 0
    assert m.is_terminated()


def test_rollback_beyond_window_raises(case):
    m = case.matcher(max_rollback=4)
    with pytest.raises(GrammarError, match="Cannot roll back 1 tokens: only 0 stored"):
        m.rollback(1)
    for token in case.doc[:6]:
        assert m.accept(token)
    mask = case.mask(m)
    with pytest.raises(GrammarError, match="Cannot roll back 5 tokens: only 4 stored"):
        m.rollback(5)
    with pytest.raises(GrammarError):
        m.rollback(-1)
    assert torch.equal(case.mask(m), mask), "a refused rollback changes nothing"
    m.rollback(0)
    m.rollback(3)
    m.rollback(1)
    with pytest.raises(GrammarError, match="only 0 stored"):
        m.rollback(1)
    fresh = case.matcher()
    for token in case.doc[:2]:
        assert fresh.accept(token)
    assert torch.equal(case.mask(m), case.mask(fresh))


def test_fork_is_independent(case):
    m = case.matcher()
    half = len(case.doc) // 2
    for token in case.doc[:half]:
        assert m.accept(token)
    mask = case.mask(m)
    fork = m.fork()
    assert torch.equal(case.mask(fork), mask)
    for token in case.doc[half:] + [case.eos]:
        assert fork.accept(token)
    assert fork.is_terminated() and not m.is_terminated()
    assert torch.equal(case.mask(m), mask)
    fork.rollback(WINDOW)  # the fork keeps its own window
    m.rollback(WINDOW)  # and so does the original, which the fork did not touch
    expect = case.matcher()
    for token in case.doc[: half - WINDOW]:
        assert expect.accept(token)
    assert torch.equal(case.mask(m), case.mask(expect))
    assert fork.validate(case.doc[len(case.doc) - WINDOW + 1 :] + [case.eos]) == WINDOW


def test_reset(case):
    m = case.matcher()
    start = case.mask(m)
    for token in case.doc + [case.eos]:
        assert m.accept(token)
    m.reset()
    assert not m.is_terminated()
    assert torch.equal(case.mask(m), start)
    with pytest.raises(GrammarError):
        m.rollback(1)
    assert m.validate(case.doc + [case.eos]) == len(case.doc) + 1


def test_forced_text_is_never_wrong(case):
    """Forced text is a prefix of every legal continuation, so of the rest of the reference."""
    m = case.matcher()
    assert m.forced_text() == '{"id":'  # the first key is required and fixed
    done = ""
    for token in case.doc:
        forced = m.forced_text()
        assert TEXT[len(done) :].startswith(forced), (done, forced)
        assert m.accept(token)
        done += case.tokenizer.decode([token])
    assert m.forced_text() == ""  # complete: EOS may come next


# -- unsupported features -------------------------------------------------------------------------

UNSUPPORTED = [
    ("xgrammar", dict(grammar='root ::= "a" | '), "EBNF"),
    ("xgrammar", dict(grammar="root ::= undefined_rule"), "undefined_rule"),
    ("xgrammar", dict(regex="(a)\\1"), "Backreference"),
    ("xgrammar", dict(schema={"type": "string", "pattern": "^(a)\\1$"}), "offending pattern"),
    ("outlines", dict(grammar='root ::= "a"'), "does not support EBNF"),
    ("outlines", dict(schema={"not": {"type": "string"}}), "Unsupported JSON Schema structure"),
    ("outlines", dict(schema={"type": "string", "format": "ipv4"}), "ipv4"),
    ("outlines", dict(regex="(?=a)a"), "regex"),
    ("llguidance", dict(grammar="root ::= undefined_rule"), "undefined_rule"),
    ("llguidance", dict(regex="(a)\\1"), "backreferences are not supported"),
    ("llguidance", dict(schema={"not": {"type": "string"}}), "Unimplemented keys"),
    ("llguidance", dict(schema={"type": "array", "uniqueItems": True}), "uniqueItems"),
]
UNSATISFIABLE = ("minimum greater than maximum", "Unsatisfiable")  # a backend's own words: grammars.satisfiable
# refuses the common cases before any backend compiles (tests/grammars/test_satisfiable.py)


@pytest.mark.parametrize("backend,kwargs,reason", UNSUPPORTED, ids=lambda x: str(x)[:40])
def test_unsupported_features_raise_grammar_error(tok, backend, kwargs, reason):
    with pytest.raises(GrammarError) as info:
        compile_grammar(grammar_spec(**kwargs), tok, backend=backend)
    message = str(info.value)
    assert backend in message and reason in message
    if reason in UNSATISFIABLE:  # no backend can help: none is suggested
        assert "backend=" not in message and "fix the schema" in message.lower()
    else:
        assert_suggests_only_backends_that_compile(message, backend, kwargs, tok)
    assert "/project/cpp" not in message  # no C++ log noise


def assert_suggests_only_backends_that_compile(message, failed, kwargs, tokenizer):
    """The error names exactly the other backends that compile and decode the grammar, or says that none does."""
    import re

    from grammars.capabilities import refused, unenforced
    from grammars.suggest import decodes

    named = set(re.findall(r"grammar_backend='(\w+)'", message))
    late = set(re.findall(r"(\w+) did not finish within", message))  # a slow machine: said so, not suggested
    schema = kwargs.get("schema")
    why = [f for f in refused(schema, failed) if f'"{f}"' in message] if schema is not None else []  # refused for
    compiles = set()
    for other in BACKENDS:
        if other != failed:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    compiled = compile_grammar(grammar_spec(**kwargs), tokenizer, backend=other)
            except GrammarError:
                continue
            if any(f in unenforced(schema, other) for f in why):  # it would ignore what was refused: never suggested
                assert other in message.split("No other backend enforces")[-1], message
                continue
            if decodes(compiled):
                compiles.add(other)
    assert named <= compiles and compiles <= named | late, (message, compiles)
    assert ("No other backend compiles it either" in message or "No other backend enforces" in message) == (
        not named
    ), message


#: Grammars some backend refuses: a missing $ref and a backreference (which the other backends refuse too), and an
#: optional empty enum.
REFUSED_SOMEWHERE = [
    dict(schema={"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}),
    dict(schema={"type": "string", "pattern": "(a)\\1"}),
    dict(regex="(a)\\1"),
    dict(schema={"type": "object", "properties": {"a": {"enum": []}, "b": {"type": "integer"}}}),
    dict(schema={"type": "array", "uniqueItems": True}),
    dict(schema={"type": "string", "format": "ipv4"}),
    dict(grammar='root ::= "a"'),
]


@pytest.mark.parametrize("kwargs", REFUSED_SOMEWHERE, ids=lambda x: str(x)[:50])
def test_a_compile_error_suggests_only_backends_that_compile_the_grammar(tok, kwargs):
    refusals = 0
    for backend in BACKENDS:
        try:
            compile_grammar(grammar_spec(**kwargs), tok, backend=backend)
        except GrammarError as e:
            refusals += 1
            assert_suggests_only_backends_that_compile(str(e), backend, kwargs, tok)
    assert refusals, "every backend compiled it: the case tests nothing"


# -- xgrammar parity ------------------------------------------------------------------------------


def _parity_check(tokenizer, schema, text, vocab_size, eos):
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=[eos])
    plain = xgr.GrammarMatcher(
        xgr.GrammarCompiler(info).compile_json_schema(schema, any_whitespace=False, separators=(",", ":"))
    )
    ours = compile_grammar(grammar_spec(schema=schema), tokenizer, vocab_size=vocab_size, backend="xgrammar")
    m = ours.matcher()
    a = xgr.allocate_token_bitmask(1, vocab_size)
    b = allocate_bitmask(1, vocab_size)
    tokens = tokenizer.encode(text, add_special_tokens=False) + [eos]
    for token in tokens:
        plain.fill_next_token_bitmask(a)
        m.fill_mask(b, 0)
        # xgrammar sets the bits past vocab_size in the last word (ids that do not exist); we clear them
        assert torch.equal(bitmask_to_ids(a[0], vocab_size), bitmask_to_ids(b[0], vocab_size))
        assert torch.equal(a[0, :-1], b[0, :-1])
        assert plain.accept_token(token) and m.accept(token)
    assert plain.is_terminated() and m.is_terminated()


@pytest.mark.parametrize("vocab", ["toy", "smollm2"])
def test_xgrammar_parity_with_plain_compact_json_schema(request, tok, vocab):
    tokenizer = tok if vocab == "toy" else request.getfixturevalue("smol_tokenizer")
    _parity_check(tokenizer, SCHEMA, TEXT, len(tokenizer) + PADDING, tokenizer.eos_token_id)


def test_xgrammar_parity_on_a_task(smol_tokenizer, tasks):
    task = next(t for t in tasks if t["kind"] == "tool_call")
    text = json.dumps(task["reference"], separators=(",", ":"), ensure_ascii=False)
    _parity_check(smol_tokenizer, task["schema"], text, len(smol_tokenizer), smol_tokenizer.eos_token_id)


# -- token decoding -------------------------------------------------------------------------------

TOKENIZERS = {
    "toy": toy_tokenizer,
    "byte_level": toy_byte_level_tokenizer,
    "byte_fallback": toy_byte_fallback_tokenizer,
}


@pytest.mark.parametrize("vocab", [*TOKENIZERS, "smollm2"])
def test_outlines_token_bytes_agree_with_xgrammar(request, vocab):
    """Both backends read every token as the same bytes (special and padding ids aside)."""
    import xgrammar as xgr

    from grammars.outlines_backend import token_bytes

    tokenizer = request.getfixturevalue("smol_tokenizer") if vocab == "smollm2" else TOKENIZERS[vocab]()
    vocab_size = len(tokenizer) + 5
    ours = token_bytes(tokenizer, vocab_size)
    theirs = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size).decoded_vocab
    special = set(tokenizer.all_special_ids)
    special |= {i for i, added in tokenizer.added_tokens_decoder.items() if added.special}
    for token_id in range(vocab_size):
        if token_id in special or token_id >= len(tokenizer):
            assert ours[token_id] is None
        else:
            assert ours[token_id] == theirs[token_id], (token_id, ours[token_id], theirs[token_id])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("vocab", ["byte_level", "byte_fallback"])
def test_characters_split_across_tokens(backend, vocab):
    """``é`` is two byte tokens: masks, forced text and rollback stay right in the middle of it."""
    from grammars.outlines_backend import token_bytes

    tokenizer = TOKENIZERS[vocab]()
    text = json.dumps({"a": "é a"}, ensure_ascii=False, separators=(",", ":"))
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    case_vocab = len(tokenizer) + 3
    compiled = compile_grammar(grammar_spec(schema=schema), tokenizer, vocab_size=case_vocab, backend=backend)
    tokens = tokenizer.encode(text, add_special_tokens=False)
    assert len(tokens) > len(text.encode()) // 2 and tokenizer.decode(tokens) == text
    pieces = token_bytes(tokenizer, len(tokenizer))  # checked against xgrammar above
    m = compiled.matcher()
    masks, done = [], b""
    for token in tokens:
        mask = allocate_bitmask(1, case_vocab)
        m.fill_mask(mask, 0)
        masks.append(mask)
        forced = m.forced_text().encode()
        assert text.encode()[len(done) :].startswith(forced), (done, forced)
        assert m.accept(token)
        done += pieces[token]
    assert done == text.encode()
    m.rollback(5)  # back across the split character
    for token, mask in zip(tokens[-5:], masks[-5:]):
        again = allocate_bitmask(1, case_vocab)
        m.fill_mask(again, 0)
        assert torch.equal(again, mask)
        assert m.accept(token)
    assert m.accept(tokenizer.eos_token_id) and m.is_terminated()


@pytest.mark.parametrize("backend", BACKENDS)
def test_forced_text_around_a_split_character(backend):
    """An enum forces the whole value; in the middle of a split ``é`` nothing whole is forced."""
    tokenizer = toy_byte_level_tokenizer()
    schema = {"type": "object", "properties": {"a": {"type": "string", "enum": ["éé"]}}, "required": ["a"]}
    m = compile_grammar(grammar_spec(schema=schema), tokenizer, backend=backend).matcher()
    tokens = tokenizer.encode('{"a":"éé"}', add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(tokens) == ['{"', "a", '":', '"', "Ã", "©", "Ã", "©", '"', "}"]
    forced = []
    for token in tokens:
        forced.append(m.forced_text())
        assert m.accept(token)
    assert forced == ['{"a":"éé"}', 'a":"éé"}', '":"éé"}', '"éé"}', 'éé"}', "", 'é"}', "", '"}', "}"]
    assert m.forced_text() == ""
