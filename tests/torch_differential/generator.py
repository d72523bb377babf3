"""Random ``torch.nn.Module`` programs from a seed, feature by feature.

Features (the campaign rotates over them, each with the core ops):
    core: elementwise ops with broadcasting, activations, reductions, matmul/linear/einsum
    conv, pool, norm, loss, embedding, attention, rnn: the ``torch.nn`` families
    view: view/reshape/permute/transpose/expand/unfold, slicing, cat/stack
    index: indexing, gather, scatter, index_put, masked ops; creation: creation ops
    dtype: int64/int32/bool inputs, mixed-dtype expressions, casts
    lowp: float16 and bfloat16 inputs and casts
    structure: reused submodules and parameters, buffers updated in forward, in-place
        writes to slices, trace-time control flow, non-contiguous and stride-0 inputs,
        tuple/list/dict outputs
    control: ``poptorch.for_loop`` and ``poptorch.cond`` (inference)
    training: ``trainingModel`` with SGD (torch's and poptorch's)
    optim: Adam, AdamW, RMSprop (torch's and poptorch's), poptorch's LAMB
    modes: deviceIterations, gradient accumulation, replication, output modes, several
        calls, ``setOptimizer`` between them
"""

from __future__ import annotations

import random

import torch

from .families import CORE
from .families_nn import NN
from .families_shape import SHAPE
from .families_structure import STRUCTURE
from .program import Input, Mode, Program, Spec, input_tensor
from .state import State

FEATURES = ("core", "conv", "pool", "norm", "loss", "view", "index", "creation", "dtype",
            "lowp", "embedding", "attention", "rnn", "structure", "control", "training",
            "optim", "modes")  # fmt: skip
FAMILIES = {**CORE, **NN, **SHAPE, **STRUCTURE}
# The op families each feature adds to a program's mix.
FEATURE_FAMILIES = {
    "core": ("elementwise", "activation", "reduce", "matmul"),
    "conv": ("conv", "pool"),
    "pool": ("pool",),
    "norm": ("norm",),
    "loss": ("loss",),
    "view": ("view",),
    "index": ("index",),
    "creation": ("creation",),
    "dtype": ("dtype",),
    "lowp": ("dtype",),
    "embedding": ("embedding",),
    "attention": ("attention",),
    "rnn": ("rnn",),
    "structure": ("structure",),
    "control": ("control",),
}
SGD = [
    "torch.optim.SGD(params, lr=0.05)",
    "torch.optim.SGD(params, lr=0.05, momentum=0.9)",
    "torch.optim.SGD(params, lr=0.02, momentum=0.5, weight_decay=0.01, nesterov=True)",
    "poptorch.optim.SGD(params, lr=0.05, momentum=0.9, loss_scaling=8.0)",
    "poptorch.optim.SGD(params, lr=0.05)",
    "torch.optim.SGD(params, lr=0.05, momentum=0.5, maximize=True)",
    "torch.optim.SGD([{'params': params[:2], 'lr': 0.2}, {'params': params[2:], 'momentum': 0.9}], lr=0.05)",
]
# Adaptive optimisers divide by a gradient's root mean square, so an element whose gradient
# is zero in exact arithmetic (a key bias under softmax, a batch norm's bias under a mean
# square loss) steps by +-lr on rounding noise, and later steps amplify that; eps=1e-2
# keeps such steps below the tolerance while gradients of 0.1 and more still step
# adaptively.
# ``params`` is the model's list of parameters.
ADAPTIVE = [
    "torch.optim.Adam(params, lr=0.01, eps=1e-2)",
    "torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, eps=1e-2)",
    "torch.optim.RMSprop(params, lr=0.01, eps=1e-2)",
    "torch.optim.RMSprop(params, lr=0.01, momentum=0.5, centered=True, eps=1e-2)",
    "poptorch.optim.Adam(params, lr=0.01, loss_scaling=16.0, eps=1e-2)",
    "poptorch.optim.AdamW(params, lr=0.01, eps=1e-2)",
    "poptorch.optim.RMSprop(params, lr=0.01, eps=1e-2)",
    "poptorch.optim.LAMB(params, lr=0.01, eps=1e-2)",
    "poptorch.optim.LAMB(params, lr=0.01, bias_correction=False, max_weight_norm=1.0, eps=1e-2)",
    "torch.optim.AdamW([{'params': params[:2], 'weight_decay': 0.0}, {'params': params[2:]}], lr=0.01, eps=1e-2)",
    "poptorch.optim.Adam([{'params': params[1:], 'lr': 0.05}, {'params': params[:1]}], lr=0.01, eps=1e-2)",
    # Refused (PopTorch implements neither): the refusal must name the optimiser.
    "torch.optim.Adam(params, lr=0.01, amsgrad=True, eps=1e-2)",
    "torch.optim.Adagrad(params, lr=0.05)",
]
OUTPUT_MODES = ["Default", "All", "Final", "Sum", "EveryN"]
BATCH = 2


def generate(seed: int, features: tuple[str, ...]) -> Program:
    """The program of ``seed`` using ``features`` (always with ``core``)."""
    features = tuple(dict.fromkeys(("core", *features)))
    rng = random.Random(seed)
    mode = _mode(rng, features)
    state = State(rng, features, mode.kind == "training", replicated=mode.replicas > 1)
    state.holder.train(mode.kind == "training")
    inputs = _inputs(state)
    families = [f for feat in features for f in FEATURE_FAMILIES.get(feat, ())]
    target = rng.randint(2, 7)
    for _ in range(60):
        if len(state.stmts) >= target:
            break
        emitter = rng.choice(FAMILIES[rng.choice(families)])
        emitter(state)
    program = Program(
        seed, features, inputs, state.init, state.stmts, [], methods=state.methods, mode=mode
    )
    _finish(state, program)
    if any("BeginBlock" in line for line in program.init):
        _pipelinable(mode)
    return program


def _pipelinable(mode: Mode) -> None:
    """PopTorch pipelines a model with blocks on two IPUs: an inference call needs a device
    iteration per stage, a training step an accumulated micro-batch per stage of the
    forward and backward (three)."""
    if mode.kind == "training":
        mode.accumulation = max(mode.accumulation, 3)
        mode.output_mode = "Final" if mode.output_mode == "EveryN" else mode.output_mode
    else:
        mode.device_iterations = max(mode.device_iterations, 2)
        mode.output_period = 1


def _mode(rng: random.Random, features: tuple[str, ...]) -> Mode:
    mode = Mode()
    trains = ("training" in features or "optim" in features) and rng.random() < 0.85
    if trains:
        mode.kind = "training"
        mode.optimizer = rng.choice(ADAPTIVE if "optim" in features else SGD)
        mode.calls = rng.randint(1, 2)
    if "modes" in features:
        mode.device_iterations = rng.randint(1, 3)
        mode.replicas = rng.choice([1, 1, 2])
        mode.output_mode = rng.choice(OUTPUT_MODES)
        mode.output_period = rng.choice([d for d in (1, 2, 3) if mode.device_iterations % d == 0])
        mode.calls = rng.randint(1, 2)
        if trains:
            mode.optimizer = rng.choice(SGD + ADAPTIVE)
            mode.accumulation = rng.randint(1, 2)
            if mode.accumulation * mode.replicas > 1 and rng.random() < 0.3:
                mode.reduction = "Sum"
            if mode.output_mode == "EveryN":
                mode.accumulation = 1
            if mode.calls == 2 and rng.random() < 0.5:
                mode.set_optimizer = rng.choice(["0.001", "0.1"])
    return mode


def _inputs(state: State) -> list[Input]:
    rng, features = state.rng, state.features
    dtypes = ["float32"]
    if "lowp" in features:
        dtypes += ["float16", "bfloat16"]
    count = rng.randint(1, 3)
    inputs = []
    for k in range(count):
        rank = rng.choice([2, 3, 3, 4] + ([5] if "conv" in features else []))
        shape = (BATCH, *(rng.randint(2, 4) for _ in range(rank - 1)))
        # bfloat16 inputs are refused (the IPU has none): a few check the refusal.
        dtype = dtypes[-1] if rng.random() < 0.1 else rng.choice(dtypes[:2])
        inputs.append(_input(state, f"x{k}", Spec(shape, dtype)))
    if set(features) & {"dtype", "index", "embedding", "loss"}:
        rank = rng.randint(1, 3)
        shape = (BATCH, *(rng.randint(2, 4) for _ in range(rank - 1)))
        dtype = rng.choice(
            ["int64", "int64", "int32", "bool"] if "dtype" in features else ["int64"]
        )
        inputs.append(_input(state, f"i{len(inputs)}", Spec(shape, dtype), high=rng.randint(2, 6)))
    return inputs


def _input(state: State, name: str, spec: Spec, high: int = 4) -> Input:
    layout = "contiguous"
    if "structure" in state.features or state.rng.random() < 0.1:
        layout = state.rng.choice(["contiguous", "transposed", "expanded"])
    made = Input(name, spec, layout, 0, high)
    state.add_input(
        made, input_tensor(made, 1, torch.Generator().manual_seed(state.rng.randrange(2**31)))
    )
    return made


def _finish(state: State, program: Program) -> None:
    """Choose the outputs and, for training, the loss."""
    rng = state.rng
    made = [v for v in state.values if v.name.startswith("v")] or state.values
    outs = list(dict.fromkeys(rng.choice(made[-3:]).name for _ in range(rng.randint(1, 2))))
    if program.mode.kind == "training":
        program.loss = _loss(state)
        program.loss_reduction = state.loss_reduction
        program.stmts = state.stmts
        program.init = state.init
    program.outputs = outs
    kinds = ["tuple", "tuple", "single"] + (
        ["list", "dict"] if "structure" in state.features else []
    )
    program.out_kind = rng.choice(kinds)


def _loss(state: State) -> str:
    """A scalar loss from the last values that depend on parameters (made if none do) and
    the values of torch's loss functions."""
    trained = [v for v in state.values if v.trained and v.is_float]
    if not trained:
        x = state.pick(lambda v: v.is_float) or state.values[0]
        name = state.attribute("scale", "torch.nn.Parameter(torch.tensor(0.5))")
        trained = [
            state.emit(f"torch.tanh({{0}}.float()) * self.{name}", [x], "elementwise", trained=True)
        ]
    # PopTorch trains on one final loss: every torch loss function must feed it.
    losses = {s.out for s in state.stmts if s.family == "loss"}
    parts = trained[-2:] + [v for v in state.values if v.name in losses and v not in trained[-2:]]
    program_reduction = state.choice(["mean", "mean", "sum", "none"])
    if program_reduction != "none" and len(parts) == 1 and state.rng.random() < 0.5:
        loss = state.emit("{0}.float().square()", parts, "reduce")  # reduced by identity_loss
    else:
        template = " + ".join(f"{{{i}}}.float().square().mean()" for i in range(len(parts)))
        loss = state.emit(template, parts, "reduce")
    # Squares too large for the reference (a summed loss): each part bounded by tanh instead,
    # every torch loss function still among them.
    bounded = " + ".join(f"{{{i}}}.float().tanh().mean()" for i in range(len(parts)))
    loss = loss or state.emit(bounded, parts, "reduce")
    state.loss_reduction = program_reduction
    return loss.name
