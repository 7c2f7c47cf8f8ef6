"""The schema n-gram's building blocks: JSON cursor, schema navigation, prompt spans."""

from __future__ import annotations

import json

import pytest

from proposers.json_cursor import (
    AFTER,
    ARR_NEXT,
    DONE,
    ERROR,
    KEY,
    OBJ_FIRST,
    SCALAR,
    STRING,
    VALUE,
    Cursor,
    advance,
    end_scalar,
    signature,
    value_nodes,
    value_path,
)
from proposers.prompt_spans import (
    delimiters,
    escape_text,
    find_near,
    label_values,
    label_variants,
    number_spans,
    skip_separators,
    span_end,
)
from proposers.schema_nav import SchemaIndex, json_text

# -- cursor -------------------------------------------------------------------


def test_cursor_worked_example():
    c = advance(Cursor(), b'{"a":[1,')
    assert c.mode == ARR_NEXT
    assert value_path(c) == (b"a", 1)
    assert signature(c) == ("V", (b"a", None))


@pytest.mark.parametrize(
    "text, mode, path",
    [
        (b"", VALUE, ()),
        (b"{", OBJ_FIRST, None),
        (b'{"ke', KEY, None),
        (b'{"key":"va', STRING, (b"key",)),
        (b'{"key":"a\\"b', STRING, (b"key",)),  # escaped quote does not end the string
        (b'{"key":12', SCALAR, (b"key",)),
        (b'{"key":12,"b":[true', SCALAR, (b"b", 0)),
        (b'{"key":"x"', AFTER, None),
        (b'{"a": [ 1 , 2 ] }', DONE, None),  # whitespace is skipped
        (b'{"a":1}}', ERROR, None),
        (b"[1,]", ERROR, None),
    ],
)
def test_cursor_modes(text, mode, path):
    c = advance(Cursor(), text)
    assert c.mode == mode
    if path is not None:
        assert value_path(c) == path


def test_cursor_is_immutable_and_incremental():
    doc = b'{"a":[{"b":"x,y"},{"b":null}],"c":-1.5e3}'
    whole = advance(Cursor(), doc)
    step = Cursor()
    for i in range(len(doc)):
        before = step
        step = advance(step, doc[i : i + 1])
        assert advance(before, doc[i : i + 1]) == step  # same input, same state: nothing mutated
    assert step == whole and whole.mode == DONE and whole.offset == len(doc)


def test_events_report_points_and_values():
    events = []
    advance(Cursor(), b'{"a":[1,{"b":"x"}]}', on_event=lambda kind, c, *span: events.append((kind, signature(c), span)))
    values = [(span, sig) for kind, sig, span in events if kind == "value"]
    assert [span for span, _ in values] == [(6, 7), (13, 16), (8, 17), (5, 18), (0, 19)]
    points = [sig for kind, sig, _ in events if kind == "point"]
    assert ("K", (b"a", None), None) in points  # start of the object inside the array
    assert ("A", (b"a", None), b"b") in points  # after its "b" value


def test_advance_takes_string_runs_as_byte_by_byte():
    """Plain runs inside keys and strings are taken at once: same cursors and events as one byte at a time."""
    import random

    schema = SchemaIndex({"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}})
    rng = random.Random(3)
    pieces = [
        b'{"',
        b'k\\"ey',
        b'":["',
        b"plain words",
        b"\\\\",
        b'\\"',
        b"\\u00e9",
        b'","',
        b"\xc3\xa9",
        b'"],"',
        b"x",
    ]
    for _ in range(300):
        text = b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        whole_events: list[tuple[object, ...]] = []
        whole = advance(Cursor(), text, schema, lambda *event, out=whole_events: out.append(event))
        step, step_events = Cursor(), []
        for i in range(len(text)):
            step = advance(step, text[i : i + 1], schema, lambda *event, out=step_events: out.append(event))
        assert whole == step and whole_events == step_events, text
        cut = rng.randint(0, len(text))  # any split point: the second part may start inside a run
        assert advance(advance(Cursor(), text[:cut], schema), text[cut:], schema) == whole, (text, cut)


def test_end_scalar_answers_what_if_the_number_ended():
    c = advance(Cursor(), b'{"a":12')
    ended = end_scalar(c)
    assert ended.mode == AFTER and ended.stack[-1].completed == 1
    assert end_scalar(advance(Cursor(), b'{"a":"1')).mode == STRING  # not a scalar: unchanged


# -- schema navigation ----------------------------------------------------------

TOOLS = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "name": {"const": "get_weather"},
                "arguments": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        },
        {"type": "object", "properties": {"name": {"const": "send_mail"}, "arguments": {"$ref": "#/$defs/mail"}}},
    ],
    "$defs": {
        "mail": {
            "type": "object",
            "properties": {
                "to": {"type": "string", "format": "email"},
                "urgent": {"type": "boolean", "default": False},
            },
        }
    },
}


def test_anyof_branches_are_told_apart_by_const_values():
    schema = SchemaIndex(TOOLS)
    c = advance(Cursor(), b'{"name":"send_mail","arguments":{', schema)
    top = c.stack[-1]
    assert schema.property_names(top.nodes) == [b"to", b"urgent"]  # through the local $ref
    c = advance(Cursor(), b'{"name":"get_weather","arguments":{', schema)
    assert schema.property_names(c.stack[-1].nodes) == [b"city"]


def test_value_texts_and_types():
    schema = SchemaIndex(TOOLS)
    c = advance(Cursor(), b'{"name":"send_mail","arguments":{"to":"a@b.c","urgent":', schema)
    nodes = value_nodes(c, schema)
    assert schema.types(nodes) == {"boolean"}
    assert schema.value_texts(nodes) == [("default", b"false")]
    root = advance(Cursor(), b'{"name":', schema)
    assert [t for _, t in schema.value_texts(value_nodes(root, schema))] == [b'"get_weather"', b'"send_mail"']
    assert schema.fixed_values(value_nodes(root, schema)) == {b'"get_weather"', b'"send_mail"'}


def test_arrays_prefix_items_and_bounds():
    schema = SchemaIndex(
        {
            "type": "array",
            "prefixItems": [{"type": "string"}],
            "items": {"type": "integer"},
            "minItems": 2,
            "maxItems": 4,
        }
    )
    assert schema.types(schema.array_child(schema.root, 0)) == {"string"}
    assert schema.types(schema.array_child(schema.root, 3)) == {"integer", "number"}
    assert schema.array_bounds(schema.root) == (2, 4)


def test_recursive_refs_terminate():
    node = {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}
    schema = SchemaIndex({"$ref": "#/$defs/node", "$defs": {"node": node}})
    assert schema.types(schema.root) == {"null"}


def test_schema_index_memo_answers_for_the_very_same_nodes():
    """A memoized lookup is keyed by node ids and keeps its nodes alive: a new node never gets an old answer."""
    schema = SchemaIndex(TOOLS)
    for i in range(200):  # fresh, short-lived nodes: their ids would be reused if the memo did not hold them
        kind = ("string", "integer", "boolean")[i % 3]
        nodes = ({"type": kind, "enum": [i]},)
        expected = {kind, "number"} if kind == "integer" else {kind}
        assert schema.types(nodes) == expected
        assert schema.fixed_values(nodes) == {json_text(i)}
        assert schema.object_child(({"properties": {f"p{i}": {"const": i}}},), f"p{i}".encode()) == ({"const": i},)
    fresh = SchemaIndex(TOOLS)
    c = advance(Cursor(), b'{"name":"send_mail","arguments":{', schema)
    assert schema.property_names(c.stack[-1].nodes) == fresh.property_names(c.stack[-1].nodes) == [b"to", b"urgent"]
    names = schema.property_names(c.stack[-1].nodes)
    names.append(b"changed")  # answers are copies: changing one changes no later answer
    assert schema.property_names(c.stack[-1].nodes) == [b"to", b"urgent"]
    assert schema.resolve(TOOLS["$defs"]["mail"]) is schema.resolve(TOOLS["$defs"]["mail"])


def test_schema_index_memo_is_bounded(monkeypatch):
    import proposers.schema_nav as nav

    monkeypatch.setattr(nav, "_MEMO_SIZE", 8)
    schema = SchemaIndex({"type": "object", "additionalProperties": {"type": "string"}})
    for i in range(50):
        assert schema.types(schema.object_child(schema.root, f"k{i}".encode())) == {"string"}
        assert len(schema._memo_table) <= 8


def test_no_schema_means_no_knowledge():
    schema = SchemaIndex(None)
    assert schema.root == () and schema.property_names(()) == [] and schema.types(()) == set()
    assert json_text({"a": [1, "é"]}) == '{"a":[1,"é"]}'.encode()


# -- prompt spans ---------------------------------------------------------------


def test_span_end_worked_examples():
    assert span_end(b"Inkwell Print Co., 88 Quarry Lane\\nBest", 0) == (17, True)
    assert span_end(b"Tri-fold menus, 11x17: 250", 0) == (14, True)
    assert span_end(b"Tri-fold menus, 11x17: 250", 0, ignore=[b","]) == (21, True)
    long = b"word " * 60
    end, closed = span_end(long, 0, limit=50)
    assert not closed and end <= 50 and long[end : end + 1] == b" "


def test_delimiters_inside_and_at_the_end():
    assert delimiters(b"a, b. Next", 0, 4) == ({b","}, b".")
    assert delimiters(b"plain\\nnext", 0, 5) == (set(), b"\\n")


def test_find_near_prefers_ahead_of_the_cursor():
    assert find_near(b"a Bob, then Bo Diddley", b"Bo", 3) == 12
    assert find_near(b"Bob: 2 tbsp oil; 4 garlic", b"2", 16) == 5
    assert find_near(b"xyz", b"q", 0) == -1


def test_numbers_labels_and_separators():
    spans = [(8, 16, b"1200.50"), (20, 24, b"2024"), (36, 37, b"3")]
    assert number_spans(b"Total: $1,200.50 on 2024-09-03, qty 3") == spans
    assert label_variants("due_date") == [b"due date", b"due_date"]
    assert label_variants("firstName") == [b"first name", b"firstname"]
    assert label_values(b"name: ada\\nage: 3", "name") == [6]
    assert label_values(b"the name of the game", "name") == []  # a label needs ':', '=', '#' or a tab
    assert label_values(b"sales tax (6%): 28.80", "sales_tax") == [16]
    assert skip_separators(b": 250 @ $1.20", 0) == 2
    assert skip_separators(b"\\n2. While", 0, numbering=True) == 5
    assert skip_separators(b"\\n2. While", 0) == 2


def test_escape_text_matches_json():
    text = 'say "hi"\n\tback\\slash é'
    assert escape_text(text) == json.dumps(text, ensure_ascii=False)[1:-1].encode()
