"""``trainingModel`` / ``inferenceModel`` and the ``PoplarExecutor`` they return.

The executor builds the program (``_program.build``) on its first call, from the shapes of
the combined batch it is given, runs it through a ``popxl.Session``, and converts between
PopTorch's host layout (one combined batch per input, results concatenated along the batch
axis) and the session's stream layout.

Weights are shared between every executor of the same module, as PopTorch shares them
through the wrapped ``torch.nn.Module``: a host copy (``state_dict()``) is the meeting
point, and weights are copied from a training executor's device to the host only when
another executor or the user needs them.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

import popxl
import popxl_addons as addons
from popxl._printing import format_schedule
from popxl.errors import InternalError

from .._names import torch_name
from ..compat.popart_ir import log_lowered, popart_ir_json
from ..enums import CommGroupType, ConnectionType, VariableRetrievalMode
from ..errors import Error
from ..optim.link import (
    attach,
    device_state,
    hyper_writes,
    link_of,
    load_into,
    read_before_detach,
    read_state,
    write_loaded,
)
from ..optim.optimizers import OPTIMIZERS, Optimizer
from ..options.core import Options, batches_per_call
from . import progress as _progress
from .export import export_step, import_step
from .hooks import compiling
from .layout import Built, check_inference_accumulation
from .program import build

if TYPE_CHECKING:
    import torch

BATCH_MSG = (
    "Invalid batch dimension: in input {i}, the batch dimension ({n}) must be a multiple of "
    "deviceIterations({di}) * replicationFactor({r}) / inputReplicaGrouping size({k}) * "
    "gradientAccumulation({ga}) = {total}."
)
CHANGED_MSG = (
    "The model was compiled for inputs {old} (micro-batch shapes and dtypes); this call "
    "gives {new}. A compiled model has fixed shapes: keep the batch size constant or build "
    "a new model."
)
NOT_COMPILED_MSG = "{what}: the model has not been compiled yet; call it (or compile) first."
INFERENCE_OPTIMIZER_MSG = "setOptimizer only applies to a trainingModel."
NEVER_MSG = (
    "Trying to run a model on an offline device (ConnectionType.Never): use "
    "model.compile(inputs) instead of model(inputs); it can be compiled and exported, but "
    "not run."
)


class OfflineDeviceError(Error, AssertionError):
    """A model made for an offline device (``ConnectionType.Never``) was run. PopTorch
    asserted it: an ``AssertionError``, and a ``poptorch.Error`` here."""

    def __init__(self) -> None:
        super().__init__(NEVER_MSG, "poptorch")


DETACHED_MSG = "The model is detached from its device; call attachToDevice() before running it."
STRICT_MSG = "load_state_dict: missing keys {missing}, unexpected keys {unexpected}."
OPTIMIZER_TYPE_MSG = "trainingModel needs a poptorch.optim.optimizers optimizer (SGD, Adam, AdamW, RMSprop, LAMB), got {got}."
GROUPING_MSG = "replicaGrouping must be called before the model is compiled."


class _WeightStore:
    """The host copy of a module's weights, shared by its executors."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] | None = None
        self.version = 0
        self.owner: weakref.ReferenceType[PoplarExecutor] | None = None

    def pull(self) -> None:
        """Bring the host copy up to date with the executor that changed it last."""
        owner = self.owner() if self.owner is not None else None
        if owner is not None:
            owner.copyWeightsToHost()
        self.owner = None


_STORES: weakref.WeakKeyDictionary[Any, _WeightStore] = weakref.WeakKeyDictionary()


def _store_of(module: Any) -> _WeightStore:
    if module not in _STORES:
        _STORES[module] = _WeightStore()
    return _STORES[module]


class _Keys(NamedTuple):
    missing_keys: list[str]
    unexpected_keys: list[str]


@dataclass
class _Timing:
    host_to_device: list[float] = field(default_factory=list)
    compute: list[float] = field(default_factory=list)
    device_to_host: list[float] = field(default_factory=list)
    # The last call's start (seconds since the epoch) and its streams' transfer counts.
    start: float = 0.0
    inputs: int = 0
    outputs: int = 0
    input_steps: int = 0
    output_steps: int = 0


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "numpy"):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype == np.float64:
        arr = arr.astype(np.float32)
    elif arr.dtype == np.int64:
        arr = arr.astype(np.int32)
    return arr


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


class PoplarExecutor:
    """A compiled model: call it with combined batches, read and write its weights.

    Not created directly: use ``trainingModel`` or ``inferenceModel``.
    """

    def __init__(
        self,
        model: addons.Module | torch.nn.Module,  # torch's for a TorchExecutor
        options: Options | None,
        training: bool,
        optimizer: Optimizer | None = None,
    ) -> None:
        if training and not isinstance(optimizer, OPTIMIZERS):
            raise TypeError(OPTIMIZER_TYPE_MSG.format(got=type(optimizer).__name__))
        if not training and options is not None:
            check_inference_accumulation(options)
        self._model = model
        self._options = (options or Options())._for_model(training)
        self.training = training
        self._optimizer = optimizer
        self._store = _store_of(model)
        self._built: Built | None = None
        self._session: popxl.Session | None = None
        self._specs: tuple[tuple[tuple[int, ...], str], ...] | None = None
        self._uploaded = -1
        self._groupings: dict[str, tuple[CommGroupType, int, VariableRetrievalMode]] = {}
        self._timing = _Timing()
        # Seconds from the first compile request to a compiled program (compilationTime).
        self._compile_started: float | None = None
        self._compile_seconds: float | None = None
        self._progress: _progress.CompileProgress | None = None  # until the first run ends
        # Seconds each stage of the first call took (capture, building, compiling, first run).
        self._first_call_seconds: dict[str, float] = {}
        if optimizer is not None:
            attach(self, optimizer)

    # ---- properties ---------------------------------------------------------------------

    @property
    def model(self) -> addons.Module | torch.nn.Module:
        """The wrapped module."""
        return self._model

    @property
    def options(self) -> Options:
        return self._options

    @property
    def ir(self) -> popxl.Ir:
        """The program this executor built (an ordinary ``popxl.Ir``)."""
        return self._require_built("ir").ir

    def _require_built(self, what: str) -> Built:
        if self._built is None:
            raise Error(NOT_COMPILED_MSG.format(what=what), "poptorch")
        return self._built

    def _require_compiled(self, what: str) -> tuple[Built, popxl.Session]:
        """The built program and its session; an error naming ``what`` if either is missing
        (not compiled yet, destroyed, or a compilation that failed part way)."""
        built, session = self._built, self._session
        if built is None or session is None:
            raise Error(NOT_COMPILED_MSG.format(what=what), "poptorch")
        return built, session

    # ---- compilation --------------------------------------------------------------------

    def _micro_specs(self, arrays: list[np.ndarray]) -> list[popxl.TensorSpec]:
        o = self._options
        di, r, k = o.device_iterations, o.replication_factor, o.input_group_size
        ga = o.training.gradient_accumulation if self.training else 1
        per_call = batches_per_call(o, self.training)
        specs = []
        for i, a in enumerate(arrays):
            dtype = popxl.dtypes.dtype.as_dtype(a.dtype)
            if a.ndim == 0 and per_call == 1:  # a scalar input: nothing to split
                specs.append(popxl.TensorSpec((), dtype))
                continue
            n = a.shape[0] if a.ndim else 0
            if a.ndim == 0 or n % per_call:
                raise ValueError(BATCH_MSG.format(i=i, n=n, di=di, r=r, k=k, ga=ga, total=per_call))
            specs.append(popxl.TensorSpec((n // per_call, *a.shape[1:]), dtype))
        return specs

    def compile(self, *args: Any) -> None:
        """Build and compile the program for inputs like ``args`` (if not done yet)."""
        self._compile_arrays([_to_numpy(a) for a in args], self._model)

    def _compile_arrays(self, arrays: list[np.ndarray], module: Any) -> None:
        """Build ``module``'s program for the combined batches ``arrays`` (if not built)."""
        specs = self._micro_specs(arrays)
        key = tuple((s.shape, s.dtype.name) for s in specs)
        if self._built is not None:
            if key != self._specs:
                raise ValueError(CHANGED_MSG.format(old=self._specs, new=key))
            return
        if self._compile_started is None:
            self._compile_started = time.perf_counter()
        groupings = {n: (g[0], g[1]) for n, g in self._groupings.items()}
        progress = self._compile_progress()
        with compiling():
            with progress.stage("building the program"):
                self._built = build(module, self._options, specs, self._optimizer, groupings)
            self._specs = key
            log_lowered(self._built.ir)
            device = "ipu_model" if self._options.use_ipu_model else "ipu_hw"
            with progress.stage("compiling"):
                self._session = popxl.Session(self._built.ir, device)
        self._adopt_weights()
        if self._optimizer is not None and self._optimizer._pending_state:
            self._load_optimizer_state(self._optimizer._pending_state)
            self._optimizer._pending_state = None
        if self._options.connection_type == ConnectionType.Always:
            self.attachToDevice()
        self._compile_seconds = time.perf_counter() - self._compile_started

    # The first call's stages this executor shows (a torch model's begin with its capture).
    _progress_stages: tuple[str, ...] = _progress.STAGES[1:]

    def _compile_progress(self) -> _progress.CompileProgress:
        """The first call's progress bar (``poptorch.execution.progress``), made on first use."""
        if self._progress is None:
            self._progress = _progress.for_options(self._options, self._progress_stages)
        return self._progress

    def compilationTime(self) -> datetime.timedelta:  # noqa: N802 (PopTorch's name)
        """How long compiling took, from the first call (capture included) to a compiled
        program; recorded with ``Options.showCompilationProgressBar``, as in PopTorch."""
        if self._compile_seconds is None:
            raise Error(COMPILE_FIRST_MSG, "poptorch_py_error")
        if not self._options.show_compilation_progress_bar:
            raise Error(PROGRESS_BAR_MSG, "poptorch_py_error")
        return datetime.timedelta(seconds=self._compile_seconds)

    def isCompiled(self) -> bool:  # noqa: N802
        """Whether the program is built and compiled (and not destroyed)."""
        return self._session is not None

    def _adopt_weights(self) -> None:
        """First executor of a module: its initial weights become the host copy; later
        ones upload the host copy before their first run."""
        store = self._store
        if store.arrays is None:
            built, session = self._require_compiled("the first run")
            data = session.get_tensors_data(list(built.weights.values()))
            store.arrays = {n: np.array(data[v]) for n, v in built.weights.items()}
            store.version += 1
            self._uploaded = store.version
        else:
            store.pull()
            self.copyWeightsToDevice()

    # ---- running ------------------------------------------------------------------------

    def __call__(self, *args: Any) -> Any:
        """Run ``deviceIterations`` iterations on the combined batch(es) ``args``.

        Returns the outputs of the module's ``build`` (the loss included for training) in
        PopTorch's layout: results of the returned micro-batches and replicas concatenated
        along the batch axis (stacked for scalars); a single result keeps its shape.
        """
        arrays = [_to_numpy(a) for a in args]
        self.compile(*arrays)
        outs = self._run_arrays(arrays)
        if self.training:
            self._store.owner = weakref.ref(self)
        if any(_is_torch(a) for a in args):
            import torch  # noqa: PLC0415 (only when the caller uses torch)

            tensors = [torch.from_numpy(np.ascontiguousarray(o)) for o in outs]
            return tensors[0] if len(tensors) == 1 else tuple(tensors)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _run_arrays(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        if self._options.popart.options.get("instrumentWithHardwareCycleCounter"):
            raise Error(CYCLE_COUNT_MSG, "poptorch_cpp_error")
        """One host call of the compiled program on combined batches; the outputs in
        PopTorch's host layout."""
        start = time.perf_counter()
        built, session = self._require_compiled("run")
        if self._options.connection_type == ConnectionType.Never:
            raise OfflineDeviceError()
        if not session.is_attached:
            if self._options.connection_type != ConnectionType.OnDemand:
                raise Error(DETACHED_MSG, "poptorch")
            self.attachToDevice()
        self._sync_weights()
        feeds = {s: self._stream_layout(a) for s, a in zip(built.inputs, arrays)}
        loaded = time.perf_counter()
        progress, self._progress = self._progress, None
        with progress.stage("first run") if progress else contextlib.nullcontext():
            results = _run(session, feeds)
        if progress is not None:
            progress.close()
            self._first_call_seconds = dict(progress.seconds)
        ran = time.perf_counter()
        outs = [self._host_layout(results[s], s) for s in built.outputs]
        done = time.perf_counter()
        if self._options.synthetic_data:  # nothing was transferred, nothing is timed
            self._timing = _Timing()
        else:
            self._record(loaded - start, ran - loaded, done - ran)
            self._timing.start = time.time() - (done - start)
            r = self._options.replication_factor
            self._timing.input_steps = built.ir.num_host_transfers * r
            batched = built.outputs and built.outputs[0].shape != built.output_specs[0].shape
            rows = built.outputs[0].shape[:1] if batched else (1,)
            self._timing.output_steps = built.stores_per_call * rows[0] * r
        self._timing.inputs, self._timing.outputs = len(built.inputs), len(built.outputs)
        return outs

    def _stream_layout(self, arr: np.ndarray) -> np.ndarray:
        """Combined batch -> ``(host transfers, replicas, micro-batch...)``."""
        o, built = self._options, self._require_built("run")
        nht, r, k = built.ir.num_host_transfers, o.replication_factor, o.input_group_size
        if arr.ndim == 0:
            return arr
        slices = r // k
        x = arr.reshape(nht, slices, -1, *arr.shape[1:])
        if k > 1:
            replica = np.arange(r)
            index = (
                replica // k
                if o.input_group_type == CommGroupType.Consecutive
                else replica % slices
            )
            x = x[:, index]
        if r == 1:
            x = x[:, 0]
        return x if nht > 1 else x[0]

    def _host_layout(self, value: np.ndarray, stream: popxl.DeviceToHostStream) -> np.ndarray:
        built = self._require_built("run")
        nht, r = built.ir.num_host_transfers, self._options.replication_factor
        x = np.asarray(value)
        if nht == 1:
            x = x[None]
        if r == 1:
            x = x[:, None]
        index = built.outputs.index(stream)
        if index < built.forward_interface().n_outputs:  # a written-back input: every store
            x = x[: built.stores_per_call]
        shape = built.output_specs[index].shape
        if len(stream.shape) > len(shape):  # several micro-batches per store (EveryN)
            x = x.swapaxes(1, 2)  # (stores, micro-batches, replicas, ...) as All orders them
            x = x.reshape(-1, *x.shape[2:])
        if x.shape[0] * x.shape[1] == 1:
            return x[0, 0, ...]  # a view: the runtime handed over a fresh array
        if shape == ():
            return x.reshape(-1)
        return x.reshape(-1, *shape[1:])

    def _record(self, h2d: float, compute: float, d2h: float) -> None:
        n = self._options.device_iterations
        self._timing = _Timing([h2d / n] * n, [compute / n] * n, [d2h / n] * n)

    def getPerfCounters(self) -> dict[str, list[list[float]]]:  # noqa: N802
        """Timestamps (seconds since the epoch) of the last call's transfers: ``input`` /
        ``input_complete`` per input stream and step, ``output`` / ``output_complete`` per
        output stream and step. A call moves all its steps in one transfer each way, so the
        steps' timestamps divide each phase evenly (as the latencies do). With synthetic
        data nothing is transferred: every stream's list is empty."""
        self._require_session("getPerfCounters")
        t = self._timing
        h2d, compute, d2h = sum(t.host_to_device), sum(t.compute), sum(t.device_to_host)
        n_in, n_out = t.input_steps, t.output_steps
        ins = [t.start + h2d * i / n_in for i in range(n_in)]
        outs = [t.start + h2d + compute * (i + 1) / n_out for i in range(n_out)]
        return {
            "input": [list(ins) for _ in range(t.inputs)],
            "input_complete": [[x + h2d / n_in for x in ins] for _ in range(t.inputs)],
            "output": [list(outs) for _ in range(t.outputs)],
            "output_complete": [[x + d2h for x in outs] for _ in range(t.outputs)],
        }

    @staticmethod
    def _stats(values: list[float]) -> tuple[float, float, float]:
        if not values:
            return (0.0, 0.0, 0.0)
        lo, hi = min(values), max(values)
        return (lo, hi, min(max(sum(values) / len(values), lo), hi))

    def getLatency(self) -> tuple[float, float, float]:  # noqa: N802
        """(min, max, mean) seconds per device iteration of the last call, host to host.

        One call is timed as a whole, so each iteration is its share of the call.
        """
        t = self._timing
        return self._stats(
            [a + b + c for a, b, c in zip(t.host_to_device, t.compute, t.device_to_host)]
        )

    def getHostIpuLatency(self) -> tuple[float, float, float]:  # noqa: N802
        """Per-iteration share of the time spent preparing inputs."""
        return self._stats(self._timing.host_to_device)

    def getComputeLatency(self) -> tuple[float, float, float]:  # noqa: N802
        """Per-iteration share of the time the compiled program ran."""
        return self._stats(self._timing.compute)

    def getIpuHostLatency(self) -> tuple[float, float, float]:  # noqa: N802
        """Per-iteration share of the time spent arranging outputs."""
        return self._stats(self._timing.device_to_host)

    # ---- device -------------------------------------------------------------------------

    def attachToDevice(self) -> None:  # noqa: N802
        """Attach (upload the weights). The model must be compiled and detached."""
        session = self._require_session("attachToDevice")
        if session.is_attached:
            raise Error("attachToDevice: the model is already attached.", "poptorch")
        session.__enter__()

    def detachFromDevice(self) -> None:  # noqa: N802
        """Detach; the device's weights are kept in the session's host copy, and a
        ``poptorch.optim`` optimiser reads its state first (as PopTorch did)."""
        session = self._require_session("detachFromDevice")
        if not session.is_attached:
            raise Error("detachFromDevice: the model is not attached.", "poptorch")
        if self.training and self._optimizer is not None:
            read_before_detach(self)
        session.__exit__(None, None, None)

    def isAttachedToDevice(self) -> bool:  # noqa: N802
        return self._session is not None and self._session.is_attached

    def _require_session(self, what: str) -> popxl.Session:
        if self._session is None:
            raise Error(NOT_COMPILED_MSG.format(what=what), "poptorch")
        return self._session

    def _owner_is_me(self) -> bool:
        owner = self._store.owner
        return owner is not None and owner() is self

    def destroy(self) -> None:
        """Release the device and the program (weights are copied to the host first)."""
        if self._session is None:
            return
        if self._owner_is_me():
            self.copyWeightsToHost()
        if self._session.is_attached:
            self._session.__exit__(None, None, None)
        self._session, self._built, self._specs = None, None, None

    # ---- weights ------------------------------------------------------------------------

    def _sync_weights(self) -> None:
        store = self._store
        if not self._owner_is_me():
            store.pull()
            if self._uploaded != store.version:
                self.copyWeightsToDevice()

    def copyWeightsToDevice(self) -> None:  # noqa: N802
        """Write the host copy of the weights to this model's device."""
        built, session = self._require_compiled("copyWeightsToDevice")
        arrays = self._store.arrays
        if arrays is None:
            raise InternalError("the host copy of the weights is made when the model compiles")
        session.write_variables_data({v: arrays[n] for n, v in built.weights.items()})
        self._uploaded = self._store.version

    def copyWeightsToHost(self) -> None:  # noqa: N802
        """Update the host copy of the weights from this model's device."""
        built, session = self._require_compiled("copyWeightsToHost")
        data = session.get_tensors_data(list(built.weights.values()))
        self._store.arrays = {n: np.array(data[v]) for n, v in built.weights.items()}
        self._store.version += 1
        self._store.owner = None
        self._uploaded = self._store.version

    def copyWeightsToHostIfNeeded(self) -> bool:  # noqa: N802
        """Copy the weights to the host if this model changed them; whether it did."""
        if not self._owner_is_me():
            return False
        self.copyWeightsToHost()
        return True

    def state_dict(self) -> dict[str, np.ndarray]:
        """The weights by name (``"fc1.weight"``...), copied from the device if needed."""
        self._store.pull()
        if self._store.arrays is None:
            raise Error(NOT_COMPILED_MSG.format(what="state_dict"), "poptorch")
        return {n: self._retrieved(n, a.copy()) for n, a in self._store.arrays.items()}

    def _retrieved(self, name: str, value: np.ndarray) -> np.ndarray:
        grouping = self._groupings.get(name)
        if grouping is None or grouping[2] == VariableRetrievalMode.OnePerGroup:
            return value
        built = self._require_built("state_dict")
        group = built.weights[name].replica_grouping
        return value[np.asarray(group.assignment)]

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> _Keys:
        """Replace weights by name; they reach the device before the next run."""
        self._store.pull()
        current = self._store.arrays
        if current is None:
            raise Error(NOT_COMPILED_MSG.format(what="load_state_dict"), "poptorch")
        missing = sorted(set(current) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(current))
        if strict and (missing or unexpected):
            raise KeyError(STRICT_MSG.format(missing=missing, unexpected=unexpected))
        for name in set(current) & set(state_dict):
            value = _to_numpy(state_dict[name]).astype(current[name].dtype)
            if value.shape != current[name].shape:
                raise ValueError(
                    f"load_state_dict: {name!r} has shape {value.shape}, the model's weight "
                    f"has shape {current[name].shape}."
                )
            current[name] = value
        self._store.version += 1
        if self.isAttachedToDevice():
            self.copyWeightsToDevice()
        return _Keys(missing, unexpected)

    def replicaGrouping(  # noqa: N802
        self,
        name: str,
        comm_group_type: CommGroupType,
        shards: int,
        variable_retrieval_mode: VariableRetrievalMode = VariableRetrievalMode.OnePerGroup,
    ) -> None:
        """Give weight ``name`` one value per group of ``shards`` replicas arranged as
        ``comm_group_type``; its initial value and ``state_dict`` entry then have a leading
        axis of one value per group (or per replica with ``AllReplicas``)."""
        if self._built is not None:
            raise Error(GROUPING_MSG, "poptorch")
        self._groupings[name] = (
            CommGroupType(comm_group_type),
            shards,
            VariableRetrievalMode(variable_retrieval_mode),
        )

    # ---- optimiser ----------------------------------------------------------------------

    def setOptimizer(self, optimizer: Any) -> None:  # noqa: N802
        """Use ``optimizer``'s hyper-parameters from the next call, without recompiling
        (only those that changed are sent to the device). A new ``poptorch.optim``
        optimiser continues from the device's optimiser state, unless it holds a state of
        its own (``load_state_dict``), which is written to the device.

        Raises:
            ValueError: a different optimiser type or group count, or a change of an
                attribute compiled as a constant.
        """
        if not self.training:
            raise Error(INFERENCE_OPTIMIZER_MSG, "poptorch")
        link_of(self).set_optimizer(optimizer)

    def _write_hyper(self, built: Built, optimizer: Any) -> None:
        """Write ``optimizer``'s hyper-parameters to the program's variables (an error if
        it changes one the program holds as a constant)."""
        spec = link_of(self).convert(optimizer)
        _, session = self._require_compiled("setOptimizer")
        session.write_variables_data(hyper_writes(built, spec))

    def _optimizer_state(self) -> dict[str, Any]:
        """The optimiser state on the device: ``ipu_state``/``ipu_param`` and the previous
        layout (``{"state": {weight: {slot: array}}, "step": n, ...}``)."""
        if self._built is None or self._session is None:
            return {}
        ipu, legacy = device_state(self)
        return {**legacy, **ipu}

    def _read_optimizer_state(self, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """``optimizer.state_dict()``'s device part and previous layout: read from the device
        if this executor uses ``optimizer`` and the device changed it, else as held."""
        return read_state(optimizer)

    def _write_loaded_optimizer_state(self, optimizer: Any) -> None:
        """``optimizer.load_state_dict()``: the state it holds is written to the device
        now if this compiled executor uses it."""
        write_loaded(optimizer)

    def _load_optimizer_state(self, state_dict: Mapping[str, Any]) -> None:
        """Write an optimiser ``state_dict()`` to the device."""
        load_into(self, state_dict)

    # ---- files --------------------------------------------------------------------------

    def _checkpoint(self, export_model: bool) -> dict[str, Any]:
        return {
            "format": "poptorch/1",
            "training": self.training,
            "options": self._options.model_dump_json(),
            "specs": self._specs,
            "weights": self.state_dict() if self._store.arrays is not None else None,
            "optimizer": self._optimizer.state_dict() if self._optimizer is not None else None,
            "model": self._model if export_model else None,
            "optimizer_object": self._optimizer if export_model else None,
        }

    def save(self, filename: str, export_model: bool = True, save_rng_state: bool = True) -> None:
        """Checkpoint: options, input shapes, weights, optimiser state (and the module and
        optimiser objects with ``export_model``) in one file ``poptorch.load`` reads."""
        with open(filename, "wb") as f:
            pickle.dump(self._checkpoint(export_model), f)

    def compileAndExport(self, filename: str, *args: Any, export_model: bool = True) -> None:  # noqa: N802
        """Compile for ``args`` and save the checkpoint plus the compiled executable
        (serialised by JAX); ``loadExecutable`` or ``poptorch.load`` restore it without
        compiling the step again."""
        self.compile(*args)
        if os.path.isdir(filename):  # PopTorch wrote one file into a directory it was given
            filename = os.path.join(filename, f"{self._options.model_name or 'model'}.poptorch")
        data = self._checkpoint(export_model)
        data["executable"] = export_step(self._require_session("compileAndExport"))
        with open(filename, "wb") as f:
            pickle.dump(data, f)

    def loadExecutable(self, filename: str) -> None:  # noqa: N802
        """Run the step exported by ``compileAndExport`` instead of compiling one."""
        with open(filename, "rb") as f:
            data = pickle.load(f)  # noqa: S301 (files this module wrote)
        if self._built is None:
            self._compile_from_checkpoint(data)
        import_step(self._require_session("loadExecutable"), data["executable"], filename)

    def _compile_from_checkpoint(self, data: dict[str, Any]) -> None:
        self._compile_from_specs(data["specs"])

    def _compile_from_specs(self, specs: Any) -> None:
        per_call = batches_per_call(self._options, self.training)
        dummies = [
            np.zeros(
                (shape[0] * per_call, *shape[1:]), popxl.dtypes.dtype.from_name(dtype).as_numpy()
            )
            for shape, dtype in specs
        ]
        self.compile(*dummies)

    # ---- inspection ---------------------------------------------------------------------

    def print_schedule(self) -> str:
        """The program's main graph and every subgraph, as ``Graph.print_schedule`` text."""
        ir = self.ir
        graphs = [ir.main_graph, *[g for g in ir._graphs.values() if g is not ir.main_graph]]
        built_weights = self._require_built("print_schedule").weights
        weights: dict[popxl.Tensor, str] = {v: torch_name(k) for k, v in built_weights.items()}
        text = "\n".join(
            format_schedule(g, {**weights, **{t: t.name for t in g.inputs}}) for g in graphs
        )
        built = self._built
        return f"{built.description}\n{text}" if built is not None and built.description else text

    def memory_report(self) -> Any:
        """The compiled program's ``Session.memory_report()``: bytes of on-chip variables
        and of remote buffers (streaming memory) per IPU, and XLA's peak."""
        return self._require_session("memory_report").memory_report()

    def _debugGetPopartIR(self) -> str:  # noqa: N802 (PopTorch's name)
        """The step's ops as PopART's serialized IR (JSON with one ``"maingraph"`` list of
        ``{type, name, attributes, inputs, outputs}`` records): see ``poptorch.compat.popart_ir``."""
        self._require_built("_debugGetPopartIR")
        return popart_ir_json(self.ir)

    def getAnchoredTensor(self, short_name: str) -> Any:  # noqa: N802 (PopTorch's name)
        """The tensor ``Options.anchorTensor`` named ``short_name``, as the last run left it
        (its output mode applied: the last value, every value, their sum, or every N-th)."""
        anchors = self._require_built("getAnchoredTensor").anchors
        held = anchors.variables() if anchors is not None else {}
        if anchors is None or short_name not in held:
            raise Error(
                f"No anchored tensor named {short_name!r}: anchor it with "
                f"options.anchorTensor({short_name!r}, long_name) (anchored: "
                f"{sorted(held)}).",
                "poptorch_py_error",
            )
        session = self._require_session("getAnchoredTensor")
        var = held[short_name]
        data = np.asarray(session.get_tensors_data([var])[var])
        return self._host_array(anchors.value(short_name, data))

    def _host_array(self, data: np.ndarray) -> Any:
        """An array as this front end returns host data (numpy; torch tensors for torch
        models)."""
        return data

    def getTensorNames(self) -> list[str]:  # noqa: N802
        """Every tensor name of the program, and the PopART-style names ``anchorTensor``
        accepts (``Gradient___<weight>``, ``UpdatedVar___<weight>``, ``finalLossScale``).
        Before the model is compiled, an ``AssertionError`` as in PopTorch."""
        if self._built is None:
            raise NotCompiledError(TENSOR_NAMES_MSG, "poptorch")
        ir = self.ir
        names = [t.name for g in ir._graphs.values() for t in g.tensors]
        built = self._built
        if built is not None and built.anchors is not None:
            known = set(names)
            names += [n for n in built.anchors.available if n not in known]
        return names


TENSOR_NAMES_MSG = "Model must be compiled before calling getTensorNames"


class NotCompiledError(Error, AssertionError):
    """A query that needs the compiled program, made before compiling: also an
    ``AssertionError``, which PopTorch raised for it."""


COMPILE_FIRST_MSG = "Please compile the model before obtaining compilation time."
PROGRESS_BAR_MSG = "Please set showCompilationProgressBar option to obtain compilation time."
CYCLE_COUNT_MSG = (
    "Cycle count logging is only supported on actual IPU hardware. This program runs through "
    "JAX: use getLatency() / getComputeLatency() for its timings instead."
)

RUN_FAILED_MSG = (
    "The device failed while running the model: {error}. The model's weights and optimiser "
    "state are as they were before this call."
)


def _run(session: popxl.Session, feeds: dict) -> dict:
    """``session.run``, with failures of the compiled program raised as ``poptorch.Error``
    (the session keeps its state when a run fails)."""
    import jax  # noqa: PLC0415 (the runtime is loaded by now)

    try:
        return session.run(feeds)
    except jax.errors.JaxRuntimeError as error:
        message = RUN_FAILED_MSG.format(error=error)
        raise Error(message, "runtime", "PoplarExecutor.__call__") from error
