"""A model and the explicit program a PopXL user writes by hand for it, to compare with
``poptorch.trainingModel`` (tests and ``bench/poptorch_step.py``).

The hand-written program: streams, ``repeat`` over device iterations, gradient
accumulation (running-mean accumulators of ``autodiff_with_accumulation``), an all-reduce
mean over replicas and Adam from ``ops.var_updates``; the loss of every micro-batch is
streamed back.
"""

from __future__ import annotations

import numpy as np

import poptorch
import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl_addons.transforms.repeat_graph import repeat_graph

FEATURES, HIDDEN, CLASSES = 16, 32, 4


class Mlp(addons.Module):
    """Two dense layers and a squared-error loss (the loss is the only output)."""

    def build(self, x: popxl.Tensor, target: popxl.Tensor) -> popxl.Tensor:
        rng = np.random.default_rng(7)
        w1 = self.add_variable_input(
            "w1", lambda: rng.normal(0, 0.3, (FEATURES, HIDDEN)).astype(np.float32), x.dtype
        )
        b1 = self.add_variable_input("b1", lambda: np.zeros(HIDDEN, np.float32), x.dtype)
        w2 = self.add_variable_input(
            "w2", lambda: rng.normal(0, 0.3, (HIDDEN, CLASSES)).astype(np.float32), x.dtype
        )
        h = ops.relu(x @ w1 + b1)
        d = h @ w2 - target
        return poptorch.identity_loss(d * d, "mean")


def make_data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    t = rng.normal(size=(n, CLASSES)).astype(np.float32)
    return x, t


def handwritten(micro_batch: int, di: int, ga: int, replicas: int, lr: float):
    """The explicit program; returns (session, (x stream, t stream), weights, loss stream)."""
    ir = popxl.Ir(replication=replicas)
    main = ir.main_graph
    with main:
        x_stream = popxl.h2d_stream((micro_batch, FEATURES), popxl.float32, "x")
        t_stream = popxl.h2d_stream((micro_batch, CLASSES), popxl.float32, "t")
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")
        facts, fwd = Mlp().create_graph(x_stream.spec, t_stream.spec)
        accum_facts, bwd = addons.autodiff_with_accumulation(fwd, fwd.args.tensors)
        weights, accum = facts.init(), accum_facts.init()
        moments = {
            k: (
                popxl.variable(np.zeros(v.shape, np.float32), name=f"{k}.m"),
                popxl.variable(np.zeros(v.shape, np.float32), name=f"{k}.v"),
            )
            for k, v in weights.named_tensors.items()
        }
        step = popxl.variable(np.float32(0), name="step")
        # One micro-batch.
        x, t = ops.host_load(x_stream, "x"), ops.host_load(t_stream, "t")
        info = fwd.bind(weights).call_with_info(x, t)
        ops.host_store(loss_stream, info.outputs[0])
        one = popxl.constant(np.float32(1.0))
        bwd.bind(accum).call(one, args=bwd.grad_graph_info.inputs_dict(info))
        repeat_graph(main, ga)
        # One optimiser step.
        for key, var in weights.named_tensors.items():
            grad = accum.named_tensors[f"accum.{key}"]
            if replicas > 1:
                ops.collectives.replicated_all_reduce_(grad, op="mean")
            m, v = moments[key]
            ops.var_updates.accumulate_moving_average_(m, grad, f=0.9)
            ops.var_updates.accumulate_moving_average_square_(v, grad, f=0.999)
            step_copy = popxl.variable(np.float32(0), name=f"{key}.step")
            upd = ops.var_updates.adam_updater(
                m, v, time_step=step_copy, beta1=0.9, beta2=0.999, epsilon=1e-8
            )
            ops.scaled_add_(var, upd, b=-lr)
        ops.var_updates.accumulate_(step, one)
        ops.var_updates.accumulator_scale_(accum.mean_accum_counter, 0.0)
        repeat_graph(main, di)
    ir.num_host_transfers = di * ga
    session = popxl.Session(ir, "ipu_model")
    return session, (x_stream, t_stream), weights, loss_stream


def host_feeds(x: np.ndarray, t: np.ndarray, di: int, ga: int, replicas: int, mb: int):
    """Combined batches in PopTorch's order -> the hand-written session's stream layout."""
    lead = tuple(d for d in (di * ga, replicas) if d > 1)
    return x.reshape(*lead, mb, FEATURES), t.reshape(*lead, mb, CLASSES)


def poptorch_model(di: int, ga: int, replicas: int, lr: float) -> poptorch.PoplarExecutor:
    """The same training as one ``trainingModel`` call (loss of every micro-batch back)."""
    opts = poptorch.Options().deviceIterations(di).replicationFactor(replicas)
    opts.Training.gradientAccumulation(ga)
    opts.outputMode(poptorch.OutputMode.All)
    return poptorch.trainingModel(Mlp(), opts, poptorch.optim.Adam(lr=lr))
