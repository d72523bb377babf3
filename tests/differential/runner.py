"""Run programs through popxl.Session and the reference, and compare them."""

from __future__ import annotations

import traceback
from dataclasses import dataclass

import numpy as np

import popxl

from .build import build_programs
from .program import Program
from .reference import evaluate, group_members

# (relative, absolute relative to the output's largest magnitude) tolerance per dtype
TOLERANCE = {"float32": (2e-3, 2e-4), "float16": (3e-2, 1e-2), "int32": (0, 0), "bool": (0, 0)}


@dataclass
class Outcome:
    """A disagreement (or crash) of one program; ``None`` from ``check`` means agreement."""

    program: Program
    message: str


def _close(got: np.ndarray, want: np.ndarray, dtype: str) -> str | None:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape} != reference {want.shape}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != reference {want.dtype}"
    rtol, atol = TOLERANCE[dtype]
    if rtol == 0:
        ok = np.array_equal(got, want)
    else:
        g, w = got.astype(np.float64), want.astype(np.float64)
        scale = max(1.0, float(np.max(np.abs(w[np.isfinite(w)]), initial=0)))
        ok = np.allclose(g, w, rtol=rtol, atol=atol * scale, equal_nan=True)
    if ok:
        return None
    worst = ""
    if rtol:
        diff = np.abs(g - w).ravel()
        k = int(np.nanargmax(diff)) if np.isfinite(diff).any() else 0
        worst = f"\n  worst: element {k}, got {got.ravel()[k]}, want {want.ravel()[k]}"
    return f"values differ:\n  got  {got.ravel()[:12]}\n  want {want.ravel()[:12]}{worst}"


def _stacked(values: list, replicas: int) -> np.ndarray:
    return np.stack(values) if replicas > 1 else values[0]


def compare(program: Program, outputs: list, variables: list) -> str | None:
    """The first difference between the session's results and the reference, if any."""
    ref_outs, ref_finals = evaluate(program)
    r = program.replicas
    # A float32 value computed from float16 ones carries float16 rounding (x - gelu(x) in
    # float16 is 1 float16 ulp off after cancellation): such programs get float16's tolerance.
    halves = any(spec.dtype == "float16" for spec in program.specs.values())
    for i, vid in enumerate(program.main.outputs):
        want = _stacked([ref_outs[k][i] for k in range(r)], r)
        dtype = program.specs[vid].dtype
        msg = _close(outputs[i], want, "float16" if halves and dtype == "float32" else dtype)
        if msg:
            return f"output v{vid}: {msg}"
    for i, leaf in enumerate(program.leaves):
        if variables[i] is None:
            continue
        firsts = sorted({m[0] for m in group_members(r, leaf.grouping)})
        want = [ref_finals[k][i] for k in firsts]
        want = np.stack(want) if len(want) > 1 else want[0]
        msg = _close(variables[i], want, program.specs[leaf.vid].dtype)
        if msg:
            return f"final value of leaf v{leaf.vid}: {msg}"
    return None


def run_session(programs: list[Program]) -> list[tuple[list, list]]:
    """Build the programs into one Ir, run it once; each program's outputs and variables."""
    ir, built = build_programs(programs)
    inputs = {s: d for b in built for s, d in b.in_streams.items()}
    with popxl.Session(ir, "ipu_model") as session:
        results = session.run(inputs)
        out = []
        for b in built:
            outs = [results[s] for s in b.out_streams]
            variables = [None if t is None else session.get_tensor_data(t) for t in b.leaf_tensors]
            out.append((outs, variables))
    return out


def batches(programs: list[Program], size: int) -> list[list[Program]]:
    """``programs`` in batches of at most ``size`` that can share one Ir (same replication
    factor and micro-batch count); placed programs apart, since one placed program makes
    the whole Ir run placed, several times slower to compile."""
    groups: dict[tuple[int, int, int], list[Program]] = {}
    for p in programs:
        groups.setdefault((p.replicas, p.steps, p.ipus), []).append(p)
    return [g[k : k + size] for g in groups.values() for k in range(0, len(g), size)]


def check(program: Program) -> Outcome | None:
    """Run one program alone; a disagreement or crash as an ``Outcome``."""
    try:
        ((outs, variables),) = run_session([program])
    except Exception:  # noqa: BLE001 (any crash of a valid program is a finding)
        return Outcome(program, "session failed:\n" + traceback.format_exc(limit=-6))
    msg = compare(program, outs, variables)
    return None if msg is None else Outcome(program, msg)


def check_batch(programs: list[Program]) -> list[Outcome]:
    """Run programs together (one compile); on a crash, run each alone to find the culprits."""
    try:
        results = run_session(programs)
    except Exception:  # noqa: BLE001
        return [o for o in map(check, programs) if o is not None]
    found = []
    for program, (outs, variables) in zip(programs, results):
        msg = compare(program, outs, variables)
        if msg is not None:
            found.append(Outcome(program, msg))
    return found
