"""Runs of calls of one graph lowered as one scan (runtime/lowering/calls.py, runtime/lowering/state_layout.py).

The scan lowering must compute what inlining every call computes: same outputs and same
variables after several training steps, with by-ref inputs, gradient graphs of the called
graph, per-layer optimizer graphs, writes to single rows of stacked variables and
replication.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
from runtime.lowering import calls, replica_sums
from runtime.lowering import runs as run_plans
from runtime.session.program import build_program

from ._chain import chain_program

H, B, LAYERS, STEPS, LR = 4, 3, 3, 3, 0.1


class Layer(addons.Module):
    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        w = self.add_variable_input("w", partial(np.zeros, (H, H)), popxl.float32)
        b = self.add_variable_input("b", partial(np.zeros, (H,)), popxl.float32)
        return ops.gelu(x @ w + b)


def sgd(w: popxl.TensorByRef, g: popxl.Tensor, count: popxl.TensorByRef, replicas: int) -> None:
    if replicas > 1:
        g = ops.collectives.replicated_all_reduce(g, op="mean")
    ops.scaled_add_(w, g, b=-LR)
    ops.var_updates.accumulate_(count, popxl.constant(1.0, popxl.float32))


def training_program(replicas: int, counts_per_layer: bool = False):
    """Forward through LAYERS calls of one layer graph, the gradient graph (with
    accumulation) called per layer in reverse, SGD graphs called per weight and layer
    (sharing one by-ref counter, or with ``counts_per_layer`` one counter per layer: then
    the SGD calls are independent of each other)."""
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        stream = popxl.h2d_stream((B, H), popxl.float32, "x")
        out = popxl.d2h_stream((B, H), popxl.float32, "y")
        x = ops.host_load(stream)
        facts, layer = Layer().create_graph(x)
        acc_facts, bwd = addons.autodiff_with_accumulation(
            layer, layer.args.tensors, grads_required=[layer.graph.inputs[0]]
        )
        weights = [facts.init(f"l{i}") for i in range(LAYERS)]
        accums = [acc_facts.init(f"l{i}.grad") for i in range(LAYERS)]
        count = popxl.variable(0.0, popxl.float32, "count")
        counts = [
            popxl.variable(0.0, popxl.float32, f"count{i}") if counts_per_layer else count
            for i in range(LAYERS)
        ]
        infos, h = [], x
        for i in range(LAYERS):
            infos.append(layer.bind(weights[i]).call_with_info(h))
            h = infos[-1].outputs[0]
        ops.host_store(out, h)
        dh = h * 2.0  # gradient of sum(h ** 2)
        for i in reversed(range(LAYERS)):
            (dh,) = bwd.bind(accums[i]).call(dh, args=bwd.grad_graph_info.inputs_dict(infos[i]))
        for key in ("w", "b"):
            spec = weights[0][key]
            step = ir.create_graph(sgd, spec, spec, count, replicas)
            for i in range(LAYERS):
                ops.call(step, weights[i][key], accums[i][f"accum.{key}"], counts[i])
        for i in range(LAYERS):  # writes to single rows of a stacked variable
            ops.var_updates.copy_var_update_(
                accums[i]["mean_accum_counter"], popxl.constant(0.0, popxl.float32)
            )
    variables = [t for named in weights + accums for t in named.tensors]
    variables += counts if counts_per_layer else [count]
    return ir, stream, out, weights, variables


def train(policy: str, replicas: int, monkeypatch: pytest.MonkeyPatch, per_layer: bool = False):
    monkeypatch.setattr(run_plans, "_policy", policy)
    ir, stream, out, weights, variables = training_program(replicas, per_layer)
    session = popxl.Session(ir, "ipu_model")
    rng = np.random.default_rng(0)
    session.write_variables_data({
        t: rng.normal(0, 0.5, t.shape).astype(np.float32)
        for named in weights
        for t in named.tensors
    })  # fmt: skip
    lead = (replicas,) if replicas > 1 else ()
    outputs = []
    with session:
        for _ in range(STEPS):
            x = rng.normal(size=(*lead, B, H)).astype(np.float32)
            outputs.append(session.run({stream: x})[out])
    data = session.get_tensors_data(variables)
    return outputs, [data[t] for t in variables], session._program


@pytest.mark.parametrize("replicas", [1, 2])
def test_scanned_training_matches_inlined(replicas, monkeypatch):
    monkeypatch.setenv("POPXL_REPLICATION", "vmap")
    sums_taken = []
    original = replica_sums.Summed.replica_sum

    def spy(self, axis_name, replicas):
        sums_taken.append(self)
        return original(self, axis_name, replicas)

    monkeypatch.setattr(replica_sums.Summed, "replica_sum", spy)
    outs_scan, vars_scan, program = train("scan", replicas, monkeypatch)
    # Under replication the gradient accumulators leave the scanned gradient calls with
    # their replica sums, which the SGD calls' all-reduces take (runtime/lowering/replica_sums.py).
    assert bool(sums_taken) == (replicas > 1)
    outs_inline, vars_inline, inlined = train("inline", replicas, monkeypatch)
    stacked = [e for e in program.entries if len(e) > 1]
    # w, b, their accumulators and the accumulation counters are stored stacked.
    assert len(stacked) == 5 and all(len(e) == LAYERS for e in stacked)
    assert all(len(e) == 1 for e in inlined.entries)
    for a, b in zip(outs_scan, outs_inline):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    for a, b in zip(vars_scan, vars_inline):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    # The by-ref counter passed to every SGD call counted 2 * LAYERS calls per step.
    assert float(vars_scan[-1]) == 2 * LAYERS * STEPS
    # Training moved the weights.
    assert not np.allclose(vars_scan[0], vars_inline[0] * 0)


def _record_results(monkeypatch, name: str) -> list:
    """Wrap ``calls.<name>`` so every result it returns is appended to the returned list."""
    found: list = []
    original = getattr(calls, name)

    def spy(*args, **kwargs):
        found.append(original(*args, **kwargs))
        return found[-1]

    monkeypatch.setattr(calls, name, spy)
    return found


@pytest.mark.parametrize("replicas", [1, 2])
def test_independent_calls_are_mapped_and_match_inlined(replicas, monkeypatch):
    """SGD calls with a counter per layer carry nothing from call to call: they are lowered
    as one ``vmap`` over the stacked weights (one kernel per op for every layer)."""
    monkeypatch.setenv("POPXL_REPLICATION", "vmap")
    mapped = _record_results(monkeypatch, "_lower_as_map")
    outs_scan, vars_scan, _ = train("scan", replicas, monkeypatch, per_layer=True)
    # The SGD runs of w and of b, once per trace of the step.
    assert mapped[:2] == [True, True] and all(mapped)
    outs_inline, vars_inline, _ = train("inline", replicas, monkeypatch, per_layer=True)
    for a, b in zip(outs_scan + vars_scan, outs_inline + vars_inline):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    # Every layer's counter counted its own two SGD calls per step.
    assert [float(v) for v in vars_scan[-LAYERS:]] == [2.0 * STEPS] * LAYERS


def test_calls_with_effects_are_scanned_not_mapped(monkeypatch):
    """A graph that loads from a host stream must see the calls in order: no map."""
    monkeypatch.setattr(run_plans, "_policy", "scan")
    ir = popxl.Ir()
    ir.num_host_transfers = 3
    with ir.main_graph:
        stream = popxl.h2d_stream((2,), popxl.float32, "x")
        ws = [popxl.variable(np.zeros(2, np.float32), name=f"w{i}") for i in range(3)]

        def load_into(w: popxl.TensorByRef) -> None:
            ops.var_updates.copy_var_update_(w, ops.host_load(stream))

        graph = ir.create_graph(load_into, ws[0])
        for w in ws:
            ops.call(graph, w)
    with popxl.Session(ir, "ipu_model") as session:
        session.run({stream: np.arange(6, dtype=np.float32).reshape(3, 2)})
        data = session.get_tensors_data(ws)
    np.testing.assert_array_equal(np.stack([data[w] for w in ws]), [[0, 1], [2, 3], [4, 5]])


def test_calls_with_identical_inputs_only(monkeypatch):
    """Calls sharing every input (nothing stacked, nothing carried) still give every
    call's outputs."""
    monkeypatch.setattr(run_plans, "_policy", "scan")
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.array([1.0, 2.0], np.float32), name="a")
        square = ir.create_graph(lambda t: t * t, a)
        outs = [ops.call(square, a)[0] for _ in range(3)]
        stream = popxl.d2h_stream((2,), popxl.float32, "out")
        ops.host_store(stream, outs[0] + outs[1] + outs[2])
    assert len(run_plans.runs_of(ir.main_graph)) == 1
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_array_equal(session.run()[stream], [3.0, 12.0])


def test_runs_are_planned_with_carries_shared_and_stacked_inputs(monkeypatch):
    monkeypatch.setattr(run_plans, "_policy", "scan")
    ir, *_ = training_program(1)
    runs = list(run_plans.runs_of(ir.main_graph).values())
    kinds = [[s.kind for s in run.slots] for run in runs]
    # forward (x carried, w and b stacked), gradient, SGD for w and for b
    assert len(runs) == 4 and all(len(run.ops) == LAYERS for run in runs)
    assert kinds[0] == ["carry", "stack", "stack"]
    assert kinds[1][0] == "carry" and kinds[1].count("stack") == len(kinds[1]) - 1
    assert kinds[2] == ["stack", "stack", "carry"]  # count: by-ref, same tensor → carried


def test_stacked_variables_read_and_written_per_variable(monkeypatch):
    monkeypatch.setattr(run_plans, "_policy", "scan")
    ir, stream, out, weights, variables = training_program(1)
    session = popxl.Session(ir, "ipu_model")
    w1 = weights[1]["w"]
    value = np.arange(H * H, dtype=np.float32).reshape(H, H)
    with session:
        session.write_variable_data(w1, value)  # attached: updates one row of the stack
        np.testing.assert_array_equal(session.get_tensor_data(w1), value)
        np.testing.assert_array_equal(session.get_tensor_data(weights[0]["w"]), np.zeros((H, H)))


def _twin_layers_program(replicas: int):
    """Two layers built as two graphs of one structure, each differentiated on its own
    (as PopTorch captures the blocks of a model): the gradient calls of the two gradient
    graphs chain in reverse. Returns (ir, the streams of the weight gradients)."""
    from popxl import transforms  # noqa: PLC0415

    rng = np.random.default_rng(2)
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        x = popxl.variable(rng.normal(size=(B, H)).astype(np.float32), name="x")
        ws = [
            popxl.variable(rng.normal(size=(H, H)).astype(np.float32), name=f"w{i}")
            for i in range(2)
        ]
        graphs = [ir.create_graph(lambda t, w: ops.tanh(t @ w), x, ws[i]) for i in range(2)]
        infos = [transforms.autodiff(g) for g in graphs]
        sites, h = [], x
        for g, w in zip(graphs, ws):
            sites.append(ops.call_with_info(g, h, w))
            h = sites[-1].outputs[0]
        grad = popxl.constant(np.ones((B, H), np.float32))
        streams = []
        for info, site in reversed(list(zip(infos, sites))):
            grads = ops.call(info.graph, grad, inputs_dict=info.inputs_dict(site))
            grad = grads[0]
            streams.append(popxl.d2h_stream(grads[1].shape, popxl.float32, f"dw{len(streams)}"))
            ops.host_store(streams[-1], grads[1])
    return ir, streams


@pytest.mark.parametrize("replicas", [1, 2])
def test_gradient_graphs_of_identical_layers_are_one_run(replicas, monkeypatch):
    """The gradient graphs of two identical layer graphs compute the same function, so their
    calls are one run like the forward calls; under replication they stay apart, so each
    weight gradient's replica sum can wait for its use. Both agree with inlining."""
    monkeypatch.setattr(run_plans, "_policy", "scan")
    ir, streams = _twin_layers_program(replicas)
    lengths = sorted(len(run.ops) for run in run_plans.runs_of(ir.main_graph).values())
    assert lengths == ([2, 2] if replicas == 1 else [2])
    with popxl.Session(ir, "ipu_model") as session:
        scanned = session.run()
    monkeypatch.setattr(run_plans, "_policy", "inline")
    ir, streams_inline = _twin_layers_program(replicas)
    with popxl.Session(ir, "ipu_model") as session:
        inlined = session.run()
    for a, b in zip(streams, streams_inline):
        np.testing.assert_allclose(scanned[a], inlined[b], rtol=1e-6, atol=1e-6)


def test_calls_that_do_not_line_up_are_inlined(monkeypatch):
    monkeypatch.setattr(run_plans, "_policy", "scan")
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones(2, np.float32), name="a")
        double = ir.create_graph(lambda t: t * 2.0, a)
        (b,) = ops.call(double, a)
        (c,) = ops.call(double, b)
        (d,) = ops.call(double, b)  # reads the first call's output, not the previous one's
        out = popxl.d2h_stream((2,), popxl.float32, "out")
        ops.host_store(out, c + d)
    assert run_plans.runs_of(ir.main_graph) == {}
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_array_equal(session.run()[out], [8.0, 8.0])


def test_scanned_calls_compute_the_chain(monkeypatch):
    monkeypatch.setattr(run_plans, "_policy", "scan")
    ir, out = chain_program()
    program = build_program(ir)
    assert any(len(e) == 3 for e in program.entries)
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_array_equal(session.run()[out], [30.0, 30.0])


def test_policy_names_are_checked(monkeypatch):
    with pytest.raises(ValueError, match="policy must be one of scan, inline, got 'loop'"):
        run_plans.set_policy("loop")
    monkeypatch.setenv("POPXL_CALLS", "unrolled")
    with pytest.raises(ValueError, match="POPXL_CALLS must be one of scan, inline, got 'unrolled'"):
        run_plans.policy()
    monkeypatch.setenv("POPXL_CALLS", "")  # set but empty, as ``POPXL_CALLS= python ...``
    assert run_plans.policy() == "scan"


def looped_program(kind: str):
    """LAYERS calls of the layer graph (and, for ``repeat``, its gradient calls into by-ref
    accumulators) inside an ``ops.repeat`` body run twice per step, or inside the taken
    branch of an ``ops.conditional``; then per-layer SGD in the main graph."""
    from popxl_addons.named_tensors import NamedTensors

    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.linspace(-1, 1, B * H, dtype=np.float32).reshape(B, H), name="x")
        out = popxl.d2h_stream((B, H), popxl.float32, "y")
        facts, layer = Layer().create_graph(x)
        acc_facts, bwd = addons.autodiff_with_accumulation(
            layer, layer.args.tensors, grads_required=[layer.graph.inputs[0]]
        )
        weights = [facts.init(f"l{i}") for i in range(LAYERS)]
        accums = [acc_facts.init(f"l{i}.grad") for i in range(LAYERS)]

        def inputs_like(named_list, by_ref=False):
            return [
                NamedTensors.from_dict({
                    k: popxl.graph_input(t.shape, t.dtype, by_ref=by_ref)
                    for k, t in named.to_dict().items()
                })
                for named in named_list
            ]  # fmt: skip

        body = ir.create_empty_graph("body")
        with body:
            h = popxl.graph_input((B, H), popxl.float32)
            w_in = inputs_like(weights)
            a_in = inputs_like(accums, by_ref=True) if kind == "repeat" else []
            infos = []
            for i in range(LAYERS):
                infos.append(layer.bind(w_in[i]).call_with_info(h))
                h = infos[-1].outputs[0]
            for i in reversed(range(len(a_in))):
                (h,) = bwd.bind(a_in[i]).call(h, args=bwd.grad_graph_info.inputs_dict(infos[i]))
            popxl.graph_output(h * 0.5)
        feed = [t for named in weights + accums[: len(a_in)] for t in named.tensors]
        if kind == "repeat":
            (y,) = ops.repeat(body, 2, x, *feed)
        else:
            other = ir.create_graph(lambda t: t * 2.0, x)
            (y,) = ops.conditional(popxl.constant(True), body, other, [x, *feed], [x])
        ops.host_store(out, y)
        if kind == "repeat":
            for key in ("w", "b"):
                step = ir.create_graph(
                    lambda w, g: ops.scaled_add_(w, g, b=-LR), weights[0][key], weights[0][key]
                )
                for i in range(LAYERS):
                    ops.call(step, weights[i][key], accums[i][f"accum.{key}"])
    variables = [t for named in weights + accums for t in named.tensors]
    return ir, out, weights, variables


def train_looped(kind: str, policy: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(run_plans, "_policy", policy)
    ir, out, weights, variables = looped_program(kind)
    session = popxl.Session(ir, "ipu_model")
    rng = np.random.default_rng(1)
    session.write_variables_data({
        t: rng.normal(0, 0.5, t.shape).astype(np.float32)
        for named in weights
        for t in named.tensors
    })  # fmt: skip
    with session:
        outputs = [session.run()[out] for _ in range(STEPS)]
    data = session.get_tensors_data(variables)
    return outputs, [data[t] for t in variables], session._program


@pytest.mark.parametrize("kind", ["repeat", "conditional"])
def test_calls_inside_loops_and_branches_scan_stored_stacks(kind, monkeypatch):
    """Runs inside a ``repeat`` body or a branch get their variables stored stacked and
    receive each stack whole (no per-iteration stacking); same numbers as inlining."""
    found = _record_results(monkeypatch, "input_stacks")
    outs_scan, vars_scan, program = train_looped(kind, "scan", monkeypatch)
    stacked = [e for e in program.entries if len(e) > 1]
    # w and b; for repeat also their accumulators and the accumulation counters
    assert len(stacked) == (5 if kind == "repeat" else 2)
    assert found and all(len(groups) == len(stacked) for groups in found if groups)
    outs_inline, vars_inline, _ = train_looped(kind, "inline", monkeypatch)
    for a, b in zip(outs_scan + vars_scan, outs_inline + vars_inline):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    if kind == "repeat":  # the accumulators and weights moved
        assert not np.allclose(vars_scan[0], vars_inline[0] * 0)


# Found by the differential campaign (seeds 601003681 and 601005329) -----------------------


@pytest.mark.parametrize("policy", ["scan", "inline"])
def test_call_output_passing_an_input_through_is_a_copy(policy, monkeypatch):
    """A called graph returns its input; an in-place op on that output must not reach the
    caller's variable (a row of the variables' stack under the scan policy)."""
    monkeypatch.setattr(run_plans, "_policy", policy)
    ir = popxl.Ir()
    with ir.main_graph:
        v0 = popxl.variable(np.float32(2.0), name="v0")
        v1 = popxl.variable(np.float32(1.1), name="v1")

        def g(a):
            ops.cast(a, popxl.float16)
            return a + a, a

        graph = ir.create_graph(g, v1)
        _, out = ops.call(graph, v1)
        before = ops.cast(v1, popxl.int32)
        ops.exp_(out)
        popxl.constant(np.ones(3, np.float32)) * 1.0
        streams = [popxl.d2h_stream(t.shape, t.dtype) for t in (before, v0)]
        for s, t in zip(streams, (before, v0)):
            ops.host_store(s, t)
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run()
        v1_after = session.get_tensor_data(v1)
    assert result[streams[0]] == 1  # cast before exp_, of the caller's unchanged v1
    assert result[streams[1]] == np.float32(2.0)
    assert v1_after == np.float32(1.1)


@pytest.mark.parametrize("policy", ["scan", "inline"])
def test_in_place_write_to_a_scanned_chain_output_that_is_also_carried(policy, monkeypatch):
    """The second output of a chain of calls feeds the next call and is also read after
    the run: an in-place write to the last call's one must be what a later read sees."""
    monkeypatch.setattr(run_plans, "_policy", policy)
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.full((3,), 7.0, np.float16))

        def g(a):
            return a, ops.identity(popxl.constant(np.full((3,), 0.5, np.float16)))

        graph = ir.create_graph(g, x)
        _, b1 = ops.call(graph, x)
        _, b2 = ops.call(graph, b1)
        ops.var_updates.accumulate_(b2, b1)
        d = popxl.d2h_stream((3,), popxl.float16)
        ops.host_store(d, b2)
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_array_equal(session.run()[d], np.ones(3, np.float16))
