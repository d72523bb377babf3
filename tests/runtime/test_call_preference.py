"""runtime.lowering.runs.prefer_inline: a program's repeated calls inlined where its builder asked,
the program is small and its repeated graphs do not convolve, on the CPU; a forced or named
policy wins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import popxl
from runtime.lowering import runs
from runtime.session.program import build_program

from ._chain import chain_program


@pytest.fixture(autouse=True)
def _no_policy_set(monkeypatch):
    monkeypatch.setattr(runs, "_policy", None)
    monkeypatch.delenv("POPXL_CALLS", raising=False)


def run(ir, out) -> np.ndarray:
    with popxl.Session(ir, "ipu_model") as session:
        return session.run()[out]


def test_a_small_program_is_inlined_when_preferred_with_the_scans_values():
    scanned_ir, scanned_out = chain_program()
    assert runs.policy(scanned_ir) == "scan"
    assert any(len(e) == 3 for e in build_program(scanned_ir).entries)  # the scales stacked

    ir, out = chain_program()
    assert runs.prefer_inline(ir)
    assert runs.policy(ir) == "inline"
    assert all(len(e) == 1 for e in build_program(ir).entries)  # each variable its own
    np.testing.assert_array_equal(run(ir, out), [30.0, 30.0])
    np.testing.assert_array_equal(run(scanned_ir, scanned_out), [30.0, 30.0])


def test_a_convolution_outside_the_repeated_graph_is_inlined_with_it():
    ir, out = chain_program(conv="after")
    assert runs.prefer_inline(ir)
    assert runs.policy(ir) == "inline"
    np.testing.assert_array_equal(run(ir, out), [60.0])


def test_convolving_layers_a_large_program_or_another_backend_keep_the_scan(monkeypatch):
    ir, out = chain_program(conv="layers")
    assert not runs.prefer_inline(ir)
    assert runs.policy(ir) == "scan"
    assert any(len(e) == 3 for e in build_program(ir).entries)
    np.testing.assert_array_equal(run(ir, out), [30.0, 30.0])

    # The main graph's 3 calls, store and host load count 1 each, the called graph's 1 op
    # once per call: 7 ops once inlined (the variables are not ops).
    ir, _ = chain_program()
    assert runs._inlined_size(ir.main_graph, {}) == len(ir.main_graph._ops) + 3
    monkeypatch.setattr(runs, "INLINE_BUDGET", runs._inlined_size(ir.main_graph, {}) - 1)
    assert not runs.prefer_inline(ir)
    assert runs.policy(ir) == "scan"
    monkeypatch.undo()

    monkeypatch.setattr(runs.jax, "default_backend", lambda: "gpu")
    assert runs.prefer_inline(ir)
    assert runs.policy(ir) == "scan"  # inlined on the CPU only


def test_preferring_inline_starts_no_jax_backend():
    """PopTorch prefers while building, before a multi-instance session sets up JAX's
    distributed run, which must come before any backend is made."""
    code = (
        "import runtime.lowering.runs as r\n"
        "from runtime.backend.host_memory import _backends_made\n"
        "from tests.runtime._chain import chain_program\n"
        "ir, _ = chain_program()\n"
        "assert r.prefer_inline(ir)\n"
        "assert not _backends_made()\n"
        "assert r.policy(ir) == 'inline'\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_forced_or_named_policy_wins_over_the_preference(monkeypatch):
    ir, out = chain_program()
    assert runs.prefer_inline(ir)
    monkeypatch.setenv("POPXL_CALLS", "scan")
    assert runs.policy(ir) == "scan"
    assert any(len(e) == 3 for e in build_program(ir).entries)
    np.testing.assert_array_equal(run(ir, out), [30.0, 30.0])
    monkeypatch.delenv("POPXL_CALLS")
    runs.set_policy("scan")
    try:
        assert runs.policy(ir) == "scan"
    finally:
        runs.set_policy(None)
    assert runs.policy(ir) == "inline"
