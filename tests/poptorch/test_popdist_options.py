"""``popdist.poptorch.Options``: PopTorch options for one ``poprun`` instance."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import popdist.poptorch
import poptorch

# Instance 2 of 4, running global replicas 4 and 5 of 8 (the environment poprun gives it).
from tests.popdist.test_popdist import not_under_poprun, under_poprun  # noqa: E402, F401


@pytest.mark.usefixtures("under_poprun")
def test_options_take_the_instance_layout_and_the_loader_its_share():
    opts = popdist.poptorch.Options(ipus_per_replica=1).deviceIterations(1)
    assert opts.replication_factor == 2
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (2, 4)
    # 80 samples over 4 instances: this one reads the third contiguous quarter, two
    # replicas' micro-batches of 5 per step.
    loader = poptorch.DataLoader(opts, np.arange(80), batch_size=5)
    assert len(loader) == 2
    np.testing.assert_array_equal(np.concatenate(list(loader)), np.arange(40, 60))
    assert isinstance(opts.clone(), popdist.poptorch.Options)


@pytest.mark.usefixtures("not_under_poprun")
def test_outside_poprun_it_is_one_instance_of_one_replica():
    opts = popdist.poptorch.Options()
    assert opts.replication_factor == 1
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (0, 1)
    model = poptorch.inferenceModel(torch.nn.Linear(2, 2), opts)
    assert model(torch.ones(3, 2)).shape == (3, 2)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda o: o.useIpuId(1), "useIpuId"),
        (lambda o: o.replicationFactor(1), "replicationFactor"),
        (lambda o: o.Distributed.disable(), "Distributed.disable"),
        (lambda o: o.Distributed.setEnvVarNames("A", "B"), "Distributed.setEnvVarNames"),
        (lambda o: o.Distributed.configureProcessId(1), "Distributed.configureProcessId"),
    ],
)
@pytest.mark.usefixtures("under_poprun")
def test_what_poprun_decides_cannot_be_changed(call, name):
    opts = popdist.poptorch.Options()
    with pytest.raises(RuntimeError, match=rf"Cannot call `{name}` with popdist\.poptorch"):
        call(opts)
    assert opts.replication_factor == 2 and opts.Distributed.processId == 2


@pytest.mark.usefixtures("under_poprun")
def test_ipus_per_replica_must_match_poprun():
    with pytest.raises(ValueError, match="does not match poprun's --ipus-per-replica 1"):
        popdist.poptorch.Options(ipus_per_replica=2)
    with pytest.raises(ValueError, match="ipus_per_replica must be a positive integer"):
        popdist.poptorch.Options(ipus_per_replica=0)


def test_a_poptorch_script_under_poprun_trains_as_one_process(tmp_path):
    """The same script (``poprun_worker.py``, a BatchNorm model) run by 2 instances of 2
    replicas each, and by one process of 4 replicas: every weight update sees the same
    samples (each instance its share), so the weights agree, and the instances agree with
    each other."""
    from tests.poptorch import poprun_worker  # noqa: PLC0415
    from tests.runtime.test_multi_instance import poprun  # noqa: PLC0415

    worker = str(Path(__file__).with_name("poprun_worker.py"))
    poprun_worker.main(tmp_path, replicas=4)  # in this process: a process start is seconds
    result = poprun(
        ["--num-instances", "2", "--num-replicas", "4", sys.executable, worker, str(tmp_path)],
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    want = dict(np.load(tmp_path / "single.npz"))
    runs = [dict(np.load(tmp_path / f"instance{i}.npz")) for i in range(2)]
    for name in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
        np.testing.assert_array_equal(runs[0][name], runs[1][name], err_msg=name)
        np.testing.assert_allclose(runs[0][name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)
    # BatchNorm's running statistics (buffers the forward updates) are each replica's own,
    # from its own micro-batches, as on IPUs (PopTorch refused only other buffer updates
    # under replication); the host reads the instance's first replica, as each instance
    # read its own IPUs, so instance 1 gets (global) replica 2's.
    for run in (*runs, want):
        assert np.all(np.isfinite(run["norm.running_mean"])) and np.any(run["norm.running_mean"])
        assert run["norm.num_batches_tracked"] == 4  # 2 epochs of one step of 2 micro-batches
    assert not np.allclose(runs[0]["norm.running_mean"], runs[1]["norm.running_mean"])
    # Each instance's Final losses are its 2 replicas'.
    assert runs[0]["losses"].shape == (2, 2) and want["losses"].shape == (2, 4)


@pytest.mark.usefixtures("under_poprun")
def test_options_that_contradict_poprun_are_refused():
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.fc(x)

    opts = poptorch.Options().replicationFactor(1)
    with pytest.raises(ValueError, match="runs 2 replicas .* Use popdist.poptorch.Options"):
        poptorch.inferenceModel(Net(), opts)(torch.ones(2, 2))
    opts = poptorch.Options().replicationFactor(2)
    opts.Distributed.configureProcessId(0, 4)
    with pytest.raises(ValueError, match="started this process as instance 2 of 4, but"):
        poptorch.inferenceModel(Net(), opts)(torch.ones(4, 2))
