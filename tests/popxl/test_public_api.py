"""Every public name of ``popxl`` and ``popxl.dtypes`` exists, with PopXL's signatures."""

import inspect

import pytest

import popxl

# Names of reference 1.1.
TOP_LEVEL = [
    "get_current_graph", "get_main_graph", "get_ir", "gcg", "gmg", "gir", "in_sequence",
    "name_scope", "ipu", "io_tiles",
    "dtype", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "half", "float8_143", "float8_152", "float16", "float", "float32", "double", "float64",
    "complex64", "complex128",
    "Graph", "Ir", "Module", "create_seeds", "ReplicaGrouping",
    "HostToDeviceStream", "DeviceToHostStream", "h2d_stream", "d2h_stream",
    "Tensor", "variable", "constant", "graph_input", "graph_output", "TensorByRef", "TensorSpec",
    "RemoteBuffer", "remote_buffer", "remote_variable", "remote_replica_sharded_variable",
    "replica_sharded_variable",
    "TensorStorage", "TensorLocation", "ReplicatedTensorSharding", "TileSet", "ExecutionContext",
    "Session",
]  # fmt: skip
SUBMODULES = [
    "ops", "dtypes", "utils", "fp8_utils", "random_seed", "testing", "context", "tensor",
    "streams", "replica_grouping", "tensorlocation", "errors", "typing_", "session", "graph",
    "ir", "module", "transforms",
]  # fmt: skip
DTYPE_NAMES = [
    "dtype", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "half", "float8_143", "float8_152", "float16", "float", "float32", "double", "float64",
    "complex64", "complex128", "np_dtype_float8_143", "np_dtype_float8_152",
]  # fmt: skip

_E = inspect.Parameter.empty
# (name, [(parameter, default), ...]) from the reference's signature list; VAR_* kinds are
# written "*name" / "**name".
SIGNATURES = {
    "get_current_graph": [],
    "get_main_graph": [],
    "get_ir": [],
    "in_sequence": [("mode", True)],
    "name_scope": [("name", _E)],
    "ipu": [("ipu", _E)],
    "io_tiles": [],
    "create_seeds": [
        ("seed", _E), ("offset", 0), ("batches_per_step", 1),
        ("gradient_accumulation_factor", 1), ("replicas", 1),
    ],
    "h2d_stream": [("shape", _E), ("dtype", _E), ("name", None)],
    "d2h_stream": [("shape", _E), ("dtype", _E), ("name", None)],
    "variable": [
        ("data", _E), ("dtype", None), ("name", None), ("downcast", True),
        ("replica_grouping", None), ("retrieval_mode", None), ("log2_scale", None),
        ("nan_on_overflow", None),
        # Keyword-only, beyond PopXL's signature: the user guide's distributed example uses it.
        ("grouping", None),
    ],
    "constant": [
        ("data", _E), ("dtype", None), ("name", None), ("downcast", True),
        ("log2_scale", None), ("nan_on_overflow", None),
    ],
    "graph_input": [
        ("shape", _E), ("dtype", _E), ("name", None), ("by_ref", False), ("meta_shape", None),
    ],
    "graph_output": [("t", _E)],
    "remote_buffer": [("tensor_shape", _E), ("tensor_dtype", _E), ("entries", 1)],
    "remote_variable": [
        ("data", _E), ("remote_buffer", _E), ("offset", 0), ("dtype", None), ("name", None),
        ("downcast", True), ("replica_grouping", None), ("retrieval_mode", "one_per_group"),
        ("log2_scale", None), ("nan_on_overflow", None),
    ],
    "remote_replica_sharded_variable": [
        ("data", _E), ("remote_buffer", _E), ("offset", 0), ("dtype", None), ("name", None),
        ("downcast", True), ("replica_grouping", None), ("retrieval_mode", "one_per_group"),
        ("log2_scale", None), ("nan_on_overflow", None),
    ],
    "replica_sharded_buffer": [
        ("shape", _E), ("dtype", _E), ("replica_grouping", None), ("shard_over", None),
        ("entries", 1),
    ],
    "replica_sharded_variable": [
        ("data", _E), ("dtype", None), ("name", None), ("downcast", True),
        ("replica_grouping", None), ("shard_over", None), ("retrieval_mode", "one_per_group"),
        ("log2_scale", None), ("nan_on_overflow", None),
    ],
}  # fmt: skip
METHOD_SIGNATURES = {
    (popxl.Ir, "__init__"): [("self", _E), ("replication", 1)],
    (popxl.Ir, "create_graph"): [("self", _E), ("fn", _E), ("*args", _E), ("**kwargs", _E)],
    (popxl.Ir, "create_empty_graph"): [("self", _E), ("name", None)],
    (popxl.Ir, "replica_grouping"): [("self", _E), ("stride", 1), ("group_size", None)],
    (popxl.Ir, "replica_grouping_from_assignments"): [("self", _E), ("assignment", _E)],
    (popxl.Ir, "dot_checkpoint"): [("self", _E), ("check", _E), ("save_dir", None)],
    (popxl.TensorSpec, "__init__"): [("self", _E), ("shape", _E), ("dtype", _E), ("meta_shape", ())],
    (popxl.Graph, "get_tensor"): [("self", _E), ("tensor_id", _E)],
    (popxl.Tensor, "strides"): [("self", _E), ("shape", None)],
    (popxl.Tensor, "transpose"): [("self", _E), ("permutation", None)],
    (popxl.Tensor, "reshape"): [("self", _E), ("shape", _E)],
    (popxl.Tensor, "copy_to_ipu"): [("self", _E), ("destination", _E), ("source", None)],
    (popxl.Variable, "copy_to_ipu"): [("self", _E), ("dst", _E), ("src", _E)],
    (popxl.RemoteBuffer, "__init__"): [
        ("self", _E), ("tensor_shape", _E), ("tensor_dtype", _E), ("entries", _E),
    ],
    (popxl.RemoteBuffer, "set_remote_buffer_info"): [
        ("self", _E), ("tensor_dtype", _E), ("tensor_shape", _E), ("entries", _E),
    ],
    (popxl.RemoteBuffer, "validate_tensor_matches_buffer"): [("self", _E), ("t", _E), ("num_shards", 1)],
    (popxl.dtypes.dtype, "from_name"): [("name", _E)],
    (popxl.dtypes.dtype, "as_dtype"): [("type_value", _E)],
}  # fmt: skip


def _described(sig: inspect.Signature) -> list:
    out = []
    for p in sig.parameters.values():
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        out.append((prefix + p.name, p.default))
    return out


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_top_level_name_exists_and_is_exported(name):
    assert hasattr(popxl, name)
    assert name in popxl.__all__


@pytest.mark.parametrize("name", SUBMODULES)
def test_submodule_importable(name):
    assert inspect.ismodule(getattr(popxl, name))


@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_dtypes_module_names(name):
    assert hasattr(popxl.dtypes, name)


def test_version_is_a_string():
    assert isinstance(popxl.__version__, str)


def test_aliases_are_the_same_functions():
    assert popxl.gcg is popxl.get_current_graph
    assert popxl.gmg is popxl.get_main_graph
    assert popxl.gir is popxl.get_ir


def test_replica_sharded_buffer_is_top_level_but_not_exported():
    assert callable(popxl.replica_sharded_buffer)
    assert "replica_sharded_buffer" not in popxl.__all__


REMOTE_OP_SIGNATURES = {
    "remote_load": [("remote_buffer", _E), ("offset", _E), ("name", None)],
    "remote_load_": [("remote_buffer", _E), ("offset", _E), ("t", _E)],
    "remote_store": [("remote_buffer", _E), ("offset", _E), ("t", _E)],
}


@pytest.mark.parametrize("name", sorted(REMOTE_OP_SIGNATURES))
def test_remote_op_signature(name):
    import popxl.ops

    assert _described(inspect.signature(getattr(popxl.ops, name))) == REMOTE_OP_SIGNATURES[name]


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_top_level_signature(name):
    assert _described(inspect.signature(getattr(popxl, name))) == SIGNATURES[name]


@pytest.mark.parametrize(
    "owner,name", sorted(METHOD_SIGNATURES, key=lambda k: (k[0].__name__, k[1]))
)
def test_method_signature(owner, name):
    assert _described(inspect.signature(getattr(owner, name))) == METHOD_SIGNATURES[owner, name]


def test_tensor_by_ref_is_an_annotation_only_sentinel():
    assert popxl.TensorByRef.__name__ == "TensorByRef"
    with pytest.raises(NotImplementedError):
        popxl.TensorByRef(1)


def test_new_alias_annotation():
    from popxl.typing_ import NewAliasAnnotation

    sentinel = NewAliasAnnotation("Foo", int)
    assert sentinel.__name__ == "Foo"
    with pytest.raises(NotImplementedError):
        sentinel()


def test_location_enums():
    assert popxl.TensorStorage.OnChip.value == "OnChip"
    assert popxl.TensorStorage.OffChip.value == "OffChip"
    assert {m.name for m in popxl.ReplicatedTensorSharding} == {"On", "Off"}
    assert {m.name for m in popxl.TileSet} == {"Compute", "IO", "Undefined", "N"}
    assert {m.name for m in popxl.ExecutionContext} == {
        "Normal", "AccumulateOuterFragment", "WeightsFromHostFragment",
        "WeightsToHostFragment", "OptimizerFromHostFragment", "Subgraph",
    }  # fmt: skip
    loc = popxl.TensorLocation()
    assert loc.storage is popxl.TensorStorage.OnChip
    assert loc.replicated_tensor_sharding is popxl.ReplicatedTensorSharding.Off
    loc = popxl.TensorLocation(popxl.TensorStorage.OffChip, popxl.ReplicatedTensorSharding.On)
    assert loc.storage is popxl.TensorStorage.OffChip
    assert loc.replicated_tensor_sharding is popxl.ReplicatedTensorSharding.On


def test_errors_module():
    from popxl import errors

    assert issubclass(errors.PopXLException, ValueError)
    assert issubclass(errors.UndefinedValue, Exception)
    err = errors.RecoverableError("boom", "popxl", "run", recovery_action="RESET")
    assert (err.message, err.type, err.location, err.recovery_action) == (
        "boom",
        "popxl",
        "run",
        "RESET",
    )
    assert issubclass(errors.UnrecoverableError, errors.Error)
