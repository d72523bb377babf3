"""PopDist's query functions, ``Ir(replication="popdist")`` and poprun's command line."""

from __future__ import annotations

import shlex

import numpy as np
import pytest

import popdist
import popxl
from runtime.distributed import launcher

POPRUN_ENV = {
    "POPDIST_NUM_INSTANCES": "4",
    "POPDIST_INSTANCE_INDEX": "2",
    "POPDIST_NUM_TOTAL_REPLICAS": "8",
    "POPDIST_NUM_LOCAL_REPLICAS": "2",
    "POPDIST_REPLICA_INDEX_OFFSET": "4",
    "POPDIST_NUM_IPUS_PER_REPLICA": "1",
}


@pytest.fixture
def under_poprun(monkeypatch):
    for name, value in POPRUN_ENV.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def not_under_poprun(monkeypatch):
    for name in POPRUN_ENV:
        monkeypatch.delenv(name, raising=False)


def _queries() -> tuple:
    return (
        popdist.isPopdistEnvSet(),
        popdist.getNumInstances(),
        popdist.getInstanceIndex(),
        popdist.getNumTotalReplicas(),
        popdist.getNumLocalReplicas(),
        popdist.getReplicaIndexOffset(),
        popdist.getNumIpusPerReplica(),
    )


def test_queries_read_the_launcher_environment(under_poprun):
    assert _queries() == (True, 4, 2, 8, 2, 4, 1)


def test_queries_outside_poprun_describe_one_instance(not_under_poprun):
    assert _queries() == (False, 1, 0, 1, 1, 0, 1)


def test_a_bad_value_names_the_variable(under_poprun, monkeypatch):
    monkeypatch.setenv("POPDIST_NUM_LOCAL_REPLICAS", "two")
    with pytest.raises(ValueError, match="POPDIST_NUM_LOCAL_REPLICAS='two' .* not a positive"):
        popdist.getNumLocalReplicas()


def test_inconsistent_layout_is_refused(under_poprun, monkeypatch):
    monkeypatch.setenv("POPDIST_NUM_TOTAL_REPLICAS", "6")
    with pytest.raises(ValueError, match="POPDIST_NUM_TOTAL_REPLICAS=6 is not"):
        popxl.Ir(replication="popdist")


def test_execute_on_instances(under_poprun):
    assert popdist.execute_on_instances({2}, lambda a: a + 1, 1) == 2
    assert popdist.execute_on_instances({0}, lambda a: a + 1, 1) is None


def test_popdist_ir_takes_its_replication_from_poprun(under_poprun):
    ir = popxl.Ir(replication="popdist")
    opts = ir._pb_ir.getSessionOptions()
    assert (ir.replication_factor, ir.instance_replication_factor) == (8, 2)
    assert (opts.globalReplicationFactor, opts.globalReplicaOffset) == (8, 4)
    assert opts.enableDistributedReplicatedGraphs and opts.replicatedGraphCount == 2
    assert ir.replica_grouping(stride=2, group_size=4).assignment == [0, 1] * 4
    with pytest.raises(RuntimeError, match="comes from poprun"):
        ir.replication_factor = 2


def test_popdist_ir_outside_poprun_is_one_replica(not_under_poprun):
    ir = popxl.Ir(replication="popdist")
    assert (ir.replication_factor, ir.instance_replication_factor) == (1, 1)
    assert not ir._pb_ir.getSessionOptions().enableDistributedReplicatedGraphs


def test_instance_environment():
    layout = launcher.Layout(num_instances=2, num_replicas=6, ipus_per_replica=1)
    env = layout.environment(1, "127.0.0.1:1234", timeout=30)
    assert env["POPDIST_REPLICA_INDEX_OFFSET"] == "3"
    assert env["POPDIST_NUM_LOCAL_REPLICAS"] == "3"
    assert env["POPDIST_COORDINATOR_ADDRESS"] == "127.0.0.1:1234"
    assert env["POPDIST_TIMEOUT"] == "30"
    assert env["XLA_FLAGS"].endswith("--xla_force_host_platform_device_count=3")


def test_a_users_device_count_flag_is_replaced():
    flags = "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=8"
    assert launcher._with_device_count(flags, 2) == (
        "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=2"
    )


def test_ignored_options_are_split_from_the_command():
    argv = shlex.split(
        "--vipu-partition p --update-partition=yes --mpi-local-args='-x A' -vv "
        "--num-instances 2 python train.py --num-instances 9"
    )
    kept, ignored = launcher.split_ignored(argv)
    assert ignored == ["--vipu-partition p", "--update-partition=yes", "--mpi-local-args=-x A"]
    args, layout, _ = launcher.parse(argv)
    assert args.command == ["python", "train.py", "--num-instances", "9"]
    assert (layout.num_instances, layout.num_replicas, args.verbose) == (2, 2, 2)


def test_hosts_split_instances_evenly():
    assert launcher.hosts_of("a,b", 4) == ["a", "a", "b", "b"]
    assert launcher.hosts_of(None, 2) == ["localhost", "localhost"]
    with pytest.raises(SystemExit, match="3 instances cannot be split evenly over 2 hosts"):
        launcher.hosts_of("a,b", 3)


def test_remote_instances_start_through_ssh():
    argv, env = launcher.instance_argv(
        ["python", "t.py"], "gpu7", {"POPDIST_INSTANCE_INDEX": "1"}, "ssh -p 22"
    )
    assert env is None
    assert argv[:4] == ["ssh", "-p", "22", "gpu7"]
    assert argv[4].endswith("&& env POPDIST_INSTANCE_INDEX=1 python t.py")


def test_variable_takes_the_grouping_under_its_user_guide_name():
    ir = popxl.Ir(replication=2)
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    with ir.main_graph:
        grouping = ir.replica_grouping(group_size=1)
        v = popxl.variable(data, grouping=grouping)
        assert v.shape == (3,) and v.replica_grouping.num_groups == 2
        v += 1.0
        with pytest.raises(ValueError, match="Pass the replica grouping once"):
            popxl.variable(data, replica_grouping=grouping, grouping=grouping)
    with popxl.Session(ir, "cpu") as session:
        session.run()
    np.testing.assert_array_equal(session.get_tensor_data(v), data + 1)


def test_all_gather_takes_a_grouping_in_place_of_the_axis():
    # The user guide's distributed RTS example: replicated_all_gather(shard, grouping).
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        grouping = ir.replica_grouping(stride=2, group_size=2)
        stream = popxl.h2d_stream((2,), popxl.float32, "x")
        x = popxl.ops.host_load(stream)
        gathered = popxl.ops.collectives.replicated_all_gather(x, grouping)
        out = popxl.d2h_stream(gathered.shape, gathered.dtype, "out")
        popxl.ops.host_store(out, gathered)
    data = np.arange(8, dtype=np.float32).reshape(4, 2)
    with popxl.Session(ir, "cpu") as session:
        got = session.run({stream: data})[out]
    members = [[0, 2], [1, 3], [0, 2], [1, 3]]
    np.testing.assert_array_equal(got, np.stack([data[m].reshape(-1) for m in members]))
