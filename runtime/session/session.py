"""``popxl.Session``: runs an IR, keeping host and device copies of its variables.

Transfers follow PopXL exactly:

=============================  ========  ==================================================
call                           attached  effect
=============================  ========  ==================================================
``__enter__`` (was detached)   -         attach + weights_from_host
``__exit__`` (matching enter)  -         weights_to_host (if enabled, no exception) + detach
``run``                        required  device state advances; host copies become stale
``get_tensor(s)_data``         yes       weights_to_host first, only if stale
``get_tensor(s)_data``         no        host values, no transfer
``write_variable(s)_data``     yes       host update + upload of the written variables
``write_variable(s)_data``     no        host update only
=============================  ========  ==================================================

Deliberate difference: writing variables while attached uploads only the written variables,
so device values of other variables that are newer than their host copies are kept.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from popxl import _log
from popxl._dot import checkpoint
from popxl._float8_host import checked_structured, is_float8, to_ml, to_structured
from popxl._popart_compat import SessionCompat
from popxl.errors import InternalError
from popxl.ir import Ir
from popxl.streams import DeviceToHostStream, HostToDeviceStream
from popxl.tensor import Constant, Tensor, Variable
from popxl.utils import to_numpy

from ..backend import host_memory
from ..devices.device import (
    DeviceInfo,
    check_compatible,
    check_io_tiles,
    ipus_needed,
    select_device,
)
from ..devices.placement import ipu_mesh, ipus_used
from ..distributed import instances as distributed
from ..lowering import state_layout
from ..lowering.graphs import reachable_graphs
from . import executable_cache, remote_state, stream_io
from .program import (
    Program,
    abstract_inputs,
    abstract_state,
    build_program,
    compiled_step,
    enable_persistent_cache,
    replica_mesh,
    state_sharding,
)

DEVICE_TYPES = ("ipu_hw", "ipu_model", "cpu")
NOT_ATTACHED_MSG = (
    "Must be attached to device before calling a runtime function. Put the call inside a "
    "Session context, for example `with session: session.run()`."
)
NOT_VAR_OR_CONST_MSG = (
    "{t} is not of type Constant or Variable. get_tensor_data is not supported for this type."
)
NOT_VARIABLE_MSG = (
    "Tensor {tid} is not of type Variable. write_variable_data is not supported for this type."
)
WRITE_DTYPE_MSG = (
    "The data for variable {tid} has dtype {got}, but the variable is {want}. Convert it "
    "first, e.g. data.astype(np.{want})."
)
WRITE_FLOAT8_MSG = (
    "The data for variable {tid} has dtype {got}, but the variable is {want}: write float8 "
    "data, an array of dtype popxl.dtypes.np_dtype_{want} (convert float data with "
    "popxl.fp8_utils.host_pow2scale_cast_to_fp8) or of the matching ml_dtypes type."
)
WRITE_SHAPE_MSG = (
    "The shape of the input array {got} must match the shape of the tensor {tid} on the "
    "host, {want}."
)
NO_OPS_MSG = (
    "The Ir {ir} has no graphs. The graphs may have all been optimised to nothing, try adding "
    "more operations to your graphs."
)
_COMPILED: set[tuple[str, Any]] = set()


class Session(SessionCompat):
    """Compile an IR and run it.

    Args:
        ir: the program. The session takes ownership: its replication factor is fixed.
        device_desc: ``"cpu"``, ``"ipu_model"`` or ``"ipu_hw"``. All run through JAX on the
            default backend (a GPU when JAX has one); set ``JAX_PLATFORMS=cpu`` to pin the CPU.
            Or a device object (``popxl.utils._to_device_info``): the session runs on it, and
            if it is already attached, copies the weights to it at once.
        weights_to_host_on_exit: copy variables back to the host when the outermost
            ``with session:`` block ends.

    >>> import popxl, popxl.ops as ops
    >>> ir = popxl.Ir()
    >>> with ir.main_graph:
    ...     a = popxl.variable(3, name="a")
    ...     d2h = popxl.d2h_stream((), popxl.int32, "out")
    ...     ops.host_store(d2h, a + 1)
    >>> with popxl.Session(ir, "ipu_model") as session:
    ...     session.run()[d2h]
    array(4, dtype=int32)
    """

    def __init__(
        self, ir: Ir, device_desc: str | DeviceInfo = "cpu", weights_to_host_on_exit: bool = True
    ):
        given = device_desc if isinstance(device_desc, DeviceInfo) else None
        if given is not None:
            device_desc = given.type
        if not isinstance(device_desc, str) or device_desc not in DEVICE_TYPES:
            raise ValueError(
                f"Incorrect device type provided: {device_desc}, must be one of: "
                f"{', '.join(DEVICE_TYPES)}"
            )
        if not ir.main_graph._ops:
            raise RuntimeError(NO_OPS_MSG.format(ir=ir.id))
        host_memory.take_host_settings()  # before JAX makes its CPU client
        enable_persistent_cache()
        if distributed.is_multi_process(ir):
            distributed.initialize()
        self.ir_ = ir
        self.device_desc = device_desc
        self._device = select_device(device_desc)
        self.weights_to_host_on_exit = weights_to_host_on_exit and not _has_read_only_memmap(ir)
        ir._attach_session(self)
        _log.trace(f"Session::Session: Ir {ir.id} on a {device_desc} device", "session")
        self._program: Program = build_program(ir)
        _log_prepared(ir)
        self._sharding = state_sharding(self._program, self._device)
        self._batched = self._program.variable_batched()
        # Replicas whose stream data this process handles (all, unless instances share them).
        self._local_replicas = self._program.local_replicas
        self._placement: distributed.Placement | None = None
        if distributed.is_multi_process(ir):
            distributed.check_same_program(self._program.key)
            mesh = replica_mesh(self._program.replicas, self._local_replicas)
            self._placement = distributed.Placement(mesh, self._local_replicas)
        # The step's stream layout is fixed now; later changes to the Ir's setting do not apply.
        self._nht = ir.num_host_transfers
        self._host: dict[Variable, np.ndarray] = {v: self._initial_host(v) for v in ir._variables}
        self._remote_vars = [v for v in ir._variables if v._remote_buffer is not None]
        remote_state.check_slot_shapes(self._remote_vars)
        # Remote buffers keep their contents while detached (streaming memory).
        axis = self._program.ipu_axis if self._program.ipus else None
        self._buffers_host = [
            np.zeros(tuple(n for i, n in enumerate(a.shape) if i != axis), a.dtype)
            for a in abstract_state(self._program)[self._program.n_entries :]
        ]
        self._state: tuple | None = None
        self._scratch: tuple | None = None  # the step's scratch buffers, while attached
        # Whether step outputs can be spread over several devices (see stream_io.host_copy).
        self._spread_outputs = self._program.mode == "shard_map" or bool(self._program.ipus)
        self._host_stale = False
        self._enter_stack: list[bool] = []
        self._ipus = ipus_needed(ir.instance_replication_factor, _ipus_per_replica(ir))
        self._device_info = given or DeviceInfo(device_desc, self._ipus)
        check_io_tiles(ir, self._device_info.tilesPerIPU)
        self._executable: Any = None
        self._compile()
        checkpoint(ir, "FINAL")  # PopART's DOT checkpoint of the prepared IR
        if self._device_info.isAttached:  # PopXL set up an attached device at once
            self._attach()
            self.weights_from_host()

    # Properties -----------------------------------------------------------------------

    @property
    def ir(self) -> Ir:
        return self.ir_

    @property
    def is_attached(self) -> bool:
        return self._state is not None and self._device_info.isAttached

    def expected_inputs(self) -> set[HostToDeviceStream]:
        """The host-to-device streams a run needs data for."""
        return self.ir_.get_all_h2d_streams()

    # Compilation -----------------------------------------------------------------------

    def _x64(self) -> Any:
        return jax.enable_x64(True) if self._program.uses_x64 else contextlib.nullcontext()

    def _compile(self) -> None:
        _log.trace(f"Preparing the executable of Ir {self.ir_.id}", "popart")
        cache = executable_cache.directory(self.ir_.session_options)
        if cache is not None:
            engine_options = self.ir_.session_options.engineOptions
            wanted = executable_cache.executable_hash(
                self._program.key,
                engine_options,
                f"{self.device_desc}:{self._device}:x64={self._program.uses_x64}"
                f":scratch={self._program.scratch_specs()}",  # the step's signature
            )
            devices = [self._device]
            if self._program.mode == "shard_map":
                devices = list(replica_mesh(self._program.replicas).devices.flat)
            elif self._program.ipus:  # placed: one device per virtual IPU (and replica)
                devices = list(ipu_mesh(self._program.ipus, self._program.replicas).devices.flat)
            self._executable = executable_cache.load_or_compile(
                cache, wanted, self._compiled, devices
            )
            host_memory.return_freed_memory()
            return
        key = (self._program.key, str(self._device))
        if key in _COMPILED:
            _log.trace("Reusing the executable compiled for an identical program", "popart")
            return
        _log.debug("Starting compilation")
        self._compiled()
        host_memory.return_freed_memory()
        _COMPILED.add(key)

    def _compiled(self) -> Any:
        return self._lowered().compile()

    def _lowered(self) -> Any:
        """The step lowered for this session's state and stream layout (``jax.stages.Lowered``;
        ``.as_text()`` shows the program XLA compiles)."""
        # The state must carry the device placement runs use, or the first run compiles again.
        state = tuple(
            jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=self._sharding)
            for a in abstract_state(self._program)
        )
        inputs = abstract_inputs(self._program)
        if self._placement is not None:
            inputs = tuple(
                jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=self._placement.streams)
                for a in inputs
            )
        stash = tuple(
            jax.ShapeDtypeStruct(shape, dtype, sharding=self._sharding)
            for shape, dtype in self._program.scratch_specs()
        )
        mut, fixed = self._program.split(state)
        with self._x64():
            return self._program.step.lower((*mut, *stash), fixed, inputs)

    def _stash(self) -> tuple:
        """The step's scratch buffers (``runtime.scratch``), made on the first run: zeros
        made on the host and put, where ``jnp.zeros`` compiled a program per shape
        (ConvNeXt-T's 40 shapes: 2 of its first training call's seconds)."""
        if self._scratch is None:
            self._scratch = tuple(
                jax.device_put(np.zeros(shape, dtype), self._sharding)
                for shape, dtype in self._program.scratch_specs()
            )
        return self._scratch

    def memory_report(self) -> Any:
        """Bytes per virtual IPU: on-chip variables, remote buffers (streaming memory) and
        the compiled step's peak from XLA's memory analysis (see ``runtime.memory``).

        >>> import popxl, numpy as np
        >>> ir = popxl.Ir()
        >>> with ir.main_graph:
        ...     w = popxl.variable(np.zeros((4, 8), np.float32))
        ...     w += 1.0
        >>> print(popxl.Session(ir, "ipu_model").memory_report()[0].variables)
        128
        """
        from ..devices import memory  # noqa: PLC0415

        program = self._program
        compiled = self._compiled()
        graphs = reachable_graphs(program.ir)
        ipus = max(program.ipus, ipus_used(graphs))
        devices = program.ipus or 1
        return memory.memory_report(
            graphs, program.variables, program.buffers, ipus, devices, compiled, program.slots
        )

    # Attach / detach --------------------------------------------------------------------

    def __enter__(self) -> Session:
        was_attached = self.is_attached
        self._enter_stack.append(was_attached)
        if not was_attached:
            self._attach()
            try:
                self.weights_from_host()
            except BaseException:
                self._enter_stack.pop()
                self._detach()
                raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        was_attached = self._enter_stack.pop() if self._enter_stack else True
        if was_attached:
            return
        try:
            if exc_type is None and self.weights_to_host_on_exit and self.is_attached:
                self.weights_to_host()
        finally:
            self._detach()

    def _attach(self) -> None:
        check_compatible(self.device_desc, self._ipus, self._device_info)
        self._device_info.attach()
        self._state = ()
        # Device-to-host transfers write straight into the host copies (no separate buffer).
        for var in self.ir_._variables:
            _log.trace(f"Reusing TensorData for d2hWeightBuffer of tensor {var.id}", "devicex")

    def _detach(self) -> None:
        self._device_info.detach()
        self._state = None
        self._scratch = None

    def _set_device(self, device: DeviceInfo) -> None:
        """Run on ``device`` from the next attach on (it must match what was compiled for)."""
        self._device_info = device

    def _require_attached(self) -> tuple:
        """The device state; raises when the session is not attached."""
        if self._state is None:
            raise ValueError(NOT_ATTACHED_MSG)
        return self._state

    # Weights ---------------------------------------------------------------------------

    def _per_replica(self, var: Variable) -> bool:
        """Whether the host keeps one value per replica (``retrieval_mode="all_replicas"``)."""
        return (
            self._program.replicas > 1
            and var.retrieval_mode == "all_replicas"
            and var.replica_grouping.group_size > 1
            and not isinstance(var._host_data, np.memmap)
        )

    def _initial_host(self, var: Variable) -> np.ndarray:
        data = var._host_data
        if self._per_replica(var):
            grouping = var.replica_grouping
            if grouping.num_groups > 1:
                data = data[grouping.assignment]
            # Replica-sharded variables keep the full value per replica on the host.
            full = var.meta_shape if var._replica_sharded else var.shape
            data = np.array(np.broadcast_to(data, (self._program.replicas, *full)))
        elif isinstance(data, np.memmap):
            return data
        # A read-only view: callers cannot change the host copy (or the Ir's data) behind
        # the session's back.
        view = data.view()
        view.flags.writeable = False
        return view

    def _placed(self, host: np.ndarray) -> np.ndarray:
        """With placed virtual IPUs, one slot per device (see ``runtime.placement``)."""
        ipus, axis = self._program.ipus, self._program.ipu_axis
        if not ipus:
            return host
        shape = np.shape(host)
        return np.broadcast_to(np.expand_dims(host, axis), (*shape[:axis], ipus, *shape[axis:]))

    def _one_device(self, value: np.ndarray) -> np.ndarray:
        """A remote buffer's host value from its placed state (every device holds its
        replica's copy, see ``runtime.placement``): the first IPU's."""
        if not self._program.ipus:
            return value
        return value[(slice(None),) * self._program.ipu_axis + (0,)]

    def _slot(self, index: int, value: Any) -> Any:
        """The device slot of state entry ``index`` that holds its value."""
        if not self._program.ipus:
            return value
        # Placed: variables are unpacked from their slots (``Program.unpack``); remote
        # buffers are kept valid on every device, so row 0 holds them.
        if index < self._program.n_entries:
            raise InternalError(f"placed variables are read by unpack, not by slot (entry {index})")
        return value[0]

    def _device_layout(self, var: Variable, host: np.ndarray) -> Any:
        """``var``'s host value as the state holds it: with a leading replica axis when
        batched (placed programs then pack it into its slot, ``Program.pack``)."""
        host = to_ml(host)  # float8: the ml_dtypes view the device takes
        replicas = self._program.replicas
        if replicas > 1 and self._batched[var] and not self._per_replica(var):
            grouping = var.replica_grouping
            if grouping.num_groups > 1:
                host = np.stack([host[g] for g in grouping.assignment])
            else:
                host = np.broadcast_to(host, (replicas, *host.shape))
        return host

    def _to_host(self, var: Variable, device_value: Any) -> np.ndarray:
        value = np.asarray(device_value)
        if self._program.replicas > 1 and self._batched[var] and not self._per_replica(var):
            grouping = var.replica_grouping
            if grouping.num_groups > 1:
                value = value[[members[0] for members in grouping.members]]
            else:
                # The instance's first replica, as each poprun instance read its own IPUs'
                # (replicas differ where a forward updates state from its own data: BatchNorm).
                first = self._placement.first_replica if self._placement is not None else 0
                value = value[first]
        # A copy: the device buffer is donated to the next run.
        value = to_structured(np.array(value))
        value.flags.writeable = False
        return value

    def weights_from_host(self) -> None:
        """Copy every variable's host value to the device (remote variables into their
        buffer slots)."""
        self._require_attached()
        _log.debug("Writing weights from host, ", "devicex")
        variables = self._program.variables
        buffers = [b.copy() for b in self._buffers_host]
        self._write_remote(buffers, self._remote_vars)
        with self._x64():
            hosts = [self._device_layout(v, self._host[v]) for v in variables]
            buffers = [self._placed(b) for b in buffers]
            entries = self._program.pack(hosts)
            self._state = tuple(self._put([*entries, *buffers]))
        _log.debug("Writing weights from host complete.", "devicex")

    def _buffer_index(self, var: Variable) -> int:
        if var._remote_buffer is None:
            raise InternalError(f"{var.id} is not a remote variable", graph=var.graph)
        return self._program.buffers.index(var._remote_buffer)

    def _write_remote(self, buffers: list[np.ndarray], variables: Iterable[Variable]) -> None:
        replicas = self._program.replicas
        for var in variables:
            remote_state.write_slots(
                buffers[self._buffer_index(var)],
                var,
                to_ml(self._host[var]),
                replicas,
                self._per_replica(var),
            )

    def weights_to_host(self) -> None:
        """Copy every variable's device value to the host."""
        state = self._require_attached()
        _log.debug("Writing weights to host", "devicex")
        n_vars = self._program.n_entries
        # Placed remote buffers are kept valid on every device: read the first IPU's copy.
        values = [self._one_device(v) if i >= n_vars else v for i, v in enumerate(self._get(state))]
        per_variable = self._program.unpack(values[:n_vars])
        for var, value in zip(self._program.variables, per_variable):
            self._set_host(var, self._to_host(var, value))
        self._buffers_host = [np.array(b) for b in values[n_vars:]]
        replicas = self._program.replicas
        for var in self._remote_vars:
            host = to_structured(
                remote_state.read_slots(
                    self._buffers_host[self._buffer_index(var)],
                    var,
                    replicas,
                    self._per_replica(var),
                )
            )
            host.flags.writeable = False
            self._set_host(var, host)
        self._host_stale = False
        _log.debug("Writing weights to host complete.", "devicex")

    def _put(self, hosts: list[Any]) -> list[Any]:
        """Host arrays (global layout) → device state."""
        if self._placement is not None:
            return self._placement.put(hosts)
        return list(jax.device_put(hosts, self._sharding))

    def _get(self, values: Iterable[Any]) -> list[np.ndarray]:
        """Device state → host arrays (global layout; a collective between instances)."""
        if self._placement is not None:
            return self._placement.get(list(values))
        return list(jax.device_get(tuple(values)))

    def _set_host(self, var: Variable, value: np.ndarray) -> None:
        current = self._host[var]
        if isinstance(current, np.memmap):
            current[...] = value
            current.flush()
        else:
            self._host[var] = value

    # Running ----------------------------------------------------------------------------

    def run(
        self,
        inputs: Mapping[HostToDeviceStream, Any] | None = None,
        downcast_inputs: bool = True,
    ) -> dict[DeviceToHostStream, np.ndarray]:
        """Run the main graph once and return the data of every device-to-host stream.

        Args:
            inputs: one array per stream read by ``host_load``, in the layout
                ``[num_host_transfers if > 1][replication_factor if > 1][*stream_shape]``.
            downcast_inputs: convert 64-bit input arrays to 32-bit.

        Raises:
            ValueError: detached, missing/unexpected streams or badly shaped arrays. PopXL's
                all-ones escape hatch (e.g. a 0-d array for a ``(1,)`` stream) is honoured
                for one-element streams only; PopXL read past the data for larger ones.
            TypeError: arrays of the wrong dtype (PopXL reinterpreted their bytes).
        """
        buffers, _ = self._execute(inputs, downcast_inputs)
        nht = self._nht
        return {
            s: to_structured(stream_io.host_copy(b, nht, self._spread_outputs))
            for s, b in zip(self._program.d2h, buffers)
        }

    def run_with_outputs(
        self,
        inputs: Mapping[HostToDeviceStream, Any] | None = None,
        outputs: Mapping[DeviceToHostStream, np.ndarray] | None = None,
        downcast_inputs: bool = True,
    ) -> None:
        """Run once, writing stream data into the given ``outputs`` arrays in place.

        Slots a run does not write (stores executed fewer than ``num_host_transfers``
        times) keep their previous contents.
        """
        self._require_attached()
        outs = dict(outputs or {})
        nht, replicas = self._nht, self._local_replicas
        stream_io.check_outputs(outs, self._program.d2h, nht, replicas)
        buffers, counts = self._execute(inputs, downcast_inputs)
        for stream, buffer, count in zip(self._program.d2h, buffers, counts):
            stream_io.fill_output(outs[stream], buffer, int(count.max()), nht)

    def _execute(self, inputs: Any, downcast: bool) -> tuple[Sequence[Any], Sequence[Any]]:
        """One step: (this instance's d2h stream buffers, store counts per stream)."""
        state = self._require_attached()
        program = self._program
        tracing = _log.enabled(_log.TRACE)
        if tracing:
            _log.trace(f"Session::run: one step of Ir {self.ir_.id}", "session")
        arrays = stream_io.prepare_inputs(
            inputs, program.h2d, self._nht, self._local_replicas, downcast
        )
        placement = self._placement
        if placement is not None:
            if self._local_replicas == 1:  # the step keeps a replica axis of this one replica
                arrays = tuple(a[:, None] for a in arrays)
            arrays = placement.inputs(arrays)
        with self._x64():
            step = program.step
            if self._executable is not None:  # loaded from the executable cache
                step = compiled_step(step, self._executable)
            mut, fixed = program.split(state)
            try:
                new, (buffers, counts) = step((*mut, *self._stash()), fixed, arrays)
            except Exception:
                self._scratch = None  # donated to a step that failed: made again next run
                raise
        if program.scratch:
            new, self._scratch = new[: len(mut)], tuple(new[len(mut) :])
        self._state = program.merge(state, new)
        self._host_stale = True
        if tracing:
            _log.trace(f"Devicex::run: step done, {len(buffers)} device-to-host streams", "devicex")
        if placement is None:
            return buffers, program.store_counts(counts)
        local = [placement.local(b, axis=1) for b in buffers]
        if self._local_replicas == 1:
            local = [b[:, 0] for b in local]
        return local, program.store_counts(tuple(placement.local(c, axis=0) for c in counts))

    def _validate_run_inputs(self, inputs: Mapping[HostToDeviceStream, Any]) -> None:
        """Check ``inputs`` as ``run`` would (stream set, dtypes, layout) without running.

        Raises:
            ValueError: missing/unexpected streams or badly shaped arrays.
            TypeError: arrays of the wrong dtype.
        """
        stream_io.prepare_inputs(inputs, self._program.h2d, self._nht, self._local_replicas, True)

    def _validate_run_outputs(self, outputs: Mapping[DeviceToHostStream, np.ndarray]) -> None:
        """Check ``outputs`` as ``run_with_outputs`` would, without running.

        Raises:
            ValueError: missing/unexpected streams, badly shaped or read-only arrays.
            TypeError: arrays that are not NumPy arrays of the stream's dtype.
        """
        stream_io.check_outputs(outputs, self._program.d2h, self._nht, self._local_replicas)

    def create_host_outputs(self) -> dict[DeviceToHostStream, np.ndarray]:
        """Empty arrays, in host layout, for every device-to-host stream."""
        nht, replicas = self._nht, self._local_replicas
        return {
            s: np.empty(stream_io.output_shape(s, nht, replicas), s.dtype.as_numpy())
            for s in self._program.d2h
        }

    # Variable data -----------------------------------------------------------------------

    def get_tensor_data(self, tensor: Variable | Constant) -> np.ndarray:
        """The host value of one variable or constant (see ``get_tensors_data``)."""
        return self.get_tensors_data([tensor])[tensor]

    def get_tensors_data(self, tensors: Iterable[Variable | Constant]) -> dict[Tensor, np.ndarray]:
        """Host values of variables and constants.

        If the session is attached and has run since the last ``weights_to_host``, the
        variables are fetched from the device first. The returned arrays are read-only
        snapshots: later runs and transfers do not change them.

        Grouped variables read as ``(num_groups, *shape)``; with
        ``retrieval_mode="all_replicas"`` and groups of more than one replica, as
        ``(replication_factor, *shape)``, row ``r`` being replica ``r``'s copy.

        Raises:
            TypeError: an element is neither a Variable nor a Constant.
        """
        tensors = list(tensors)
        for t in tensors:
            if not isinstance(t, (Variable, Constant)):
                raise TypeError(NOT_VAR_OR_CONST_MSG.format(t=t) + self._loaded_from_hint(t))
        if self.is_attached and self._host_stale and any(isinstance(t, Variable) for t in tensors):
            self.weights_to_host()
        return {t: self._read_host(t) for t in tensors}

    def _read_host(self, t: Tensor) -> np.ndarray:
        if isinstance(t, Constant):
            return t._data
        value = self._host.get(t)  # type: ignore[call-overload]
        if value is None:
            raise ValueError(f"Variable {t.id} does not belong to this session's Ir {self.ir_.id}.")
        return value

    def _loaded_from_hint(self, t: Any) -> str:
        """For a tensor remote-loaded from a variable's slot (e.g. the shard handle
        ``replica_sharded_variable`` returns): which variable to read instead."""
        op = getattr(t, "_producer", None)
        if op is None or op.opdef.key not in ("remote_load", "remote_load_"):
            return ""
        offset = op.inputs[1]
        for var in self.ir_._variables:
            buffer = var._remote_buffer
            if (
                buffer is not None
                and buffer.remote_buffer_id == op.attrs["buffer_id"]
                and isinstance(offset, Constant)
                and int(np.asarray(offset._data)) == var._remote_offset
            ):
                return f" It is loaded from variable {var.id}: read that variable instead."
        return ""

    def write_variable_data(self, tensor: Variable, data: Any) -> None:
        """Set one variable's value (see ``write_variables_data``)."""
        self.write_variables_data({tensor: data})

    def write_variables_data(self, tensors: Mapping[Variable, Any]) -> None:
        """Set variables' values on the host and, if attached, on the device.

        Every entry is checked before any is written, so a bad entry changes nothing.

        Raises:
            TypeError: a non-variable, or an array whose dtype differs from the variable's.
            ValueError: an array whose shape is not the variable's host shape.
        """
        checked = [(var, self._checked_write(var, data)) for var, data in tensors.items()]
        for var, arr in checked:
            self._set_host(var, arr)
        if self.is_attached and checked:
            self._upload_written([var for var, _ in checked])

    def _upload_written(self, written: list[Variable]) -> None:
        index = {v: i for i, v in enumerate(self._program.variables)}
        where = state_layout.locate(self._program.entries)
        state = list(self._state or ())
        on_chip = [v for v in written if v in index]
        remote = [v for v in written if v._remote_buffer is not None]
        with self._x64():
            if self._program.slots:
                self._upload_slots(state, [index[v] for v in on_chip])
                on_chip = []
            hosts = [self._device_layout(v, self._host[v]) for v in on_chip]
            layouts = [self._program.entry_layout(where[index[v]][0]) for v in on_chip]
            placed = self._put(
                [h if p is None else np.transpose(h, p) for h, p in zip(hosts, layouts)]
            )
            for var, value in zip(on_chip, placed):
                entry, row = where[index[var]]
                if row is None:
                    state[entry] = value
                elif self._batched[var]:
                    state[entry] = state[entry].at[:, row].set(value)
                else:
                    state[entry] = state[entry].at[row].set(value)
            if remote:
                n_vars = self._program.n_entries
                buffers = [np.array(self._one_device(b)) for b in self._get(state[n_vars:])]
                self._write_remote(buffers, remote)
                state[n_vars:] = self._put([self._placed(b) for b in buffers])
        self._state = tuple(state)

    def _upload_slots(self, state: list, written: list[int]) -> None:
        """Placed programs: write variables (by index) into their owner's row of their slot."""
        layout = self._program.slots
        if layout is None:
            raise InternalError("only placed programs have variable slots")
        for i in written:
            slot, row = layout.where(i)
            var = self._program.variables[i]
            lead = self._program.replica_lead
            host = np.asarray(self._device_layout(var, self._host[var])).reshape(*lead, -1)
            state[slot] = jax.device_put(state[slot].at[..., row, :].set(host), self._sharding)

    def _checked_write(self, var: Any, data: Any) -> np.ndarray:
        if not isinstance(var, Variable):
            raise TypeError(NOT_VARIABLE_MSG.format(tid=getattr(var, "id", var)))
        if var not in self._host:
            raise ValueError(
                f"Variable {var.id} does not belong to this session's Ir {self.ir_.id}."
            )
        want = var.dtype.as_numpy()
        if isinstance(data, (bool, int, float, np.number)):
            if var.dtype.name.startswith("float8"):
                raise TypeError(
                    f"Write float8 variable {var.id} with a float8 NumPy array, not a Python number."
                )
            data = np.array(data).astype(want)
        arr = to_numpy(data, downcast=False, copy=False)
        if var.dtype.name.startswith("float8"):
            if not is_float8(arr.dtype):
                raise TypeError(
                    WRITE_FLOAT8_MSG.format(tid=var.id, got=arr.dtype, want=var.dtype.name)
                )
            arr = checked_structured(arr, var.dtype)  # either float8 form, stored structured
        if arr.dtype != want:
            raise TypeError(WRITE_DTYPE_MSG.format(tid=var.id, got=arr.dtype, want=want))
        if arr.shape != var.shape_on_host:
            raise ValueError(
                WRITE_SHAPE_MSG.format(got=arr.shape, tid=var.id, want=var.shape_on_host)
            )
        if var.retrieval_mode == "all_replicas" and var.replica_grouping.group_size > 1:
            raise NotImplementedError(
                f"Writing variable {var.id} with retrieval_mode='all_replicas' is not supported; "
                "create it with retrieval_mode='one_per_group' to write it."
            )
        copy = np.array(arr)
        copy.flags.writeable = False
        return copy


def _log_prepared(ir: Ir) -> None:
    """PopART's log once the IR is prepared: a summary (INFO), every graph (DEBUG)."""
    if _log.enabled(_log.INFO):
        n_ops = sum(len(g._ops) for g in ir._graphs.values())
        _log.info(f"Ir {ir.id} prepared: {n_ops} ops in {len(ir._graphs)} graphs", "ir")
    ir._pb_ir.logIr()


def _ipus_per_replica(ir: Ir) -> int:
    """One more than the highest IPU any op is placed on."""
    placed = [op.ipu for g in ir._graphs.values() for op in g._ops if op.ipu is not None]
    return max(placed, default=0) + 1


def _has_read_only_memmap(ir: Ir) -> bool:
    return any(
        isinstance(v._host_data, np.memmap) and v._host_data.mode == "r" for v in ir._variables
    )


__all__ = ["Session"]
