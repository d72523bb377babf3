"""The top-level surface of popxl_addons: names, import structure, GIT_COMMIT, seed_variable,
debugging prints and testing_utils (reference section 0)."""

import subprocess
import sys

import numpy as np
import pytest

import popxl
import popxl_addons as addons
from popxl import ops
from popxl_addons import _git
from popxl_addons.debugging import print_tensor, print_text
from popxl_addons.layers import Linear
from popxl_addons.testing_utils import TensorInput, ops_of_type, run_module

F32 = popxl.float32


def test_top_level_names_are_the_functions_of_their_modules():
    import popxl_addons.ops.streams as streams
    import popxl_addons.performance_utils as perf
    import popxl_addons.transforms as transforms

    assert addons.host_load is streams.host_load and addons.host_store is streams.host_store
    assert addons.cross_entropy is addons.ops.cross_entropy
    assert addons.cross_entropy_with_grad is addons.ops.cross_entropy_with_grad
    assert callable(addons.seed_variable) and addons.seed_variable.__name__ == "seed_variable"
    assert addons.transforms.autodiff is transforms.autodiff and callable(
        addons.transforms.autodiff
    )
    assert addons.total_FLOPs is perf.total_FLOPs
    assert addons.set_available_memory_proportion_by_ipu is (
        transforms.set_available_memory_proportion_by_ipu
    )
    assert addons.print_tensor is print_tensor and addons.print_tensor is not ops.print_tensor


def test_every_name_in_all_resolves():
    missing = [name for name in addons.__all__ if not hasattr(addons, name)]
    assert missing == []
    assert {"GIT_COMMIT", "TaskSession", "write_variables_pb", "fp8_amax_scale"} <= set(
        addons.__all__
    )


def test_import_loads_no_layers_patterns_testing_utils_or_runtime():
    code = (
        "import sys, popxl_addons as a; "
        "print(sorted(m for m in ('popxl_addons.layers', 'popxl_addons.patterns', "
        "'popxl_addons.testing_utils', 'popxl_addons.optimizers', 'runtime', 'jax') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_git_commit_is_the_short_head_of_the_working_directory(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}  # fmt: skip
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "x"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True)
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()
    (repo / "sub").mkdir()
    monkeypatch.chdir(repo / "sub")
    _git.git_commit.cache_clear()
    try:
        assert addons.GIT_COMMIT == sha[:7]
        _git.git_commit.cache_clear()
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
        assert addons.GIT_COMMIT is None
    finally:
        _git.git_commit.cache_clear()


def test_unknown_top_level_name_raises_attribute_error():
    with pytest.raises(AttributeError, match="module 'popxl_addons' has no attribute 'nope'"):
        _ = addons.nope


# seed_variable ------------------------------------------------------------------------------


def test_seed_variable_gives_one_seed_per_replica_group():
    ir = popxl.Ir(4)
    group = ir.replica_grouping(group_size=2)
    with ir.main_graph:
        seed_v, seed = addons.seed_variable(1984, group)
        d2h = popxl.d2h_stream(seed.shape, seed.dtype)
        ops.host_store(d2h, seed)
    assert seed.shape == (2,) and seed.dtype == popxl.uint32
    with popxl.Session(ir, "ipu_hw") as sess:
        out = sess.run()[d2h].reshape(2, 2, 2)  # (groups, replicas in group, seed)
        stored = sess.get_tensor_data(seed_v)
    expected = popxl.create_seeds(1984, replicas=2)
    np.testing.assert_array_equal(out[:, 0], expected)
    np.testing.assert_array_equal(out[:, 1], expected)
    np.testing.assert_array_equal(stored, expected)


def test_seed_variable_defaults_to_a_seed_per_replica_and_feeds_random_ops():
    ir = popxl.Ir(2)
    with ir.main_graph:
        seed_v, seed = addons.seed_variable(7)
        x = ops.random_uniform(seed, (3,))
        d2h = addons.host_store(x)
    with popxl.Session(ir, "ipu_hw") as sess:
        a = sess.run()[d2h]
        b = sess.run()[d2h]
        seeds = sess.get_tensor_data(seed_v)
    np.testing.assert_array_equal(seeds, popxl.create_seeds(7, replicas=2))
    assert not np.array_equal(a[0], a[1])  # different seeds per replica
    np.testing.assert_array_equal(a, b)  # the seed variable is not advanced by a run


# debugging ----------------------------------------------------------------------------------


def _prints(level_env, monkeypatch, **kwargs):
    monkeypatch.setenv("MODEL_LOG_LEVEL", level_env)
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.arange(3, dtype=np.float32))
        out = print_tensor(t, "t", **kwargs)
        print_text("hello", **kwargs)
    return t, out, ops_of_type(ir.main_graph._ops, "PrintTensor")


def test_debug_prints_are_left_out_at_info_level(monkeypatch):
    t, out, n = _prints("INFO", monkeypatch)
    assert out is t and n == 0


def test_debug_prints_are_recorded_at_debug_level(monkeypatch):
    t, out, n = _prints("DEBUG", monkeypatch)
    assert out is not t and n == 2


def test_warn_prints_are_recorded_at_info_level(monkeypatch):
    _, _, n = _prints("INFO", monkeypatch, level="WARN")
    assert n == 2


def test_bad_model_log_level_is_reported(monkeypatch):
    with pytest.raises(ValueError, match=r"MODEL_LOG_LEVEL must be one of \['TRACE', 'DEBUG', "):
        _prints("LOUD", monkeypatch)


# testing_utils ------------------------------------------------------------------------------


def test_run_module_runs_a_linear_with_given_weights(rng):
    x = rng.normal(size=(2, 3)).astype(np.float32)
    w = rng.normal(size=(3, 4)).astype(np.float32)
    b = rng.normal(size=(4,)).astype(np.float32)
    (y,) = run_module(Linear(4), TensorInput(x, F32), weights=lambda v: {v.weight: w, v.bias: b})
    np.testing.assert_allclose(y, x @ w + b, rtol=1e-5)


def test_run_module_infers_dtype_and_accepts_a_weights_mapping():
    class Double(addons.Module):
        def build(self, x):
            return x * 2.0, x + 1.0

    a, b = run_module(Double(), TensorInput(np.array([1.0, 2.0])))
    assert a.dtype == np.float32
    np.testing.assert_array_equal(a, [2.0, 4.0])
    np.testing.assert_array_equal(b, [2.0, 3.0])


def test_ops_of_type_counts_by_type_name():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((2, 2), np.float32))
        y = x * x
        _ = (y * x) @ y
    assert ops_of_type(ir.main_graph._ops, "Mul") == 2
    assert ops_of_type(ir.main_graph._ops, "MatMul") == 1
    with pytest.raises(TypeError, match="op_type must be an op type name such as 'MatMul'"):
        ops_of_type(ir.main_graph._ops, int)


def test_memmap_variables_expose_their_memmap(tmp_path):
    ir = popxl.Ir()
    with ir.main_graph:
        factory = addons.VariableFactory(lambda: np.arange(4, dtype=np.float32), name="w")
        mapped = factory.create_tensor("w", memmap_dir=str(tmp_path))
        plain = popxl.variable(np.zeros(2, np.float32))
        ops.var_updates.accumulate_(mapped, popxl.constant(np.ones(4, np.float32)))
    assert isinstance(mapped._memmap_arr, np.memmap) and plain._memmap_arr is None
    with popxl.Session(ir, "ipu_hw") as session:
        session.run()
        value = session.get_tensor_data(mapped)
    assert value is mapped._memmap_arr
    np.testing.assert_array_equal(np.load(tmp_path / "w.npy"), np.arange(4) + 1.0)


def _memmapped_linear(memmap_dir):
    ir = popxl.Ir()
    with ir.main_graph:
        facts, _ = Linear(3).create_graph(popxl.TensorSpec((2, 4), F32))
        variables = facts.init("model", memmap_dir=str(memmap_dir))
    return ir, variables


def test_initialise_memmap_dir_from_checkpoint(tmp_path):
    from popxl_addons.task_session import TaskSession, initialise_memmap_dir_from_checkpoint

    ir, variables = _memmapped_linear(tmp_path / "a")
    with ir.main_graph:
        ops.var_updates.accumulate_(variables.weight, popxl.constant(np.ones((4, 3), np.float32)))
    session = TaskSession([], [], variables, ir=ir, device_desc="ipu_hw")
    with session:
        session.run()
    trained = session.get_named_tensors_data().to_dict()
    session.save_checkpoint(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "model" / "notes.txt").write_text("ignored")
    written = initialise_memmap_dir_from_checkpoint(tmp_path / "ckpt", tmp_path / "b", "model")
    assert [p.rsplit("/", 1)[1] for p in written] == ["model.bias.npy", "model.weight.npy"]
    _, restored = _memmapped_linear(tmp_path / "b")
    for key, value in trained.items():
        np.testing.assert_array_equal(restored[key]._memmap_arr, value)
    with pytest.raises(FileNotFoundError, match="must be a directory written by"):
        initialise_memmap_dir_from_checkpoint(tmp_path / "nowhere", tmp_path / "c")
