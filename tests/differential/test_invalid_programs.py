"""Invalid programs are refused when the op is created, with a typed, teaching error, and
the refusal leaves the IR as it was (nothing half-applied)."""

import numpy as np
import pytest

import popxl

from .generator import generate
from .invalid import InvalidBuilder, Mutations

FEATURES = ("call", "repeat", "cond", "views", "inplace", "replication", "autodiff")


def _drive(seeds):
    findings, tried = [], {}
    for seed in seeds:
        program = generate(seed, FEATURES)
        ir = popxl.Ir(replication=program.replicas)
        builder = InvalidBuilder(ir, np.random.default_rng(seed))
        builder.specs = program.specs
        builder.program(program)
        findings += [f"seed {seed}: {f}" for f in builder.findings]
        for k, n in builder.tried.items():
            tried[k] = tried.get(k, 0) + n
    return findings, tried


def test_invalid_programs_are_refused_with_typed_errors_and_leave_the_ir_unchanged():
    findings, tried = _drive(range(120))
    assert not findings, "\n".join(findings)
    untried = set(Mutations.names()) - set(tried)
    assert not untried, f"mutations never applied: {sorted(untried)}"


@pytest.mark.parametrize("name", Mutations.names())
def test_each_mutation_is_refused_at_least_once(name):
    """A direct case per mutation, in a subgraph of a replicated Ir."""
    ir = popxl.Ir(replication=2)
    rng = np.random.default_rng(0)
    with ir.main_graph:
        x = popxl.variable(np.ones((2, 3), np.float32))
    main_env = [x]
    g = ir.create_empty_graph("sub")
    with g:
        y = popxl.graph_input((2, 3), popxl.float32, "y")  # noqa: F841
        builder = InvalidBuilder(ir, rng)
        builder.main_env[:] = main_env
        made = getattr(builder.mutations, name)([y])
        assert made is not None
        builder.tried[name] = 0
        what, bad = made
        from .invalid import judge, snapshot

        before = snapshot(ir)
        error = None
        try:
            bad()
        except Exception as e:  # noqa: BLE001
            error = e
        problem = judge(error, f"{name} ({what})")
        assert problem is None, problem
        assert snapshot(ir) == before, f"{name} ({what}): refused but half-applied"
