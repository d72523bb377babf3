"""Several instances under ``poprun``: the launcher, and distributed results equal to one
process running the same global replicas.

Every launch has a time limit, and each test checks that no process it started is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
WORKER = str(HERE / "multi_instance_worker.py")
CHECKPOINT_WORKER = str(HERE / "checkpoint_worker.py")
POPRUN = [sys.executable, "-m", "runtime.distributed.launcher"]
LIMIT_S = 240


def _leftovers(marker: str) -> list[int]:
    """Processes whose command line mentions ``marker`` (a test's unique tmp path)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found


def _child_env() -> dict[str, str]:
    """This environment, with the project first on the child's import path."""
    path = [str(HERE.parent.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def poprun(
    args: list[str], marker: str, timeout: float = LIMIT_S, **kw
) -> subprocess.CompletedProcess:
    """Run poprun to completion and check it left no process behind."""
    env = _child_env()
    result = subprocess.run(
        [*POPRUN, *args], capture_output=True, text=True, timeout=timeout, env=env, **kw
    )
    assert _leftovers(marker) == []
    return result


def py(code: str, marker: str) -> list[str]:
    """A ``python -c`` command; ``marker`` makes its processes findable."""
    return [sys.executable, "-c", code, marker]


# Launcher ------------------------------------------------------------------------------

ENV_CODE = (
    "import popdist; print(popdist.getInstanceIndex(), popdist.getNumInstances(), "
    "popdist.getNumLocalReplicas(), popdist.getReplicaIndexOffset(), "
    "popdist.getNumTotalReplicas(), popdist.getNumIpusPerReplica(), popdist.isPopdistEnvSet())"
)


def test_instances_get_their_place_and_tagged_output(tmp_path):
    result = poprun(
        ["--num-instances", "2", "--num-replicas", "4", "--ipus-per-replica", "2",
         "--vipu-partition", "p", "--mpi-local-args=-x PATH", *py(ENV_CODE, str(tmp_path))],
        str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = sorted(result.stdout.splitlines())
    assert lines == [
        "[1,0]<stdout>:0 2 2 0 4 2 True",
        "[1,1]<stdout>:1 2 2 2 4 2 True",
    ]
    assert (
        "poprun: ignoring PopRun options with no meaning here: --vipu-partition p "
        "--mpi-local-args=-x PATH"
    ) in result.stderr


def test_only_output_from_one_instance(tmp_path):
    code = "import popdist, sys; print('out', popdist.getInstanceIndex()); sys.stderr.write('e\\n')"
    result = poprun(
        ["--num-instances", "3", "--only-output-from-instance", "1", *py(code, str(tmp_path))],
        str(tmp_path),
    )
    assert result.returncode == 0
    assert result.stdout == "out 1\n"
    assert result.stderr == "e\n"


def test_one_failure_stops_every_instance(tmp_path):
    # Instance 1 fails at once; instance 0 (and a child it started) would sleep for minutes.
    code = (
        "import popdist, subprocess, sys, time\n"
        "if popdist.getInstanceIndex() == 1: sys.exit(3)\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', sys.argv[1]])\n"
        "time.sleep(300)"
    )
    start = time.monotonic()
    result = poprun(["--num-instances", "2", *py(code, str(tmp_path))], str(tmp_path))
    assert result.returncode == 3
    assert time.monotonic() - start < 60
    assert "poprun: instance 1 exited with status 3; stopping the other 1 instance(s)" in (
        result.stderr
    )


def test_signals_are_forwarded(tmp_path):
    code = (
        "import popdist, signal, sys, time, pathlib\n"
        "def bye(sig, frame):\n"
        "    pathlib.Path(sys.argv[1], f'got{popdist.getInstanceIndex()}').write_text(str(sig))\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "pathlib.Path(sys.argv[1], f'ready{popdist.getInstanceIndex()}').touch()\n"
        "time.sleep(300)"
    )
    env = _child_env()
    proc = subprocess.Popen(
        [*POPRUN, "--num-instances", "2", *py(code, str(tmp_path))],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + LIMIT_S
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert [(tmp_path / f"got{i}").read_text() for i in range(2)] == [str(int(signal.SIGTERM))] * 2
    proc.stdout.close()
    proc.stderr.close()
    assert _leftovers(str(tmp_path)) == []


def test_hosts_other_than_this_one_go_through_ssh(tmp_path):
    # A stand-in for ssh that records the host and runs the remote command line here.
    fake_ssh = tmp_path / "fake_ssh.py"
    fake_ssh.write_text(
        "import subprocess, sys, pathlib\n"
        f"pathlib.Path({str(tmp_path)!r}, 'ssh_' + sys.argv[1]).touch()\n"
        "sys.exit(subprocess.call(['bash', '-c', sys.argv[2]]))\n"
    )
    code = "import os, popdist; print(popdist.getInstanceIndex(), os.environ['POPDIST_COORDINATOR_ADDRESS'])"
    result = poprun(
        ["--num-instances", "4", "--host", "localhost,otherhost",
         "--ssh-command", f"{sys.executable} {fake_ssh}", *py(code, str(tmp_path))],
        str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.glob("ssh_*")) == ["ssh_otherhost"]
    lines = sorted(result.stdout.splitlines())
    assert [line.split(":")[0] for line in lines] == [f"[1,{i}]<stdout>" for i in range(4)]
    addresses = {line.split()[-1] for line in lines}
    assert len(addresses) == 1 and addresses.pop().startswith("127.0.0.1:")


def test_bad_command_lines_are_refused(tmp_path):
    result = poprun(["--num-instances", "3", "--num-replicas", "4", "true"], str(tmp_path))
    assert result.returncode == 2
    assert "--num-replicas 4 cannot be split evenly over --num-instances 3" in result.stderr
    result = poprun(["--num-instances", "2"], str(tmp_path))
    assert result.returncode == 2
    assert "no command to run" in result.stderr


# Distributed programs -------------------------------------------------------------------


@pytest.fixture(scope="module")
def single_process_4(tmp_path_factory):
    """The worker's results with 4 replicas in one process (the reference)."""
    out = tmp_path_factory.mktemp("single")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    subprocess.run(
        [sys.executable, WORKER, str(out), "--single", "4"],
        check=True,
        timeout=LIMIT_S,
        env=env,
        capture_output=True,
    )
    return dict(np.load(out / "instance0.npz"))


def _stacked(parts: list[np.ndarray], local: int) -> np.ndarray:
    """Instances' stream outputs (their replicas) → the single-process layout."""
    return np.concatenate([p if local > 1 else p[None] for p in parts])


@pytest.mark.parametrize("instances", [2, 4])
def test_distributed_results_equal_one_process(tmp_path, single_process_4, instances):
    result = poprun(
        ["--num-instances", str(instances), "--num-replicas", "4",
         sys.executable, WORKER, str(tmp_path)],
        str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    runs = [dict(np.load(tmp_path / f"instance{i}.npz")) for i in range(instances)]
    local = 4 // instances
    for i, run in enumerate(runs):
        # replication_factor (global), instance_replication_factor, globalReplicationFactor,
        # globalReplicaOffset
        assert run["layout"].tolist() == [4, local, 4, i * local]
    for key, expected in single_process_4.items():
        if key == "layout":
            continue
        if key.startswith(("var/", "grouped/")):  # variables: the global value everywhere
            for run in runs:
                np.testing.assert_array_equal(run[key], expected, err_msg=key)
        else:  # streams: each instance has its replicas' rows
            got = _stacked([run[key] for run in runs], local)
            np.testing.assert_array_equal(got, expected, err_msg=key)


def test_mismatched_programs_fail_every_instance(tmp_path):
    result = poprun(
        ["--num-instances", "2", "--num-replicas", "2", "--timeout", "30",
         sys.executable, WORKER, str(tmp_path), "--mismatch"],
        str(tmp_path),
    )  # fmt: skip
    assert result.returncode != 0
    assert "The instances are not running the same program" in result.stdout + result.stderr


def test_a_dead_instance_ends_the_run(tmp_path):
    result = poprun(
        ["--num-instances", "2", "--num-replicas", "2", "--kill-timeout", "2",
         sys.executable, WORKER, str(tmp_path), "--die-after-compile"],
        str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 7
    assert "instance 1 exited with status 7" in result.stderr
    assert not list(tmp_path.glob("*.npz"))


def test_unreachable_coordinator_is_a_clear_error(tmp_path):
    from runtime.distributed.launcher import free_port

    env = {
        **os.environ,
        "POPDIST_NUM_INSTANCES": "2",
        "POPDIST_INSTANCE_INDEX": "1",
        "POPDIST_NUM_TOTAL_REPLICAS": "2",
        "POPDIST_NUM_LOCAL_REPLICAS": "1",
        "POPDIST_REPLICA_INDEX_OFFSET": "1",
        "POPDIST_NUM_IPUS_PER_REPLICA": "1",
        "POPDIST_COORDINATOR_ADDRESS": f"127.0.0.1:{free_port()}",
        "POPDIST_TIMEOUT": "3",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
    }
    result = subprocess.run(
        [sys.executable, WORKER, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        env=env,
    )
    assert result.returncode != 0
    assert "Instance 1 of 2 could not join the distributed run through the coordinator" in (
        result.stderr
    )


@pytest.mark.parametrize("fail", [False, True])
def test_checkpoints_are_complete_or_absent(tmp_path, fail):
    target = tmp_path / "ckpt"
    result = poprun(
        ["--num-instances", "2", "--num-replicas", "2", "--kill-timeout", "2",
         sys.executable, CHECKPOINT_WORKER, str(target), *(["--fail"] if fail else [])],
        str(tmp_path),
    )  # fmt: skip
    if fail:
        assert result.returncode == 3
        # Whichever instance reports first, the run fails with the writer's error.
        assert "checkpoint failed:" in result.stdout
        assert "disk full (simulated)" in result.stdout
        assert not target.exists()
        assert [p.name for p in tmp_path.iterdir()] == []
        return
    assert result.returncode == 0, result.stderr[-3000:]
    saved = np.load(target / "model" / "v.npz")["v"]
    np.testing.assert_array_equal(saved, np.arange(8, dtype=np.float32).reshape(2, 4) + 1)
    assert (target / "dataloader.bin").read_text() == "position 1"
