"""Execution strategies: blocks placed on IPUs, sharded, pipelined and phased programs.

Each strategy trains to the same weights as the unsplit program, prints its blocks,
stages and IPUs, and (with 8 forced host devices, see tests/conftest.py) runs each IPU's
ops on its own JAX device."""

import contextlib

import numpy as np
import pytest

import poptorch
import popxl_addons as addons
from poptorch import optim
from popxl import ops

IN, HID, OUT, B = 4, 8, 3, 2


def _w(shape, seed):
    return lambda: np.random.default_rng(seed).normal(0, 0.5, shape).astype(np.float32)


class Dense(addons.Module):
    def __init__(self, shape, seed):
        super().__init__()
        self.shape, self.seed = shape, seed

    def build(self, x):
        w = self.add_variable_input("weight", _w(self.shape, self.seed), x.dtype)
        return x @ w


class MLP(addons.Module):
    """Three layers; ``blocks`` marks them with Block scopes ("with") or BeginBlock."""

    def __init__(self, style="with", ipus=(0, 1, 2)):
        super().__init__()
        self.style, self.ipus = style, ipus
        self.l1, self.l2, self.l3 = Dense((IN, HID), 1), Dense((HID, HID), 2), Dense((HID, OUT), 3)
        if style == "begin":
            poptorch.BeginBlock(self.l1, "one", ipu_id=ipus[0])
            poptorch.BeginBlock(self.l2, "two", ipu_id=ipus[1])
            poptorch.BeginBlock(self.l3, "three", ipu_id=ipus[2])

    def build(self, x, t):
        if self.style == "begin":
            y = self.l3(ops.gelu(self.l2(ops.gelu(self.l1(x)))))
        elif self.style == "with":
            with poptorch.Block("one", ipu_id=self.ipus[0]):
                h = ops.gelu(self.l1(x))
            with poptorch.Block("two", ipu_id=self.ipus[1]):
                h = ops.gelu(self.l2(h))
            with poptorch.Block("three", ipu_id=self.ipus[2]):
                y = self.l3(h)
        else:
            y = self.l3(ops.gelu(self.l2(ops.gelu(self.l1(x)))))
        d = y - t
        return y, poptorch.identity_loss(d * d, "mean")


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, IN)).astype(np.float32), rng.normal(size=(n, OUT)).astype(np.float32)


def _train(model, strategy=None, ga=6, di=2, opt=None):
    opts = poptorch.Options().deviceIterations(di)
    opts.Training.gradientAccumulation(ga)
    if strategy is not None:
        opts.setExecutionStrategy(strategy)
    executor = poptorch.trainingModel(model, opts, opt or optim.SGD(lr=0.05, momentum=0.9))
    x, t = _data(di * ga * B)
    out = executor(x, t)
    executor(x[::-1].copy(), t[::-1].copy())
    return executor, out


def _same_weights(a, b):
    wa, wb = a.state_dict(), b.state_dict()
    assert wa.keys() == wb.keys()
    for k in wa:
        np.testing.assert_allclose(wa[k], wb[k], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def reference():
    return _train(MLP(style="none"))


@pytest.mark.parametrize("style", ["with", "begin"])
def test_sharded_execution_trains_like_one_ipu(reference, style):
    model, (y, loss) = _train(MLP(style), poptorch.ShardedExecution())
    _same_weights(model, reference[0])
    np.testing.assert_allclose(loss, reference[1][1], rtol=1e-5)
    text = model.print_schedule()
    assert "ShardedExecution" in text
    assert "block 'one': stage 0, IPU 0" in text and "block 'three': stage 2, IPU 2" in text


def test_pipelined_execution_trains_like_one_ipu(reference):
    """Three forward stages -> five pipeline stages (forward 0, 1, 2 with 2's backward,
    backward 1, backward 0), over GA = 10 micro-batches per step."""
    ref, _ = _train(MLP(style="none"), ga=10)
    model, (y, loss) = _train(MLP("begin"), poptorch.PipelinedExecution(), ga=10)
    _same_weights(model, ref)
    text = model.print_schedule()
    assert "PipelinedExecution" in text and "block 'two': stage 1, IPU 1" in text
    assert "Pipeline: 5 stages over 10 steps" in text  # forward 0, 1, 2 (+ its backward), 1, 0
    assert model._session._program.ipus == 3  # placed: one device per IPU


def test_pipelined_stages_group_blocks():
    """Stage("one", "two") on IPU 0 and Stage("three") on IPU 1: two forward stages."""
    strategy = poptorch.PipelinedExecution(
        poptorch.Stage("one", "two").ipu(0), poptorch.Stage("three").ipu(1)
    )
    model, _ = _train(MLP("with"), strategy, ga=6)
    ref, _ = _train(MLP(style="none"), ga=6)
    _same_weights(model, ref)
    text = model.print_schedule()
    assert "block 'two': stage 0, IPU 0" in text and "block 'three': stage 1, IPU 1" in text


def test_pipeline_needs_as_many_micro_batches_as_stages():
    message = (
        r"gradientAccumulation must be greater than or equal to the number of pipeline stages "
        r"\(5\) .* a model with 3 pipeline stages in PopTorch will have an additional 2 stages"
    )
    with pytest.raises(poptorch.Error, match=message):
        _train(MLP("with"), poptorch.PipelinedExecution(), ga=4)
    model, _ = _train(MLP("with"), poptorch.PipelinedExecution(), ga=5)  # fewest: one per stage
    ref, _ = _train(MLP(style="none"), ga=5)
    _same_weights(model, ref)
    assert "Pipeline: 5 stages over 5 steps" in model.print_schedule()


def test_pipelined_inference_needs_as_many_device_iterations_as_stages():
    opts = poptorch.Options().deviceIterations(2)
    model = poptorch.inferenceModel(MLP("with"), opts)
    with pytest.raises(poptorch.Error, match=r"deviceIterations must be greater .* \(3\)"):
        model(*_data(2 * B))


@pytest.mark.parametrize(
    "mode, period, pick",
    [
        (poptorch.OutputMode.EveryN, 1, lambda y: y),
        (poptorch.OutputMode.EveryN, 2, lambda y: y[1::2]),
        (poptorch.OutputMode.EveryN, 3, lambda y: y[2::3]),
        (poptorch.OutputMode.Final, 1, lambda y: y[-1:]),
        (poptorch.OutputMode.Sum, 1, lambda y: y.sum(0, keepdims=True)),
    ],
)
def test_pipelined_inference_pipelines_over_all_device_iterations(mode, period, pick):
    """Three stages over six device iterations, whatever the output mode (an output
    period shorter than the pipeline is no reason to refuse)."""
    opts = poptorch.Options().deviceIterations(6).outputMode(mode, period)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    model = poptorch.inferenceModel(MLP("with"), opts)
    plain = poptorch.inferenceModel(MLP("none"), poptorch.Options().deviceIterations(6))
    x, t = _data(6 * B)
    y, loss = model(x, t)
    y_all, loss_all = (np.asarray(v) for v in plain(x, t))
    want_y = pick(y_all.reshape(6, B, OUT)).reshape(-1, OUT)
    np.testing.assert_allclose(np.asarray(y).reshape(-1, OUT), want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(loss).reshape(-1), pick(loss_all), rtol=1e-5)
    assert "Pipeline: 3 stages over 6 steps" in model.print_schedule()
    short = poptorch.Options().deviceIterations(2).outputMode(poptorch.OutputMode.EveryN, 1)
    with pytest.raises(poptorch.Error, match=r"deviceIterations must be greater .* \(3\)"):
        poptorch.inferenceModel(MLP("with"), short)(*_data(2 * B))


def test_inference_refuses_gradient_accumulation():
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    with pytest.raises(poptorch.Error, match="Use poptorch.Options\\(\\).deviceIterations"):
        poptorch.inferenceModel(MLP("with"), opts)
    opts.setExecutionStrategy(poptorch.ShardedExecution())
    with pytest.raises(poptorch.Error, match=r"gradientAccumulation to 1 .*inferenceModel\(\)\.$"):
        poptorch.inferenceModel(MLP("with"), opts)


def test_pipelined_inference_returns_every_batch():
    opts = poptorch.Options().deviceIterations(8)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    model = poptorch.inferenceModel(MLP("with"), opts)
    plain = poptorch.inferenceModel(MLP("none"), poptorch.Options().deviceIterations(8))
    x, t = _data(8 * B)
    y, loss = model(x, t)
    y_ref, loss_ref = plain(x, t)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-5)


@pytest.mark.parametrize("parallel", [False, True])
def test_phased_execution_streams_weights_per_phase(reference, parallel):
    """Phases one / two / three: the weights, momentum and accumulators live in remote
    buffers (loaded when their phase runs), activations go off chip after the forward."""
    cls = poptorch.ParallelPhasedExecution if parallel else poptorch.SerialPhasedExecution
    strategy = cls(poptorch.Phase("one"), poptorch.Phase("two"), poptorch.Phase("three"))
    strategy.setTensorsLiveness(poptorch.Liveness.OffChipAfterFwd)
    model, _ = _train(MLP("with"), strategy)
    _same_weights(model, reference[0])
    text = model.print_schedule()
    assert "RemoteLoad" in text and "RemoteStore" in text
    # The phases name no IPUs: each block runs on its Block's ipu_id (as in PopTorch), which
    # here also keeps even phases on even IPUs and odd on odd.
    assert "block 'two': phase 1, IPU 1" in text and "block 'three': phase 2, IPU 2" in text
    report = model.memory_report()
    weights = 4 * (IN * HID + HID * HID + HID * OUT)
    assert sum(m.remote for m in report.ipus) >= 3 * weights  # weight, momentum, accumulator


def test_unlisted_block_is_an_error():
    strategy = poptorch.PipelinedExecution(poptorch.Stage("one", "two"))
    with pytest.raises(ValueError, match="Block 'three' is in no Stage of the PipelinedExecution"):
        _train(MLP("with"), strategy)


def test_stages_must_follow_the_blocks():
    strategy = poptorch.ShardedExecution(
        poptorch.Stage("two"), poptorch.Stage("one"), poptorch.Stage("three")
    )
    with pytest.raises(ValueError, match="Block 'two' runs after block 'one'"):
        _train(MLP("with"), strategy)


def test_placed_blocks_run_on_their_own_devices(monkeypatch):
    """With placement on (8 forced host devices), each block's call runs on the device of
    its IPU: the step is split over 3 devices and the numbers are unchanged."""
    monkeypatch.setenv("POPXL_PLACEMENT", "on")
    model, (y, loss) = _train(MLP("with"), poptorch.ShardedExecution(), ga=2)
    monkeypatch.setenv("POPXL_PLACEMENT", "off")
    ref, (y_ref, loss_ref) = _train(MLP("with"), poptorch.ShardedExecution(), ga=2)
    _same_weights(model, ref)
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-5)
    session = model._session
    assert session._program.ipus == 3
    devices = {d.id for d in session._state[0].sharding.device_set}
    assert len(devices) == 3
    calls = [
        op
        for g in model.ir._graphs.values()
        for op in g._ops
        if op.opdef.key == "call" and op.attrs["graphs"][0].name.startswith("block_")
    ]
    assert sorted({op.ipu for op in calls}) == [0, 1, 2]


def _options(ga, strategy=None, r=1):
    opts = poptorch.Options().deviceIterations(2).replicationFactor(r)
    opts.Training.gradientAccumulation(ga)
    if strategy is not None:
        opts.setExecutionStrategy(strategy)
    return opts


@pytest.mark.parametrize("combo", ["loss_scaling", "off_chip_weights", "replicas", "lamb_clipping"])
def test_pipelines_combine_with_the_other_options(combo):
    """Automatic loss scaling (scale copied to each IPU), off-chip weights (loaded in each
    stage), two replicas, LAMB with gradient clipping (norms summed over the IPUs)."""
    r = 2 if combo == "replicas" else 1

    def opts(strategy):
        o = _options(10, strategy, r)
        if combo == "loss_scaling":
            o.Training.setAutomaticLossScaling(True, growth_interval=1)
        if combo == "off_chip_weights":
            o.TensorLocations.setWeightLocation(
                poptorch.TensorLocationSettings().useOnChipStorage(False)
            )
        return o

    def opt():
        if combo == "lamb_clipping":
            return optim.LAMB(lr=0.01, max_grad_norm=0.1)
        return optim.Adam(lr=0.01, loss_scaling=4.0)

    x, t = _data(2 * 10 * r * B)
    piped = poptorch.trainingModel(MLP("with"), opts(poptorch.PipelinedExecution()), opt())
    plain = poptorch.trainingModel(MLP("none"), opts(None), opt())
    piped(x, t)
    plain(x, t)
    _same_weights(piped, plain)


def test_final_output_mode_pipelined_inference():
    opts = poptorch.Options().deviceIterations(6).outputMode(poptorch.OutputMode.Final)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    model = poptorch.inferenceModel(MLP("with"), opts)
    x, t = _data(6 * B)
    y, loss = model(x, t)
    np.testing.assert_allclose(
        y, poptorch.inferenceModel(MLP("none"))(x[-B:], t[-B:])[0], rtol=1e-5
    )


def test_begin_block_models_save_and_load(tmp_path):
    model, _ = _train(MLP("begin"), poptorch.ShardedExecution(), ga=2)
    path = str(tmp_path / "blocks.poptorch")
    model.save(path)
    restored = poptorch.load(path)
    x, t = _data(2 * 2 * B)
    model(x, t)
    restored(x, t)
    _same_weights(restored, model)
    assert "block 'two': stage 1, IPU 1" in restored.print_schedule()


def test_begin_block_needs_a_module_or_a_function():
    with pytest.raises(TypeError, match="BeginBlock expects a torch.nn.Module, a popxl_addons"):
        poptorch.BeginBlock(object(), "x")


class Skip(MLP):
    """Block three reads block one's output too (a skip connection over block two)."""

    def build(self, x, t):
        with poptorch.Block("one", ipu_id=0) if self.style == "with" else _nothing():
            h1 = ops.gelu(self.l1(x))
        with poptorch.Block("two", ipu_id=1) if self.style == "with" else _nothing():
            h = ops.gelu(self.l2(h1))
        with poptorch.Block("three", ipu_id=2) if self.style == "with" else _nothing():
            y = self.l3(h + h1)
        d = y - t
        return y, poptorch.identity_loss(d * d, "mean")


def _nothing():
    return contextlib.nullcontext()


def test_skip_connections_sum_their_gradients_across_ipus():
    """h1's gradient comes from blocks two and three (on IPUs 1 and 2) and is summed before
    block one's backward on IPU 0."""
    model, _ = _train(Skip("with"), poptorch.ShardedExecution())
    ref, _ = _train(Skip("none"))
    _same_weights(model, ref)


Skip.IPUS = (("one", 0), ("two", 1), ("three", 2))


class SkipBack(MLP):
    """Block three, back on IPU 0, reads block one's output (made on IPU 0 two stages
    before) and the input ``t`` that only it reads; block two runs on IPU 1."""

    IPUS = (("one", 0), ("two", 1), ("three", 0))

    def build(self, x, t):
        with poptorch.Block("one", ipu_id=0) if self.style == "with" else _nothing():
            h1 = ops.gelu(self.l1(x))
        with poptorch.Block("two", ipu_id=1) if self.style == "with" else _nothing():
            h = ops.gelu(self.l2(h1))
        with poptorch.Block("three", ipu_id=0) if self.style == "with" else _nothing():
            y = self.l3(h + h1)
            d = y - t
        return y, poptorch.identity_loss(d * d, "mean")


@pytest.mark.parametrize("model", [Skip, SkipBack], ids=["other_ipu", "same_ipu"])
def test_pipelines_carry_values_to_any_later_stage(model):
    """A value read two stages after the one that makes it (as BERT's attention mask is
    read by every encoder stage) reaches the later stage with its own micro-batch's value,
    forward and backward: the pipelined model trains as the unsplit one."""
    # One stage a block, in the order they run, on the blocks' own IPUs.
    stages = [poptorch.Stage(name).ipu(ipu) for name, ipu in model.IPUS]
    pipelined, out = _train(model("with"), poptorch.PipelinedExecution(*stages), ga=10)
    plain, want = _train(model("none"), ga=10)
    _same_weights(pipelined, plain)
    for got, expected in zip(out, want):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["All", "Sum", "Final"])
@pytest.mark.parametrize("kind", ["sharded", "phased", "pipelined"])
def test_inference_strategies_return_the_unsplit_results(kind, mode):
    strategy = {
        "sharded": poptorch.ShardedExecution(),
        "phased": poptorch.SerialPhasedExecution(
            poptorch.Phase("one"), poptorch.Phase("two", "three")
        ),
        "pipelined": poptorch.PipelinedExecution(),
    }[kind]
    output_mode = poptorch.OutputMode[mode]
    opts = poptorch.Options().deviceIterations(6).outputMode(output_mode)
    model = poptorch.inferenceModel(MLP("with"), opts.clone().setExecutionStrategy(strategy))
    plain = poptorch.inferenceModel(MLP("none"), opts)
    x, t = _data(6 * B)
    for got, want in zip(model(x, t), plain(x, t)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_pipelines_recompute_where_popart_options_ask():
    """``_Popart.set("autoRecomputation", ...)``, as the applications set it: the backward
    stages run each block's forward again (recomputing gradient graphs) and train as the
    unsplit model."""
    import popart  # noqa: PLC0415

    model = Skip("with")
    opts = poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(10)
    opts.setExecutionStrategy(
        poptorch.PipelinedExecution(*[poptorch.Stage(n).ipu(i) for n, i in Skip.IPUS])
    )
    opts._Popart.set("autoRecomputation", int(popart.RecomputationType.Pipeline))
    executor = poptorch.trainingModel(model, opts, optim.SGD(lr=0.05, momentum=0.9))
    x, t = _data(2 * 10 * B)
    executor(x, t)
    executor(x[::-1].copy(), t[::-1].copy())
    plain, _ = _train(Skip("none"), ga=10)
    _same_weights(executor, plain)
    names = (
        [g.name for g in executor._built.ir._graphs.values()] if hasattr(executor, "_built") else []
    )
    assert any("recomp" in n for n in names), names
