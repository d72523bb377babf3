"""Execution strategies on one MLP: plain, pipelined over 2 and 4 devices, batch-serialised,
phased.

Every variant trains the same 4-layer MLP (width ``--width``) for one optimiser step per
``session.run``: ``--steps`` micro-batches of ``--micro`` samples, gradients accumulated
(mean), then plain SGD. Printed per variant: samples/s (fastest of alternating rounds),
and from ``Session.memory_report()`` the per-device peak (XLA) and the on-chip peak (the
peak less remote buffers, which an IPU keeps in streaming memory), each against the plain
run. A check run compares every variant's weights after one step with the plain run's.

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python bench/strategies.py
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from collections.abc import Callable
from functools import partial

_REPLICAS = int(sys.argv[sys.argv.index("--replicas") + 1]) if "--replicas" in sys.argv else 1
# 4 devices per replica: the 4-IPU pipeline placed on a (replicas, 4) device mesh.
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={4 * _REPLICAS}")
if "--one-thread-per-device" in sys.argv:  # must be set before JAX starts its CPU backend
    os.environ["XLA_FLAGS"] += " --xla_cpu_multi_thread_eigen=false"

import jax  # noqa: E402
import numpy as np  # noqa: E402

import popxl  # noqa: E402
import popxl_addons as addons  # noqa: E402
from popxl import ops  # noqa: E402
from popxl_addons.transforms.batch_serialisation import (  # noqa: E402
    RemoteHandle,
    batch_serial_buffer,
    batch_serialise,
    batch_serialise_fwd_and_grad,
)
from popxl_addons.transforms.repeat_graph import repeat_graph  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import device_name, set_matmul_precision  # noqa: E402

LAYERS = 4
LR = 0.05


class Layer(addons.Module):
    def __init__(self, out: int, last: bool) -> None:
        super().__init__()
        self.out, self.last = out, last

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        scale = 1 / np.sqrt(x.shape[-1])
        w = self.add_variable_input(
            "w", partial(np.random.normal, 0, scale, (x.shape[-1], self.out)), x.dtype
        )
        y = x @ w
        return y if self.last else ops.gelu(y)


class Model:
    """One graph pair (forward, accumulating gradient) per layer, and their variables."""

    def __init__(self, width: int, micro: int, classes: int = 10) -> None:
        np.random.seed(0)
        spec = popxl.TensorSpec((micro, width), popxl.float32)
        self.layers = []
        for i in range(LAYERS):
            last = i == LAYERS - 1
            facts, fwd = Layer(classes if last else width, last).create_graph(spec)
            required = [fwd.graph.inputs[0]] if i else []
            dfacts, bwd = addons.autodiff_with_accumulation(
                fwd, [fwd.args.w], grads_required=required
            )
            self.layers.append((facts, fwd, dfacts, bwd))

    def init(self, remote: list[popxl.RemoteBuffer] | None = None) -> None:
        self.vars, self.grads = [], []
        for i, (facts, _, dfacts, _) in enumerate(self.layers):
            if remote is None:
                self.vars.append(facts.init())
            else:
                data = next(facts.w.data_iter)  # the draw facts.init() would have used
                w = popxl.remote_variable(data, remote[i], 0, name=f"w{i}")
                self.vars.append(addons.NamedTensors.from_dict({"w": w}))
            self.grads.append(dfacts.init())

    def sgd(self) -> None:
        for i in range(LAYERS):
            self.update(i, self.vars[i].w)

    def update(self, i: int, w: popxl.Tensor) -> None:
        """SGD on layer ``i``'s weight ``w`` with its mean gradient (averaged over the
        replicas too), then the accumulator reset."""
        grads = self.grads[i]
        if popxl.gcg().ir.replication_factor > 1:
            ops.collectives.replicated_all_reduce_(grads.accum.w, op="mean")
        ops.scaled_add_(w, grads.accum.w, b=-LR)
        ops.var_updates.accumulator_scale_(grads.mean_accum_counter, 0.0)
        ops.var_updates.accumulator_scale_(grads.accum.w, 0.0)


def _streams_and_model(args: argparse.Namespace) -> tuple:
    """The input and label streams and the (uninitialised) model; call in the main graph."""
    x_in = popxl.h2d_stream((args.micro, args.width), popxl.float32, "x")
    y_in = popxl.h2d_stream((args.micro,), popxl.int32, "labels")
    return x_in, y_in, Model(args.width, args.micro)


def build_plain(args: argparse.Namespace) -> tuple:
    ir = popxl.Ir(replication=args.replicas)
    with ir.main_graph:
        x_in, y_in, model = _streams_and_model(args)
        model.init()
        x, labels = ops.host_load(x_in), ops.host_load(y_in)
        infos = []
        for (_, fwd, _, _), v in zip(model.layers, model.vars):
            infos.append(fwd.bind(v).call_with_info(x))
            x = infos[-1].outputs[0]
        _, dx = addons.ops.cross_entropy_with_grad(x, labels)
        for (_, _, _, bwd), g, info in reversed(list(zip(model.layers, model.grads, infos))):
            outs = bwd.bind(g).call(dx, args=bwd.grad_graph_info.inputs_dict(info))
            dx = outs[0] if outs else dx
    repeat_graph(ir.main_graph, args.steps)  # the step runs in a loop of `steps` iterations
    with ir.main_graph:
        model.sgd()
    return ir, x_in, y_in, model


def build_pipelined(args: argparse.Namespace, devices: int) -> tuple:
    """Forward layers spread over ``devices`` IPUs; the last IPU also computes the loss and
    its layers' backward; the backward of the other IPUs' layers runs on their IPU in later
    stages, with the activations stashed."""
    per = LAYERS // devices
    ir = popxl.Ir(replication=args.replicas)
    with ir.main_graph:
        x_in, y_in, model = _streams_and_model(args)
        model.init()
        with addons.pipelined_execution(args.steps) as p:
            infos = []
            x = None
            for d in range(devices):
                with p.stage(d), popxl.ipu(d):
                    if d == 0:
                        x = ops.host_load(x_in)
                    for i in range(d * per, (d + 1) * per):
                        _, fwd, _, _ = model.layers[i]
                        infos.append(fwd.bind(model.vars[i]).call_with_info(x))
                        x = infos[-1].outputs[0]
                    if d < devices - 1:
                        x = x.copy_to_ipu(d + 1)
            dx = None
            for d in reversed(range(devices)):
                stage = devices - 1 + (devices - 1 - d)
                with p.stage(stage), popxl.ipu(d):
                    if d == devices - 1:
                        labels = ops.host_load(y_in)
                        _, dx = addons.ops.cross_entropy_with_grad(x, labels)
                    for i in reversed(range(d * per, (d + 1) * per)):
                        _, _, _, bwd = model.layers[i]
                        acts = p.stash_and_restore_activations(infos[i], bwd.grad_graph_info)
                        outs = bwd.bind(model.grads[i]).call(dx, args=acts)
                        dx = outs[0] if outs else dx
                    if d > 0:
                        dx = dx.copy_to_ipu(d - 1)
        for d in range(devices):
            with popxl.ipu(d):
                for i in range(d * per, (d + 1) * per):
                    model.update(i, model.vars[i].w)
    return ir, x_in, y_in, model


def _io_ir(replicas: int) -> popxl.Ir:
    ir = popxl.Ir(replication=replicas)
    ir._pb_ir.getSessionOptions().numIOTiles = 32
    return ir


def build_serialised(args: argparse.Namespace, phased: bool) -> tuple:
    """Each layer's forward and backward batch-serialised over the micro-batches, with
    activations and gradients in remote buffers; ``phased`` also keeps the weights in remote
    buffers, loaded for each layer's phase and stored back after its update."""
    ir = _io_ir(args.replicas)
    with ir.main_graph:
        x_in, y_in, model = _streams_and_model(args)
        weight_buffers = None
        if phased:
            weight_buffers = [
                popxl.remote_buffer(fwd.args.w.shape, popxl.float32, 1)
                for _, fwd, _, _ in model.layers
            ]
        model.init(weight_buffers)
        steps, mode = args.steps, "compute"
        outs = [fwd.graph.outputs[0] for _, fwd, _, _ in model.layers]
        acts = [batch_serial_buffer(y, steps=steps) for y in outs]  # layer outputs
        grads = [batch_serial_buffer(y, steps=steps) for y in outs]  # their gradients
        fwd_results, bwd_results = [], []
        x_handle: popxl.HostToDeviceStream | RemoteHandle = x_in
        for i, (_, fwd, _, bwd) in enumerate(model.layers):
            loads = {fwd.graph.inputs[0]: x_handle, bwd.graph.inputs[0]: RemoteHandle(grads[i])}
            stores = {outs[i]: RemoteHandle(acts[i])}
            if i:  # the gradient of this layer's input is the previous layer's output grad
                stores[bwd.graph.outputs[0]] = RemoteHandle(grads[i - 1])
            f, b = batch_serialise_fwd_and_grad(
                fwd, bwd, fwd.args, steps, loads, {}, stores, io_mode=mode
            )
            fwd_results.append(f)
            bwd_results.append(b)
            x_handle = RemoteHandle(acts[i])
        logits_spec = popxl.TensorSpec(outs[-1].shape, popxl.float32)
        loss_graph = ir.create_graph(
            _loss_grad, logits_spec, popxl.TensorSpec((args.micro,), popxl.int32)
        )
        loss_bs = batch_serialise(
            addons.GraphWithNamedArgs(loss_graph), steps,
            {loss_graph.inputs[0]: RemoteHandle(acts[-1]), loss_graph.inputs[1]: y_in},
            {}, {loss_graph.outputs[0]: RemoteHandle(grads[-1])}, io_mode=mode,
        )  # fmt: skip
        with popxl.in_sequence(True):
            weights = []
            for i, f in enumerate(fwd_results):
                w = _phase_weight(model, i, weight_buffers)
                weights.append(w)
                addons.BoundGraph(f.graph.graph, {f.graph.args.w: w}).call(0)
            loss_bs.graph.call(0)
            for i in reversed(range(LAYERS)):
                b = bwd_results[i]
                w = _phase_weight(model, i, weight_buffers)
                bound = dict(zip(b.graph.args.accum.tensors, model.grads[i].accum.tensors))
                bound[b.graph.args.mean_accum_counter] = model.grads[i].mean_accum_counter
                bound[b.graph.args.w] = w
                addons.BoundGraph(b.graph.graph, bound).call(0)
                model.update(i, w)
                if weight_buffers is not None:
                    ops.remote_store(weight_buffers[i], 0, w)
    return ir, x_in, y_in, model


def _phase_weight(model: Model, i: int, buffers: list | None) -> popxl.Tensor:
    if buffers is None:
        return model.vars[i].w
    return ops.remote_load(buffers[i], 0, f"w{i}_loaded")


def _loss_grad(logits: popxl.Tensor, labels: popxl.Tensor) -> popxl.Tensor:
    _, dx = addons.ops.cross_entropy_with_grad(logits, labels)
    return dx


VARIANTS: dict[str, Callable[[argparse.Namespace], tuple]] = {
    "plain": build_plain,
    "pipelined x2": partial(build_pipelined, devices=2),
    "pipelined x2 1dev": partial(build_pipelined, devices=2),
    "pipelined x4": partial(build_pipelined, devices=4),
    "pipelined x4 1dev": partial(build_pipelined, devices=4),
    "batch-serialised": partial(build_serialised, phased=False),
    "phased": partial(build_serialised, phased=True),
}


def data(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    lead = (args.steps, args.replicas) if args.replicas > 1 else (args.steps,)
    x = rng.normal(0, 1, (*lead, args.micro, args.width)).astype(np.float32)
    y = rng.integers(0, 10, (*lead, args.micro)).astype(np.int32)
    return x, y


def prepare(name: str, args: argparse.Namespace) -> dict:
    """Build and compile one variant, run one step (its weights are checked against the
    plain run's) and read its memory report; ``timed`` runs ``--repeats`` more steps."""
    ir, x_in, y_in, model = VARIANTS[name](args)
    ir.num_host_transfers = args.steps
    x, y = data(args)
    # "1dev": the same pipelined program with its IPUs on one device (no placement).
    placement = "off" if name.endswith("1dev") else os.environ.get("POPXL_PLACEMENT", "auto")
    previous = os.environ.get("POPXL_PLACEMENT")
    os.environ["POPXL_PLACEMENT"] = placement
    try:
        session = popxl.Session(ir, "ipu_model")
    finally:
        os.environ.pop("POPXL_PLACEMENT")
        if previous is not None:
            os.environ["POPXL_PLACEMENT"] = previous
    report = session.memory_report()
    feeds = {x_in: x, y_in: y}
    with session:
        session.run(feeds)
        weights = [session.get_tensor_data(v.w).copy() for v in model.vars]

    def timed() -> tuple[float, float]:
        """(wall, CPU) seconds per step over ``--repeats`` steps."""
        with session:
            cpu = _cpu_seconds()
            start = time.perf_counter()
            for _ in range(args.repeats):
                session.run(feeds)
            jax.block_until_ready(session._state)  # runs without outputs return at once
            wall = time.perf_counter() - start
            return wall / args.repeats, (_cpu_seconds() - cpu) / args.repeats

    return {
        "timed": timed,
        "device_peak": max(m.device_peak for m in report.ipus),
        "chip_peak": max(m.chip_peak for m in report.ipus),
        "resident": max(m.resident for m in report.ipus),
        "devices": _devices(session),
        "weights": weights,
    }


def measure(names: list[str], args: argparse.Namespace) -> dict[str, dict]:
    """Every variant prepared, then timed in alternating rounds (the fastest round counts:
    other processes on a shared machine only add time)."""
    results = {name: prepare(name, args) for name in names}
    for r in results.values():
        r["wall"], r["cpu"] = float("inf"), float("inf")
    for _ in range(args.rounds):
        for r in results.values():
            wall, cpu = r["timed"]()
            r["wall"], r["cpu"] = min(r["wall"], wall), min(r["cpu"], cpu)
    for r in results.values():
        r["samples_per_s"] = args.steps * args.micro * args.replicas / r["wall"]
        r["cpu_ms"] = r["cpu"] * 1e3
    return results


def _devices(session: popxl.Session) -> int:
    """The devices a session's step runs on: its IPUs' (placed), times its replicas' (unless
    they share one device under vmap)."""
    program = session._program
    replicas = program.replicas if program.mode != "vmap" else 1
    return (program.ipus or 1) * replicas


def _cpu_seconds() -> float:
    """CPU time this process has used (all threads, user + system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--micro", type=int, default=32)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", nargs="*", default=list(VARIANTS))
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="data-parallel replicas of every variant (gradients averaged over them); "
        "placed programs then run on a (replicas, IPUs) device mesh",
    )
    parser.add_argument(
        "--one-thread-per-device",
        action="store_true",
        help="XLA CPU without intra-op threads: each device computes on one thread, so a "
        "placed run on N devices gets N threads and the plain run one",
    )
    args = parser.parse_args()
    threads = "one thread per device" if args.one_thread_per_device else "XLA's intra-op threads"
    print(f"device: {device_name()}; {threads}; load average {os.getloadavg()}; MLP "
          f"{LAYERS}x{args.width}, {args.steps} micro-batches of {args.micro}, "
          f"{args.replicas} replica(s)")  # fmt: skip
    results = measure(args.only, args)
    base = results.get("plain")
    print(f"{'variant':18s} {'devices':>7s} {'samples/s':>10s} {'x plain':>8s} {'CPU ms/step':>11s} "
          f"{'x plain':>8s} {'vars MB':>8s} {'x plain':>8s} {'device peak MB':>15s} {'x plain':>8s} "
          f"{'chip peak MB':>13s} {'x plain':>8s} {'same weights':>12s}")  # fmt: skip
    for name, r in results.items():

        def ratio(k: str, r: dict = r) -> float:
            return r[k] / base[k] if base else float("nan")

        same = base is not None and all(
            np.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(r["weights"], base["weights"])
        )
        print(
            f"{name:18s} {r['devices']:>7d} {r['samples_per_s']:>10.0f} {ratio('samples_per_s'):>8.2f} "
            f"{r['cpu_ms']:>11.1f} {ratio('cpu_ms'):>8.2f} "
            f"{r['resident'] / 2**20:>8.2f} {ratio('resident'):>8.2f} "
            f"{r['device_peak'] / 2**20:>15.2f} {ratio('device_peak'):>8.2f} "
            f"{r['chip_peak'] / 2**20:>13.2f} {ratio('chip_peak'):>8.2f} {str(same):>12s}"
        )  # fmt: skip
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    set_matmul_precision()
    main()
