"""trainingModel / inferenceModel executors: layouts, output modes, weights, files."""

import numpy as np
import pytest

import poptorch
import popxl
import popxl_addons as addons

from ._linear import OUT, Linear, data, grad, initial_w

B = 2


def options(di=1, ga=1, r=1, mode=None, period=None):
    opts = poptorch.Options().deviceIterations(di).replicationFactor(r)
    opts.Training.gradientAccumulation(ga)
    if mode is not None:
        opts.outputMode(mode, period)
    return opts


def sgd_reference(x, t, steps, lr, micro):
    """Plain SGD over ``steps`` steps, each averaging ``micro`` micro-batch gradients."""
    w = initial_w().astype(np.float64)
    for xs, ts in zip(np.split(x, steps), np.split(t, steps)):
        g = np.mean([grad(w, a, b) for a, b in zip(np.split(xs, micro), np.split(ts, micro))], 0)
        w = w - lr * g
    return w


# Layouts and output modes -----------------------------------------------------------------


def test_inference_output_mode_all_concatenates_batches():
    model = poptorch.inferenceModel(Linear(), options(di=3, r=2))
    x, t = data(3 * 2 * B)
    y, loss = model(x, t)
    np.testing.assert_allclose(y, x @ initial_w(), rtol=1e-6, atol=1e-7)
    assert y.shape == (12, OUT) and loss.shape == (6,)
    per_batch = ((x @ initial_w() - t) ** 2).reshape(6, B * OUT).mean(1)
    np.testing.assert_allclose(loss, per_batch, rtol=1e-5)


@pytest.mark.parametrize(
    "mode, period, count",
    [
        (poptorch.OutputMode.Final, None, 1),
        (poptorch.OutputMode.EveryN, 2, 2),
        (poptorch.OutputMode.All, None, 4),
    ],
)
def test_inference_output_modes_pick_batches(mode, period, count):
    model = poptorch.inferenceModel(Linear(), options(di=4, mode=mode, period=period))
    x, t = data(4 * B)
    y, loss = model(x, t)
    batches = np.split(x @ initial_w(), 4)
    picked = {1: [3], 2: [1, 3], 4: [0, 1, 2, 3]}[count]
    expected = np.concatenate([batches[i] for i in picked])
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-7)
    assert loss.shape == (() if count == 1 else (count,))


def test_inference_output_mode_sum():
    model = poptorch.inferenceModel(Linear(), options(di=4, mode=poptorch.OutputMode.Sum))
    x, t = data(4 * B)
    y, _ = model(x, t)
    np.testing.assert_allclose(y, sum(np.split(x @ initial_w(), 4)), rtol=1e-5)


def test_training_default_is_final_and_trains():
    """Default training output: the last micro-batch only; weights follow SGD."""
    model = poptorch.trainingModel(Linear(), options(di=3, ga=2), poptorch.optim.SGD(lr=0.1))
    x, t = data(3 * 2 * B)
    y, loss = model(x, t)
    assert y.shape == (B, OUT) and loss.shape == ()
    expected = sgd_reference(x, t, 3, 0.1, 2)
    np.testing.assert_allclose(model.state_dict()["w"], expected, rtol=1e-5, atol=1e-6)


def test_training_replicas_concatenate_in_replica_order():
    opts = options(di=2, ga=2, r=2, mode=poptorch.OutputMode.All)
    model = poptorch.trainingModel(Linear(), opts, poptorch.optim.SGD(lr=0.0))
    x, t = data(2 * 2 * 2 * B)
    y, loss = model(x, t)
    np.testing.assert_allclose(y, x @ initial_w(), rtol=1e-6, atol=1e-7)
    assert loss.shape == (8,)


@pytest.mark.parametrize("r", [1, 2])
def test_training_every_n_returns_each_micro_batch_of_every_nth_iteration(r):
    """EveryN with gradient accumulation: all micro-batches of iterations N, 2N, ...
    (PopART's EveryN anchor: deviceIterations * accumulation / N values per replica),
    ordered as All orders them. With lr 0 the outputs are the initial weights' products."""
    di, ga = 4, 2
    opts = options(di=di, ga=ga, r=r, mode=poptorch.OutputMode.EveryN, period=2)
    model = poptorch.trainingModel(Linear(), opts, poptorch.optim.SGD(lr=0.0))
    x, t = data(di * ga * r * B)
    y, loss = model(x, t)
    per_iteration = np.split(x @ initial_w(), di)
    np.testing.assert_allclose(y, np.concatenate(per_iteration[1::2]), rtol=1e-6, atol=1e-7)
    per_micro_batch = ((x @ initial_w() - t) ** 2).reshape(di * ga * r, -1).mean(1)
    np.testing.assert_allclose(loss, per_micro_batch.reshape(di, -1)[1::2].reshape(-1), rtol=1e-5)
    assert model.getPerfCounters()["output"][0].__len__() == di // 2 * ga * r


def test_input_replica_grouping_shares_slices():
    opts = options(r=4).inputReplicaGrouping(2, poptorch.CommGroupType.Consecutive)
    opts.outputMode(poptorch.OutputMode.All)
    model = poptorch.inferenceModel(Linear(), opts)
    x, t = data(2 * B)
    y, _ = model(x, t)
    halves = np.split(x @ initial_w(), 2)
    np.testing.assert_allclose(
        y, np.concatenate([halves[0], halves[0], halves[1], halves[1]]), rtol=1e-6, atol=1e-7
    )


# Errors -----------------------------------------------------------------------------------


def test_batch_dimension_must_divide():
    model = poptorch.inferenceModel(Linear(), options(di=3, r=2))
    with pytest.raises(ValueError, match="the batch dimension \\(10\\) must be a multiple of"):
        model(*data(10))


def test_shapes_are_fixed_after_compiling():
    model = poptorch.inferenceModel(Linear())
    model(*data(4))
    with pytest.raises(ValueError, match="compiled for inputs"):
        model(*data(6))


def test_inference_with_gradient_accumulation_is_refused():
    with pytest.raises(poptorch.Error, match="gradientAccumulation to 1 or leave it"):
        poptorch.inferenceModel(Linear(), options(ga=2))(*data(4))


def test_every_n_period_must_divide_device_iterations():
    model = poptorch.inferenceModel(
        Linear(), options(di=4, mode=poptorch.OutputMode.EveryN, period=3)
    )
    with pytest.raises(ValueError, match="multiple of 3, but deviceIterations is 4"):
        model(*data(4 * B))


def test_loss_must_be_a_scalar():
    import popxl_addons as addons

    class NoReduce(addons.Module):
        def build(self, x):
            w = self.add_variable_input("w", lambda: np.ones((2, 2), np.float32), x.dtype)
            return x @ w

    with pytest.raises(ValueError, match="The loss must be a scalar"):
        poptorch.trainingModel(NoReduce())(np.ones((2, 2), np.float32))


def test_set_optimizer_on_inference_is_an_error():
    model = poptorch.inferenceModel(Linear())
    with pytest.raises(poptorch.Error, match="only applies to a trainingModel"):
        model.setOptimizer(poptorch.optim.SGD(lr=0.1))


def test_not_compiled_errors_and_error_classes():
    model = poptorch.inferenceModel(Linear())
    with pytest.raises(poptorch.Error, match="has not been compiled yet") as info:
        model.copyWeightsToHost()
    assert info.value.type == "poptorch" and "compiled" in info.value.message
    assert issubclass(poptorch.RecoverableError, poptorch.Error)
    assert (
        poptorch.RecoverableError("x", recovery_action="IPU_RESET").recovery_action == "IPU_RESET"
    )
    assert issubclass(poptorch.UnrecoverableError, poptorch.Error)


def test_connection_never_compiles_but_does_not_run():
    opts = options().connectionType(poptorch.ConnectionType.Never)
    model = poptorch.inferenceModel(Linear(), opts)
    model.compile(*data(B))
    assert model.isCompiled() and not model.isAttachedToDevice()
    with pytest.raises(AssertionError, match="Trying to run a model on an offline device"):
        model(*data(B))
    with pytest.raises(poptorch.Error, match="use model.compile"):
        model(*data(B))


# Weights ----------------------------------------------------------------------------------


def test_training_and_inference_models_share_weights():
    module = Linear()
    train = poptorch.trainingModel(module, options(di=2), poptorch.optim.SGD(lr=0.1))
    infer = poptorch.inferenceModel(module)
    x, t = data(2 * B)
    train(x, t)
    y, _ = infer(x[:B], t[:B])
    trained = sgd_reference(x, t, 2, 0.1, 1)
    np.testing.assert_allclose(y, x[:B] @ trained, rtol=1e-5, atol=1e-6)
    train(x, t)  # train again: inference sees the new weights without explicit copies
    y2, _ = infer(x[:B], t[:B])
    assert np.abs(y2 - y).max() > 1e-4
    np.testing.assert_allclose(y2, x[:B] @ train.state_dict()["w"], rtol=1e-5, atol=1e-6)


def test_load_state_dict_reaches_the_device():
    model = poptorch.inferenceModel(Linear())
    x, t = data(B)
    model(x, t)
    keys = model.load_state_dict({"w": np.zeros_like(initial_w())})
    assert keys.missing_keys == [] and keys.unexpected_keys == []
    y, _ = model(x, t)
    np.testing.assert_array_equal(y, 0)
    with pytest.raises(KeyError, match="unexpected keys \\['v'\\]"):
        model.load_state_dict({"w": initial_w(), "v": 1})
    assert model.load_state_dict({}, strict=False).missing_keys == ["w"]


def test_copy_weights_and_detach_attach():
    model = poptorch.trainingModel(Linear(), options(), poptorch.optim.SGD(lr=0.1))
    x, t = data(B)
    model(x, t)
    assert model.copyWeightsToHostIfNeeded() and not model.copyWeightsToHostIfNeeded()
    model.detachFromDevice()
    assert not model.isAttachedToDevice()
    with pytest.raises(poptorch.Error, match="call attachToDevice"):
        model(x, t)
    model.attachToDevice()
    model(x, t)
    expected = sgd_reference(np.concatenate([x, x]), np.concatenate([t, t]), 2, 0.1, 1)
    np.testing.assert_allclose(model.state_dict()["w"], expected, rtol=1e-5, atol=1e-6)
    model.destroy()
    assert not model.isCompiled()
    np.testing.assert_allclose(model.state_dict()["w"], expected, rtol=1e-5, atol=1e-6)


def test_replica_grouped_weights():
    """Listing 4.14's pattern: one weight value per orthogonal group of replicas."""
    opts = options(r=4, mode=poptorch.OutputMode.All)
    model = poptorch.trainingModel(Linear(), opts, poptorch.optim.SGD(lr=0.1))
    model.replicaGrouping(
        "w", poptorch.CommGroupType.Orthogonal, 2, poptorch.VariableRetrievalMode.AllReplicas
    )
    x, t = data(4 * B)
    model(x, t)
    w = model.state_dict()["w"]
    assert w.shape == (4, *initial_w().shape)
    xs, ts = np.split(x, 4), np.split(t, 4)
    for replica in range(4):
        group = [replica % 2, replica % 2 + 2]  # orthogonal groups {0, 2}, {1, 3}
        g = np.mean([grad(initial_w(), xs[i], ts[i]) for i in group], 0)
        np.testing.assert_allclose(w[replica], initial_w() - 0.1 * g, rtol=1e-5, atol=1e-6)
    with pytest.raises(poptorch.Error, match="before the model is compiled"):
        model.replicaGrouping("w", poptorch.CommGroupType.All, 1)


# Files ------------------------------------------------------------------------------------


def test_save_and_load_checkpoint(tmp_path):
    model = poptorch.trainingModel(Linear(), options(di=2), poptorch.optim.Adam(lr=0.05))
    x, t = data(2 * B)
    model(x, t)
    path = str(tmp_path / "model.poptorch")
    model.save(path)
    restored = poptorch.load(path)
    model(x, t)
    restored(x, t)
    np.testing.assert_allclose(restored.state_dict()["w"], model.state_dict()["w"], rtol=1e-6)


def test_compile_and_export_then_load_executable(tmp_path):
    model = poptorch.inferenceModel(Linear(), options(di=2))
    x, t = data(2 * B)
    path = str(tmp_path / "exe.poptorch")
    model.compileAndExport(path, x, t, export_model=False)
    fresh = poptorch.inferenceModel(Linear(), options(di=2))
    fresh.loadExecutable(path)
    y, _ = fresh(x, t)
    np.testing.assert_allclose(y, x @ initial_w(), rtol=1e-6, atol=1e-7)
    with pytest.raises(poptorch.Error, match="export_model=False"):
        poptorch.load(path)
    other = poptorch.inferenceModel(Linear(), options(di=1))
    other.compile(x[:B], t[:B])
    with pytest.raises(poptorch.Error, match="different program"):
        other.loadExecutable(path)


# Inspection -------------------------------------------------------------------------------


def test_program_is_an_ordinary_ir_and_prints():
    opts = options(di=3, ga=2, r=2)
    model = poptorch.trainingModel(Linear(), opts, poptorch.optim.SGD(lr=0.1))
    model(*data(3 * 2 * 2 * B))
    assert isinstance(model.ir, popxl.Ir)
    assert model.ir.num_host_transfers == 6 and model.ir.replication_factor == 2
    text = model.print_schedule()
    for op in ("Loop", "HostLoad", "ReplicatedAllReduceInplace", "CopyVarUpdate", "HostStore"):
        assert op in text
    assert "learningRate___specific___w" in model.getTensorNames()  # PopART's naming
    so = model.ir._pb_ir.getSessionOptions()
    assert (so.accumulationFactor, so.replicatedGraphCount) == (2, 2)
    lo, hi, mean = model.getLatency()
    assert 0 < lo <= mean <= hi
    assert model.getComputeLatency()[2] <= mean * (1 + 1e-9)


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    model = poptorch.inferenceModel(Linear())
    x, t = data(B)
    y, _ = model(torch.tensor(x), torch.tensor(t, dtype=torch.float64))
    assert isinstance(y, torch.Tensor)
    np.testing.assert_allclose(y.numpy(), x @ initial_w(), rtol=1e-6)


def test_device_failures_are_poptorch_errors(monkeypatch):
    import jax

    model = poptorch.inferenceModel(Linear())
    x, t = data(B)
    model(x, t)

    def fail(*_args, **_kwargs):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: out of memory")

    monkeypatch.setattr(model._session, "_execute", fail)  # every run goes through it
    with pytest.raises(poptorch.Error, match="device failed while running") as info:
        model(x, t)
    assert info.value.type == "runtime" and info.value.location == "PoplarExecutor.__call__"
    assert "RESOURCE_EXHAUSTED" in info.value.message


def test_model_name_scopes_the_program():
    opts = options().modelName("regressor")
    model = poptorch.inferenceModel(Linear(), opts)
    model(*data(B))
    assert any(name.startswith("regressor") for name in model.getTensorNames())


def test_input_group_size_must_divide_replicas():
    opts = options(r=4).inputReplicaGrouping(3, poptorch.CommGroupType.Consecutive)
    with pytest.raises(ValueError, match="group size 3 must divide replicationFactor 4"):
        poptorch.inferenceModel(Linear(), opts).compile(*data(4))


def test_off_chip_tensor_locations_use_remote_buffers():
    """Weights and optimiser state off chip: the same training, through remote buffers."""
    opts = options(di=3, ga=2)
    off = poptorch.TensorLocationSettings().useOnChipStorage(False)
    opts.TensorLocations.setWeightLocation(off).setOptimizerLocation(off)
    opts.TensorLocations.setAccumulatorLocation(off.model_copy())
    opt = poptorch.optim.SGD(lr=0.1, momentum=0.5)
    model = poptorch.trainingModel(Linear(), opts, opt)
    x, t = data(3 * 2 * B)
    model(x, t)
    text = model.print_schedule()
    assert "RemoteLoad" in text and "RemoteStore" in text
    ref_opt = poptorch.optim.SGD(lr=0.1, momentum=0.5)
    reference = poptorch.trainingModel(Linear(), options(di=3, ga=2), ref_opt)
    reference(x, t)
    velocity = opt.state_dict()["state"]["w"]["momentum_buffer"]
    np.testing.assert_allclose(
        velocity, ref_opt.state_dict()["state"]["w"]["momentum_buffer"], rtol=1e-6
    )
    assert np.abs(velocity).max() > 0
    assert "RemoteLoad" not in reference.print_schedule()
    np.testing.assert_allclose(model.state_dict()["w"], reference.state_dict()["w"], rtol=1e-6)
    # Below the element threshold a tensor stays on chip.
    small = poptorch.TensorLocationSettings().useOnChipStorage(False).minElementsForOffChip(100)
    opts = options()
    opts.TensorLocations.setWeightLocation(small)
    model = poptorch.inferenceModel(Linear(), opts)
    model(*data(B))
    assert "RemoteLoad" not in model.print_schedule()


def test_exported_model_loads_with_its_executable(tmp_path):
    model = poptorch.trainingModel(Linear(), options(di=2), poptorch.optim.SGD(lr=0.1))
    x, t = data(2 * B)
    path = str(tmp_path / "trained.poptorch")
    model.compileAndExport(path, x, t)
    restored = poptorch.load(path, edit_opts_fn=lambda o: o.randomSeed(3))
    assert restored.options.random_seed == 3 and restored.isCompiled()
    restored(x, t)
    np.testing.assert_allclose(
        restored.state_dict()["w"], sgd_reference(x, t, 2, 0.1, 1), rtol=1e-5, atol=1e-6
    )


class _RandomInit(addons.Module):
    """A weight drawn from NumPy's global generator (seeded by ``randomSeed``)."""

    def build(self, x: popxl.Tensor):
        w = self.add_variable_input("w", lambda: np.random.normal(size=(4, 3)), x.dtype)
        return x @ w


def test_a_64_bit_random_seed_seeds_the_weights_as_a_distinct_seed():
    """Seeds are 64-bit, as torch.manual_seed and PopART take them: seeds past 2**32
    compile, repeat themselves and differ from their low 32 bits."""

    def weights(seed):
        model = poptorch.inferenceModel(_RandomInit(), poptorch.Options().randomSeed(seed))
        model.compile(np.ones((2, 4), np.float32))
        return np.asarray(model.state_dict()["w"]).copy()

    big = 2**40 + 7
    np.testing.assert_array_equal(weights(big), weights(big))
    assert not np.array_equal(weights(big), weights(7))
