"""poptorch.Options: setters, validation, files, session options, strategies."""

import numpy as np
import pytest

import popxl
import poptorch
from poptorch.options import distributed_env


def test_setters_chain_and_store_values():
    opts = poptorch.Options().deviceIterations(10).replicationFactor(2).randomSeed(5)
    opts.Training.gradientAccumulation(4)
    opts.Precision.setPartialsType(np.float16).enableStochasticRounding(True)
    assert (opts.device_iterations, opts.replication_factor, opts.random_seed) == (10, 2, 5)
    assert opts.training.gradient_accumulation == 4
    assert opts.precision.partials_type == "half" and opts.precision.stochastic_rounding


def test_clone_is_independent_and_json_round_trips():
    opts = poptorch.Options().deviceIterations(3)
    opts.setExecutionStrategy(
        poptorch.SerialPhasedExecution(poptorch.Phase(poptorch.Stage("A"), poptorch.Stage("B")))
    )
    copy = opts.clone().deviceIterations(7)
    assert opts.device_iterations == 3 and copy.device_iterations == 7
    restored = poptorch.Options.model_validate_json(opts.model_dump_json())
    assert restored.device_iterations == 3
    assert restored.model_dump()["strategy"]["phases"][0]["stages"][1]["blocks"] == ["B"]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda o: o.deviceIterations(0), "deviceIterations must be a positive integer, got 0"),
        (lambda o: o.replicationFactor(1.5), "replicationFactor must be a positive integer"),
        (lambda o: o.Training.gradientAccumulation(-1), "gradientAccumulation must be a pos"),
        (lambda o: o.outputMode(poptorch.OutputMode.EveryN), "EveryN needs output_return_period"),
        (lambda o: o.outputMode(poptorch.OutputMode.All, 2), "only used with OutputMode.EveryN"),
        (
            lambda o: o.inputReplicaGrouping(2, poptorch.CommGroupType.All),
            "cannot use CommGroupType.All",
        ),
        (lambda o: o.Precision.setPartialsType("int8"), "setPartialsType accepts float32"),
        (lambda o: o.setAvailableMemoryProportion({"IPU0": 1.5}), "values in \\(0, 1\\]"),
        (
            lambda o: o.Training.accumulationAndReplicationReductionType(
                poptorch.ReductionType.NoReduction
            ),
            "must be ReductionType.Mean or ReductionType.Sum",
        ),
    ],
)
def test_invalid_values_raise_teaching_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call(poptorch.Options())


def test_execution_strategy_must_be_a_strategy():
    with pytest.raises(TypeError, match="setExecutionStrategy expects a PipelinedExecution"):
        poptorch.Options().setExecutionStrategy("pipelined")


def test_load_from_file(tmp_path):
    """Listings 4.1/4.2: one setter call per line, without the 'options.' prefix."""
    path = tmp_path / "poptorch.conf"
    path.write_text(
        "deviceIterations(1)\n"
        "# a comment\n"
        "\n"
        "replicationFactor(2)\n"
        "Training.gradientAccumulation(4)\n"
        "outputMode(poptorch.OutputMode.EveryN, 2)\n"
        "enableExecutableCaching('/tmp/cache')\n"
    )
    opts = poptorch.Options()
    assert opts.loadFromFile(str(path)) is opts
    assert opts.replication_factor == 2 and opts.training.gradient_accumulation == 4
    assert opts.output_mode == poptorch.OutputMode.EveryN and opts.output_return_period == 2
    assert opts.executable_cache_dir == "/tmp/cache"


@pytest.mark.parametrize(
    "line, message",
    [
        ("deviceIterations = 3", "is not an option call"),
        ("frobnicate(3)", "Options has no setter 'frobnicate'"),
        ("deviceIterations(os.getpid())", "is not an option call|Unknown name|malformed"),
    ],
)
def test_load_from_file_rejects_bad_lines(tmp_path, line, message):
    path = tmp_path / "bad.conf"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message):
        poptorch.Options().loadFromFile(str(path))


def test_session_options_receive_the_overlapping_values():
    opts = poptorch.Options().replicationFactor(2).logDir("/tmp/logs")
    opts.enableExecutableCaching("/tmp/exe")
    opts.Training.gradientAccumulation(4)
    opts.Precision.enableStochasticRounding(True).setPartialsType("float")
    opts.TensorLocations.numIOTiles(32)
    so = popxl.Ir()._pb_ir.getSessionOptions()
    opts.apply_to_session_options(so, training=True)
    assert (so.replicatedGraphCount, so.enableReplicatedGraphs) == (2, True)
    assert (so.accumulationFactor, so.enableGradientAccumulation) == (4, True)
    assert so.enableStochasticRounding and so.partialsTypeMatMuls == "float"
    assert so.enableEngineCaching and so.cachePath == "/tmp/exe"
    assert so.logDir == "/tmp/logs" and so.numIOTiles == 32
    opts.apply_to_session_options(so, training=False)
    assert (so.accumulationFactor, so.enableGradientAccumulation) == (1, False)


def test_tensor_location_settings():
    """The API reference's TensorLocations example."""
    opts = poptorch.Options()
    opts.TensorLocations.setActivationLocation(
        poptorch.TensorLocationSettings().useOnChipStorage(False)
    )
    opts.TensorLocations.setWeightLocation(
        poptorch.TensorLocationSettings()
        .useReplicatedTensorSharding(True)
        .minElementsForReplicatedTensorSharding(1024)
        .useIOTilesToLoad()
    )
    assert opts.tensor_locations.activation.on_chip is False
    weight = opts.tensor_locations.weight
    assert weight.replicated_tensor_sharding and weight.min_elements_rts == 1024
    assert weight.io_tiles_to_load and not weight.io_tiles_to_store


def test_distributed_options_from_environment():
    assert distributed_env({}) == (0, 1)
    env = {"POPDIST_NUM_INSTANCES": "4", "POPDIST_INSTANCE_INDEX": "3"}
    assert distributed_env(env) == (3, 4)
    with pytest.raises(ValueError, match="Invalid process id 4"):
        distributed_env({"POPDIST_NUM_INSTANCES": "4", "POPDIST_INSTANCE_INDEX": "4"})


def test_distributed_configure_and_env_var_names(monkeypatch):
    """The API reference's Distributed example: configureProcessId(0, 2)."""
    opts = poptorch.Options()
    opts.Distributed.configureProcessId(0, 2)
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (0, 2)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "8")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "5")
    opts.Distributed.setEnvVarNames("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK")
    assert (opts.distributed.process_id, opts.distributed.num_processes) == (5, 8)
    assert opts.Distributed.disable().numProcesses == 1
    monkeypatch.setenv("POPDIST_NUM_INSTANCES", "2")
    monkeypatch.setenv("POPDIST_INSTANCE_INDEX", "1")
    assert poptorch.Options().distributed.process_id == 1


def test_phased_strategies():
    """Listings 4.10, 4.12, 4.13."""
    first = poptorch.Phase(poptorch.Stage("A").ipu(0))
    second = poptorch.Phase(poptorch.Stage("B", "C").ipu(1))
    assert first.stages[0].ipu_id == 0 and second.stages[0].blocks == ["B", "C"]
    serial = poptorch.SerialPhasedExecution(
        poptorch.Phase(poptorch.Stage("A"), poptorch.Stage("A2")),
        poptorch.Phase(poptorch.Stage("B"), poptorch.Stage("B2")),
        poptorch.Phase(poptorch.Stage("C"), poptorch.Stage("C2")),
    )
    for i in range(3):
        serial.phase(i).ipus(0, 1)
    assert [s.ipu_id for s in serial.phase(2).stages] == [0, 1]
    parallel = poptorch.ParallelPhasedExecution(
        poptorch.Phase(poptorch.Stage("0"), poptorch.Stage("1")),
        poptorch.Phase(poptorch.Stage("2"), poptorch.Stage("3")),
        poptorch.Phase(poptorch.Stage("4"), poptorch.Stage("5")),
    )
    parallel.phase(0).ipus(0, 2)
    parallel.phase(1).ipus(1, 3)
    parallel.phase(2).ipus(0, 2)
    with pytest.raises(ValueError, match="odd phases on odd IPUs, but phase 1 was given IPU 0"):
        parallel.phase(1).ipus(0, 3)
    with pytest.raises(ValueError, match="Phase with 2 stages was given 1 IPUs"):
        parallel.phase(0).ipus(0)
    with pytest.raises(IndexError, match="has 3 phases; phase 3 does not exist"):
        parallel.phase(3)
    opts = poptorch.Options().setExecutionStrategy(parallel)
    assert opts.strategy is parallel
    restored = poptorch.Options.model_validate_json(opts.model_dump_json()).strategy
    assert isinstance(restored, poptorch.ParallelPhasedExecution)
    with pytest.raises(ValueError, match="even phases on even IPUs"):
        restored.phase(2).ipus(1, 3)


def test_output_mode_examples():
    """API reference: outputMode(All) and outputMode(EveryN, 10)."""
    opts = poptorch.Options()
    assert opts.defaultOutputMode()
    opts.outputMode(poptorch.OutputMode.All)
    assert opts.output_mode == poptorch.OutputMode.All and not opts.defaultOutputMode()
    opts.outputMode(poptorch.OutputMode.EveryN, 10)
    assert opts.output_return_period == 10
