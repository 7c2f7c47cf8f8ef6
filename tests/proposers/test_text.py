"""Text -> canonical tokens (proposers.text) on the real SmolLM2 tokenizer."""

from __future__ import annotations

import json

import pytest

import proposers.text as text_module
from proposers.text import SplitPreferences, continuation_tokens, token_text

DOC = json.dumps(
    {
        "name": "John Smith",
        "email": "john@example.com",
        "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-22", "qty": 10}],
        "note": "Café ☕ — déjà vu",
        "ok": True,
    },
    separators=(",", ":"),
    ensure_ascii=False,
)


def names(tok, ids):
    return [tok.convert_ids_to_tokens(i) for i in ids]


def test_worked_example(smol_tokenizer):
    tok = smol_tokenizer
    context = tok.encode('{"x":1,"name":"', add_special_tokens=False)
    out = continuation_tokens(tok, context, 'John Smith","age":')
    assert names(tok, out) == ["John", "ĠSmith", '","', "age", '":']


def test_canonical_prefix_continues_canonically(smol_tokenizer):
    """Cut the canonical split of a document anywhere: the rest comes back exactly."""
    tok = smol_tokenizer
    helper = token_text(tok)
    full = tok.encode(DOC, add_special_tokens=False)
    for cut in range(1, len(full)):
        context = full[:cut]
        rest_text = DOC.encode("utf-8")[len(helper.bytes_of(context)) :]
        try:
            text = rest_text.decode("utf-8")
        except UnicodeDecodeError:  # the cut splits a character: no text-level continuation
            continue
        assert continuation_tokens(tok, context, text) == full[cut:], f"cut at token {cut}"


def test_seam_that_would_resplit_committed_text_backs_off(smol_tokenizer):
    tok = smol_tokenizer
    helper = token_text(tok)
    context = tok.encode('{"a":"x', add_special_tokens=False) + tok.encode('"', add_special_tokens=False)
    # '"' followed by ',"' canonically merges into '","': that would re-split the committed quote.
    assert tok.encode('x","', add_special_tokens=False)[-1] != tok.encode('"', add_special_tokens=False)[0]
    out = continuation_tokens(tok, context, ',"b":')
    assert helper.bytes_of(out) == b',"b":'
    assert out == list(tok.encode(',"b":', add_special_tokens=False))


def test_tokens_always_spell_the_text(smol_tokenizer):
    tok = smol_tokenizer
    helper = token_text(tok)
    context = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)  # ends next to a special token
    for text in ['{"note":"déjà vu ☕"}', " leading space", "\n\n", "😀😀", '"']:
        out = continuation_tokens(tok, context, text)
        assert helper.bytes_of(out) == text.encode("utf-8")


def test_empty_text_and_empty_context(smol_tokenizer):
    assert continuation_tokens(smol_tokenizer, [1, 2, 3], "") == []
    out = continuation_tokens(smol_tokenizer, [], '{"a":1}')
    assert out == list(smol_tokenizer.encode('{"a":1}', add_special_tokens=False))


@pytest.mark.parametrize("lookback", [0, 1, 4, 8])
def test_lookback_zero_still_spells_text(smol_tokenizer, lookback):
    tok = smol_tokenizer
    context = tok.encode('{"k":"v', add_special_tokens=False)
    out = continuation_tokens(tok, context, 'alue"}', lookback=lookback)
    assert token_text(tok).bytes_of(out) == b'alue"}'


def test_continuation_cache_is_the_rule_and_hands_out_copies(smol_tokenizer):
    """Cached answers equal the uncached rule for the same context tail; changing one changes no later answer."""
    tok = smol_tokenizer
    helper = token_text(tok)
    ids = tok.encode(DOC, add_special_tokens=False)
    for cut in range(1, len(ids), 3):
        context, text = ids[:cut], helper.bytes_of(ids[cut:]).decode("utf-8", "ignore")
        first = continuation_tokens(tok, context, text)
        assert first == list(helper._continuation(tuple(context[-4:]), text))
        first.append(-1)
        assert continuation_tokens(tok, context, text) == list(helper._continuation(tuple(context[-4:]), text))
        assert continuation_tokens(tok, [7] + list(context[-4:]), text) == first[:-1]  # only the tail counts


# -- learned splits -----------------------------------------------------------------


def test_split_preferences_learn_the_targets_split(smol_tokenizer):
    tok = smol_tokenizer
    helper = token_text(tok)
    splits = SplitPreferences(tok)
    context = tok.encode('{"a":"x', add_special_tokens=False)
    draft = continuation_tokens(tok, context, '","b":"y')
    assert names(tok, draft)[0] == '","'
    splits.remember(context, draft)
    # The target wrote '",' and then '"' where the draft had '","'.
    committed = context + tok.encode('",', add_special_tokens=False) + tok.encode('"', add_special_tokens=False)
    splits.observe(committed)
    again = splits.resplit(context, draft)
    assert names(tok, again)[:2] == ['",', '"'] and helper.bytes_of(again) == helper.bytes_of(draft)
    other = tok.encode('{"a":"x', add_special_tokens=False)[:-1] + tok.encode("z", add_special_tokens=False)
    assert names(tok, splits.resplit(other, draft))[:2] == ['",', '"']  # the fallback applies after any token


def test_split_preferences_keep_what_was_accepted(smol_tokenizer):
    tok = smol_tokenizer
    splits = SplitPreferences(tok)
    context = tok.encode('{"a":"x', add_special_tokens=False)
    draft = continuation_tokens(tok, context, '","b":"y')
    splits.remember(context, draft)
    splits.observe(context + tok.encode('",', add_special_tokens=False) + [0])
    splits.remember(context, splits.resplit(context, draft))
    splits.observe(context + draft[:2])  # later the target wrote '","' after 'x': kept
    assert splits.resplit(context, draft) == draft


def test_split_preferences_follow_the_latest_sighting_in_any_context(smol_tokenizer):
    """The target's choice runs in streaks: a split it kept elsewhere replaces an older rejection."""
    tok = smol_tokenizer
    splits = SplitPreferences(tok)

    def after(value):
        context = tok.encode('{"a":"' + value, add_special_tokens=False)
        return context, continuation_tokens(tok, context, '","b":"y')

    context, draft = after("x")
    splits.remember(context, draft)
    splits.observe(context + tok.encode('",', add_special_tokens=False) + [0])  # rejected: '",' then '"'
    context, draft = after("q")
    assert names(tok, splits.resplit(context, draft))[:2] == ['",', '"']
    splits.remember(context, draft)  # drafted canonically anyway
    splits.observe(context + draft[:2])  # and kept: '","'
    context, draft = after("z")
    assert splits.resplit(context, draft) == draft


def test_split_preferences_ignore_a_different_text(smol_tokenizer):
    tok = smol_tokenizer
    splits = SplitPreferences(tok)
    context = tok.encode('{"a":"x', add_special_tokens=False)
    draft = continuation_tokens(tok, context, '","b":"y')
    splits.remember(context, draft)
    splits.observe(context + tok.encode("yz", add_special_tokens=False))  # the target disagreed on the text
    assert splits.resplit(context, draft) == draft
    splits.observe(context + [5])  # nothing remembered any more: no effect
    assert not splits.by_context and not splits.by_token


def test_a_later_request_starts_from_the_splits_an_earlier_one_saw(smol_tokenizer):
    """``memory`` at the end of one request, ``recall`` after the next one's ``start``: its first draft is split
    the way the target wrote that text before; what the new request sees itself wins over the memory."""
    tok = smol_tokenizer
    context = tok.encode('{"a":"x', add_special_tokens=False)
    draft = continuation_tokens(tok, context, '","b":"y')
    first = SplitPreferences(tok)
    first.remember(context, draft)
    first.observe(context + tok.encode('",', add_special_tokens=False) + [0])  # the target wrote '",' then '"'
    memory = first.memory()
    assert memory.by_token and memory.by_context

    later = SplitPreferences(tok)
    later.start(tok, context)
    assert later.resplit(context, draft) == draft  # a fresh request knows nothing
    later.recall(memory)
    assert names(tok, later.resplit(context, draft))[:2] == ['",', '"']
    later.remember(context, later.resplit(context, draft))
    later.observe(context + draft[:2])  # this request's target kept '","': its own sighting wins
    assert later.resplit(context, draft) == draft
    later.recall(memory)  # recalled again under what it learned: still its own
    assert later.resplit(context, draft) == draft
    assert first.memory() == memory  # memory is a snapshot; recalling it changed nothing in the first


def test_split_memory_keeps_the_latest_entries(smol_tokenizer, monkeypatch):
    """At most MEMORY_ENTRIES of each table are handed on: the ones seen last (a sighting again is a new one)."""
    monkeypatch.setattr(text_module, "MEMORY_ENTRIES", 3)
    splits = SplitPreferences(smol_tokenizer)
    for canonical in (10, 11, 12, 13):
        splits._note(1, canonical, canonical + 100)
    splits._note(1, 10, 110)  # seen again: now the latest
    memory = splits.memory()
    assert [c for c, _ in memory.by_token] == [12, 13, 10]
    assert [key for key, _ in memory.by_context] == [(1, 12), (1, 13), (1, 10)]
