"""Calls of one graph and identical variable updates grouped wherever they sit in the
schedule (runtime/lowering/grouping.py, runtime/lowering/calls.py).

Grouped lowering must compute what lowering every call and op in program order computes,
and keep the order of what the program observes: in-place writes, host IO and random seeds
between the grouped calls.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from runtime.lowering import calls, grouping
from runtime.lowering import runs as run_plans
from runtime.session.program import abstract_inputs, abstract_state, build_program

LAYERS, LR = 3, 0.5
SHAPES = {"w": (4, 3), "b": (3,), "s": (2,)}


def optimizer_program(inline: bool):
    """Per-variable updates written the popxl-addons way: one graph per shape (cached),
    called for every variable in variable order, so calls of one graph are interleaved
    with calls of the others. Between them: a host store of a variable just updated, a
    random draw from a seed, and (``inline``) the update written as ``scaled_add_``."""
    ir = popxl.Ir()
    with ir.main_graph:
        rng = np.random.default_rng(0)
        params = {
            (i, k): popxl.variable(rng.normal(size=s).astype(np.float32), name=f"{k}{i}")
            for i in range(LAYERS)
            for k, s in SHAPES.items()
        }
        grads = {key: v * 0.5 + 1.0 for key, v in params.items()}  # computed from the params
        seen = popxl.d2h_stream(SHAPES["b"], popxl.float32, "seen")
        noise_out = popxl.d2h_stream((2,), popxl.float32, "noise")
        seed = popxl.variable(np.array([7, 11], np.uint32), popxl.uint32, "seed")
        graphs = {}

        def sgd(w: popxl.TensorByRef, g: popxl.Tensor) -> None:
            ops.scaled_add_(w, ops.sin(g), b=-LR)

        for (i, k), v in params.items():
            if inline:
                ops.scaled_add_(v, ops.sin(grads[i, k]), b=-LR)
            else:
                if k not in graphs:
                    graphs[k] = ir.create_graph(sgd, v, grads[i, k])
                ops.call(graphs[k], v, grads[i, k])
            if (i, k) == (1, "b"):  # must see layer 1's b updated, layer 2's not
                ops.host_store(seen, v)
                ops.host_store(noise_out, ops.random_normal(seed, (2,)))
    return ir, params, grads, seen, noise_out


def expected(params_before: dict) -> dict:
    return {k: v - LR * np.sin(v * 0.5 + 1.0) for k, v in params_before.items()}


def run(policy: str, inline: bool, monkeypatch: pytest.MonkeyPatch) -> tuple:
    monkeypatch.setattr(run_plans, "_policy", policy)
    ir, params, _, seen, noise = optimizer_program(inline)
    with popxl.Session(ir, "ipu_model") as session:
        before = session.get_tensors_data(list(params.values()))
        before = {k: before[v].copy() for k, v in params.items()}
        outs = session.run()
        data = session.get_tensors_data(list(params.values()))
    return before, {k: data[v] for k, v in params.items()}, outs[seen], outs[noise], ir


@pytest.mark.parametrize("inline", [False, True])
def test_interleaved_updates_match_program_order(inline, monkeypatch):
    before, grouped, seen, noise, ir = run("scan", inline, monkeypatch)
    _, plain, seen_plain, noise_plain, _ = run("inline", inline, monkeypatch)
    want = expected(before)
    for key in want:
        np.testing.assert_allclose(grouped[key], want[key], rtol=1e-6)
        np.testing.assert_array_equal(grouped[key], plain[key])
    np.testing.assert_array_equal(seen, want[1, "b"])  # the store saw its own update only
    np.testing.assert_array_equal(seen, seen_plain)
    np.testing.assert_array_equal(noise, noise_plain)
    order = grouping.schedule(ir.main_graph)
    if inline:  # the updates of each shape became one group
        groups = [g for g in order if isinstance(g, grouping.OpGroup)]
        assert {len(g.ops) for g in groups if g.ops[0].opdef.key.startswith("scaled")} == {LAYERS}
    else:  # the calls of each graph are consecutive
        called = [op.attrs["graphs"][0] for op in order if op.opdef.special == "call"]
        changes = sum(a is not b for a, b in zip(called, called[1:]))
        assert changes == len(SHAPES) - 1


def test_host_io_between_calls_of_an_effectful_graph_keeps_its_order(monkeypatch):
    """Calls that load from a stream, with stores of what they loaded between them: the
    loads and stores keep their order, so each store sees its own call's value."""
    monkeypatch.setattr(run_plans, "_policy", "scan")
    ir = popxl.Ir()
    ir.num_host_transfers = 3
    with ir.main_graph:
        x = popxl.h2d_stream((2,), popxl.float32, "x")
        y = popxl.d2h_stream((2,), popxl.float32, "y")
        ws = [popxl.variable(np.zeros(2, np.float32), name=f"w{i}") for i in range(3)]

        def load_into(w: popxl.TensorByRef) -> None:
            ops.var_updates.copy_var_update_(w, ops.host_load(x))

        graph = ir.create_graph(load_into, ws[0])
        for w in ws:
            ops.call(graph, w)
            ops.host_store(y, w * 2.0)
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run({x: np.arange(6, dtype=np.float32).reshape(3, 2)})[y]
    np.testing.assert_array_equal(out, [[0, 2], [4, 6], [8, 10]])


def test_dependent_op_between_chained_calls_moves_after_them(monkeypatch):
    """A sum of the calls' side outputs between chained calls (autodiff's gradient of an
    input shared by every layer) is moved after the chain, which becomes one scan."""
    scans = []
    original = calls.lower_run

    def spy(ctx, env, run):
        scans.append(len(run.ops))
        return original(ctx, env, run)

    monkeypatch.setattr(calls, "lower_run", spy)
    results = {}
    for policy in ("scan", "inline"):
        monkeypatch.setattr(run_plans, "_policy", policy)
        ir = popxl.Ir()
        with ir.main_graph:
            ws = [popxl.variable(np.full(3, i + 1.0, np.float32), name=f"w{i}") for i in range(4)]
            x = popxl.variable(np.array([0.1, 0.2, 0.3], np.float32), name="x")
            layer = ir.create_graph(lambda h, w: (ops.tanh(h * w), h + w), x, ws[0])
            h, total = x, None
            for w in ws:
                h, side = ops.call(layer, h, w)
                total = side if total is None else total + side
            out = popxl.d2h_stream((3,), popxl.float32, "out")
            ops.host_store(out, h + total)
        with popxl.Session(ir, "ipu_model") as session:
            results[policy] = session.run()[out]
    assert scans == [4]
    np.testing.assert_allclose(results["scan"], results["inline"], rtol=1e-6)


def _count_primitive(jaxpr: Any, name: str) -> int:
    """Equations of primitive ``name`` in ``jaxpr`` and the jaxprs nested in it."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == name
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                inner = getattr(sub, "jaxpr", sub)  # a closed jaxpr, or a jaxpr
                if hasattr(inner, "eqns"):
                    count += _count_primitive(inner, name)
    return count


@pytest.mark.parametrize("inline", [False, True])
def test_each_graph_is_traced_once(inline, monkeypatch):
    """The traced step holds one ``sin`` per shape (one body per graph, or per group of
    inline updates), not one per variable; lowered in program order it holds one per
    variable. Inline, ``b1`` is the exception: the program also stores it on its own, so
    it is not stacked and its update chain is lowered on its own (one more ``sin``)."""
    counts = {}
    for policy in ("scan", "inline"):
        monkeypatch.setattr(run_plans, "_policy", policy)
        ir, *_ = optimizer_program(inline)
        program = build_program(ir)
        state = program.split(abstract_state(program))
        jaxpr = program.step.trace(*state, abstract_inputs(program)).jaxpr
        counts[policy] = _count_primitive(jaxpr.jaxpr, "sin")
    grouped = len(SHAPES) + (1 if inline else 0)
    assert counts == {"scan": grouped, "inline": len(SHAPES) * LAYERS}


def remote_program():
    """Per-layer weights in one remote buffer: loaded, updated and stored back per layer,
    with a load of layer 0's slot after its store (it must see the stored value)."""
    ir = popxl.Ir()
    with ir.main_graph:
        buffer = popxl.remote_buffer((3,), popxl.float32, LAYERS)
        init = np.arange(3 * LAYERS, dtype=np.float32).reshape(LAYERS, 3)
        _ = [popxl.remote_variable(init[i], buffer, i, name=f"w{i}") for i in range(LAYERS)]
        out = popxl.d2h_stream((3,), popxl.float32, "out")
        for i in range(LAYERS):
            w = ops.remote_load(buffer, i)
            ops.remote_store(buffer, i, ops.sin(w) + 1.0)
            if i == 0:
                ops.host_store(out, ops.remote_load(buffer, 0))
    return ir, init, out


def _scan_and_inline(monkeypatch: pytest.MonkeyPatch, build: Any) -> dict[str, tuple]:
    """``build()``'s program (``ir, init, out``) run with repeated calls and ops grouped
    (``scan``) and in program order (``inline``): ``{policy: (ir, init, out's value)}``."""
    results = {}
    for policy in ("scan", "inline"):
        monkeypatch.setattr(run_plans, "_policy", policy)
        ir, init, out = build()
        with popxl.Session(ir, "ipu_model") as session:
            results[policy] = (ir, init, session.run()[out])
    return results


def test_remote_io_grouped_keeps_slot_order(monkeypatch):
    runs = _scan_and_inline(monkeypatch, remote_program)
    ir, init, _ = runs["scan"]
    results = {policy: run[2] for policy, run in runs.items()}
    np.testing.assert_allclose(results["scan"], np.sin(init[0]) + 1.0, rtol=1e-6)
    np.testing.assert_array_equal(results["scan"], results["inline"])
    groups = [g for g in grouping.schedule(ir.main_graph) if isinstance(g, grouping.OpGroup)]
    assert {g.ops[0].opdef.key for g in groups} >= {"remote_store"}


def test_all_reduces_grouped_under_replication(monkeypatch):
    """Per-variable mean all-reduces of gradients, each followed by its update: grouped
    into one all-reduce of the stack, with the same numbers."""
    monkeypatch.setenv("POPXL_REPLICATION", "vmap")
    results = {}
    for policy in ("scan", "inline"):
        monkeypatch.setattr(run_plans, "_policy", policy)
        ir = popxl.Ir(replication=2)
        with ir.main_graph:
            x = popxl.h2d_stream((3,), popxl.float32, "x")
            data = ops.host_load(x)
            ws = [popxl.variable(np.ones(3, np.float32), name=f"w{i}") for i in range(LAYERS)]
            for i, w in enumerate(ws):
                g = ops.collectives.replicated_all_reduce(data * float(i + 1), op="mean")
                ops.scaled_add_(w, g, b=-LR)
        feed = np.arange(6, dtype=np.float32).reshape(2, 3)
        with popxl.Session(ir, "ipu_model") as session:
            session.run({x: feed})
            values = session.get_tensors_data(ws)
        results[policy] = np.stack([values[w] for w in ws])
        if policy == "scan":
            sizes = [
                len(g.ops)
                for g in grouping.schedule(ir.main_graph)
                if isinstance(g, grouping.OpGroup) and "all_reduce" in g.ops[0].opdef.key
            ]
            assert sizes == [LAYERS]
    want = np.stack([1.0 - LR * (i + 1) * feed.mean(0) for i in range(LAYERS)])
    np.testing.assert_allclose(results["scan"].reshape(want.shape), want, rtol=1e-6)
    np.testing.assert_array_equal(results["scan"], results["inline"])


def test_structurally_identical_graphs_share_a_run(monkeypatch):
    """Graphs built separately from the same function (a pipeline's stash graph per layer)
    are grouped like one graph; a graph that computes something else is not."""
    runs = []
    original = calls.lower_run

    def spy(ctx, env, run):
        runs.append(len(run.ops))
        return original(ctx, env, run)

    monkeypatch.setattr(calls, "lower_run", spy)
    results = {}
    for policy in ("scan", "inline"):
        monkeypatch.setattr(run_plans, "_policy", policy)
        ir = popxl.Ir()
        with ir.main_graph:
            ws = [popxl.variable(np.full(2, i + 1.0, np.float32), name=f"w{i}") for i in range(4)]

            def halve(w: popxl.TensorByRef) -> None:
                ops.scaled_add_(w, ops.cos(w), a=0.5)

            def double(w: popxl.TensorByRef) -> None:
                ops.scaled_add_(w, ops.cos(w), a=2.0)

            for w in ws:
                ops.call(ir.create_graph(halve, w), w)
            ops.call(ir.create_graph(double, ws[0]), ws[0])
        with popxl.Session(ir, "ipu_model") as session:
            session.run()
            data = session.get_tensors_data(ws)
        results[policy] = np.stack([data[w] for w in ws])
    assert runs == [4]
    np.testing.assert_array_equal(results["scan"], results["inline"])
    halved = [0.5 * (i + 1.0) + np.cos(i + 1.0) for i in range(4)]
    halved[0] = 2.0 * halved[0] + np.cos(halved[0])
    np.testing.assert_allclose(results["scan"][:, 0], halved, rtol=1e-6)


def out_of_order_layers_program():
    """Three layers whose weights were created out of layer order (as by name: layer 10
    before layer 2), called in layer order; then per-variable updates in layer order, as a
    torch optimizer step is captured: a gradient, a per-variable learning rate, their
    product, an in-place update. Two weights of each layer share a shape, so a group of
    updates reads two stacks."""
    ir = popxl.Ir()
    rng = np.random.default_rng(3)
    names = ("w", "b", "c")
    with ir.main_graph:
        weights: dict[tuple[int, str], popxl.Variable] = {}
        for i in (0, 2, 1):
            for k in names:
                shape = (3, 3) if k == "w" else (3,)
                data = rng.normal(size=shape).astype(np.float32)
                weights[i, k] = popxl.variable(data, name=f"{k}{i}")
        scales = {
            key: popxl.variable(np.float32(0.1 * (n + 1)), name=f"s{n}")
            for n, key in enumerate(sorted(weights))
        }
        x = popxl.variable(rng.normal(size=(2, 3)).astype(np.float32), name="x")

        def layer(h: popxl.Tensor, w: popxl.Tensor, b: popxl.Tensor, c: popxl.Tensor):
            return ops.tanh(h @ w + b) * c

        graph = ir.create_graph(layer, x, *(weights[0, k] for k in names))
        h = x
        for i in range(3):
            (h,) = ops.call(graph, h, *(weights[i, k] for k in names))
        out = popxl.d2h_stream((2, 3), popxl.float32, "out")
        ops.host_store(out, h)
        for i in range(3):
            for k in names:
                v = weights[i, k]
                lr = ops.mul(scales[i, k], popxl.constant(2.0))
                ops.scaled_add_(v, ops.mul(ops.sin(v), lr), b=-1.0)
    return ir, weights, scales, x, out


def _gathered_rows(jaxpr: Any) -> list[tuple[int, ...]]:
    """The row shape of every ``gather`` in ``jaxpr`` and the jaxprs nested in it."""
    rows = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "gather":
            rows.append(tuple(eqn.invars[0].aval.shape[1:]))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    rows += _gathered_rows(inner)
    return rows


def test_layers_created_out_of_order_are_read_without_gathers(monkeypatch):
    """The weights' stacks follow the calls' order, and each group of updates reads the
    stacks the previous groups left in the order that gathers least (a gather copies every
    row each step)."""
    results = {}
    for policy in ("scan", "inline"):
        monkeypatch.setattr(run_plans, "_policy", policy)
        ir, weights, scales, x, out = out_of_order_layers_program()
        with popxl.Session(ir, "ipu_model") as session:
            before = {key: session.get_tensor_data(v).copy() for key, v in weights.items()}
            s = {key: float(session.get_tensor_data(v)) for key, v in scales.items()}
            x0 = session.get_tensor_data(x)
            got = session.run()[out]
            after = {key: session.get_tensor_data(v) for key, v in weights.items()}
        results[policy] = (got, after)
        if policy == "scan":
            program = build_program(ir)
            state = program.split(abstract_state(program))
            jaxpr = program.step.trace(*state, abstract_inputs(program)).jaxpr
            # Only the learning rates (scalars, cheaper to gather than weight rows) are
            # gathered: the product group reads them in the order of the weights' stacks.
            assert _gathered_rows(jaxpr.jaxpr) == [()]
            assert _count_primitive(jaxpr.jaxpr, "scatter") == 0
    h = x0
    for i in range(3):
        h = np.tanh(h @ before[i, "w"] + before[i, "b"]) * before[i, "c"]
    np.testing.assert_allclose(results["scan"][0], h, rtol=1e-5)
    for key, v in before.items():
        want = v - np.sin(v) * np.float32(2 * s[key])
        np.testing.assert_allclose(results["scan"][1][key], want, rtol=1e-5)
        np.testing.assert_array_equal(results["scan"][1][key], results["inline"][1][key])


def phased_loads_program():
    """Two phases, as phased execution writes them: every layer's weight is loaded from
    its remote slot in layer order and used, then loaded again in reverse layer order."""
    ir = popxl.Ir()
    with ir.main_graph:
        buffer = popxl.remote_buffer((2, 3), popxl.float32, LAYERS)
        init = np.arange(6 * LAYERS, dtype=np.float32).reshape(LAYERS, 2, 3) / 10
        _ = [popxl.remote_variable(init[i], buffer, i, name=f"w{i}") for i in range(LAYERS)]
        out = popxl.d2h_stream((2, 3), popxl.float32, "out")
        h = popxl.constant(np.ones((2, 3), np.float32))
        forward = [ops.remote_load(buffer, i) for i in range(LAYERS)]
        backward = [ops.remote_load(buffer, i) for i in reversed(range(LAYERS))]
        for w in forward:
            h = ops.sin(h * w)
        for w in backward:
            h = ops.cos(h + w)
        ops.host_store(out, h)
    return ir, init, out


def test_phase_loads_read_the_buffer_without_a_gather(monkeypatch):
    """Loads of every slot in order, then in reverse, are the buffer and its reverse (no
    gather, which copies every row each step), with the numbers of program order."""
    runs = _scan_and_inline(monkeypatch, phased_loads_program)
    ir, init, _ = runs["scan"]
    groups = [g for g in grouping.schedule(ir.main_graph) if isinstance(g, grouping.OpGroup)]
    assert [len(g.ops) for g in groups if g.ops[0].opdef.key == "remote_load"] == [2 * LAYERS]
    monkeypatch.setattr(run_plans, "_policy", "scan")
    program = build_program(ir)
    state = program.split(abstract_state(program))
    jaxpr = program.step.trace(*state, abstract_inputs(program)).jaxpr
    assert _gathered_rows(jaxpr.jaxpr) == []
    h = np.ones((2, 3), np.float32)
    for i in range(LAYERS):
        h = np.sin(h * init[i])
    for i in reversed(range(LAYERS)):
        h = np.cos(h + init[i])
    np.testing.assert_allclose(runs["scan"][2], h, rtol=1e-5)
    np.testing.assert_array_equal(runs["scan"][2], runs["inline"][2])


def test_weights_the_forward_reads_alone_keep_an_entry_each(monkeypatch):
    """Weights read one by one by the forward pass (no run of layers) are not stacked for
    their group of updates (each read would copy its row every step), and that group is
    lowered op by op, in place. The momenta follow: their updates read the weights' ops'
    outputs, arrays of their own, so they too are kept apart and updated in place.
    Nothing is concatenated, sliced or scattered."""
    results = {}
    for policy in ("scan", "inline"):
        monkeypatch.setattr(run_plans, "_policy", policy)
        ir = popxl.Ir()
        with ir.main_graph:
            rng = np.random.default_rng(3)
            ws = [popxl.variable(rng.normal(size=(4, 4)).astype(np.float32), name=f"w{i}")
                  for i in range(3)]  # fmt: skip
            ms = [popxl.variable(np.full((4, 4), 0.5, np.float32), name=f"m{i}") for i in range(3)]
            x = popxl.variable(rng.normal(size=(2, 4)).astype(np.float32), name="x")
            h = x
            for w in ws:
                h = ops.tanh(h @ w)
            out = popxl.d2h_stream((2, 4), popxl.float32, "out")
            ops.host_store(out, h)
            for w, m in zip(ws, ms):
                ops.scaled_add_(m, ops.sin(w), a=0.9, b=0.1)
                ops.scaled_add_(w, m, b=-0.5)
        with popxl.Session(ir, "ipu_model") as session:
            got = session.run()[out]
            results[policy] = (got, session.get_tensors_data(ws + ms))
        if policy == "scan":
            program = build_program(ir)
            names = [tuple(program.variables[i].name for i in e) for e in program.entries]
            assert sorted(names) == sorted((v.name,) for v in [*ws, *ms, x])
            state = program.split(abstract_state(program))
            jaxpr = program.step.trace(*state, abstract_inputs(program)).jaxpr
            for name in ("concatenate", "slice", "scatter", "gather", "dynamic_update_slice"):
                assert _count_primitive(jaxpr.jaxpr, name) == 0, name
    scan_out, scan_vars = results["scan"]
    inline_out, inline_vars = results["inline"]
    np.testing.assert_array_equal(scan_out, inline_out)
    for (t, a), b in zip(scan_vars.items(), inline_vars.values()):
        np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=t.name)


def differentiated_layers_program():
    """Three layers' weights created out of layer order (layer 0, 2, 1: neither their
    order nor its reverse, as weights created by name are), a model graph calling one
    layer graph per layer, its gradient graph from ``autodiff`` (calling the layer's
    gradient graph in reverse layer order), and SGD updates in layer order: a captured
    torch training step in miniature."""
    ir = popxl.Ir()
    rng = np.random.default_rng(5)
    with ir.main_graph:
        created = {
            i: popxl.variable(rng.normal(size=(3, 3)).astype(np.float32), name=f"w{i}")
            for i in (0, 2, 1)
        }
        ws = [created[i] for i in range(LAYERS)]
        x = popxl.variable(rng.normal(size=(2, 3)).astype(np.float32), name="x")
        layer = ir.create_graph(lambda h, w: ops.tanh(h @ w), x.spec, ws[0].spec)

        def model(h: popxl.Tensor, *weights: popxl.Tensor) -> popxl.Tensor:
            for w in weights:
                (h,) = ops.call(layer, h, w)
            return ops.sum(h)

        fwd = ir.create_graph(model, x.spec, *(w.spec for w in ws))
        info = popxl.transforms.autodiff(fwd, grads_required=fwd.inputs[1:])
        site = ops.call_with_info(fwd, x, *ws)
        seed = popxl.constant(1.0, popxl.float32, "seed")
        grads = ops.call(info.graph, seed, inputs_dict=info.inputs_dict(site))
        for w, g in zip(ws, grads):
            ops.scaled_add_(w, g, b=-LR)
    return ir, ws, x


def test_layers_created_out_of_order_are_stored_in_layer_order(monkeypatch):
    """The forward graph's layers read the weights in the order the updates in the main
    graph read them, and the gradient run in reverse: the weights' stack follows the
    forward run (a chain of layers), not the gradient run. The forward run then scans it
    as it lies, the gradient run scans it in reverse and writes the gradients in layer
    order, and the updates read both stacks as they lie: no reversed copy anywhere (each
    would copy every weight every step)."""
    results = {}
    for policy in ("scan", "inline"):
        monkeypatch.setattr(run_plans, "_policy", policy)
        ir, ws, x = differentiated_layers_program()
        with popxl.Session(ir, "ipu_model") as session:
            before = [session.get_tensor_data(w).copy() for w in ws]
            x0 = session.get_tensor_data(x).copy()
            session.run()
            results[policy] = [session.get_tensor_data(w).copy() for w in ws]
        if policy == "scan":
            program = build_program(ir)
            mut, fixed = program.split(abstract_state(program))
            stash = tuple(jax.ShapeDtypeStruct(*spec) for spec in program.scratch_specs())
            jaxpr = program.step.trace((*mut, *stash), fixed, abstract_inputs(program)).jaxpr
            assert _count_primitive(jaxpr.jaxpr, "scan") == 2
            assert _count_primitive(jaxpr.jaxpr, "rev") == 0
            assert _gathered_rows(jaxpr.jaxpr) == []

    def loss(weights: list) -> Any:
        h = jnp.asarray(x0)
        for w in weights:
            h = jnp.tanh(h @ w)
        return jnp.sum(h)

    grads = jax.grad(loss)([jnp.asarray(w) for w in before])
    for w, g, got, inlined in zip(before, grads, results["scan"], results["inline"]):
        np.testing.assert_allclose(got, w - LR * np.asarray(g), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got, inlined, rtol=1e-6, atol=1e-7)
