"""DotTree: keys, ordering, mutation, views and (de)serialisation (reference 1.1 and 6.3)."""

import pytest

from popxl_addons.dot_tree import DotTree, sanitise, to_mapping


class Tree(DotTree):
    """A subclass, to check that class-preserving operations keep it."""


def _nested():
    return DotTree.from_dict({"a.b": 1, "a.c": 2, "d": 3})


# Keys ------------------------------------------------------------------------------------


def test_sanitise_replaces_non_word_characters_and_a_leading_digit():
    assert sanitise("fc1/weight") == "fc1_weight"
    assert sanitise("a.b-c d") == "a_b_c_d"
    assert sanitise("0abc") == "_0abc"
    assert sanitise("ok_name") == "ok_name"


def test_int_keys_are_stored_as_strings_and_read_back_by_int_or_string():
    t = DotTree()
    t.insert(0, "zero")
    t.insert("1", "one")
    assert t.keys() == ["0", "1"]
    assert t[0] == t["0"] == "zero"
    assert t[1] == t.get("1") == "one"
    assert 0 in t and "1" in t and 2 not in t


def test_negative_int_keys_count_back_from_the_largest_numeric_key_without_compacting_gaps():
    t = DotTree()
    for k, v in [(0, "a"), (1, "b"), (3, "d")]:
        t.insert(k, v)
    t.insert("name", "n")
    assert t[-1] == "d"
    assert t[-3] == "b"
    assert t[-4] == "a"
    with pytest.raises(KeyError):
        t[-2]  # the gap at 2 is not compacted
    with pytest.raises(KeyError):
        t[-5]  # before the first numeric key


def test_negative_int_key_without_numeric_keys_raises_key_error():
    with pytest.raises(KeyError):
        DotTree(a=1)[-1]


def test_negative_int_keys_cannot_be_inserted():
    with pytest.raises(ValueError, match="-1"):
        DotTree().insert(-1, "x")


@pytest.mark.parametrize("key", ["", "1a", "a b", ".a", "a.", "a..b", "a-b", "a.1b"])
def test_invalid_keys_are_rejected(key):
    t = DotTree()
    with pytest.raises(ValueError, match="not a valid python identifier"):
        t.insert(key, 1)
    assert t.to_dict() == {}


def test_invalid_key_message_names_the_segment():
    with pytest.raises(ValueError, match="'a-b' is not a valid python identifier"):
        DotTree().insert("a-b", 1)


def test_keys_that_are_identifiers_or_digits_are_accepted():
    t = DotTree()
    t.insert("_private", 1)
    t.insert("layer0.12.w", 2)
    assert t.to_dict() == {"_private": 1, "layer0.12.w": 2}
    assert t.layer0[12].w == 2


def test_non_string_keys_are_a_type_error():
    with pytest.raises(TypeError):
        DotTree().insert(1.5, 1)
    assert 1.5 not in DotTree(a=1)


# Access ----------------------------------------------------------------------------------


def test_kwargs_constructor_inserts_in_order_and_accepts_subtrees():
    t = DotTree(layer1=DotTree(w=1), layer0=DotTree(w=0), x=5)
    assert t.keys_flat() == ["layer1.w", "layer0.w", "x"]
    assert t.layer1.w == 1 and t["layer0.w"] == 0


def test_dotted_get_walks_into_subtrees_and_contains_accepts_intermediate_nodes():
    t = DotTree.from_dict({"foo.bar.hee": 1})
    assert t.get("foo.bar.hee") == 1
    assert isinstance(t["foo.bar"], DotTree)
    assert "foo" in t and "foo.bar" in t and "foo.bar.hee" in t
    assert "foo.baz" not in t and "foo.bar.hee.x" not in t


def test_missing_key_error_lists_the_available_keys():
    t = DotTree(alpha=1, beta=2)
    with pytest.raises(KeyError, match="alpha"):
        t["gamma"]


def test_getattr_error_is_an_attribute_error_listing_keys():
    t = DotTree(alpha=1)
    with pytest.raises(AttributeError, match=r"No attribute 'gamma'. Available Keys: .*alpha"):
        _ = t.gamma
    assert not hasattr(t, "gamma")
    assert getattr(t, "gamma", "default") == "default"


def test_keys_that_collide_with_methods_are_reachable_only_by_item_access():
    t = DotTree()
    t.insert("keys", 1)
    t.insert("copy", 2)
    assert callable(t.keys) and callable(t.copy)
    assert t["keys"] == 1 and t["copy"] == 2


def test_dotted_get_requires_the_same_subclass_but_attribute_chaining_does_not():
    t = Tree()
    t.insert("plain", DotTree(w=1))
    assert t.plain.w == 1
    with pytest.raises(KeyError):
        t.get("plain.w")


def test_dotted_get_through_a_leaf_raises_key_error():
    with pytest.raises(KeyError):
        DotTree(a=1).get("a.b")


# Mutation --------------------------------------------------------------------------------


def test_insert_existing_key_without_overwrite_raises_and_with_overwrite_replaces():
    t = DotTree(a=1)
    with pytest.raises(ValueError, match="'a' already exists"):
        t.insert("a", 2)
    assert t.a == 1
    t.insert("a", 2, overwrite=True)
    assert t.a == 2


def test_dotted_insert_into_an_existing_subtree_needs_overwrite_and_then_merges():
    t = _nested()
    with pytest.raises(ValueError, match="'a' already exists"):
        t.insert("a.e", 4)
    assert t.to_dict() == {"a.b": 1, "a.c": 2, "d": 3}
    t.insert("a.e", 4, overwrite=True)
    assert t.to_dict() == {"a.b": 1, "a.c": 2, "a.e": 4, "d": 3}


def test_overwriting_merge_is_atomic():
    t = _nested()
    subtree = t.a
    with pytest.raises(ValueError):
        t.insert("a.b.x-y", 5, overwrite=True)  # fails deep inside the copy
    assert t.to_dict() == {"a.b": 1, "a.c": 2, "d": 3}
    assert t.a is subtree and subtree.to_dict() == {"b": 1, "c": 2}


def test_overwriting_dotted_insert_does_not_mutate_the_original_subtree_object():
    t = _nested()
    subtree = t.a
    t.insert("a.e", 4, overwrite=True)
    assert subtree.to_dict() == {"b": 1, "c": 2}
    assert t.a is not subtree


def test_dotted_insert_with_overwrite_through_a_leaf_replaces_the_leaf_with_a_subtree():
    t = DotTree(a=1)
    t.insert("a.b", 2, overwrite=True)
    assert t.to_dict() == {"a.b": 2}
    assert isinstance(t.a, DotTree)


def test_nested_inserts_create_nodes_of_the_same_class():
    t = Tree()
    t.insert("x.y.z", 1)
    assert type(t.x) is Tree and type(t.x.y) is Tree


def test_update_without_overwrite_raises_on_any_shared_top_level_key_and_changes_nothing():
    t = DotTree(a=DotTree(b=1), e=5)
    with pytest.raises(ValueError, match="'a' already exists"):
        t.update(DotTree.from_dict({"z": 0, "a.d": 4}))
    assert t.to_dict() == {"a.b": 1, "e": 5}


def test_update_with_overwrite_replaces_clashing_subtrees_wholesale():
    t = DotTree.from_dict({"a.b": 1, "a.c": 2, "e": 5})
    t.update(DotTree.from_dict({"a.d": 4, "f": 6}), overwrite=True)
    assert t.to_dict() == {"a.d": 4, "e": 5, "f": 6}


def test_update_copies_the_incoming_subtrees():
    other = DotTree.from_dict({"a.b": 1})
    t = DotTree()
    t.update(other)
    t.a.insert("c", 2)
    assert other.to_dict() == {"a.b": 1}


def test_pop_returns_leaves_and_subtrees_and_leaves_empty_parents():
    t = DotTree.from_dict({"a.b": 1, "a.c.d": 2, "e": 3})
    assert t.pop("a.b") == 1
    sub = t.pop("a.c")
    assert isinstance(sub, DotTree) and sub.to_dict() == {"d": 2}
    assert t.keys() == ["a", "e"] and t.a.keys() == []
    assert t.pop("e") == 3
    with pytest.raises(KeyError):
        t.pop("missing")
    with pytest.raises(KeyError):
        t.pop("a.missing")


def test_copy_is_structural_and_shares_leaves():
    leaf = [1]
    t = Tree.from_dict({"a.b": leaf, "c": 2})
    c = t.copy()
    assert type(c) is Tree and type(c.a) is Tree
    assert c.a is not t.a
    assert c.a.b is leaf
    c.insert("a.new", 3, overwrite=True)
    c.a.insert("z", 9)
    assert t.to_dict() == {"a.b": leaf, "c": 2}


def test_clear_removes_leaves_but_keeps_empty_subtrees():
    t = DotTree.from_dict({"a.b": 1, "a.c.d": 2, "e": 3})
    sub = t.a
    t._clear()
    assert t.to_dict() == {}
    assert t.keys() == ["a"]
    assert t.a is sub and sub.keys() == ["c"]
    assert t.len_flat() == 0 and t.len() == 1


# Views -----------------------------------------------------------------------------------


def test_to_dict_is_depth_first_in_insertion_order_and_skips_empty_subtrees():
    t = DotTree()
    t.insert("z", 1)
    t.insert("m.b", 2)
    t.insert("empty", DotTree())
    t.insert("m.a", 3, overwrite=True)
    t.insert("a", 4)
    assert list(t.to_dict().items()) == [("z", 1), ("m.b", 2), ("m.a", 3), ("a", 4)]
    assert t.keys_flat() == ["z", "m.b", "m.a", "a"]
    assert t.values_flat() == [1, 2, 3, 4]
    assert t.len_flat() == 4
    assert t.keys() == ["z", "m", "empty", "a"]
    assert t.len() == len(t) == 4
    assert t.values()[0] == 1 and isinstance(t.values()[1], DotTree)


def test_map_applies_to_every_leaf_keeps_order_and_class():
    t = Tree.from_dict({"b.y": 1, "a": 2, "b.x": 3})
    doubled = t.map(lambda v: v * 2)
    assert type(doubled) is Tree and type(doubled.b) is Tree
    assert list(doubled.to_dict().items()) == [("b.y", 2), ("b.x", 6), ("a", 4)]
    assert t.to_dict() == {"b.y": 1, "a": 2, "b.x": 3}


def test_filter_keys_accepts_leaves_and_subtrees_and_merges_siblings():
    t = DotTree.from_dict({"a.b": 1, "a.c": 2, "a.d": 5, "e.f": 3, "g": 4})
    f = t.filter_keys(["a.b", "a.d", "e", "g"])
    assert f.to_dict() == {"a.b": 1, "a.d": 5, "e.f": 3, "g": 4}
    assert t.to_dict() == {"a.b": 1, "a.c": 2, "a.d": 5, "e.f": 3, "g": 4}


def test_filter_keys_does_not_share_subtrees_with_the_source():
    t = DotTree.from_dict({"e.f": 3})
    f = t.filter_keys(["e"])
    f.e.insert("new", 1)
    assert t.to_dict() == {"e.f": 3}


def test_filter_keys_rejects_duplicates_and_missing_keys():
    t = DotTree.from_dict({"a.b": 1})
    with pytest.raises(ValueError, match="a.b"):
        t.filter_keys(["a.b", "a.b"])
    with pytest.raises(KeyError):
        t.filter_keys(["nope"])


def test_repr_shows_the_flat_dict():
    assert repr(DotTree.from_dict({"a.b": 1, "c": 2})) == "{'a.b': 1, 'c': 2}"
    assert repr(DotTree()) == "{}"


# Serialisation ---------------------------------------------------------------------------


def test_from_dict_builds_nested_nodes_in_order_with_int_keys():
    t = Tree.from_dict({"layers.1.w": "w1", 0: "zero", "layers.0.w": "w0"})
    assert t.keys() == ["layers", "0"]
    assert t.layers.keys() == ["1", "0"]
    assert t.layers[0].w == "w0" and t[0] == "zero"
    assert type(t.layers[1]) is Tree


def test_from_dict_accepts_subtree_values():
    t = DotTree.from_dict({"outer": DotTree(w=1)})
    assert t.to_dict() == {"outer.w": 1}


def test_from_dict_with_a_key_that_collides_with_a_method_name_works():
    t = DotTree.from_dict({"keys.x": 1, "keys.y": 2})
    assert t["keys"].to_dict() == {"x": 1, "y": 2}
    assert t.to_dict() == {"keys.x": 1, "keys.y": 2}


def test_from_dict_rejects_a_key_below_a_leaf_and_invalid_segments():
    with pytest.raises(ValueError):
        DotTree.from_dict({"a": 1, "a.b": 2})
    with pytest.raises(ValueError):
        DotTree.from_dict({"a-b.c": 2})


def test_unpack_sorts_by_flat_key_and_returns_a_zip():
    t = DotTree.from_dict({"b": 2, "a.z": 1, "a.b": 0, "10": 10, "9": 9})
    packed = t.unpack()
    assert isinstance(packed, zip)
    names, values = packed
    assert names == ("10", "9", "a.b", "a.z", "b")  # a plain string sort
    assert values == (10, 9, 0, 1, 2)


def test_unpack_of_an_empty_tree_is_two_empty_lists():
    assert DotTree().unpack() == ([], [])
    names, values = DotTree().unpack()
    assert names == [] and values == []


def test_pack_undoes_unpack_and_drops_extra_elements():
    t = Tree.from_dict({"b": 2, "a.z": 1})
    names, values = t.unpack()
    again = Tree.pack(names, values)
    assert type(again) is Tree
    assert again.to_dict() == {"a.z": 1, "b": 2}
    assert Tree.pack(["x", "y", "z"], [1, 2]).to_dict() == {"x": 1, "y": 2}
    assert Tree.pack(["x"], [1, 2]).to_dict() == {"x": 1}


def test_to_mapping_connects_shared_flat_keys_and_ignores_the_rest():
    keys = DotTree.from_dict({"a.b": "K1", "c": "K2", "only_here": "K3"})
    values = DotTree.from_dict({"c": "V2", "a.b": "V1", "only_there": "V4"})
    assert to_mapping(keys, values) == {"K1": "V1", "K2": "V2"}
    assert keys.to_mapping(values) == {"K1": "V1", "K2": "V2"}
    assert to_mapping(keys, DotTree()) == {}
