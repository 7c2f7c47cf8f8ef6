"""grammars.schema_walk.schema_nodes: the one walk over a schema's objects, following refs where asked."""

from __future__ import annotations

from grammars.ref_cycles import same_value_cycle
from grammars.schema_walk import schema_nodes


def _ids(nodes):
    return [id(node) for node in nodes]


def test_a_plain_walk_yields_each_place_of_the_tree_and_follows_no_ref():
    shared = {"type": "string"}
    schema = {"properties": {"a": shared, "b": shared}, "$ref": "#/$defs/x", "$defs": {"x": {"type": "null"}}}
    nodes = list(schema_nodes(schema))
    assert _ids(nodes).count(id(shared)) == 2  # the same object at two places: met at both
    assert {"type": "null"} in nodes  # $defs are walked like any subschema


def test_following_refs_goes_into_their_targets_once_and_skips_what_it_is_told():
    a: dict = {"$ref": "#/$defs/b"}
    b: dict = {"$ref": "#/$defs/a", "properties": {"x": {"type": "string"}}}
    unused = {"type": "null"}
    schema = {"$defs": {"a": a, "b": b, "unused": unused}, "$ref": "#/$defs/a"}
    follow = {id(schema): a, id(a): b, id(b): a}  # a cycle: a -> b -> a
    nodes = list(schema_nodes(schema, follow=follow, skip=("$defs",)))
    assert _ids(nodes) == [id(schema), id(a), id(b), id(b["properties"]["x"])]
    assert all(node is not unused for node in nodes)  # only reached through the skipped $defs
    assert _ids(schema_nodes(schema)) == [id(schema), id(a), id(b), id(b["properties"]["x"]), id(unused)]


def test_the_ref_cycle_check_walks_only_what_the_root_reaches():
    cycle = {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}
    assert same_value_cycle({"$defs": cycle, "type": "string"}) is None  # defined, never referred to
    assert same_value_cycle({"$defs": cycle, "$ref": "#/$defs/a"}) == ["#/$defs/a", "#/$defs/b", "#/$defs/a"]
