"""Weight gradients and accumulators summed over replicas.

Under ``jax.vmap`` replication, the gradient of a 2-D matmul weight that is all-reduced
(add or mean) over every replica is computed as one product of all replicas' activations and
cotangents (``runtime.lowering.replica_sums.WeightGrad``), and an accumulator fed from such gradients
carries its replica sum along (``Accumulation``). These tests check the numbers against NumPy
on both replica mappings, that the deferred forms are taken where they apply, and that every
other consumer still sees each replica's own value.
"""

import os
from collections import OrderedDict

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import transforms
from popxl.ops import collectives
from runtime.lowering import replica_sums
from runtime.session import program

from ..replication_helpers import mode, run_replicated  # noqa: F401  (the `mode` fixture)

R, B, K, N = 4, 3, 5, 2
RNG = np.random.default_rng(3)
X = RNG.normal(size=(R, B, K)).astype(np.float32)
W = RNG.normal(size=(K, N)).astype(np.float32)


def _per_replica_grads(x, w):
    """d/dw sum(tanh(x @ w)) for each replica, in float64: (R, K, N)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    h = np.tanh(x @ w)
    dy = 1 - h * h
    r = len(x)
    return np.einsum("rbk,rbn->rkn", x.reshape(r, -1, x.shape[-1]), dy.reshape(r, -1, dy.shape[-1]))


def _weight_grad(ir, x, w_value=W, forward=None):
    """The gradient of ``forward(x, w)`` (default sum(tanh(x @ w))) for a variable ``w``."""
    w = popxl.variable(w_value, name="w")

    def default(x, w):
        return ops.sum(ops.tanh(x @ w))

    fwd = ir.create_graph(forward or default, x.spec, w.spec)
    info = transforms.autodiff(fwd, grads_required=[fwd.inputs[1]])
    site = ops.call_with_info(fwd, x, w)
    seed = popxl.constant(1.0, w.dtype, "seed")
    (g,) = ops.call(info.graph, seed, inputs_dict=info.inputs_dict(site))
    return g


def _assert_reduced(got, per_replica, op, atol):
    """Every replica's row of ``got`` is the sum (``add``) or mean of ``per_replica``."""
    want = per_replica.sum(0) if op == "add" else per_replica.mean(0)
    for replica in range(R):
        np.testing.assert_allclose(got[replica], want, rtol=1e-5, atol=atol)


def _under_vmap():
    return os.environ["POPXL_REPLICATION"] == "vmap"  # set by the ``mode`` fixture


@pytest.fixture
def spy(monkeypatch):
    """Counts of replica sums and per-replica materialisations of ``WeightGrad``
    (``replica_sum``, ``value``) and ``Accumulation`` (``acc_sum``, ``acc_value``), with an
    empty step cache so that every program is lowered afresh."""
    monkeypatch.setattr(program, "_STEP_CACHE", OrderedDict())
    counts = {"replica_sum": 0, "value": 0, "acc_sum": 0, "acc_value": 0}
    methods = {
        "replica_sum": (replica_sums.WeightGrad, "replica_sum"),
        "value": (replica_sums.WeightGrad, "value"),
        "acc_sum": (replica_sums.Accumulation, "replica_sum"),
        "acc_value": (replica_sums.Accumulation, "value"),
    }
    for key, (cls, name) in methods.items():
        original = getattr(cls, name)

        def counted(self, *args, _key=key, _original=original):
            counts[_key] += 1
            return _original(self, *args)

        monkeypatch.setattr(cls, name, counted)
    return counts


@pytest.mark.parametrize("op", ["add", "mean"])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.usefixtures("mode")
def test_all_reduced_weight_grad_matches_numpy(spy, op, inplace):
    reduce = collectives.replicated_all_reduce_ if inplace else collectives.replicated_all_reduce

    def build(ir, x):
        return reduce(_weight_grad(ir, x), op)

    (got,) = run_replicated(R, build, [X])
    _assert_reduced(got, _per_replica_grads(X, W), op, atol=1e-6)
    # One contraction over the replicas under vmap (each lowering: the batching probe and the
    # step); shard_map keeps the psum of local gradients.
    assert (spy["replica_sum"] > 0) == _under_vmap()
    assert spy["value"] == 0


@pytest.mark.usefixtures("mode")
def test_reduce_scatter_of_a_weight_grad(spy):
    def build(ir, x):
        g = _weight_grad(ir, x)
        shard = collectives.replicated_reduce_scatter(
            g, "mean", configure_output_for_replicated_tensor_sharding=True
        )
        return collectives.replicated_all_gather(shard)

    (got,) = run_replicated(R, build, [X])
    _assert_reduced(got, _per_replica_grads(X, W), "mean", atol=1e-6)
    assert (spy["replica_sum"] > 0) == _under_vmap()


@pytest.mark.usefixtures("mode")
def test_batched_left_operand(spy):
    """A 3-D left operand: the gradient sums over its batch and row dimensions."""
    x = RNG.normal(size=(R, 2, B, K)).astype(np.float32)

    def build(ir, x):
        return collectives.replicated_all_reduce(_weight_grad(ir, x), "mean")

    (got,) = run_replicated(R, build, [x])
    np.testing.assert_allclose(got[1], _per_replica_grads(x, W).mean(0), rtol=1e-5, atol=1e-6)
    assert (spy["replica_sum"] > 0) == _under_vmap()


@pytest.mark.usefixtures("mode")
def test_other_consumers_get_each_replicas_own_gradient(spy):
    """max/grouped reductions and direct reads all see the per-replica gradient."""

    def build(ir, x):
        g = _weight_grad(ir, x)
        group = ir.replica_grouping(group_size=2)
        return (
            g + 0,
            collectives.replicated_all_reduce(g, "max"),
            collectives.replicated_all_reduce(g, "add", group=group),
            collectives.replicated_all_reduce(g, "add"),
        )

    own, largest, pair_sums, total = run_replicated(R, build, [X])
    grads = _per_replica_grads(X, W)
    np.testing.assert_allclose(own, grads, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(largest, np.broadcast_to(grads.max(0), grads.shape), rtol=1e-5)
    for replica in range(R):
        first = replica - replica % 2
        want = grads[first] + grads[first + 1]
        np.testing.assert_allclose(pair_sums[replica], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(total[replica], grads.sum(0), rtol=1e-5, atol=1e-6)
    assert (spy["value"] > 0) == _under_vmap()


@pytest.mark.usefixtures("mode")
def test_weight_also_reaching_the_left_operand(spy):
    """``transpose_(w) @ w``: the gradient flows through both operands, so the weight's
    gradient must not be taken as the right operand's alone."""
    w_square = RNG.normal(size=(K, K)).astype(np.float32)
    x = RNG.normal(size=(R, K, K)).astype(np.float32)

    def forward(x, w):
        return ops.sum(x * (ops.transpose_(w) @ w))

    def build(ir, x):
        g = _weight_grad(ir, x, w_square, forward)
        return collectives.replicated_all_reduce(g, "mean")

    (got,) = run_replicated(R, build, [x])
    w64 = w_square.astype(np.float64)
    # d/dw sum(x * wᵀw) = w (x + xᵀ)
    want = np.mean([w64 @ (xr + xr.T) for xr in x.astype(np.float64)], axis=0)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    assert spy["replica_sum"] == 0


@pytest.mark.usefixtures("mode")
def test_float16_weight_grad(spy):
    x16, w16 = X.astype(np.float16), W.astype(np.float16)

    def build(ir, x):
        return collectives.replicated_all_reduce(_weight_grad(ir, x, w16), "mean")

    (got,) = run_replicated(R, build, [x16])
    assert got.dtype == np.float16
    want = _per_replica_grads(x16, w16).mean(0)
    np.testing.assert_allclose(got[2], want, rtol=1e-2, atol=1e-2)
    assert (spy["replica_sum"] > 0) == _under_vmap()


def test_data_parallel_sgd_stores_shared_weights_once(monkeypatch):
    """SGD from the contracted gradient: the update matches NumPy, and the weight, identical
    on every replica, is stored once under vmap."""
    monkeypatch.setenv("POPXL_REPLICATION", "vmap")
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        stream = popxl.h2d_stream((B, K), popxl.float32, "x")
        g = _weight_grad(ir, ops.host_load(stream))
        (w,) = ir.main_graph.variables
        collectives.replicated_all_reduce_(g, "mean")
        ops.scaled_add_(w, g, b=-0.1)
    with popxl.Session(ir, "ipu_model") as session:
        session.run({stream: X})
        got = session.get_tensor_data(w)
        assert session._program.batched == (False,)
    want = W - 0.1 * _per_replica_grads(X, W).mean(0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# Accumulators ------------------------------------------------------------------------------

X2 = RNG.normal(size=(R, 2, B, K)).astype(np.float32)  # two micro-batches per replica
A0 = RNG.normal(size=(K, N)).astype(np.float32)  # the accumulator's initial value


def _expected_accumulator(rule, factor, acc0=A0):
    """Each replica's accumulator after its two micro-batches' gradients: (R, K, N)."""
    acc = np.broadcast_to(acc0.astype(np.float64), (R, K, N))
    for step in range(2):
        g = _per_replica_grads(X2[:, step], W)
        if rule == "accumulate_":
            acc = acc + factor * g
        elif rule == "accumulate_moving_average_":
            acc = factor * acc + (1 - factor) * g
        else:  # accumulate_mean_ with the counter at 0, then 1
            acc = step / (step + 1) * acc + 1 / (step + 1) * g
    return acc


def _accumulate_two(ir, x, rule, factor, acc_dtype=np.float32):
    """An accumulator fed with the weight gradients of two micro-batches (``x[0]``, ``x[1]``)
    by ``rule`` (an ``ops.var_updates`` name); ``"counter"`` as the factor uses a
    counter variable, as ``autodiff_with_accumulation`` does."""
    from popxl.ops import var_updates

    acc = popxl.variable(A0.astype(acc_dtype), name="acc")
    counter = popxl.variable(0.0, popxl.float32, name="counter")
    update = getattr(var_updates, rule)
    for step in range(2):
        g = _weight_grad(ir, x[step])
        update(acc, g, counter if isinstance(factor, str) else factor)
        var_updates.accumulate_(counter, popxl.constant(1.0, popxl.float32))
    return acc


ACCUMULATE_CASES = [
    ("accumulate_", 0.5),
    ("accumulate_moving_average_", 0.75),
    ("accumulate_mean_", "counter"),
]


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("rule,factor", ACCUMULATE_CASES)
@pytest.mark.parametrize("op", ["add", "mean"])
def test_all_reduced_accumulator_matches_numpy(spy, rule, factor, op):
    def build(ir, x):
        acc = _accumulate_two(ir, x, rule, factor)
        return collectives.replicated_all_reduce(acc, op)

    (got,) = run_replicated(R, build, [X2])
    _assert_reduced(got, _expected_accumulator(rule, factor), op, atol=1e-5)
    assert (spy["acc_sum"] > 0) == _under_vmap()
    # (The accumulator variable itself keeps its per-replica value, so that is computed too.)


@pytest.mark.usefixtures("mode")
def test_accumulator_all_reduced_in_place_keeps_the_mean(spy):
    """Tutorial 3's pattern: the accumulator variable itself is all-reduced in place, and
    the next run starts from that mean."""
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        stream = popxl.h2d_stream(X2.shape[1:], popxl.float32, "x")
        x = ops.host_load(stream)
        acc = _accumulate_two(ir, x, "accumulate_moving_average_", 0.75)
        collectives.replicated_all_reduce_(acc, "mean")
    with popxl.Session(ir, "ipu_model") as session:
        session.run({stream: X2})
        first = session.get_tensor_data(acc)
        session.run({stream: X2})
        second = session.get_tensor_data(acc)
    want_first = _expected_accumulator("accumulate_moving_average_", 0.75).mean(0)
    np.testing.assert_allclose(first, want_first, rtol=1e-5, atol=1e-5)
    want_second = _expected_accumulator("accumulate_moving_average_", 0.75, want_first).mean(0)
    np.testing.assert_allclose(second, want_second, rtol=1e-5, atol=1e-5)
    assert (spy["acc_sum"] > 0) == _under_vmap()
    assert spy["acc_value"] == spy["value"] == 0  # no replica's own gradient is computed


@pytest.mark.usefixtures("mode")
def test_accumulator_read_per_replica(spy):
    """Read without a reduction, every replica sees its own accumulator."""

    def build(ir, x):
        return _accumulate_two(ir, x, "accumulate_mean_", "counter") + 0

    (got,) = run_replicated(R, build, [X2])
    want = _expected_accumulator("accumulate_mean_", "counter")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert (spy["acc_value"] > 0) == _under_vmap()


@pytest.mark.usefixtures("mode")
def test_per_replica_factor_scales_each_replicas_terms(spy):
    """A factor that differs between replicas (here host-loaded) scales each replica's terms
    before the replica sum (``Σ_r a_r·t_r + b_r·x_r``), which is still taken deferred."""
    factors = np.linspace(0.2, 0.8, R).astype(np.float32)

    def build(ir, x, f):
        acc = _accumulate_two(ir, x, "accumulate_moving_average_", f)
        return collectives.replicated_all_reduce(acc, "mean")

    (got,) = run_replicated(R, build, [X2, factors])
    per_replica = np.stack(
        [_expected_accumulator("accumulate_moving_average_", f)[r] for r, f in enumerate(factors)]
    )
    np.testing.assert_allclose(got[0], per_replica.mean(0), rtol=1e-5, atol=1e-5)
    assert (spy["acc_sum"] > 0) == _under_vmap()


@pytest.mark.usefixtures("mode")
def test_float16_accumulator_rounds_every_update(spy):
    def build(ir, x):
        acc = _accumulate_two(ir, x, "accumulate_", 0.5, np.float16)
        return collectives.replicated_all_reduce(acc, "mean")

    (got,) = run_replicated(R, build, [X2])
    assert got.dtype == np.float16
    want = _expected_accumulator("accumulate_", 0.5).mean(0)
    np.testing.assert_allclose(got[3], want, rtol=1e-2, atol=1e-2)
    assert spy["acc_sum"] == 0


@pytest.mark.usefixtures("mode")
def test_accumulating_through_a_view():
    """An accumulator updated through a reshaping view of a flat variable."""
    from popxl.ops import var_updates

    def build(ir, x):
        flat = popxl.variable(A0.reshape(-1), name="flat")
        view = ops.reshape_(flat, (K, N))
        for step in range(2):
            var_updates.accumulate_(view, _weight_grad(ir, x[step]), 0.5)
        return collectives.replicated_all_reduce(flat, "mean")

    (got,) = run_replicated(R, build, [X2])
    want = _expected_accumulator("accumulate_", 0.5).mean(0).reshape(-1)
    np.testing.assert_allclose(got[1], want, rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("mode")
def test_float16_gradients_summed_into_a_float32_accumulator(spy):
    """Mixed precision: the replicas' float16 gradients are summed at float32, so a sum
    beyond float16's range (4 × 2 × 30000 here) stays finite, as per-replica float32
    accumulators followed by a float32 all-reduce would give."""
    from popxl.ops import var_updates

    x = np.full((R, 2, B, K), 10000.0, np.float16)

    def build(ir, x):
        acc = popxl.variable(np.zeros((K, N), np.float32), name="acc")
        for step in range(2):
            g = _weight_grad(ir, x[step], W.astype(np.float16), lambda x, w: ops.sum(x @ w))
            var_updates.accumulate_(acc, g, 1.0)
        return collectives.replicated_all_reduce(acc, "add")

    (got,) = run_replicated(R, build, [x])
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.full((R, K, N), R * 2 * B * 10000.0))
    assert (spy["acc_sum"] > 0) == _under_vmap()


@pytest.mark.usefixtures("mode")
def test_accumulator_summed_inside_a_loop_body(spy):
    """Inside a loop body ``vmap`` cannot tell replica-dependent values from shared ones: an
    accumulator already holding each replica's own sum, then fed a deferred gradient and
    all-reduced in the same body, sums every replica's value (it once took R times this
    replica's own, as if the accumulator were shared)."""
    ones = np.ones((B, N), np.float32)

    def build(ir, x):
        w = popxl.variable(W, name="w")
        acc = popxl.variable(np.zeros((K, N), np.float32), name="acc")
        fwd = ir.create_graph(lambda x, w: ops.sum(ops.tanh(x @ w)), x.spec, w.spec)
        info = transforms.autodiff(fwd, grads_required=[fwd.inputs[1]])
        body = ir.create_empty_graph("body")
        with body:
            popxl.graph_input((K, N), popxl.float32, "total")
            xs = popxl.graph_input(x.shape, popxl.float32, "x")
            ws = popxl.graph_input(W.shape, popxl.float32, "w")
            accs = popxl.graph_input((K, N), popxl.float32, "acc", by_ref=True)
            # This replica's own value first, then a deferred weight gradient.
            ops.var_updates.accumulate_(accs, ops.transpose(xs) @ popxl.constant(ones))
            site = ops.call_with_info(fwd, xs, ws)
            seed = popxl.constant(1.0, popxl.float32)
            (g,) = ops.call(info.graph, seed, inputs_dict=info.inputs_dict(site))
            ops.var_updates.accumulate_(accs, g)
            popxl.graph_output(collectives.replicated_all_reduce(accs, "add"))
        zeros = popxl.constant(np.zeros((K, N), np.float32))
        (total,) = ops.repeat(body, 2, zeros, x, w, acc)
        return total

    (got,) = run_replicated(R, build, [X])
    own = np.einsum("rbk,bn->rkn", X.astype(np.float64), ones) + _per_replica_grads(X, W)
    for replica in range(R):
        np.testing.assert_allclose(got[replica], 2 * own.sum(0), rtol=1e-5, atol=1e-5)
    assert (spy["acc_sum"] > 0) == _under_vmap()  # still summed as an Accumulation
