"""TensorLocations: off-chip storage, replicated tensor sharding, IO tiles, activations.

Every placement trains to the same numbers as the all-on-chip program; the program shows
the mechanism (remote loads/stores, all-gathers, reduce-scatters, IO-tile copies) and the
memory report shows the bytes that left the chip."""

import numpy as np
import pytest

import poptorch
from poptorch import optim

from ._linear import Linear, data

B = 2
Settings = poptorch.TensorLocationSettings


def _train(make_opt, r=2, ga=2, di=2, **where):
    opts = poptorch.Options().deviceIterations(di).replicationFactor(r)
    opts.Training.gradientAccumulation(ga)
    loc = opts.TensorLocations
    for kind, settings in where.items():
        {
            "weight": loc.setWeightLocation,
            "optimizer": loc.setOptimizerLocation,
            "accumulator": loc.setAccumulatorLocation,
            "activation": loc.setActivationLocation,
            "io_tiles": lambda n: loc.numIOTiles(n),
        }[kind](settings)
    opt = make_opt()
    model = poptorch.trainingModel(Linear(), opts, opt)
    x, t = data(di * ga * r * B)
    model(x, t)
    model(x[::-1].copy(), t[::-1].copy())
    return model, opt


def _same(a, b):
    (ma, oa), (mb, ob) = a, b
    np.testing.assert_allclose(ma.state_dict()["w"], mb.state_dict()["w"], rtol=1e-5, atol=1e-6)
    sa, sb = oa.state_dict()["state"]["w"], ob.state_dict()["state"]["w"]
    assert sa.keys() == sb.keys()
    for slot in sa:
        np.testing.assert_allclose(sa[slot], sb[slot], rtol=1e-5, atol=1e-6)


def _adam():
    return optim.Adam(lr=0.05, weight_decay=0.01)


def _schedule(model):
    return model.print_schedule()


@pytest.mark.parametrize("on_chip", [True, False])
def test_sharded_weights_and_state_train_like_whole_ones(on_chip):
    """RTS of weights, optimiser state and accumulators over 2 replicas: gradients are
    reduce-scattered, each replica updates its shard, weights are all-gathered for use."""
    rts = Settings().useOnChipStorage(on_chip).useReplicatedTensorSharding(True)
    sharded = _train(_adam, weight=rts, optimizer=rts.model_copy(), accumulator=rts.model_copy())
    _same(sharded, _train(_adam))
    text = _schedule(sharded[0])
    assert "ReplicatedReduceScatter" in text and "ReplicatedAllGather" in text
    assert "ReplicatedAllReduce" not in text.replace("ReplicatedAllReduceInplace", "")
    # On chip, the 4 shards (weight, 2 moments, accumulator) are loaded once, by the
    # weights-from-host fragment; off chip they stream in and out inside the loops.
    assert (text.count("RemoteLoad") == 4) == on_chip


@pytest.mark.parametrize("what", ["weight", "optimizer", "accumulator"])
def test_each_class_can_be_sharded_alone(what):
    rts = Settings().useReplicatedTensorSharding(True)
    sgd = lambda: optim.SGD(lr=0.1, momentum=0.9)  # noqa: E731
    sharded = _train(sgd, r=4, **{what: rts})
    _same(sharded, _train(sgd, r=4))
    assert "ReplicatedReduceScatter" in _schedule(sharded[0])


def test_lamb_norms_and_clipping_add_up_the_shards():
    """LAMB's trust ratio and max_grad_norm need whole-tensor norms: the shards' partial
    sums are all-reduced, so sharded training matches whole-tensor training."""
    lamb = lambda: optim.LAMB(lr=0.05, max_grad_norm=0.05)  # noqa: E731
    rts = Settings().useReplicatedTensorSharding(True)
    _same(_train(lamb, weight=rts, optimizer=rts.model_copy()), _train(lamb))


def test_sharding_thresholds():
    """12 weight elements: a threshold of 13 keeps them whole; one replica never shards."""
    rts = Settings().useReplicatedTensorSharding(True).minElementsForReplicatedTensorSharding(13)
    model, _ = _train(_adam, weight=rts)
    assert "ReplicatedReduceScatter" not in _schedule(model)
    model, _ = _train(_adam, r=1, weight=Settings().useReplicatedTensorSharding(True))
    assert "ReplicatedReduceScatter" not in _schedule(model)


def test_off_chip_bytes_show_in_the_memory_report():
    """Weight (12 floats), Adam's two moments and the accumulator off chip: 4 x 48 bytes of
    remote buffers per replica; sharded over 2 replicas each replica keeps half."""
    off = Settings().useOnChipStorage(False)
    where = {"weight": off, "optimizer": off.model_copy(), "accumulator": off.model_copy()}
    remote, _ = _train(_adam, **where)
    chip, _ = _train(_adam)
    assert remote.memory_report().ipus[0].remote == 4 * 48
    assert chip.memory_report().ipus[0].remote == 0
    on_chip_vars = chip.memory_report().ipus[0].variables
    assert on_chip_vars - remote.memory_report().ipus[0].variables == 4 * 48
    rts = off.model_copy().useReplicatedTensorSharding(True)
    where = {"weight": rts, "optimizer": rts.model_copy(), "accumulator": rts.model_copy()}
    sharded, _ = _train(_adam, **where)
    assert sharded.memory_report().ipus[0].remote == 4 * 24


def test_io_tiles_load_and_store_remote_tensors():
    io = Settings().useOnChipStorage(False).useIOTilesToLoad(True).useIOTilesToStore(True)
    model = _train(_adam, weight=io, optimizer=io.model_copy(), io_tiles=32)
    assert "IoTileCopy" in _schedule(model[0])
    _same(model, _train(_adam))


def test_io_tiles_need_reserved_tiles():
    io = Settings().useOnChipStorage(False).useIOTilesToLoad(True)
    with pytest.raises(ValueError, match="numIOTiles"):
        _train(_adam, weight=io)


def test_off_chip_activations_pass_through_streaming_memory():
    """The forward values the backward reads are stored after the forward and loaded
    before the backward; below minElementsForOffChip they stay on chip."""
    off = Settings().useOnChipStorage(False)
    model = _train(_adam, activation=off)
    text = _schedule(model[0])
    assert "RemoteStore" in text and "RemoteLoad" in text
    assert any("_reloaded" in n for n in model[0].getTensorNames())
    _same(model, _train(_adam))
    big = Settings().useOnChipStorage(False).minElementsForOffChip(10**6)
    assert "RemoteLoad" not in _schedule(_train(_adam, activation=big)[0])


def test_activations_cannot_be_sharded():
    with pytest.raises(ValueError, match="Activations cannot use replicated tensor sharding"):
        poptorch.Options().TensorLocations.setActivationLocation(
            Settings().useReplicatedTensorSharding(True)
        )
