"""poptorch.Options: setters, validation, files, session options, strategies."""

import copy
import logging

import numpy as np
import pytest

import poptorch
import popxl
from poptorch.options.base import OptionValueError
from poptorch.options.core import distributed_env

Settings = poptorch.TensorLocationSettings
MeanReduction = poptorch.MeanReductionStrategy


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
        (lambda o: o.outputMode(poptorch.OutputMode.EveryN, 0), "output_return_period must be"),
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


# ---- PopTorch's Options API as its own tests use it ----------------------------------------


def _popart_options():
    opts = poptorch.Options().outputMode(poptorch.OutputMode.All)
    opts._Popart.set("hardwareInstrumentations", {0, 1})
    opts._Popart.set("dotChecks", ["FINAL"])
    opts._Popart.set("engineOptions", {"debug.allowOutOfMemory": "true"})
    opts._Popart.set("autoRecomputation", 1)
    opts._Popart.set("enableOutlining", True)
    opts._Popart.set("outlineThreshold", 0.5)
    opts._Popart.set("batchSerializationSettings.factor", 2)
    opts._Popart.setPatterns({"PadSum": True}, 0)
    return opts


def test_popart_options_are_checked_and_logged(caplog):
    """_validateOptions(toDict()) reads every value as PopTorch's backend did and logs it."""
    opts = _popart_options().enableSyntheticData(True)
    with caplog.at_level(logging.DEBUG, logger="poptorch::python"):
        poptorch.poptorch_core._validateOptions(opts.toDict())
    for line in (
        "poptorch.Options added 0 to hardwareInstrumentations",
        "poptorch.Options added FINAL to dotChecks",
        "poptorch.Options set engineOptions[debug.allowOutOfMemory] to true",
        "poptorch.Options set autoRecomputation to value 1",
        "poptorch.Options set enableOutlining to value true",
        "poptorch.Options set outlineThreshold to value 0.5",
        "poptorch.Options set syntheticDataMode to value 2",
        "poptorch.Options set device_iterations to value 1",
        "poptorch.Options set execution_mode to value 0",
    ):
        assert line in caplog.text


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("asdfasdf", True, "Unknown bool option asdfasdf"),
        ("enableOutlining", 1, "Unknown uint64 option enableOutlining"),
        ("cachePath", 3.5, "Unknown floating point option cachePath"),
        ("dotChecks", object(), "Unknown value type object for option dotChecks"),
        ("autoRecomputation", 5, "Value for RecomputationType out of range"),
        ("hardwareInstrumentations", [2], "Value for Instrumentation out of range"),
        ("batchSerializationSettings.factor", -1, "takes an unsigned integer"),
        ("frobOptions", {"a": "b"}, "Unknown map option frobOptions"),
        ("patterns", {"PadSum": True}, "without first setting 'patterns_level'"),
    ],
)
def test_invalid_popart_options_raise_poptorch_errors(key, value, message):
    opts = poptorch.Options().outputMode(poptorch.OutputMode.All)
    opts._Popart.set(key, value)
    with pytest.raises(poptorch.Error, match=message):
        poptorch.poptorch_core._validateOptions(opts.toDict())


def test_to_dict_is_the_backend_dictionary():
    opts = poptorch.Options().outputMode(poptorch.OutputMode.Sum).randomSeed(3)
    opts.setExecutionStrategy(poptorch.ShardedExecution())
    opts.TensorLocations.setWeightLocation(Settings().useOnChipStorage(False)).numIOTiles(32)
    opts.setAvailableMemoryProportion({"IPU1": 0.25})
    opts.Precision.setPartialsType(np.float32)
    opts.Training.setConvolutionDithering(True)
    d = opts.toDict()
    assert d["execution_mode"] == 1 and d["output_mode"] == int(poptorch.OutputMode.Sum)
    assert d["random_seed"] == 3 and d["available_memory_proportion"] == {1: 0.25}
    assert d["location_weight"] == {"onChip": 0} and d["numIOTiles"] == 32
    assert d["partialsTypeMatMuls"] == "float"
    assert d["convolutionOptions"] == {"partialsType": "float", "enableConvDithering": True}
    assert d["meanAccumulationAndReplicationReductionStrategy"] == 1
    with pytest.raises(AssertionError, match="An output mode must be picked"):
        poptorch.Options().toDict()
    opts._Popart.set("device_iterations", 2)
    with pytest.raises(ValueError, match="have some keys in common: \\['device_iterations'\\]"):
        opts.toDict()


def test_phased_strategies_in_the_backend_dictionary():
    strategy = poptorch.SerialPhasedExecution(poptorch.Phase(poptorch.Stage("A")))
    strategy.setTensorsLiveness(poptorch.Liveness.OffChipAfterFwd)
    d = poptorch.Options().setExecutionStrategy(strategy).outputMode(poptorch.OutputMode.All)
    backend = d.toDict()
    assert backend["execution_mode"] == 2 and backend["tensors_liveness"] == 1
    assert backend["serial_phases_execution"] is True
    assert d._execution_strategy is strategy


def test_building_a_model_checks_and_logs_the_options(caplog):
    opts = poptorch.Options().deviceIterations(2).enableSyntheticData(True)
    so = popxl.Ir()._pb_ir.getSessionOptions()
    with caplog.at_level(logging.DEBUG, logger="poptorch::python"):
        opts.apply_to_session_options(so, training=True)
    assert "poptorch.Options set device_iterations to value 2" in caplog.text
    assert "poptorch.Options set output_mode to value 0" in caplog.text  # Default -> Final
    opts._Popart.set("notAnOption", True)
    with pytest.raises(poptorch.Error, match="Unknown bool option notAnOption"):
        opts.apply_to_session_options(so, training=True)


def test_frozen_options_raise_on_any_change():
    opts = poptorch.Options().deviceIterations(2)
    opts._freeze()
    for change in (
        lambda: opts.randomSeed(1),
        lambda: opts.set(random_seed=42),
        lambda: opts.Training.gradientAccumulation(2),
        lambda: opts.Precision.enableStochasticRounding(True),
        lambda: opts._Popart.set("autoRecomputation", 1),
        lambda: opts.TensorLocations.numIOTiles(32),
        lambda: opts.Distributed.configureProcessId(0, 2),
        lambda: opts.anchorTensor("a", "b"),
        lambda: opts.checkIsFrozen(),
    ):
        with pytest.raises(AttributeError, match="Can't modify frozen Options"):
            change()
    for copied in (copy.deepcopy(opts), opts.clone()):
        copied.deviceIterations(5).Training.gradientAccumulation(4)
        copied._Popart.set("autoRecomputation", 3)
        copied.Precision.setPartialsType(np.float16)
        assert copied.precision.partials_type == "half" and opts.precision.partials_type == ""
    assert opts.device_iterations == 2


def test_a_model_keeps_a_frozen_copy_with_its_output_mode_resolved():
    opts = poptorch.Options()
    kept = opts._for_model(training=True)
    assert kept.output_mode == poptorch.OutputMode.Final and opts.defaultOutputMode()
    assert poptorch.Options()._for_model(False).output_mode == poptorch.OutputMode.All
    for frozen in (opts, kept):
        with pytest.raises(AttributeError, match="frozen"):
            frozen.deviceIterations(2)


class _HalfAccumulator:
    accum_type = "torch.float16"
    use_combined_accum = False


def test_mean_reduction_strategy_follows_the_optimizer():
    training = poptorch.Options().Training
    assert training.meanAccumulationAndReplicationReductionStrategy == MeanReduction.Post
    training._adopt_optimizer(object(), compiled=False)
    assert training.mean_reduction_strategy == MeanReduction.Post
    with pytest.raises(ValueError, match="already compiled"):
        training._adopt_optimizer(_HalfAccumulator(), compiled=True)
    training._adopt_optimizer(_HalfAccumulator(), compiled=False)
    assert training.mean_reduction_strategy == MeanReduction.Running


def test_default_options_from_the_environment(monkeypatch):
    monkeypatch.setenv(
        "POPTORCH_DEFAULT_OPTIONS",
        '{"deviceIterations": 2, "Precision.enableFloatingPointExceptions": true, '
        '"connectionType": "ConnectionType.OnDemand", "_Popart.set": ["autoRecomputation", 3]}',
    )
    monkeypatch.setenv("POPTORCH_CACHE_DIR", "/tmp/poptorch_cache")
    opts = poptorch.Options()
    assert opts.device_iterations == 2 and opts.precision.fp_exceptions
    assert opts.connection_type == poptorch.ConnectionType.OnDemand
    assert opts._Popart.options["autoRecomputation"] == 3
    assert opts.executable_cache_dir == "/tmp/poptorch_cache"
    expected = poptorch.Options.model_validate_json(opts.model_dump_json())
    assert f"{expected}" == f"{opts}" and str(opts).startswith("Options(")
    monkeypatch.setenv("POPTORCH_DEFAULT_OPTIONS", '{"frobnicate": 1}')
    with pytest.raises(ValueError, match="has no setter 'frobnicate'"):
        poptorch.Options()


def test_load_from_file_builds_option_objects_and_reports_syntax_errors(tmp_path):
    path = tmp_path / "tmp.conf"
    path.write_text(
        "setExecutionStrategy(poptorch.ShardedExecution())\n"
        "\n"
        "TensorLocations.setWeightLocation(poptorch.TensorLocationSettings()"
        ".useOnChipStorage(False))\n"
        "Precision.setPartialsType(torch.float16)  # a comment\n"
        "_Popart.set('autoRecomputation', 1)\n"
    )
    opts = poptorch.Options().loadFromFile(str(path))
    assert isinstance(opts.strategy, poptorch.ShardedExecution)
    assert opts.tensor_locations.weight.on_chip is False
    assert opts.precision.partials_type == "half"
    path.write_text("deviceIterations(3)\n# comment\nreplicationFactor(2\n")
    fresh = poptorch.Options()
    with pytest.raises(poptorch.options.ConfigFileError) as info:
        fresh.loadFromFile(str(path))
    assert (
        "SyntaxError at line 2 of tmp.conf: unexpected EOF while parsing\n"
        "> options.replicationFactor(2" in str(info.value)
    )
    assert fresh.device_iterations == 1  # nothing applied
    path.write_text("setExecutionStrategy(__import__('os').getcwd())\n")
    with pytest.raises(ValueError, match="Unknown name"):
        fresh.loadFromFile(str(path))


def test_upstream_attribute_names():
    opts = poptorch.Options()
    opts.Distributed.configureProcessId(5, 15)
    opts.anchorTensor("t1", "tensor1", poptorch.OutputMode.EveryN, 2)
    opts.anchorTensor("t2", "tensor2")
    opts.TensorLocations.setWeightLocation(Settings().useOnChipStorage(True))
    assert opts.Distributed.distributed_process_id == 5
    assert opts.Distributed.num_distributed_processes == 15
    assert opts.anchored_tensors["t1"].as_list() == ["tensor1", False, 1, 2]
    assert opts.anchored_tensors["t2"].as_list() == ["tensor2", True, None, 1]
    assert opts.TensorLocations.location_weight == {"onChip": 1}
    with pytest.raises(AttributeError, match="Invalid attribute location_optimizer"):
        _ = opts.TensorLocations.location_optimizer
    with pytest.raises(AttributeError, match="Invalid attribute asdf."):
        _ = opts.asdf
    assert opts.Training.accumulation_and_replication_reduction_type == poptorch.ReductionType.Mean
    opts.set(input_cgt=poptorch.CommGroupType.Orthogonal, device_iterations=3)
    assert opts.input_group_type == poptorch.CommGroupType.Orthogonal
    with pytest.raises(AttributeError, match="Invalid option nope"):
        opts.set(nope=1)
    with pytest.raises(AssertionError, match="Unexpected type"):
        opts.set(log_dir=3)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda o: o.TensorLocations.numIOTiles(33), "even number between 32 and 192"),
        (lambda o: o.TensorLocations.numIOTiles(194), "even number between 32 and 192"),
        (lambda o: o.Jit.traceModel(True), "traceModel\\(True\\) is no longer supported"),
        (lambda o: o.useOfflineIpuTarget(3), "ipu_version must be 1, 2 or 21"),
        (lambda o: o.randomSeed("1"), "randomSeed expects an integer"),
        (lambda o: o.randomSeed(2**64), "randomSeed expects an integer < 2\\*\\*64"),
        (lambda o: o.useIpuModel(1), "useIpuModel expects a bool"),
        (lambda o: o.logCycleCount("yes"), "logCycleCount expects a bool"),
        (lambda o: o.setAvailableMemoryProportion({"GPU0": 0.5}), "map IPU names"),
        (lambda o: o.outputMode("All"), "outputMode expects one of OutputMode.Final"),
        (lambda o: o.TensorLocations.setWeightLocation({"onChip": 0}), "TensorLocationSettings"),
        (lambda o: o.Precision.runningStatisticsAlwaysFloat(1), "needs to be set to a bool"),
    ],
)
def test_setters_check_their_arguments(call, message):
    with pytest.raises(AssertionError, match=message):  # also ValueErrors
        call(poptorch.Options())


def test_setters_without_effect_are_recorded():
    opts = poptorch.Options().useOfflineIpuTarget().maxRepeatLogs(None).broadcastBuffers(False)
    opts.enableProfiling("/tmp/p").enableStableNorm(True).logCycleCount(True)
    opts.updatableNamedBuffers(["b"]).disableModuleNamescope().useIpuId(1)
    opts.sourceLocationExcludes(["x"]).appendToLocationExcludes("y")
    opts.showCompilationProgressBar(False).relaxOptimizerAttributesChecks()
    opts.outputMode(poptorch.OutputMode.All, 5)  # the period only counts for EveryN
    assert opts.output_return_period == 1
    assert opts.connection_type == poptorch.ConnectionType.Never and opts.ipu_version == 2
    assert opts.max_repeat_logs == (1 << 64) - 1 and not opts.broadcast_buffers
    assert opts._Popart.options["engineOptions"]["autoReport.directory"] == "/tmp/p"
    assert opts._source_location_excludes == ["x", "y"]
    assert not opts._module_namescope_enabled and opts._relax_optimizer_checks
    assert not opts._show_compilation_progress_bar
    poptorch.poptorch_core._validateOptions(opts.toDict())


def test_input_replica_grouping_no_grouping_and_io_tiles_check():
    opts = poptorch.Options().replicationFactor(4)
    opts.inputReplicaGrouping(2, poptorch.CommGroupType.NoGrouping)
    assert (opts.input_group_size, opts.input_group_type) == (1, poptorch.CommGroupType.Consecutive)
    on_chip_io = Settings().useIOTilesToStore(True)  # on chip: no IO tiles are used
    opts.TensorLocations.setWeightLocation(on_chip_io).check_io_tiles()
    off_chip_io = Settings().useOnChipStorage(False).useIOTilesToLoad(True)
    with pytest.raises(ValueError, match="no IO tiles are reserved"):
        opts.TensorLocations.setWeightLocation(off_chip_io).check_io_tiles()


def test_partials_and_loss_scaling_live_in_the_popart_options():
    opts = poptorch.Options()
    opts._Popart.set("enableStochasticRounding", True)
    opts._Popart.set("automaticLossScalingSettings.enabled", True)
    assert opts.precision.stochastic_rounding and opts.training.automatic_loss_scaling
    opts.Precision.enableStochasticRounding(False)
    assert opts._Popart.options["enableStochasticRounding"] is False


def test_new_enums():
    assert poptorch.enums.VariableRetrievalMode.AllReplicas == 2
    assert poptorch.enums.HalfFloatCastingBehavior.Default == 2
    assert poptorch.enums.MatMulSerializationMode.Disabled.value == "none"
    assert poptorch.enums.OverlapMode("no_overlap") is poptorch.enums.OverlapMode.NoOverlap
    assert poptorch.enums.MultiConvPlanType.Serial == 1


def test_poparts_enumerations_set_options_as_applications_pass_them():
    # Graphcore's applications pass PopART's enums, as ints or members.
    import popart  # noqa: PLC0415

    opts = poptorch.Options().enableSyntheticData(int(popart.SyntheticDataMode.RandomNormal))
    assert opts._Popart.options["syntheticDataMode"] == popart.SyntheticDataMode.RandomNormal
    assert poptorch.Options().enableSyntheticData(0)._Popart.options["syntheticDataMode"] == 0
    opts._Popart.set("autoRecomputation", popart.RecomputationType.Standard)
    opts._Popart.set(
        "accumulateOuterFragmentSettings.schedule",
        int(popart.AccumulateOuterFragmentSchedule.OverlapMemoryOptimized),
    )
    assert opts._Popart.options["autoRecomputation"] == 1
    with pytest.raises(OptionValueError, match="enableSyntheticData"):
        poptorch.Options().enableSyntheticData("yes")
