"""The persistent executable cache: .popef files in cachePath / POPXL_CACHE_DIR, loaded by
later sessions and processes, with PopART's log lines."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import popxl
import popxl.ops as ops

COMPILED = "Starting compilation"
LOADED = "Loading serialized PopART executable"


def _ir(scale=2.0, cache=None, engine_options=None):
    ir = popxl.Ir()
    with ir.main_graph:
        x_h2d = popxl.h2d_stream((3,), popxl.float32, "x")
        w = popxl.variable(np.array([1.0, 2.0, 3.0], np.float32), name="w")
        out = popxl.d2h_stream((3,), popxl.float32, "out")
        ops.host_store(out, ops.host_load(x_h2d) * scale + w)
    opts = ir._pb_ir.getSessionOptions()
    if cache is not None:
        opts.enableEngineCaching = True
        opts.cachePath = str(cache)
    opts.engineOptions.update(engine_options or {})
    return ir, x_h2d, out


def _run(ir, x_h2d, out):
    with popxl.Session(ir, "ipu_hw") as session:
        return session.run({x_h2d: np.array([1.0, -1.0, 0.5], np.float32)})[out]


@pytest.fixture
def debug_log(monkeypatch, capsys):
    monkeypatch.setenv("POPART_LOG_LEVEL", "DEBUG")
    monkeypatch.delenv("POPXL_CACHE_DIR", raising=False)
    monkeypatch.delenv("POPART_PRELOAD_POPEF", raising=False)
    capsys.readouterr()
    return lambda: capsys.readouterr().err


def test_second_session_loads_what_the_first_saved(tmp_path, debug_log):
    first = _run(*_ir(cache=tmp_path))
    log = debug_log()
    assert COMPILED in log and LOADED not in log
    files = list(tmp_path.glob("*.popef"))
    assert len(files) == 1
    second = _run(*_ir(cache=tmp_path))
    log = debug_log()
    assert LOADED in log and COMPILED not in log
    # PopART's lines end with the same hash: the file inferred to hold it was loaded.
    inferred = [ln.split(" ")[-1] for ln in log.splitlines() if "inferred to have hash" in ln]
    loaded = [ln.split(" ")[-1] for ln in log.splitlines() if LOADED in ln]
    assert loaded == inferred == [files[0].stem]
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(second, [3.0, 0.0, 4.0])


def test_changed_program_or_engine_options_miss(tmp_path, debug_log):
    _run(*_ir(cache=tmp_path))
    debug_log()
    np.testing.assert_array_equal(_run(*_ir(scale=3.0, cache=tmp_path)), [4.0, -1.0, 4.5])
    assert COMPILED in debug_log()
    _run(*_ir(cache=tmp_path, engine_options={"opt.enableInlining": "false"}))
    assert COMPILED in debug_log()
    assert len(list(tmp_path.glob("*.popef"))) == 3


def test_environment_variable_turns_the_cache_on(tmp_path, monkeypatch, debug_log):
    monkeypatch.setenv("POPXL_CACHE_DIR", str(tmp_path / "env_cache"))
    _run(*_ir())
    assert len(list((tmp_path / "env_cache").glob("*.popef"))) == 1
    debug_log()
    _run(*_ir())
    assert LOADED in debug_log()


def test_bad_and_mismatched_files_are_ignored(tmp_path, debug_log):
    _run(*_ir(cache=tmp_path))
    _run(*_ir(scale=3.0, cache=tmp_path))
    mine, other = sorted(tmp_path.glob("*.popef"), key=lambda p: p.stat().st_mtime)
    (tmp_path / "junk.popef").write_text("This is not cache")
    mine.write_bytes(other.read_bytes())  # right name, someone else's executable
    debug_log()
    np.testing.assert_array_equal(_run(*_ir(cache=tmp_path)), [3.0, 0.0, 4.0])
    log = debug_log()
    assert COMPILED in log and LOADED not in log
    assert "Ignoring cache file because it does not contain a valid executable" in log
    assert "Cache file hash did not match the IR hash" in log


def test_preload_reads_files_whole(tmp_path, monkeypatch, debug_log):
    _run(*_ir(cache=tmp_path))
    debug_log()
    monkeypatch.setenv("POPART_PRELOAD_POPEF", "full-preload")
    _run(*_ir(cache=tmp_path))
    log = debug_log()
    assert "Performing preload of popef file" in log and "Completed preload of popef file" in log
    monkeypatch.delenv("POPART_PRELOAD_POPEF")
    _run(*_ir(cache=tmp_path))
    assert "preload" not in debug_log()


def test_another_process_loads_the_executable(tmp_path, debug_log):
    expected = _run(*_ir(cache=tmp_path))
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        from test_executable_cache import _ir, _run
        print(_run(*_ir(cache={str(tmp_path)!r})).tolist())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert LOADED in done.stderr and COMPILED not in done.stderr
    assert done.stdout.strip() == str(expected.tolist())


@pytest.mark.parametrize("replication", ["vmap", "shard_map"])
def test_replicated_programs_load_too(tmp_path, monkeypatch, debug_log, replication):
    monkeypatch.setenv("POPXL_REPLICATION", replication)

    def build():
        ir = popxl.Ir(replication=2)
        with ir.main_graph:
            x_h2d = popxl.h2d_stream((2,), popxl.float32, "x")
            out = popxl.d2h_stream((2,), popxl.float32, "out")
            ops.host_store(out, ops.collectives.replicated_all_reduce(ops.host_load(x_h2d)))
        ir._pb_ir.getSessionOptions().enableEngineCaching = True
        ir._pb_ir.getSessionOptions().cachePath = str(tmp_path)
        with popxl.Session(ir, "ipu_model") as session:
            return session.run({x_h2d: np.array([[1.0, 2.0], [10.0, 20.0]], np.float32)})[out]

    build()
    debug_log()
    np.testing.assert_array_equal(build(), [[11.0, 22.0], [11.0, 22.0]])
    assert LOADED in debug_log()
