"""``PoplarExecutor`` for ``torch.nn`` models: capture on the first call, weights in the model.

What PopTorch users rely on:

* The first call (or ``compile``) captures ``forward`` with the call's arguments cut to one
  micro-batch (``_capture``) and builds the program as for any PopTorch model
  (``_program``); later calls must keep the same input shapes and dtypes.
* The torch model holds the host copy of the weights. They are written to the device when
  the model attaches (first run, ``attachToDevice``, ``copyWeightsToDevice``,
  ``load_state_dict``). After a training call the device copy is newer: the model is
  instrumented (its class is swapped for a subclass, as PopTorch did) so that reading its
  parameters, buffers, ``state_dict()`` or calling it copies the weights back first, once.
  An ``inferenceModel`` of a model being trained picks those weights up before it runs.
* Arguments and results keep their structure (tuples, lists, dicts, ``None``), results are
  torch tensors, and inputs the model modifies in place are updated on the host.
"""

from __future__ import annotations

import collections
import copy
import logging
import time
import weakref
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree

import popxl
from popxl.errors import InternalError

from .. import _log
from .._names import tree_key
from ..aten.registry import popxl_dtype, torch_dtype
from ..blocks import module_repr
from ..capture import arguments as _args
from ..capture.buffer_guard import guard_buffers, replica_local_buffers
from ..capture.export import Capture, capture
from ..capture.model import CapturedModel
from ..capture.translate import Leaf
from ..enums import ConnectionType
from ..errors import Error
from ..options.core import Options, batches_per_call
from .executor import OfflineDeviceError, PoplarExecutor
from .hooks import compiling
from .progress import STAGES

logger = logging.getLogger("poptorch")

REQUIRES_GRAD_MSG = (
    "Input tensor has requires_grad=True set. This tensor will be detached because backward "
    "pass via inputs is not supported."
)

NOT_OPTIONS_MSG = "Invalid type: 'options' is of type {got} (Expected poptorch.Options)"
ALREADY_WRAPPED_MSG = (
    "Model has already been wrapped in 'poptorch.trainingModel'. Call model.destroy() on the "
    "model to unwrap before wrapping again."
)
NO_EXECUTABLE_ERR = "Model has not been compiled or has been destroyed."
BROADCAST_BUFFERS_MSG = (
    "PopTorch does not support broadcasting buffers. If your model is able to tolerate "
    "buffers becoming out of sync between replicas, you can disable buffer broadcasting "
    "using poptorch.Options.broadcastBuffers(False)."
)
NO_UPDATABLE_MSG = (
    "copyNamedBuffersToDevice copies the buffers named in Options.updatableNamedBuffers, but "
    "none were named. Name them (options.updatableNamedBuffers(['running_mean', ...])) or "
    "use copyWeightsToDevice to copy all the weights."
)
UNKNOWN_BUFFER_MSG = (
    "Options.updatableNamedBuffers names {names}, which the model does not register as "
    "buffers; its buffers are {known}."
)
ZERO_SIZE_MSG = (
    "Zero-sized tensors are unsupported (Got shape {shape}): input {index} has no elements. "
    "Give every input at least one element in each dimension."
)
BATCH_MSG = (
    "Invalid batch dimension: In the input {shape}, the batch dimension ({n}) must be a "
    "multiple of Options.deviceIterations({di}) * Options.replicationFactor({r}) / "
    "Options.inputReplicaGrouping.group_size({k}) * "
    "Options.Training.gradientAccumulation({ga}) = {total} because it is used to calculate "
    "the batch size which will be executed on the device in any given iteration. For a full "
    "explanation see the batching semantics page of the documentation."
)
BACKWARD_MSG = (
    "backward() cannot be called explicitly on outputs of a PopTorch model. If you're using "
    "a trainingModel, the backwards pass is performed automatically when invoking the model. "
    "If you're using an inferenceModel, you should use a trainingModel instead."
)


# The executor that trains a user model (so reads of the model copy its weights back) is kept
# in the model's own ``__dict__``: a global table keyed weakly by the model would still hold
# the executor, and through it the model, for as long as the process lives.
_TRAINER_ATTR = "_poptorch_trainer"


def _trainer(model: Any) -> Any:
    """The executor training ``model``, if any."""
    return vars(model).get(_TRAINER_ATTR) if isinstance(model, torch.nn.Module) else None


# How many times each user model's host weights were refreshed from a device.
_VERSIONS: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()


def host_weights_version(model: torch.nn.Module) -> int:
    return _VERSIONS.get(model, 0)


def _bump(model: torch.nn.Module) -> None:
    _VERSIONS[model] = _VERSIONS.get(model, 0) + 1


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t, device="meta")


def _zeros_like_meta(t: torch.Tensor) -> torch.Tensor:
    return torch.zeros(t.shape, dtype=t.dtype)


def _micro(t: torch.Tensor, per_call: int) -> torch.Tensor:
    return t[: t.shape[0] // per_call] if t.dim() else t


def _host_array(t: torch.Tensor, what: str) -> np.ndarray:
    dtype = popxl_dtype(t.dtype, what).as_numpy()
    # Each torch call costs microseconds: only the ones this tensor needs.
    if t.requires_grad:
        t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    array = t.numpy()
    return array if array.dtype == dtype else array.astype(dtype)


class TorchExecutor(PoplarExecutor):
    """A ``torch.nn.Module`` wrapped by ``trainingModel`` / ``inferenceModel``."""

    _progress_stages = STAGES

    def __init__(
        self,
        model: torch.nn.Module,
        options: Options | None,
        training: bool,
        optimizer: Any = None,
        user_model: torch.nn.Module | None = None,
    ) -> None:
        if options is not None and not isinstance(options, Options):
            raise Error(NOT_OPTIONS_MSG.format(got=type(options)), "poptorch")
        self._user_model = user_model if user_model is not None else model
        self._torch_model = model
        self._optimizer_in = optimizer
        super().__init__(model, options, training, _optimizer_for(optimizer, model, training))
        self._binder = _args.Binder(model)
        self._compiled_call: _args.CallArgs | None = None
        self._captured: CapturedModel | None = None
        self._host_version = -1
        self._dirty_host_weights = False
        if training:
            _instrument(self._user_model, self)

    # ---- PopTorch's attribute forwarding -------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_user_model", "_torch_model"):
            raise AttributeError(name)
        return getattr(self.__dict__["_user_model"], name)

    def __repr__(self) -> str:
        return module_repr(self._user_model)

    @property
    def model(self) -> torch.nn.Module:
        """The wrapped torch model."""
        return self._user_model

    # ---- compilation ---------------------------------------------------------------------

    def _per_call(self) -> int:
        return batches_per_call(self._options, self.training)

    def _check_batch(self, tensors: list[torch.Tensor]) -> None:
        per_call = self._per_call()
        o = self._options
        for i, t in enumerate(tensors):
            if t.numel() == 0:
                raise Error(ZERO_SIZE_MSG.format(shape=list(t.shape), index=i), "poptorch")
            n = t.shape[0] if t.dim() else 1
            if (t.dim() == 0 and per_call > 1) or n % per_call:
                raise Error(
                    BATCH_MSG.format(
                        shape=list(t.shape),
                        n=n,
                        di=o.device_iterations,
                        r=o.replication_factor,
                        k=o.input_group_size,
                        ga=o.training.gradient_accumulation if self.training else 1,
                        total=per_call,
                    ),
                    "poptorch",
                )

    def _host_array(self, data: np.ndarray) -> torch.Tensor:
        return _to_torch(data)

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """Capture and compile the model for inputs like ``args`` (if not done yet)."""
        self._compile_call(self._binder.bind(args, kwargs))

    def _compile_call(self, call: _args.CallArgs) -> list[torch.Tensor]:
        """Compile for ``call`` unless compiled (then check it matches); its tensors."""
        if self._built is not None:
            compiled = self._compiled_call
            if compiled is None:
                raise InternalError("a built model has no record of its compiled call")
            _args.validate(compiled, call)
            return _args.in_compiled_order(compiled, call).tensors()
        if self._compile_started is None:
            self._compile_started = time.perf_counter()
        tensors = call.tensors()
        self._check_batch(tensors)
        self._check_updatable_buffers()
        per_call = self._per_call()
        micro = _args.CallArgs(
            [_args._map_tensors(a, lambda t: _micro(t, per_call).detach()) for a in call.args],
            call.names,
            {
                k: _args._map_tensors(v, lambda t: _micro(t, per_call).detach())
                for k, v in call.kwargs.items()
            },
        )
        # The call's shapes and dtypes (meta tensors: no memory; a combined batch can be
        # gigabytes), for a checkpoint to capture the model again (``_checkpoint``).
        self._example_call = (
            [_args._map_tensors(a, _meta_like) for a in call.args],
            {k: _args._map_tensors(v, _meta_like) for k, v in call.kwargs.items()},
        )
        if any(t.requires_grad for t in tensors):
            _log.logger.warning(REQUIRES_GRAD_MSG)
        with compiling(), _unwrapped(self._user_model):
            with guard_buffers(self._torch_model), self._compile_progress().stage("capture"):
                captured = capture(self._torch_model, *self._binder.by_name(micro))
            self._check_buffer_broadcast(captured)
            self._captured = CapturedModel(
                captured, self.training, self._options.random_seed, self._options
            )
            arrays = [_host_array(t, f"Input {i}") for i, t in enumerate(tensors)]
            self._compile_arrays(arrays, self._captured)
        self._compiled_call = _args.metadata(call)
        return tensors

    # ---- saving ----------------------------------------------------------------------------

    def _checkpoint(self, export_model: bool) -> dict[str, Any]:
        """The base checkpoint, plus zero inputs shaped like the compiled call (to capture the
        model again in ``poptorch.load``) and the torch model and optimiser as the user
        passed them."""
        data = super()._checkpoint(export_model)
        example = getattr(self, "_example_call", None)
        if example is not None:
            args, kwargs = example
            example = (
                [_args._map_tensors(a, _zeros_like_meta) for a in args],
                {k: _args._map_tensors(v, _zeros_like_meta) for k, v in kwargs.items()},
            )
        data["torch_call"] = example
        data["model"] = self._user_model if export_model else None
        data["optimizer_object"] = self._optimizer_in if export_model else None
        data["weights"] = None  # the pickled torch model carries its (host-synchronised) weights
        return data

    def _compile_from_checkpoint(self, data: dict[str, Any]) -> None:
        if data.get("torch_call") is not None:
            args, kwargs = data["torch_call"]
            self.compile(*args, **kwargs)

    # ---- running -------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run ``deviceIterations`` iterations on the combined batch in ``args``/``kwargs``
        (the model's own arguments); returns the model's outputs, concatenated over the
        micro-batches the output mode returns."""
        if self._options.connection_type == ConnectionType.Never:
            raise OfflineDeviceError()
        call = self._binder.bind(args, kwargs, check=self._built is None)
        tensors = self._compile_call(call)
        if not self.training:
            self._refresh_from_trainer()
        arrays = [_host_array(t, f"Input {i}") for i, t in enumerate(tensors)]
        outs = self._run_arrays(arrays)
        if self.training:
            self._dirty_host_weights = True
        forward = self._forward()
        n_user = forward.n_outputs
        results = _outputs_to_torch(outs[:n_user])
        for k, index in enumerate(forward.input_outputs):
            target = call.caller_tensor(tensors[index])
            with torch.no_grad():
                target.copy_(results_input(outs[n_user + k], target))
        return self._structure(results)

    def _forward(self) -> Any:
        captured = self._captured
        if captured is None or captured.forward is None:
            raise InternalError("the model runs before its forward graph is captured")
        return captured.forward

    def _structure(self, results: list[torch.Tensor]) -> Any:
        forward = self._forward()
        leaves = [results[x.index] if isinstance(x, Leaf) else x for x in forward.out_leaves]
        for r in results:
            r.backward = _backward_error  # type: ignore[method-assign]
        out = pytree.tree_unflatten(leaves, forward.out_spec)
        if isinstance(out, list) and len(out) == 1 and not isinstance(out, tuple):
            return out
        return out

    def _refresh_from_trainer(self) -> None:
        """An inference model of a model being trained elsewhere runs its latest weights."""
        trainer = _trainer(self._user_model)
        if trainer is not None and trainer is not self:
            trainer.copyWeightsToHostIfNeeded()
            version = host_weights_version(self._user_model)
            if version != self._host_version:
                logger.debug("Implicit copyWeightsToDevice()")
                self.copyWeightsToDevice()

    # ---- weights -------------------------------------------------------------------------

    def _named_state(self) -> dict[str, torch.Tensor]:
        with _unwrapped(self._user_model):
            model = self._torch_model
            state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
            return {tree_key(n): t for n, t in state.items()}

    def _adopt_weights(self) -> None:
        """Weights come from the torch model: the program starts from its values, and
        attaching writes them again (``attachToDevice``)."""

    def _sync_weights(self) -> None:
        """The torch model is the host copy; nothing to pull before a run."""

    def copyWeightsToDevice(self) -> None:  # noqa: N802
        """Copy the torch model's parameters and buffers to the device. The host's values
        win: weights trained since they were last read on the host are overwritten (as in
        PopTorch), not copied back first."""
        if self._session is None or self._built is None:
            raise Error(NO_EXECUTABLE_ERR, "poptorch")
        self._dirty_host_weights = False  # reading the host tensors must not copy back
        state = self._named_state()
        writes = {}
        for name, var in self._built.weights.items():
            if name in state:
                writes[var] = self._grouped(name, _host_array(state[name], f"Weight {name}"))
        logger.debug("Writing weights from host to IPU memory")
        self._session.write_variables_data(writes)
        self._dirty_host_weights = False
        self._host_version = host_weights_version(self._user_model)

    def _grouped(self, name: str, value: np.ndarray) -> np.ndarray:
        return value

    def _check_buffer_broadcast(self, captured: Capture) -> None:
        """PopTorch kept replicas' buffers equal by refusing forwards that update them from
        a replica's data where replicas read different inputs (BatchNorm's running
        statistics excepted: see ``replica_local_buffers``)."""
        o = self._options
        if o.input_group_size < o.replication_factor and o.broadcast_buffers:
            updated = set(captured.program.graph_signature.buffers_to_mutate.values())
            if updated - captured.frozen - replica_local_buffers(captured.program):
                raise Error(BROADCAST_BUFFERS_MSG, "poptorch")

    def _updatable_buffers(self) -> list[str]:
        return list(self._options.popart.options.get("updatableNamedBuffers", []))

    def _check_updatable_buffers(self) -> None:
        with _unwrapped(self._user_model):
            known = {n for n, _ in self._torch_model.named_buffers()}
        unknown = [n for n in self._updatable_buffers() if n not in known]
        if unknown:
            raise Error(UNKNOWN_BUFFER_MSG.format(names=unknown, known=sorted(known)), "poptorch")

    def copyNamedBuffersToDevice(self) -> None:  # noqa: N802
        """Copy the buffers named in ``Options.updatableNamedBuffers`` (only those) from the
        torch model to the device.

        Raises:
            poptorch.Error: the model is not compiled, or no buffer was named updatable.
        """
        if self._session is None or self._built is None:
            raise Error(NO_EXECUTABLE_ERR, "poptorch")
        names = [tree_key(n) for n in self._updatable_buffers()]
        if not names:
            raise Error(NO_UPDATABLE_MSG, "poptorch")
        state = self._named_state()
        weights = self._built.weights
        writes = {
            weights[n]: self._grouped(n, _host_array(state[n], f"Buffer {n}"))
            for n in names
            if n in weights
        }
        self._session.write_variables_data(writes)

    def copyWeightsToHost(self) -> None:  # noqa: N802
        """Copy the device's weights into the torch model's parameters and buffers."""
        if self._session is None or self._built is None:
            raise Error(NO_EXECUTABLE_ERR, "poptorch")
        self._dirty_host_weights = False
        built = self._built
        data = self._session.get_tensors_data(list(built.weights.values()))
        state = self._named_state()
        logger.debug("Writing weights from IPU to host")
        with torch.no_grad():
            for name, var in built.weights.items():
                if name in state:
                    target = state[name]
                    value = torch.from_numpy(np.array(data[var]))
                    target.copy_(value.reshape(target.shape).to(target.dtype))
        _bump(self._user_model)
        self._host_version = host_weights_version(self._user_model)

    def copyWeightsToHostIfNeeded(self) -> bool:  # noqa: N802
        """Copy the weights back if a training call changed them; whether it did."""
        if self._dirty_host_weights and self._session is not None:
            logger.debug("Implicit copyWeightsToHost()")
            self.copyWeightsToHost()
            return True
        return False

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The torch model's ``state_dict()`` (with the device's latest weights)."""
        self.copyWeightsToHostIfNeeded()
        return self._user_model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True) -> Any:
        """``load_state_dict`` on the torch model, then copy the weights to the device."""
        out = self._user_model.load_state_dict(state_dict, strict)
        if self.isAttachedToDevice():
            logger.debug("load_state_dict: implicit copyWeightsToDevice()")
            self.copyWeightsToDevice()
        return out

    def attachToDevice(self) -> None:  # noqa: N802
        """Attach with the torch model's weights: they go to the session's host copy first,
        so attaching uploads them once."""
        if self._session is not None and not self._session.is_attached:
            self.copyWeightsToDevice()
        super().attachToDevice()

    def detachFromDevice(self) -> None:  # noqa: N802
        """Detach, bringing trained weights to the torch model first (``attachToDevice``
        writes the model's weights back)."""
        if self._session is not None and self._session.is_attached:
            self.copyWeightsToHostIfNeeded()
        super().detachFromDevice()

    def destroy(self) -> None:
        """Release the device and the program; the trained weights are copied to the model
        first, and the model is no longer instrumented."""
        if self._session is not None and self._dirty_host_weights:
            self.copyWeightsToHost()
        super().destroy()
        self._captured = None
        self._compiled_call = None
        if self.training:
            _uninstrument(self._user_model)

    def isCompiled(self) -> bool:  # noqa: N802
        return self._session is not None


def results_input(value: np.ndarray, target: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.array(value, order="C")).reshape(target.shape).to(target.dtype)


def _outputs_to_torch(values: list[Any]) -> list[torch.Tensor]:
    """A run's outputs as tensors. The runtime hands over fresh host arrays: each becomes a
    tensor's memory without another copy, unless an earlier output already uses it."""
    used: set[int] = set()
    tensors = []
    for value in values:
        base = value.base if isinstance(value, np.ndarray) and value.base is not None else value
        fresh = (
            isinstance(value, np.ndarray)
            and value.flags.writeable
            and value.flags.c_contiguous
            and id(base) not in used
        )
        used.add(id(base))
        tensors.append(_to_torch(value, copy=not fresh))
    return tensors


def _to_torch(value: Any, copy: bool = True) -> torch.Tensor:
    array = np.array(value, order="C") if copy else value
    if array.dtype == np.uint32:
        array = array.astype(np.int64)
    return torch.from_numpy(array)


def _backward_error(*_: Any, **__: Any) -> None:
    raise Error(BACKWARD_MSG, "poptorch")


def _optimizer_for(optimizer: Any, model: torch.nn.Module, training: bool) -> Any:
    """The program's optimiser for a torch model's ``optimizer`` (None: PopTorch's default
    ``poptorch.optim.SGD(model.parameters(), lr=0.01)``), bound to the model's parameter
    names."""
    if not training:
        return None
    from ..optim.binding import bind  # noqa: PLC0415

    return bind(optimizer, model)


# ---- instrumenting the user's model ------------------------------------------------------------


class _Unwrapped:
    depth = 0


_UNWRAP = _Unwrapped()


class _unwrapped:
    """While active, reading an instrumented model does not copy weights from the device."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __enter__(self) -> None:
        _UNWRAP.depth += 1

    def __exit__(self, *exc: Any) -> None:
        _UNWRAP.depth -= 1


def _copy_back(model: Any) -> None:
    if _UNWRAP.depth:
        return
    trainer = _trainer(model)
    if trainer is not None:
        _UNWRAP.depth += 1
        try:
            trainer.copyWeightsToHostIfNeeded()
        finally:
            _UNWRAP.depth -= 1


_WRAPPER_CLASSES: dict[type, type] = {}


def _instrumented_class(cls: type[torch.nn.Module]) -> type:
    if cls in _WRAPPER_CLASSES:
        return _WRAPPER_CLASSES[cls]

    def __getattribute__(self: Any, name: str) -> Any:  # noqa: N807
        if name in ("_parameters", "_buffers", "forward", "state_dict"):
            _copy_back(self)
        return cls.__getattribute__(self, name)

    def copyWeightsToHostIfNeeded(self: Any) -> bool:  # noqa: N802
        trainer = _trainer(self)
        return trainer.copyWeightsToHostIfNeeded() if trainer is not None else False

    def destroy(self: Any) -> None:
        trainer = _trainer(self)
        if trainer is not None:
            trainer.destroy()

    def __reduce_ex__(self: Any, protocol: Any) -> Any:  # noqa: N807
        # Saved models are plain torch models: the wrapper class is not pickled.
        _copy_back(self)
        state = self.__dict__.copy()
        state.pop(_TRAINER_ATTR, None)
        return (_rebuild_plain, (cls, state))

    wrapper = type(
        f"Poptorch{cls.__name__}",
        (cls,),
        {
            "__getattribute__": __getattribute__,
            "copyWeightsToHostIfNeeded": copyWeightsToHostIfNeeded,
            "destroy": destroy,
            "__reduce_ex__": __reduce_ex__,
            "__module__": cls.__module__,
            "__qualname__": f"Poptorch{cls.__qualname__}",
        },
    )
    _WRAPPER_CLASSES[cls] = wrapper
    return wrapper


def _rebuild_plain(cls: type[torch.nn.Module], state: dict) -> Any:
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return obj


# id(parameter or buffer) -> a weak reference to the user model whose trainer refreshes it.
# Keyed by id: hashing or weak-referencing the tensor itself would re-enter its
# __getattribute__.
_OWNERS: dict[int, weakref.ReferenceType] = {}


def _copy_back_tensor(t: torch.Tensor) -> None:
    ref = _OWNERS.get(id(t))
    owner = ref() if ref is not None else None
    if owner is not None:
        _copy_back(owner)


class PoptorchParameter(torch.nn.Parameter):
    """A parameter of a model being trained: reading it copies the weights back first."""

    def __getattribute__(self, name: str) -> Any:
        if not _UNWRAP.depth:
            _copy_back_tensor(self)
        return super().__getattribute__(name)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return super().__torch_function__(func, types, args, kwargs or {})


class PoptorchBuffer(torch.Tensor):
    """A buffer of a model being trained: reading it copies the weights back first."""

    def __getattribute__(self, name: str) -> Any:
        if not _UNWRAP.depth:
            _copy_back_tensor(self)
        return super().__getattribute__(name)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Saved as the plain tensor it is (a checkpoint's state dict, as PopTorch's held
        # plain tensors): ``torch.load``'s default ``weights_only`` refuses this class.
        return self.as_subclass(torch.Tensor).__reduce_ex__(protocol)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return super().__torch_function__(func, types, args, kwargs or {})


def _instrument(model: torch.nn.Module, executor: TorchExecutor) -> None:
    if _trainer(model) not in (None, executor):
        raise RuntimeError(ALREADY_WRAPPED_MSG)
    model.__dict__[_TRAINER_ATTR] = executor
    cls = type(model)
    if cls not in _WRAPPER_CLASSES.values():
        model.__class__ = _instrumented_class(cls)
    with _unwrapped(model):
        for p in model.parameters():
            _OWNERS[id(p)] = weakref.ref(model)
            if type(p) is torch.nn.Parameter:
                p.__class__ = PoptorchParameter
        for b in model.buffers():
            _OWNERS[id(b)] = weakref.ref(model)
            if type(b) is torch.Tensor:
                b.__class__ = PoptorchBuffer


def _set_class(obj: Any, cls: type) -> None:
    """Give ``obj`` class ``cls`` (``obj`` is narrowed to its current class where this is
    called, which the assignment would contradict)."""
    obj.__class__ = cls


def _uninstrument(model: torch.nn.Module) -> None:
    model.__dict__.pop(_TRAINER_ATTR, None)
    cls = type(model)
    for plain, wrapper in _WRAPPER_CLASSES.items():
        if wrapper is cls:
            model.__class__ = plain
            break
    with _unwrapped(model):
        for p in model.parameters():
            _OWNERS.pop(id(p), None)
            if type(p) is PoptorchParameter:
                _set_class(p, torch.nn.Parameter)
        for b in model.buffers():
            _OWNERS.pop(id(b), None)
            if type(b) is PoptorchBuffer:
                _set_class(b, torch.Tensor)


def is_wrapped(model: Any) -> bool:
    return _trainer(model) is not None


def unwrapped_class(model: Any) -> type:
    cls = type(model)
    for plain, wrapper in _WRAPPER_CLASSES.items():
        if wrapper is cls:
            return plain
    return cls


def torch_models(model: Any) -> bool:
    return isinstance(model, torch.nn.Module)


def new_executor(
    model: torch.nn.Module, options: Any, training: bool, optimizer: Any
) -> TorchExecutor:
    """PopTorch's wrapping: a shallow copy of the model is captured; the user's model is the
    one whose weights are kept in sync (and, for training, instrumented)."""
    if training and is_wrapped(model):
        raise RuntimeError(ALREADY_WRAPPED_MSG)
    plain = copy.copy(model)
    plain.__class__ = unwrapped_class(model)
    return TorchExecutor(plain, options, training, optimizer, user_model=model)


__all__ = ["TorchExecutor", "new_executor", "collections", "popxl", "torch_dtype"]
