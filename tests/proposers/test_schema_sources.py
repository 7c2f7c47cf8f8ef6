"""The schema drafter's parts on tiny inputs: the document model and each candidate source.

One token per byte (``BYTE_TOKENS``), so no tokenizer is needed; the examples
are the ones in the docstrings of :mod:`proposers.schema_sources`.
"""

from __future__ import annotations

import pytest

from proposers.json_cursor import Cursor, advance, value_nodes
from proposers.json_document import BYTE_TOKENS, Document, Prompt
from proposers.schema_nav import SchemaIndex
from proposers.schema_plan import ranked
from proposers.schema_sources import (
    Candidate,
    candidates,
    document_continuation,
    follow_length,
    from_history,
    keys,
    labels,
    prompt_continuation,
    prompt_number,
    prompt_number_start,
    prompt_string_start,
    schema_values,
    separators,
    sibling_value,
    values,
)
from proposers.text import token_sources

S, INT = {"type": "string"}, {"type": "integer"}


def obj(props, required=()):
    return {"type": "object", "properties": props, "required": list(required)}


def doc_of(text: bytes, schema=None, prompt: bytes = b"") -> Document:
    doc = Document(SchemaIndex(schema), Prompt.from_text(prompt), BYTE_TOKENS)
    doc.feed(list(text))
    return doc


def snapshot(doc: Document):
    values = {k: list(v) for k, v in doc.values.items() if v}
    points = {k: list(v) for k, v in doc.points.items() if v}
    endings = {k: +v for k, v in doc.endings.items() if +v}
    return bytes(doc.text), doc.cursor, values, points, endings, doc.prompt_cursor


# -- the document model ----------------------------------------------------------------


def test_document_records_values_and_follows_the_prompt():
    doc = doc_of(b'{"name":"Ada","age":36}', prompt=b"Ada is 36.")
    assert doc.values[(b"name",)] == [b'"Ada"'] and doc.values[(b"age",)] == [b"36"]
    assert doc.prompt_cursor == 9  # after the 36 it copied


@pytest.mark.parametrize("cut", range(0, 40))
def test_truncate_then_feed_again_leaves_no_trace(cut):
    """Every cut, including one right before the comma that ends a number, undoes exactly what came after."""
    text = b'{"a":12,"b":"Ada Lovelace","c":[1,2],"d":3}'
    once = doc_of(text, prompt=b"Ada Lovelace, 12 and 3")
    again = doc_of(text, prompt=b"Ada Lovelace, 12 and 3")
    again.truncate(cut)
    partial = doc_of(text[:cut], prompt=b"Ada Lovelace, 12 and 3")
    assert snapshot(again) == snapshot(partial)
    again.feed(list(text[cut:]))
    assert snapshot(again) == snapshot(once)


def test_prompt_from_ids_escapes_between_special_tokens():
    table = list(BYTE_TOKENS) + [b"<s>"]
    ids = list(b'system: quote "x"') + [256] + list(b"a user message that is long enough to count")
    prompt = Prompt.from_ids(ids, table, frozenset({256}))
    assert prompt.text.startswith(b'system: quote \\"x\\"a user')  # escaped as inside a JSON string
    assert prompt.start == len(b'system: quote \\"x\\"')  # copying starts at the user's message


# -- the candidate sources -------------------------------------------------------------


def test_candidates_ask_the_sources_that_fit_the_position():
    doc = doc_of(b'{"a":"x",', obj({"a": S, "b": S}))
    assert candidates(doc.cursor, doc, b"", doc.prompt_cursor) == [Candidate("schema", b'"b":')]


def test_follow_length_stops_at_the_next_scalar_slot():
    assert follow_length(advance(Cursor(), b'[{"a":1},{'), b'"a":1},{"a":2}]') == 4


def test_history_repeats_what_followed_the_same_point():
    doc = doc_of(b'[{"a":1,"b":2},{')
    assert from_history(doc.cursor, doc, b"") == [Candidate("history", b'"a":')]
    doc = doc_of(b'[{"a":1,"b":2},{"a":1,"b":')  # a value that repeats at its path, but not in this array
    assert [c.source for c in from_history(doc.cursor, doc, b"")] == ["history_value"]


def test_keys_stop_at_the_first_required_one():
    schema = obj({"a": S, "b": S, "c": S}, ["b"])
    assert keys(doc_of(b"{", schema).cursor, SchemaIndex(schema)) == [
        Candidate("schema", b'"a":'),
        Candidate("schema", b'"b":', 0.5),
    ]
    assert keys(doc_of(b'{"b', schema).cursor, SchemaIndex(schema)) == [Candidate("schema", b'":', 0.5)]  # typed


def test_separators_follow_the_required_keys_and_array_bounds():
    schema = obj({"a": S, "b": S}, ["a", "b"])
    assert separators(doc_of(b'{"a":"x"', schema).cursor, SchemaIndex(schema)) == [Candidate("schema", b",")]
    assert separators(doc_of(b'{"a":"x","b":"y"', schema).cursor, SchemaIndex(schema)) == [Candidate("schema", b"}")]
    array = {"type": "array", "items": S, "minItems": 2, "maxItems": 2}
    assert separators(doc_of(b'["x"', array).cursor, SchemaIndex(array)) == [Candidate("schema", b",")]
    assert separators(doc_of(b'["x","y"', array).cursor, SchemaIndex(array)) == [Candidate("schema", b"]")]


def test_values_start_after_a_label_and_open_the_only_type():
    doc = doc_of(b'{"name":', obj({"name": S}), b"Name: Ada")
    assert values(doc.cursor, doc, doc.prompt_cursor) == [
        Candidate("prompt_label", b'"Ada"', 1.0, 9, True),
        Candidate("schema", b'"', 0.05, certain=True),
    ]


def test_sibling_value_copies_the_previous_member_of_the_same_type():
    doc = doc_of(b'{"s":10,"d":', obj({"s": INT, "d": INT}))
    types = doc.schema.types(value_nodes(doc.cursor, doc.schema))
    assert sibling_value(doc.cursor, doc, types, b"") == [Candidate("sibling", b"10")]
    assert sibling_value(doc.cursor, doc, types, b"1") == [Candidate("sibling", b"0")]
    assert sibling_value(doc.cursor, doc, types, b"2") == []  # does not fit what was typed
    assert sibling_value(doc.cursor, doc, {"string"}, b"") == []  # another type


def test_schema_values_rank_guesses_by_the_prompt_and_complete_the_only_one_left():
    schema = SchemaIndex({"type": "string", "enum": ["celsius", "fahrenheit"]})
    nodes = value_nodes(Cursor(), schema)
    prompt = Prompt.from_text(b"in Fahrenheit")
    guesses = schema_values(schema, nodes, {"string"}, b"", prompt, 0)
    assert [(c.source, c.data) for c in guesses] == [("schema_guess", b'"celsius"'), ("schema_guess", b'"fahrenheit"')]
    assert guesses[1].weight > guesses[0].weight  # the prompt mentions it
    assert schema_values(schema, nodes, {"string"}, b'"c', prompt, 0) == [Candidate("schema", b'elsius"')]


def test_prompt_continuation_finishes_a_started_string():
    prompt = Prompt.from_text(b"Order from Priya Raman (email: p@x.io).")
    assert prompt_continuation(b"Pri", prompt, 0) == [Candidate("prompt", b'ya Raman"', 1.0, 22, True)]
    assert prompt_continuation(b"Zed", prompt, 0) == []


def test_document_continuation_finishes_an_earlier_value():
    doc = doc_of(b'["Desk Lamp","De')
    assert document_continuation(doc.cursor, doc) == [Candidate("document", b'sk Lamp"', 1.0, -1, True)]


def test_prompt_string_start_after_a_label_and_after_the_latest_copy():
    prompt = Prompt.from_text(b"Ada. Email: ada@x.io")
    assert prompt_string_start("email", prompt, 0, (), False) == [
        Candidate("prompt_label", b'"ada@x.io"', 1.0, 20, True)
    ]
    nxt = prompt_string_start(None, Prompt.from_text(b"Ada, Bob"), 3, (), True)
    assert nxt == [Candidate("prompt_next", b'Bob"', 1.0, 8, True)]


def test_prompt_numbers_finish_and_start_values():
    assert prompt_number(b"12", Prompt.from_text(b"qty 125, 12"), 0) == ([Candidate("prompt", b"5", 1.0, 7)], False)
    assert prompt_number(b"12", Prompt.from_text(b"qty 12"), 0) == ([], True)
    prompt = Prompt.from_text(b"Ada, age: 36, 1.70 m")
    assert prompt_number_start("age", prompt, 0, True) == [Candidate("prompt_label", b"36", 1.0, 12)]
    assert [c.data for c in prompt_number_start(None, prompt, 13, False)] == [b"1.70", b"36"]  # next, near


def test_labels_match_key_spellings():
    assert labels("due_date", Prompt.from_text(b"Due date: May 3"), 0) == [10]
    assert labels(None, Prompt.from_text(b"Due date: May 3"), 0) == []


# -- the planner's ranking and the source of each token ------------------------------------


def test_ranked_keeps_certain_candidates_and_drops_weak_ones():
    cands = [Candidate("a", b"x", 0.05), Candidate("b", b"y"), Candidate("c", b"z", 0.05, certain=True)]
    assert ranked(cands, lambda source: 0.5, 6, 0.05) == [cands[1], cands[2]]
    assert ranked(cands, lambda source: 0.5, 1, 0.05) == [cands[1]]


def test_token_sources_name_the_segment_holding_each_tokens_first_byte():
    table = list(BYTE_TOKENS) + [b"ab"]
    assert token_sources(list(b"abc"), table, [("key", 1), ("value", 3)]) == ["key", "value", "value"]
    assert token_sources([256, ord("c")], table, [("x", 1), ("y", 3)]) == ["x", "y"]  # 'ab' starts in x
    assert token_sources([1, 2], table, [], "default") == ["default", "default"]


def test_prompt_continuation_matches_the_longest_suffix_by_bisection():
    """The bisection over word starts finds what trying every suffix, longest first, finds."""
    import random

    from proposers.prompt_spans import find_near
    from proposers.schema_sources import _find_typed

    def every_suffix(prompt, typed, cursor):  # the plain reading of the rule
        for used in [typed] + [typed[i:] for i in range(1, len(typed) - 2) if typed[i - 1 : i] == b" "]:
            pos = find_near(prompt.text, used, cursor)
            if pos < 0:
                pos = find_near(prompt.lower, used.lower(), cursor)
            if pos >= 0:
                return pos, used
        return -1, b""

    rng = random.Random(7)
    words = [b"ab", b"Ab", b"cd", b"Cd", b"e", b"xyz", b"ab cd", b" ", b"q"]
    found = 0
    for _ in range(3000):
        prompt = Prompt.from_text(b" ".join(rng.choice(words) for _ in range(rng.randint(0, 12))))
        typed = b" ".join(rng.choice(words) for _ in range(rng.randint(1, 8)))
        cursor = rng.randint(0, len(prompt.text))
        expected = every_suffix(prompt, typed, cursor)
        assert _find_typed(prompt, typed, cursor) == expected, (prompt.text, typed, cursor)
        found += expected[0] >= 0
    assert 300 < found < 2700  # both outcomes were exercised
    # A paraphrased start: the last words are found; a long string the prompt lacks is not.
    prompt = Prompt.from_text(b"Ship to Priya Raman at 4 Elm St.")
    assert _find_typed(prompt, b"Ms Priya Ram", 0) == (8, b"Priya Ram")
    assert _find_typed(prompt, b"word " * 200 + b"zzz", 0) == (-1, b"")
