"""Collectives between replicas (and ``all_reduce`` between IPUs) against NumPy.

Every replicated test runs with replicas mapped by ``jax.vmap`` and by ``jax.shard_map``
(the ``mode`` fixture). Each program computes many collectives at once so a grouping costs
one compilation.
"""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import transforms
from popxl.ops import collectives

from ...replication_helpers import group_of, members, mode, run_replicated  # noqa: F401  (the `mode` fixture)

F32 = popxl.float32
REDUCTIONS = ("add", "mean", "mul", "min", "max", "square_add")
LOGICAL = ("and", "or")


def _numpy_reduce(values: np.ndarray, op: str) -> np.ndarray:
    return {
        "add": lambda v: v.sum(0),
        "mean": lambda v: v.mean(0),
        "mul": lambda v: v.prod(0),
        "min": lambda v: v.min(0),
        "max": lambda v: v.max(0),
        "square_add": lambda v: (v * v).sum(0),
        "and": lambda v: v.all(0),
        "or": lambda v: v.any(0),
    }[op](values)


def _chunk(flat: np.ndarray, size: int, rank: int) -> np.ndarray:
    padded = np.zeros(-(-flat.size // size) * size, flat.dtype)
    padded[: flat.size] = flat
    n = padded.size // size
    return padded[rank * n : (rank + 1) * n]


# The reference's exact arrays (test_replica_grouping.py, 8 replicas, replica i holds [i]) --

GROUPINGS_8 = [(1, 1), (1, 2), (1, 4), (2, 4), (4, 2), (2, 2), (1, 8)]
KINDS = ("all_gather", "all_reduce", "all_reduce_", "reduce_scatter")


def _replica_index_program(ir):
    outs = []
    with popxl.in_sequence():
        for stride, size in GROUPINGS_8:
            group = ir.replica_grouping(stride, size)
            for kind in KINDS:
                x = popxl.variable(
                    np.arange(8, dtype=np.int32)[:, None],
                    replica_grouping=ir.replica_grouping(1, 1),
                    name=f"x_{kind}",
                )
                if kind == "all_gather":
                    y = collectives.replicated_all_gather(x, group=group, output_shape="new_axis")
                elif kind == "all_reduce":
                    y = collectives.replicated_all_reduce(x, "add", group)
                elif kind == "all_reduce_":
                    y = collectives.replicated_all_reduce_(x, "add", group)
                else:
                    y = collectives.replicated_reduce_scatter(x, "add", group)
                outs.append(y)
    return outs


@pytest.mark.usefixtures("mode")
def test_reference_replica_grouping_arrays():
    ir = popxl.Ir(replication=8)
    with ir.main_graph:
        outs = _replica_index_program(ir)
        streams = []
        for y in outs:
            streams.append(popxl.d2h_stream(y.shape, y.dtype))
            ops.host_store(streams[-1], y)
    with popxl.Session(ir, "ipu_model") as session:
        results = session.run()
    got = iter(results[s] for s in streams)
    for stride, size in GROUPINGS_8:
        assignment = ir.replica_grouping(stride, size).assignment
        gathered = np.array([np.argwhere(np.array(assignment) == g) for g in assignment], np.int32)
        first = [members(assignment)[g][0] for g in assignment]
        scattered = [[gathered[r].sum()] if r == first[r] else [0] for r in range(8)]
        expected = {
            "all_gather": gathered,
            "all_reduce": gathered[:, :, 0].sum(axis=1)[:, None],
            "all_reduce_": gathered[:, :, 0].sum(axis=1)[:, None],
            "reduce_scatter": np.array(scattered, np.int32),
        }
        for kind in KINDS:
            np.testing.assert_array_equal(
                next(got), expected[kind], err_msg=f"{kind} {stride, size}"
            )


def test_reference_arrays_spelled_out():
    """A few of the expected arrays written literally (stride 2, group size 4)."""
    ir = popxl.Ir(replication=8)
    with ir.main_graph:
        x = popxl.variable(
            np.arange(8, dtype=np.int32)[:, None], replica_grouping=ir.replica_grouping(1, 1)
        )
        group = ir.replica_grouping(2, 4)
        g = collectives.replicated_all_gather(x, group=group, output_shape="new_axis")
        r = collectives.replicated_all_reduce(x, group=group)
        s = collectives.replicated_reduce_scatter(x, group=group)
        streams = [popxl.d2h_stream(t.shape, t.dtype) for t in (g, r, s)]
        for stream, t in zip(streams, (g, r, s)):
            ops.host_store(stream, t)
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()
    evens, odds = [[0], [2], [4], [6]], [[1], [3], [5], [7]]
    np.testing.assert_array_equal(out[streams[0]], [evens, odds] * 4)
    np.testing.assert_array_equal(out[streams[1]], [[12], [16]] * 4)
    np.testing.assert_array_equal(out[streams[2]], [[12], [16], [0], [0], [0], [0], [0], [0]])


# Every collective and reduction against NumPy ---------------------------------------------

# (replicas, stride, group_size)
GROUPINGS = [(2, 1, 1), (2, 1, 2), (4, 1, 2), (4, 2, 2), (4, 1, 4), (8, 1, 4), (8, 2, 4), (8, 1, 8)]


def _all_collectives(ir, x, b, y, group):
    outs = {f"reduce_{op}": collectives.replicated_all_reduce(x, op, group) for op in REDUCTIONS}
    outs.update({f"reduce_{op}": collectives.replicated_all_reduce(b, op, group) for op in LOGICAL})
    outs["reduce_int_max"] = collectives.replicated_all_reduce(
        ops.cast(x, popxl.int32), "max", group
    )
    copy = x + 0.0
    outs["reduce_inplace"] = collectives.replicated_all_reduce_(copy, "add", group)
    outs["reduce_inplace_base"] = copy
    outs["gather_new_axis"] = collectives.replicated_all_gather(
        x, group=group, output_shape="new_axis"
    )
    outs["gather_concat0"] = collectives.replicated_all_gather(x, 0, group, "concat")
    outs["gather_concat1"] = collectives.replicated_all_gather(x, 1, group, "concat")
    outs["gather_auto"] = collectives.replicated_all_gather(x, -1, group)
    outs["slice0"] = collectives.replicated_slice(x, 0, group)
    outs["scatter_add"] = collectives.replicated_reduce_scatter(x, "add", group)
    outs["scatter_max"] = collectives.replicated_reduce_scatter(y, "max", group)
    outs["scatter_padded"] = collectives.replicated_reduce_scatter(y, "add", group)
    outs["sharded_slice"] = collectives.replica_sharded_slice(y, group)
    return outs


def _expected(name, xs, bs, ys, replica, assignment):
    ms, rank = group_of(assignment, replica)
    size = len(ms)
    op = name.removeprefix("reduce_")
    if name in ("reduce_inplace", "reduce_inplace_base"):
        return xs[ms].sum(0)
    if name == "reduce_int_max":
        return xs[ms].astype(np.int32).max(0)
    if op in LOGICAL:
        return _numpy_reduce(bs[ms], op)
    if op in REDUCTIONS:
        return _numpy_reduce(xs[ms], op)
    if name == "gather_new_axis":
        return xs[ms]
    if name == "gather_concat0":
        return np.concatenate(xs[ms], 0)
    if name in ("gather_concat1", "gather_auto"):
        return np.concatenate(xs[ms], 1)
    if name == "slice0":
        part = xs.shape[1] // size
        piece = xs[replica][rank * part : (rank + 1) * part]
        return piece[0] if part == 1 else piece
    if name == "scatter_add":
        return _chunk(xs[ms].sum(0).reshape(-1), size, rank)
    if name == "scatter_max":
        return _chunk(ys[ms].max(0), size, rank)  # the zero padding is the same everywhere
    if name == "scatter_padded":
        return _chunk(ys[ms].sum(0), size, rank)
    if name == "sharded_slice":
        return _chunk(ys[replica], size, rank)
    raise AssertionError(name)


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("replicas,stride,group_size", GROUPINGS)
def test_collectives_match_numpy(replicas, stride, group_size, rng):
    xs = rng.uniform(-2, 2, (replicas, 8, 3)).astype(np.float32)
    bs = rng.uniform(size=(replicas, 2, 3)) > 0.5
    ys = rng.uniform(-2, 2, (replicas, 5)).astype(np.float32)
    names = []

    def build(ir, x, b, y):
        outs = _all_collectives(ir, x, b, y, ir.replica_grouping(stride, group_size))
        names.extend(outs)
        return list(outs.values())

    results = run_replicated(replicas, build, [xs, bs, ys])
    assignment = popxl.Ir(replication=replicas).replica_grouping(stride, group_size).assignment
    for name, got in zip(names, results):
        for r in range(replicas):
            want = _expected(name, xs, bs, ys, r, assignment)
            assert got[r].shape == np.shape(want), name
            assert got[r].dtype == np.asarray(want).dtype, name
            np.testing.assert_allclose(got[r], want, rtol=1e-5, atol=1e-5, err_msg=f"{name} r{r}")


@pytest.mark.usefixtures("mode")
def test_default_group_is_all_replicas():
    xs = np.arange(4 * 2, dtype=np.float32).reshape(4, 2)
    (reduced, gathered) = run_replicated(
        4,
        lambda ir, x: [collectives.replicated_all_reduce(x), collectives.replicated_all_gather(x)],
        [xs],
    )
    np.testing.assert_array_equal(reduced, np.broadcast_to(xs.sum(0), (4, 2)))
    np.testing.assert_array_equal(gathered, np.broadcast_to(xs.reshape(-1), (4, 8)))


@pytest.mark.usefixtures("mode")
def test_mul_multiplies():
    """Deliberate fix: the original mapped "mul" to the mean operator."""
    xs = np.array([[2.0], [3.0]], np.float32)
    (out,) = run_replicated(2, lambda ir, x: collectives.replicated_all_reduce(x, "mul"), [xs])
    np.testing.assert_array_equal(out, [[6.0], [6.0]])


# Shapes, meta-shapes and modes -------------------------------------------------------------


def test_output_shapes_names_and_meta_shapes():
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        x = popxl.variable(np.zeros((2, 3), np.float32), name="x")
        g2 = ir.replica_grouping(1, 2)
        assert collectives.replicated_all_reduce(x).name == "x_all_reduce"
        assert collectives.replicated_all_gather(x, group=g2, output_shape="new_axis").shape == (
            2,
            2,
            3,
        )
        assert collectives.replicated_all_gather(x, 1).shape == (2, 12)
        assert collectives.replicated_all_gather(x).shape == (8, 3)
        assert collectives.replicated_slice(x, 0, g2).shape == (3,)  # length-1 part: axis dropped
        assert collectives.replicated_slice(x, 0, ir.replica_grouping(1, 1)).shape == (2, 3)
        assert collectives.replicated_slice(ops.reshape(x, (3, 2)), 1, g2).shape == (3,)
        plain = collectives.replicated_reduce_scatter(x)
        rts = collectives.replicated_reduce_scatter(
            x, configure_output_for_replicated_tensor_sharding=True
        )
        assert plain.shape == rts.shape == (2,)
        assert plain.meta_shape == () and rts.meta_shape == (2, 3)
        padded = collectives.replicated_reduce_scatter(
            ops.reshape(x, (6,)), group=ir.replica_grouping(1, 4)
        )
        assert padded.shape == (2,)  # ceil(6 / 4)
        shard = collectives.replica_sharded_slice(x)
        assert shard.shape == (2,) and shard.meta_shape == (2, 3)
        assert collectives.replicated_all_gather(shard).shape == (2, 3)  # auto -> meta_shape
        assert collectives.replicated_all_gather(shard, output_shape="concat").shape == (8,)
        assert collectives.replicated_all_gather(shard, output_shape="meta_shape").shape == (2, 3)


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("replicas,group_size", [(2, 2), (4, 4), (4, 2)])
def test_shard_then_gather_round_trips_with_padding(replicas, group_size, rng):
    xs = rng.uniform(size=(replicas, 5, 3)).astype(np.float32)  # 15 elements: padded shards

    def build(ir, x):
        group = ir.replica_grouping(1, group_size)
        shard = collectives.replica_sharded_slice(x, group)
        rts = collectives.replicated_reduce_scatter(
            x, "add", group, configure_output_for_replicated_tensor_sharding=True
        )
        return [
            collectives.replicated_all_gather(shard, group=group),
            collectives.replicated_all_gather(rts, group=group, output_shape="meta_shape"),
            collectives.replicated_all_gather(rts, group=group, output_shape="concat"),
        ]

    same, reduced, raw = run_replicated(replicas, build, [xs])
    assignment = popxl.Ir(replication=replicas).replica_grouping(1, group_size).assignment
    for r in range(replicas):
        ms, _ = group_of(assignment, r)
        total = xs[ms].sum(0)
        np.testing.assert_allclose(reduced[r], total, rtol=1e-6)
        chunks = [_chunk(total.reshape(-1), group_size, k) for k in range(group_size)]
        np.testing.assert_allclose(raw[r], np.concatenate(chunks), rtol=1e-6)  # padding kept
    # Shards of each replica's own value, gathered over its group: member 0's value only
    # where the group's members hold different data.
    for r in range(replicas):
        ms, _ = group_of(assignment, r)
        pieces = [_chunk(xs[m].reshape(-1), group_size, k) for k, m in enumerate(ms)]
        np.testing.assert_allclose(same[r].reshape(-1), np.concatenate(pieces)[:15])


@pytest.mark.usefixtures("mode")
def test_scalars():
    xs = np.array([3.0, 5.0], np.float32)

    def build(ir, x):
        gathered = collectives.replicated_all_gather(x)  # like a one-element vector
        assert gathered.shape == (2,)
        return [
            gathered,
            collectives.replicated_reduce_scatter(x),
            collectives.replicated_all_reduce(x),
        ]

    gathered, scattered, reduced = run_replicated(2, build, [xs])
    np.testing.assert_array_equal(gathered, [[3.0, 5.0]] * 2)
    np.testing.assert_array_equal(scattered, [[8.0], [0.0]])
    np.testing.assert_array_equal(reduced, [8.0, 8.0])


@pytest.mark.usefixtures("mode")
def test_collectives_inside_repeat_and_conditional():
    xs = np.arange(8, dtype=np.float32).reshape(4, 2)

    def build(ir, x):
        group = ir.replica_grouping(2, 2)  # [0, 2] and [1, 3]
        halve_sum = ir.create_graph(
            lambda a: collectives.replicated_all_reduce(a, group=group) * 0.5, x.spec
        )
        (looped,) = ops.repeat(halve_sum, 3, x)
        then_graph = ir.create_graph(
            lambda a: collectives.replicated_all_gather(a, output_shape="new_axis"), x.spec
        )
        else_graph = ir.create_graph(lambda a: ops.reshape(ops.concat([a] * 4), (4, 2)), x.spec)
        (branched,) = ops.conditional(popxl.constant(True), then_graph, else_graph, [x], [x])
        return [looped, branched]

    looped, branched = run_replicated(4, build, [xs])
    np.testing.assert_array_equal(looped, [[2.0, 3.0], [4.0, 5.0]] * 2)  # a fixed point
    np.testing.assert_array_equal(branched, np.broadcast_to(xs, (4, 4, 2)))


# Errors ----------------------------------------------------------------------------------


def test_invalid_arguments_raise_value_error():
    ir = popxl.Ir(replication=4)
    with ir.main_graph, popxl.ipu(0):
        x = popxl.variable(np.zeros((3, 2), np.float32))
        for fn in (
            lambda: collectives.replicated_all_reduce(x, "sum"),
            lambda: collectives.replicated_all_reduce_(x, "prod"),
            lambda: collectives.replicated_reduce_scatter(x, "avg"),
            lambda: collectives.all_reduce([x], [0], op="xor"),
            lambda: collectives.all_reduce_identical_inputs([x], [0], op="nope"),
            lambda: collectives.all_reduce_identical_grad_inputs([x], [0], op="nope"),
        ):
            with pytest.raises(ValueError, match="Not a valid op"):
                fn()
        with pytest.raises(ValueError, match="divisible"):
            collectives.replicated_slice(x, 0)  # 3 rows over 4 replicas
        with pytest.raises(ValueError, match="scalar"):
            collectives.replicated_slice(popxl.constant(1.0))
        with pytest.raises(ValueError):
            collectives.replicated_all_gather(x, axis=2)
        with pytest.raises(ValueError):
            collectives.replicated_all_gather(x, axis=0.5)
        with pytest.raises(ValueError):
            collectives.replicated_all_gather(x, output_shape="stack")
        with pytest.raises(ValueError):
            collectives.replicated_all_gather(x, output_shape="meta_shape")  # x has no meta-shape
        with pytest.raises(ValueError):
            collectives.all_reduce([x, x], [0])
        unplaced = popxl.variable(np.zeros(2, np.float32))
        with pytest.raises(ValueError, match="ipus"):
            collectives.all_reduce([unplaced])  # no producer, no consumer: IPU unknown


def test_comm_group():
    group = collectives.CommGroup(collectives.CommGroupType.Consecutive, 2)
    assert group.type is collectives.CommGroupType.Consecutive and group.replicaGroupSize == 2
    assert {t.name for t in collectives.CommGroupType} == {
        "All",
        "Consecutive",
        "Orthogonal",
        "Ungrouped",
    }


# all_reduce across the IPUs of one replica -------------------------------------------------


def _ipu_program(fn, values, op="add"):
    ir = popxl.Ir()
    with ir.main_graph:
        ts = []
        for k, v in enumerate(values):
            with popxl.ipu(k):
                ts.append(popxl.variable(v, name=f"v{k}") * 1.0)  # placed by its producer
        outs = fn(ts, op=op)
        streams = []
        for k, o in enumerate(outs):
            streams.append(popxl.d2h_stream(o.shape, o.dtype, f"o{k}"))
            with popxl.ipu(k):
                ops.host_store(streams[-1], o)
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run()
    return outs, [result[s] for s in streams]


@pytest.mark.parametrize("op", ["add", "mean", "max", "mul"])
def test_all_reduce_across_ipus(op):
    values = [
        np.array([1.0, -2.0], np.float32),
        np.array([3.0, 4.0], np.float32),
        np.array([0.5, 2.0], np.float32),
    ]
    outs, got = _ipu_program(collectives.all_reduce, values, op)
    assert isinstance(outs, list) and len(outs) == 3
    for g in got:
        np.testing.assert_allclose(g, _numpy_reduce(np.stack(values), op), rtol=1e-6)


def test_all_reduce_identical_variants_forward():
    values = [np.array([1.0, 2.0], np.float32), np.array([10.0, 20.0], np.float32)]
    _, same = _ipu_program(collectives.all_reduce_identical_inputs, values)
    np.testing.assert_array_equal(same[0], values[0])
    np.testing.assert_array_equal(same[1], values[1])
    _, summed = _ipu_program(collectives.all_reduce_identical_grad_inputs, values)
    for g in summed:
        np.testing.assert_array_equal(g, [11.0, 22.0])


# Gradients ---------------------------------------------------------------------------------


def _replicated_grads(replicas, fwd, x_shape, seeds_shape, xs, seeds):
    """Differentiate ``fwd`` (a subgraph of the replicated IR); returns (grad graph, dx)."""
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        graph = ir.create_graph(lambda t: fwd(ir, t), popxl.TensorSpec(x_shape, F32))
        info = transforms.autodiff(graph)
        x_in = popxl.h2d_stream(x_shape, F32, "x")
        s_in = popxl.h2d_stream(seeds_shape, F32, "seed")
        site = ops.call_with_info(graph, ops.host_load(x_in))
        (dx,) = ops.call(info.graph, ops.host_load(s_in), inputs_dict=info.inputs_dict(site))
        out = popxl.d2h_stream(dx.shape, F32, "dx")
        ops.host_store(out, dx)
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run({x_in: xs, s_in: seeds})
    return info.graph, result[out]


def _op_types(graph):
    return [op.type for op in graph._ops]


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("output_shape", ["new_axis", "concat"])
def test_all_gather_gradient_is_replicated_slice(output_shape, rng):
    replicas, size = 4, 2
    xs = rng.uniform(size=(replicas, 2, 3)).astype(np.float32)
    seed_shape = (size, 2, 3) if output_shape == "new_axis" else (2 * size, 3)
    seeds = rng.uniform(size=(replicas, *seed_shape)).astype(np.float32)

    def fwd(ir, t):
        return collectives.replicated_all_gather(t, 0, ir.replica_grouping(2, size), output_shape)

    grad_graph, dx = _replicated_grads(replicas, fwd, (2, 3), seed_shape, xs, seeds)
    assert "ReplicatedSlice" in _op_types(grad_graph)
    assert "ReplicatedReduceScatter" not in _op_types(grad_graph)
    assignment = [0, 1, 0, 1]
    for r in range(replicas):
        _, rank = group_of(assignment, r)
        own = seeds[r].reshape(size, 2, 3)[rank]  # no reduction over the replicas
        np.testing.assert_allclose(dx[r], own, rtol=1e-6)


@pytest.mark.usefixtures("mode")
def test_all_gather_meta_shape_gradient_is_sharded_slice(rng):
    replicas = 2
    xs = rng.uniform(size=(replicas, 3)).astype(np.float32)
    seeds = rng.uniform(size=(replicas, 2, 3)).astype(np.float32)

    def fwd(ir, t):
        shard = collectives.replica_sharded_slice(ops.reshape(ops.concat([t, t]), (2, 3)))
        return collectives.replicated_all_gather(shard)  # auto -> meta_shape (2, 3)

    # x -> (2, 3) of [x; x] -> shard (3,) = row `rank` -> gathered (2, 3).
    grad_graph, dx = _replicated_grads(replicas, fwd, (3,), (2, 3), xs, seeds)
    assert "ReplicaShardedSlice" in _op_types(grad_graph)
    for r in range(replicas):
        # d shard = own chunk of the seed; replica_sharded_slice's vjp puts it at row r.
        np.testing.assert_allclose(dx[r], seeds[r][r], rtol=1e-6)


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("part", [1, 2])
def test_replicated_slice_gradient_is_all_gather(part, rng):
    replicas = 4
    xs = rng.uniform(size=(replicas, 4 * part, 2)).astype(np.float32)
    seed_shape = (2,) if part == 1 else (part, 2)
    seeds = rng.uniform(size=(replicas, *seed_shape)).astype(np.float32)

    def fwd(ir, t):
        return collectives.replicated_slice(t, 0)

    grad_graph, dx = _replicated_grads(replicas, fwd, (4 * part, 2), seed_shape, xs, seeds)
    assert "ReplicatedAllGather" in _op_types(grad_graph)
    gathered = seeds.reshape(replicas * part, 2)
    for r in range(replicas):
        np.testing.assert_allclose(dx[r], gathered, rtol=1e-6)


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("stride,size", [(1, 4), (1, 2), (2, 2)])
def test_all_reduce_add_gradient_is_all_reduce_of_gradients(stride, size, rng):
    replicas = 4
    xs = rng.uniform(size=(replicas, 3)).astype(np.float32)
    seeds = rng.uniform(size=(replicas, 3)).astype(np.float32)

    def fwd(ir, t):
        return collectives.replicated_all_reduce(t * 2.0, "add", ir.replica_grouping(stride, size))

    _, dx = _replicated_grads(replicas, fwd, (3,), (3,), xs, seeds)
    assignment = popxl.Ir(replication=replicas).replica_grouping(stride, size).assignment
    for r in range(replicas):
        ms, _ = group_of(assignment, r)
        np.testing.assert_allclose(dx[r], 2.0 * seeds[ms].sum(0), rtol=1e-5)


def _ipu_grads(fn, values, seeds):
    ir = popxl.Ir()
    with ir.main_graph:

        def fwd(a, b):
            with popxl.ipu(0):
                a = a * 1.0
            with popxl.ipu(1):
                b = b * 1.0
            return fn([a, b], [0, 1])

        specs = [popxl.TensorSpec(v.shape, F32) for v in values]
        graph = ir.create_graph(fwd, *specs)
        info = transforms.autodiff(graph)
        site = ops.call_with_info(graph, *[popxl.variable(v) for v in values])
        grads = ops.call(
            info.graph, *[popxl.constant(s) for s in seeds], inputs_dict=info.inputs_dict(site)
        )
        streams = [popxl.d2h_stream(g.shape, F32) for g in grads]
        for s, g in zip(streams, grads):
            ops.host_store(s, g)
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run()
    return [result[s] for s in streams]


def test_all_reduce_identical_inputs_gradient_is_all_reduce():
    seeds = [np.array([1.0, 2.0], np.float32), np.array([10.0, 30.0], np.float32)]
    grads = _ipu_grads(
        collectives.all_reduce_identical_inputs, [np.zeros(2, np.float32)] * 2, seeds
    )
    for g in grads:
        np.testing.assert_array_equal(g, [11.0, 32.0])


def test_all_reduce_identical_grad_inputs_gradient_is_identity():
    seeds = [np.array([1.0, 2.0], np.float32), np.array([10.0, 30.0], np.float32)]
    grads = _ipu_grads(
        collectives.all_reduce_identical_grad_inputs, [np.zeros(2, np.float32)] * 2, seeds
    )
    np.testing.assert_array_equal(grads[0], seeds[0])
    np.testing.assert_array_equal(grads[1], seeds[1])
