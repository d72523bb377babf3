"""Build a program as PopXL IR: the system under test's side of the comparison."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl import transforms
from popxl.ops import collectives
from popxl_addons.transforms.batch_serialisation import (
    RemoteHandle,
    batch_serial_buffer,
    batch_serialise,
)
from popxl_addons.transforms.recomputation import recompute_graph

from .generator_extras import ADDONS_SHIFT, BATCH_SHIFT, written_args
from .program import Block, Leaf, Node, Program

DTYPES = {
    "float32": popxl.float32,
    "float16": popxl.float16,
    "int32": popxl.int32,
    "bool": popxl.bool,
}

UNARY = {
    name: getattr(ops, name)
    for name in (
        "exp", "tanh", "sin", "cos", "sigmoid", "gelu", "swish", "negate", "abs", "relu",
        "floor", "ceil", "sign", "sqrt", "log", "logical_not", "identity",
        "relu_", "exp_", "sigmoid_",
    )
}  # fmt: skip
BINARY = {
    name: getattr(ops, name)
    for name in (
        "add", "sub", "mul", "div", "maximum", "greater", "equal", "logical_and",
        "logical_or", "matmul", "add_",
    )
}  # fmt: skip
REDUCE = {
    n: getattr(ops, n) for n in ("sum", "mean", "max", "min", "prod", "sumsquare", "logsumexp")
}


class Built:
    """One program's handles in a built Ir: its output streams and leaf tensors."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.out_streams: list[Any] = []
        self.leaf_tensors: list[Any] = []
        self.in_streams: dict[Any, np.ndarray] = {}


class Builder:
    """Builds programs into one Ir (several programs may share it)."""

    def __init__(self, ir: popxl.Ir) -> None:
        self.ir = ir
        self.graphs: dict[int, popxl.Graph] = {}
        self.buffers: dict[int, popxl.RemoteBuffer] = {}
        self.where: dict[str, int] = {}  # main-graph tensor id -> IPU, in placed programs
        self.pipeline: Any = None  # the PipelineContext while a pipelined program is built
        self.copies: dict[tuple[str, int], Any] = {}

    def group(self, grouping: tuple[int, int] | None) -> Any:
        return None if grouping is None else self.ir.replica_grouping(*grouping)

    def program(self, program: Program) -> Built:
        built = Built(program)
        self.buffers, self.copies = {}, {}
        with self.ir.main_graph:
            if program.steps > 1:
                with addons.pipelined_execution(program.steps) as self.pipeline:
                    self.main(program, built)
                self.pipeline = None
            else:
                self.main(program, built)
        return built

    def main(self, program: Program, built: Built) -> None:
        env: dict[int, Any] = {}
        for leaf in program.leaves:
            with self.placed(leaf.ipu if program.ipus > 1 else None):
                env[leaf.vid] = self.leaf(program, leaf, built)
                self.where[_tensor(env[leaf.vid]).id] = leaf.ipu
        # PopXL orders a load after a store of the same slot only in sequence.
        stores = any(n.op in ("remote_store", "rts_store") for n in program.main.nodes)
        with popxl.in_sequence(True) if stores else contextlib.nullcontext():
            self.nodes(program.main.nodes, env)
        for vid in program.main.outputs:
            t = env[vid]
            with self.placed(self.where.get(t.id) if program.ipus > 1 else None):
                d2h = popxl.d2h_stream(t.shape, t.dtype, f"out_v{vid}")
                ops.host_store(d2h, t)
            built.out_streams.append(d2h)

    def placed(self, ipu: int | None) -> Any:
        """The IPU context of ``ipu`` (and its pipeline stage in a pipelined program)."""
        stack = contextlib.ExitStack()
        if ipu is not None:
            if self.pipeline is not None:
                stack.enter_context(self.pipeline.stage(ipu))
            stack.enter_context(popxl.ipu(ipu))
        return stack

    def leaf(self, program: Program, leaf: Leaf, built: Built) -> Any:
        spec = program.specs[leaf.vid]
        dt = DTYPES[spec.dtype]
        if leaf.kind == "stream":
            h2d = popxl.h2d_stream(spec.shape, dt, f"in_v{leaf.vid}")
            built.in_streams[h2d] = leaf.data
            t = ops.host_load(h2d, f"v{leaf.vid}")
            built.leaf_tensors.append(None)
            return t
        group = self.group(leaf.grouping)
        if leaf.kind == "remote":
            key, offset, entries = leaf.slot
            if key not in self.buffers:
                self.buffers[key] = popxl.remote_buffer(spec.shape, dt, entries)
            buffer = self.buffers[key]
            var = popxl.remote_variable(
                leaf.data, buffer, offset, dt, f"v{leaf.vid}", replica_grouping=group
            )
            built.leaf_tensors.append(var)
            return (buffer, offset, var)
        if leaf.kind == "rts":
            buffer = popxl.replica_sharded_buffer(leaf.data.shape, dt, group)
            var = popxl.remote_replica_sharded_variable(
                leaf.data, buffer, 0, dt, f"v{leaf.vid}", replica_grouping=group
            )
            built.leaf_tensors.append(var)
            return (buffer, 0, var)
        var = popxl.variable(leaf.data, dt, f"v{leaf.vid}", replica_grouping=group)
        built.leaf_tensors.append(var)
        return var

    def nodes(self, nodes: list[Node], env: dict[int, Any]) -> None:
        for node in nodes:
            xs = [env[v] for v in node.args]
            ipu = node.attrs.get("ipu")
            if ipu is not None:
                kept = written_args(node)
                xs = [x if p in kept else self.copied(x, ipu) for p, x in enumerate(xs)]
            with self.placed(ipu):
                outs = self.node(node, xs)
            for vid, t in zip(node.outs, outs):
                env[vid] = t
                if ipu is not None:
                    self.where[t.id] = ipu

    def copied(self, x: Any, ipu: int) -> Any:
        """``x``, copied to ``ipu`` when it lives on another IPU."""
        source = self.where[x.id]
        if source == ipu:
            return x
        if self.pipeline is None:
            return ops.ipu_copy(x, ipu, source)
        # Pipelined programs have no in-place ops, so one copy serves every reader.
        key = (x.id, ipu)
        if key not in self.copies:
            with self.placed(source):
                self.copies[key] = ops.ipu_copy(x, ipu, source)
        return self.copies[key]

    def graph(self, block: Block, program_specs: dict) -> popxl.Graph:
        key = id(block)
        if key in self.graphs:
            return self.graphs[key]
        graph = self.ir.create_empty_graph(block.name)
        env: dict[int, Any] = {}
        with graph:
            for pos, vid in enumerate(block.inputs):
                spec = program_specs[vid]
                env[vid] = popxl.graph_input(
                    spec.shape, DTYPES[spec.dtype], f"v{vid}", by_ref=pos in block.by_ref
                )
            self.nodes(block.nodes, env)
            for vid in block.outputs:
                popxl.graph_output(env[vid])
        self.graphs[key] = graph
        return graph

    def node(self, node: Node, xs: list) -> tuple:
        a = node.attrs
        op = node.op
        handler = getattr(self, "_" + op, None)
        if handler is not None:
            return handler(node, xs)
        if op in UNARY:
            return (UNARY[op](xs[0]),)
        if op in BINARY:
            return (BINARY[op](*xs),)
        if op in REDUCE:
            return (REDUCE[op](xs[0], list(a["axis"]), a["keepdims"]),)
        raise KeyError(f"the builder has no rule for op {op!r}")

    # Ops with attributes ----------------------------------------------------------------

    def _const(self, node: Node, xs: list) -> tuple:
        spec = self.specs[node.outs[0]]
        c = popxl.constant(np.asarray(node.attrs["data"]), DTYPES[spec.dtype], f"c{node.outs[0]}")
        return (ops.identity(c),)

    def _reshape(self, node: Node, xs: list) -> tuple:
        return (ops.reshape(xs[0], node.attrs["shape"]),)

    def _reshape_(self, node: Node, xs: list) -> tuple:
        return (ops.reshape_(xs[0], node.attrs["shape"]),)

    def _transpose(self, node: Node, xs: list) -> tuple:
        return (ops.transpose(xs[0], node.attrs["perm"]),)

    def _transpose_(self, node: Node, xs: list) -> tuple:
        return (ops.transpose_(xs[0], node.attrs["perm"]),)

    def _slice_args(self, node: Node) -> dict:
        bounds = node.attrs["bounds"]
        return {
            "start": [b[0] for b in bounds],
            "stop": [b[1] for b in bounds],
            "step": [b[2] for b in bounds],
            "axis": list(range(len(bounds))),
        }

    def _slice(self, node: Node, xs: list) -> tuple:
        return (ops.slice(xs[0], **self._slice_args(node)),)

    def _slice_(self, node: Node, xs: list) -> tuple:
        return (ops.slice_(xs[0], **self._slice_args(node)),)

    def _concat(self, node: Node, xs: list) -> tuple:
        return (ops.concat(xs, node.attrs["axis"]),)

    def _cast(self, node: Node, xs: list) -> tuple:
        return (ops.cast(xs[0], DTYPES[node.attrs["dtype"]]),)

    def _clip(self, node: Node, xs: list) -> tuple:
        return (ops.clip(xs[0], node.attrs["min"], node.attrs["max"]),)

    def _scaled_add_(self, node: Node, xs: list) -> tuple:
        return (ops.scaled_add_(xs[0], xs[1], node.attrs["a"], node.attrs["b"]),)

    def _accumulate_(self, node: Node, xs: list) -> tuple:
        return (ops.var_updates.accumulate_(xs[0], xs[1]),)

    # Remote variables ------------------------------------------------------------------------

    def _remote_load(self, node: Node, xs: list) -> tuple:
        buffer, offset, _ = xs[0]
        return (ops.remote_load(buffer, offset),)

    _rts_load = _remote_load

    def _remote_store(self, node: Node, xs: list) -> tuple:
        (buffer, offset, _), value = xs
        ops.remote_store(buffer, offset, value)
        return ()

    _rts_store = _remote_store

    def _rts_gather(self, node: Node, xs: list) -> tuple:
        group = self.group(node.attrs["group"])
        return (collectives.replicated_all_gather(xs[0], group=group, output_shape="meta_shape"),)

    def _rts_slice(self, node: Node, xs: list) -> tuple:
        return (collectives.replica_sharded_slice(xs[0], self.group(node.attrs["group"])),)

    # Collectives --------------------------------------------------------------------------

    def _all_reduce(self, node: Node, xs: list) -> tuple:
        a = node.attrs
        return (collectives.replicated_all_reduce(xs[0], a["op"], self.group(a.get("group"))),)

    def _all_reduce_(self, node: Node, xs: list) -> tuple:
        a = node.attrs
        return (collectives.replicated_all_reduce_(xs[0], a["op"], self.group(a.get("group"))),)

    def _all_gather(self, node: Node, xs: list) -> tuple:
        group = self.group(node.attrs.get("group"))
        return (collectives.replicated_all_gather(xs[0], 0, group, "concat"),)

    def _reduce_scatter(self, node: Node, xs: list) -> tuple:
        a = node.attrs
        return (collectives.replicated_reduce_scatter(xs[0], a["op"], self.group(a.get("group"))),)

    # Subgraphs ------------------------------------------------------------------------------

    def _call(self, node: Node, xs: list) -> tuple:
        graph = self.graph(node.attrs["body"], self.specs)
        if node.attrs.get("by_dict"):
            return ops.call(graph, inputs_dict=dict(zip(graph.inputs, xs)))
        return ops.call(graph, *xs)

    def _repeat(self, node: Node, xs: list) -> tuple:
        graph = self.graph(node.attrs["body"], self.specs)
        return ops.repeat(graph, node.attrs["count"], *xs)

    def _cond(self, node: Node, xs: list) -> tuple:
        n_then = node.attrs["n_then"]
        then = self.graph(node.attrs["then"], self.specs)
        other = self.graph(node.attrs["else"], self.specs)
        return ops.conditional(xs[0], then, other, xs[1 : 1 + n_then], xs[1 + n_then :])

    def _grad(self, node: Node, xs: list) -> tuple:
        body = node.attrs["body"]
        fwd = self.graph(body, self.specs)
        n_in = len(body.inputs)
        info = transforms.autodiff(fwd, grads_required=[fwd.inputs[p] for p in node.attrs["wrt"]])
        site = ops.call_with_info(fwd, *xs[:n_in])
        return ops.call(info.graph, *xs[n_in:], inputs_dict=info.inputs_dict(site))

    def _addons_grad(self, node: Node, xs: list) -> tuple:
        a = node.attrs
        body = a["body"]
        n_in = len(body.inputs)
        fwd = addons.GraphWithNamedArgs(self.graph(body, self.specs))
        inputs = fwd.graph.inputs
        required = [inputs[p] for p in a["wrt"]]
        accum = None
        if a["acc"]:
            factories, grad = addons.autodiff_with_accumulation(
                fwd, [inputs[p] for p in a["acc"]], grads_required=required
            )
            accum = factories.init()
        else:
            grad = addons.autodiff(fwd, grads_required=required)
        if a["recompute"]:
            grad = recompute_graph(grad)
        for step in range(a["steps"]):
            args = list(xs[:n_in])
            if step:
                args[0] = args[0] + popxl.constant(step * ADDONS_SHIFT, popxl.float32)
            info = fwd.call_with_info(*args)
            bound = grad.bind(accum) if accum is not None else grad
            outs = bound.call(*xs[n_in:], args=grad.grad_graph_info.inputs_dict(info))
        totals = accum.to_dict() if accum is not None else {}
        means = [ops.identity(totals[f"accum.{inputs[p].name}"]) for p in a["acc"]]
        return (*outs, *means)

    def _batch_serial(self, node: Node, xs: list) -> tuple:
        a = node.attrs
        steps, n_load = a["steps"], a["n_load"]
        graph = self.graph(a["body"], self.specs)
        with popxl.in_sequence(True):
            loads = {}
            for t, x in zip(graph.inputs[:n_load], xs[:n_load]):
                buffer = batch_serial_buffer(x, steps=steps)
                for j in range(steps):
                    shift = popxl.constant(
                        j if x.dtype == popxl.int32 else j * BATCH_SHIFT, x.dtype
                    )
                    ops.remote_store(buffer, j, x + shift if j else x)
                loads[t] = RemoteHandle(buffer, 0)
            stores = {
                t: RemoteHandle(batch_serial_buffer(t, steps=steps), 0) for t in graph.outputs
            }
            result = batch_serialise(
                addons.GraphWithNamedArgs(graph), steps, loads, {}, stores, io_mode=a["io_mode"]
            )
            result.graph.call(0, *xs[n_load:])
            outs = []
            for t in graph.outputs:
                buffer = stores[t].buffer
                rows = [ops.remote_load(buffer, j).reshape((1, *t.shape)) for j in range(steps)]
                outs.append(ops.concat(rows, 0) if steps > 1 else rows[0])
        return tuple(outs)


def _tensor(value: Any) -> Any:
    """The tensor of a leaf (a remote leaf is ``(buffer, offset, variable)``)."""
    return value[2] if isinstance(value, tuple) else value


def build_programs(programs: list[Program]) -> tuple[popxl.Ir, list[Built]]:
    """One Ir holding every program (all of one replication factor and micro-batch count)."""
    ir = popxl.Ir(replication=programs[0].replicas)
    ir.num_host_transfers = programs[0].steps
    ir._pb_ir.getSessionOptions().numIOTiles = 32  # batch serialisation's io modes
    builder = Builder(ir)
    built = []
    for program in programs:
        builder.specs = program.specs
        built.append(builder.program(program))
    return ir, built
