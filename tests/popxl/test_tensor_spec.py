"""``TensorSpec``: a Mapping of shape, dtype and meta-shape."""

from collections.abc import Mapping

import popxl


def test_tensor_spec_is_a_mapping():
    spec = popxl.TensorSpec((1, 2), popxl.int32)
    assert isinstance(spec, Mapping)
    assert list(spec) == ["shape", "dtype", "meta_shape"]
    assert len(spec) == 3
    assert dict(spec) == {"shape": (1, 2), "dtype": popxl.int32, "meta_shape": ()}
    assert spec.to_dict() == dict(spec)
    assert spec.to_tuple() == ((1, 2), popxl.int32, ())
    assert spec["shape"] == spec.shape == (1, 2)


def test_tensor_spec_repr_hash_and_equality():
    spec = popxl.TensorSpec([1, 2], popxl.int32, [4, 2])
    assert repr(spec) == "TensorSpec(shape=(1, 2), dtype=popxl.dtypes.int32, meta_shape=(4, 2))"
    same = popxl.TensorSpec((1, 2), popxl.int32, (4, 2))
    assert spec == same and hash(spec) == hash(same)
    assert spec != popxl.TensorSpec((1, 2), popxl.float32, (4, 2))


def test_tensor_spec_unpacks_into_graph_input():
    ir = popxl.Ir()
    spec = popxl.TensorSpec((3,), popxl.float16)
    with ir.create_empty_graph():
        t = popxl.graph_input(**spec, name="w")
    assert t.spec == spec and t.name == "w"
