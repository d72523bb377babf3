"""Table-driven op tests: one ``OpCase`` per op behaviour, checked against NumPy.

A case builds ops from input tensors (host-loaded, so values are runtime data), and gives
a NumPy ``reference``. ``run_case`` runs the program through a Session and compares every
output; ``check_inference`` compares each recorded op's inferred specs with what its JAX
lowering produces. Cases live in ``cases_<family>.py`` modules as a list named ``CASES``.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import jax
import numpy as np

import popxl
import popxl.ops as ops
from popxl import dtypes
from tests.case_groups import each_alone_if_failing


@dataclass(frozen=True)
class OpCase:
    """One op behaviour to test.

    Attributes:
        name: test id.
        build: ``build(*tensors) -> Tensor | sequence of Tensors``, run in the main graph
            with one host-loaded tensor per input array.
        inputs: the input arrays (their dtypes become the tensors' dtypes).
        reference: NumPy function of the input arrays returning the expected output(s).
        rtol, atol: tolerances for the forward comparison.
        grad: check gradients of the float inputs (True), of the listed input indices, or
            not at all (False: integer/bool outputs, non-differentiable ops).
        grad_rtol, grad_atol: tolerances for the gradient comparison.
        exact_dtype: also require the output dtype to equal the reference's.
        fp16_grad: also check gradients with the float32 inputs cast to float16 (looser
            tolerance); set False where float16 cannot represent the computation.
    """

    name: str
    build: Callable[..., Any]
    inputs: Sequence[np.ndarray]
    reference: Callable[..., Any]
    rtol: float = 1e-5
    atol: float = 1e-6
    grad: bool | Sequence[int] = True
    grad_rtol: float = 2e-3
    grad_atol: float = 2e-3
    exact_dtype: bool = True
    fp16_grad: bool = True
    tags: tuple[str, ...] = field(default=())


def as_outputs(result: Any) -> tuple:
    if result is None:
        return ()
    if isinstance(result, popxl.Tensor):
        return (result,)
    return tuple(result)


def build_case(case: OpCase) -> tuple[popxl.Ir, list, list]:
    """The case's program: host-load the inputs, build, host-store the outputs."""
    ir, [(streams, out_streams)] = build_cases([case])
    return ir, streams, out_streams


def build_cases(cases: Sequence[OpCase]) -> tuple[popxl.Ir, list[tuple[list, list]]]:
    """One program for every case of ``cases``, side by side: each case's input and output
    streams (named ``c<k>_in<i>``, ``c<k>_out<i>``)."""
    ir = popxl.Ir()
    found = []
    with ir.main_graph:
        for k, case in enumerate(cases):
            streams = [
                popxl.h2d_stream(x.shape, dtypes.dtype.as_dtype(x.dtype), f"c{k}_in{i}")
                for i, x in enumerate(case.inputs)
            ]
            tensors = [ops.host_load(s, f"x{i}") for i, s in enumerate(streams)]
            outs = as_outputs(case.build(*tensors))
            out_streams = []
            for i, o in enumerate(outs):
                stream = popxl.d2h_stream(o.shape, o.dtype, f"c{k}_out{i}")
                ops.host_store(stream, o)
                out_streams.append(stream)
            found.append((streams, out_streams))
    return ir, found


def run_case(case: OpCase) -> list[np.ndarray]:
    return run_cases([case])[0]


def run_cases(cases: Sequence[OpCase]) -> list[list[np.ndarray]]:
    """Each case's outputs, from one program for them all."""
    ir, found = build_cases(cases)
    feed = {s: x for case, (ins, _) in zip(cases, found) for s, x in zip(ins, case.inputs)}
    with popxl.Session(ir, "ipu_model") as session:
        results = session.run(feed)
    return [[results[s] for s in outs] for _, outs in found]


def check_forward(case: OpCase) -> None:
    _compare_forward(case, run_case(case))


def _compare_forward(case: OpCase, got: list[np.ndarray]) -> None:
    expected = case.reference(*[np.array(x) for x in case.inputs])
    expected = (
        [expected] if isinstance(expected, np.ndarray) or np.isscalar(expected) else list(expected)
    )
    assert len(got) == len(expected), (
        f"{case.name}: {len(got)} outputs, reference has {len(expected)}"
    )
    for g, e in zip(got, expected):
        e = np.asarray(e)
        assert g.shape == e.shape, f"{case.name}: shape {g.shape} != reference {e.shape}"
        if case.exact_dtype:
            assert g.dtype == e.dtype, f"{case.name}: dtype {g.dtype} != reference {e.dtype}"
        if g.dtype in (dtypes.np_dtype_float8_143, dtypes.np_dtype_float8_152):
            # PopXL's structured float8 host data compares byte by byte: NaN equals NaN.
            assert e.dtype == g.dtype, f"{case.name}: float8 {g.dtype} != reference {e.dtype}"
            np.testing.assert_equal(g, e, err_msg=case.name)
        elif g.dtype == np.bool_ or np.issubdtype(g.dtype, np.integer):
            np.testing.assert_array_equal(g, e, err_msg=case.name)
        else:
            np.testing.assert_allclose(
                g.astype(np.float64),
                e.astype(np.float64),
                rtol=case.rtol,
                atol=case.atol,
                err_msg=case.name,
            )


# Several cases in one program ---------------------------------------------------------------
#
# Each program costs a session and a compilation whatever its size (a small op's program
# compiled in about 35 ms here), so the table checks its cases several to a program, each
# with its own streams or subgraph. A group that fails is checked again case by case, so the
# failure names its case; a group that fails although each of its cases passes alone fails
# as it is (the cases interfered).


def groups(cases: Sequence[OpCase], size: int) -> list[tuple[OpCase, ...]]:
    """``cases`` in consecutive groups of at most ``size``."""
    return [tuple(cases[i : i + size]) for i in range(0, len(cases), size)]


def group_id(group: Sequence[OpCase]) -> str:
    """A group's test id: its cases' names (``-k NAME`` selects the group holding one)."""
    return "+".join(c.name for c in group)


def check_forward_group(cases: Sequence[OpCase]) -> None:
    """``check_forward`` of every case in ``cases``, with one program for them all."""

    def together() -> None:
        for case, got in zip(cases, run_cases(cases)):
            _compare_forward(case, got)

    each_alone_if_failing(together, check_forward, cases)


def check_gradients_group(cases: Sequence[OpCase]) -> None:
    """``check_gradients`` of every case in ``cases``, with one program for them all."""

    def together() -> None:
        plans = [_gradient_plan(case) for case in cases]
        got = run_gradients_of(cases, [(wrt, seeds) for wrt, seeds in plans])
        for case, (wrt, seeds), grads in zip(cases, plans, got):
            _compare_gradients(case, wrt, seeds, grads)

    each_alone_if_failing(together, check_gradients, cases)


def recorded_ops(ir: popxl.Ir) -> list:
    from runtime.lowering.graphs import reachable_graphs

    return [op for g in reachable_graphs(ir) for op in g.ops]


def check_inference(case: OpCase) -> None:
    """Every op's inferred output specs equal the shapes/dtypes its lowering produces."""
    ir, _, _ = build_case(case)
    for op in recorded_ops(ir):
        opdef = op.opdef
        if opdef.lower is None or opdef.special is not None:
            continue
        args = [jax.ShapeDtypeStruct(t.shape, t.dtype._np_device) for t in op.inputs]
        result = jax.eval_shape(partial(opdef.lower, **op.attrs), *args)
        result = result if isinstance(result, tuple) else (result,)
        for k, out in enumerate(op.outputs):
            assert tuple(result[k].shape) == out.shape, (
                f"{op}: lowering shape {result[k].shape} != inferred {out.shape}"
            )
            assert result[k].dtype == out.dtype._np_device, (
                f"{op}: lowering dtype {result[k].dtype} != inferred {out.dtype}"
            )


def all_cases() -> list[OpCase]:
    """Every ``CASES`` list of the ``cases_*`` modules next to this file."""
    package = importlib.import_module(__package__)
    cases: list[OpCase] = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("cases_"):
            module = importlib.import_module(f"{__package__}.{info.name}")
            cases.extend(module.CASES)
    return cases


def covered_op_keys(cases: Sequence[OpCase]) -> set[str]:
    keys: set[str] = set()
    for case in cases:
        ir, _, _ = build_case(case)
        keys.update(op.opdef.key for op in recorded_ops(ir))
    return keys


def f32(*shape: int, seed: int = 0, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    """A reproducible float32 array (uniform in [low, high))."""
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def i32(*shape: int, seed: int = 0, low: int = -5, high: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).integers(low, high, shape).astype(np.int32)


# Gradients ----------------------------------------------------------------------------------


def grad_inputs(case: OpCase) -> list[int]:
    floats = [
        i for i, x in enumerate(case.inputs) if np.issubdtype(np.asarray(x).dtype, np.floating)
    ]
    if case.grad is True:
        return floats
    if case.grad is False:
        return []
    return [i for i in case.grad if i in floats]


def _reference_list(case: OpCase, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    out = case.reference(*arrays)
    return (
        [np.asarray(out)]
        if isinstance(out, np.ndarray) or np.isscalar(out)
        else [np.asarray(o) for o in out]
    )


def numeric_gradients(
    case: OpCase, seeds: Sequence[np.ndarray], wrt: Sequence[int]
) -> list[np.ndarray]:
    """Central finite differences of ``sum_k <reference_k(x), seed_k>`` in float64."""
    base = [
        np.asarray(x).astype(np.float64) if i in wrt else np.asarray(x)
        for i, x in enumerate(case.inputs)
    ]

    def loss(arrays: list[np.ndarray]) -> float:
        outs = _reference_list(case, arrays)
        return float(
            sum(np.sum(o.astype(np.float64) * s) for o, s in zip(outs, seeds) if s is not None)
        )

    grads = []
    for i in wrt:
        g = np.zeros(base[i].shape)
        for idx in np.ndindex(base[i].shape):
            eps = 1e-3 * max(1.0, abs(base[i][idx]))
            hi = [a.copy() for a in base]
            lo = [a.copy() for a in base]
            hi[i][idx] += eps
            lo[i][idx] -= eps
            g[idx] = (loss(hi) - loss(lo)) / (2 * eps)
        grads.append(g)
    return grads


def run_gradients(
    case: OpCase, wrt: Sequence[int], seeds_np: Sequence[np.ndarray | None]
) -> list[np.ndarray]:
    """Gradients from ``transforms.autodiff`` of a subgraph built by the case."""
    return run_gradients_of([case], [(wrt, seeds_np)])[0]


def run_gradients_of(
    cases: Sequence[OpCase], plans: Sequence[tuple[Sequence[int], Sequence[Any]]]
) -> list[list[np.ndarray]]:
    """Each case's gradients (of its inputs ``wrt``, its outputs seeded with ``seeds``: one
    ``(wrt, seeds)`` plan per case) from ``transforms.autodiff`` of a subgraph the case
    builds, every case in one program."""
    ir = popxl.Ir()
    found = []
    with ir.main_graph:
        for k, (case, (wrt, seeds_np)) in enumerate(zip(cases, plans)):
            found.append(_gradient_program(k, case, wrt, seeds_np, ir))
    with popxl.Session(ir, "ipu_model") as session:
        results = session.run()
    return [[results[s] for s in streams] for streams in found]


def _gradient_program(
    k: int, case: OpCase, wrt: Sequence[int], seeds_np: Sequence[Any], ir: popxl.Ir
) -> list:
    from popxl import transforms

    def body(*ts: Any) -> Any:
        # Copy the inputs so in-place ops write intermediates, not graph inputs.
        return case.build(*[ops.identity(t) for t in ts])

    specs = [
        popxl.TensorSpec(x.shape, dtypes.dtype.as_dtype(np.asarray(x).dtype)) for x in case.inputs
    ]
    graph = ir.create_graph(body, *specs)
    provided = [o for o, s in zip(graph.outputs, seeds_np) if s is not None]
    info = transforms.autodiff(graph, provided, [graph.inputs[i] for i in wrt])
    args = [
        popxl.variable(x, dtypes.dtype.as_dtype(np.asarray(x).dtype), f"c{k}_in{i}")
        for i, x in enumerate(case.inputs)
    ]
    fwd = ops.call_with_info(graph, *args)
    seeds = [
        popxl.constant(s.astype(o.dtype.as_numpy()))
        for o, s in zip(graph.outputs, seeds_np)
        if s is not None
    ]
    grads = ops.call(info.graph, *seeds, inputs_dict=info.inputs_dict(fwd))
    streams = []
    for i, g in enumerate(grads):
        stream = popxl.d2h_stream(g.shape, g.dtype, f"c{k}_grad{i}")
        ops.host_store(stream, g)
        streams.append(stream)
    return streams


def _gradient_plan(case: OpCase) -> tuple[list[int], list[Any]]:
    """The inputs whose gradients are checked and the seed of each output (float outputs
    only)."""
    wrt = grad_inputs(case)
    assert wrt, f"{case.name}: no float inputs to differentiate"
    outs = _reference_list(case, [np.asarray(x) for x in case.inputs])
    rng = np.random.default_rng(1)
    seeds = [
        rng.uniform(0.5, 1.5, o.shape) if np.issubdtype(o.dtype, np.floating) else None
        for o in outs
    ]
    return wrt, seeds


def check_gradients(case: OpCase) -> None:
    wrt, seeds = _gradient_plan(case)
    _compare_gradients(case, wrt, seeds, run_gradients(case, wrt, seeds))


def _compare_gradients(
    case: OpCase, wrt: Sequence[int], seeds: Sequence[Any], got: Sequence[np.ndarray]
) -> None:
    expected = numeric_gradients(case, seeds, wrt)
    for i, g, e in zip(wrt, got, expected):
        np.testing.assert_allclose(
            g.astype(np.float64),
            e,
            rtol=case.grad_rtol,
            atol=case.grad_atol,
            err_msg=f"{case.name}: gradient of input {i}",
        )


def as_float16(case: OpCase) -> OpCase | None:
    """The case with its float32 inputs in float16, for a looser gradient check."""
    arrays = [np.asarray(x) for x in case.inputs]
    if not case.fp16_grad or not any(a.dtype == np.float32 for a in arrays):
        return None
    if any(np.issubdtype(a.dtype, np.floating) and a.dtype != np.float32 for a in arrays):
        return None
    inputs = [a.astype(np.float16) if a.dtype == np.float32 else a for a in arrays]
    return dataclasses.replace(
        case, name=f"{case.name}[fp16]", inputs=inputs, grad_rtol=5e-2, grad_atol=5e-2
    )
