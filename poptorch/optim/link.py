"""The optimiser of a training executor: its description, its hyper-parameters on the
device and its state, as PopTorch kept them in step.

* ``Link`` (one per executor) reads the optimiser into a ``Spec`` when the model is wrapped
  and at every ``setOptimizer`` (checking its attributes, adapting the options), logs
  PopTorch's "Updating graph optimizer" lines when the hyper-parameters reach the device
  (at compilation, then only when they changed) and refuses changes of constants.
* ``state_dict()`` of a ``poptorch.optim`` optimiser reads the device state only if the
  device changed it since the last read ("Using cached optimiser state dict" otherwise);
  ``load_state_dict`` writes it to the device at once if the optimiser is in use by a
  compiled model, else when a model is compiled with it.
* ``Bound``: a torch model's optimiser with the names of the model's parameters.

The state's layout is PopTorch's: ``ipu_state`` maps PopART's names of the state tensors
(``Accl1___fc.weight``...) to values, ``ipu_param`` the variable hyper-parameters
(``learningRate___specific___fc.weight``, ``lossScaling_FLOAT``; SGD without momentum shows
PopART's ``scaledLearningRate0`` / ``weightDecayScaleFactor0`` instead).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from popxl.errors import InternalError

from .._log import logger
from ..enums import ConnectionType
from . import optimizers as optim
from . import rules
from .convert import AttrTracker, is_subclassed, to_spec, warn_if_subclassed
from .rules import Spec

NO_COMPILED_SPEC_MSG = "a compiled training model has no record of the optimiser it was built with"
STRUCTURE_MSG = (
    "{cls}.{attr} was {old} when the model was compiled and is part of the program, so it "
    "cannot become {new}: build a new trainingModel to change it."
)


class Bound(optim._Binding):
    """A torch model's optimiser (``torch.optim`` or ``poptorch.optim``) with the names of
    the model's parameters, which is what the program trains."""

    def __init__(self, optimizer: Any, names_by_id: dict[int, str]) -> None:
        self.user = optimizer
        self.names = names_by_id
        self._executor: Any = None

    def rebind(self, optimizer: Any) -> Bound:
        return Bound(optimizer, self.names)

    def _link(self, executor: Any) -> None:
        self._executor = weakref.ref(executor)
        if isinstance(self.user, optim.Optimizer):
            self.user._set_executor(executor)
        else:
            optim.mark_stepped(self.user)
        link_of(executor).attach(self)

    def _linked(self) -> Any:
        return self._executor() if self._executor is not None else None

    @property
    def _pending_state(self) -> Any:
        return getattr(self.user, "_pending_state", None)

    @_pending_state.setter
    def _pending_state(self, value: Any) -> None:
        if isinstance(self.user, optim.Optimizer):
            self.user._pending_state = value

    def state_dict(self) -> dict[str, Any]:
        return self.user.state_dict()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_executor": None}


def user_of(obj: Any) -> Any:
    """The user's optimiser behind what the executor holds."""
    return obj.user if isinstance(obj, Bound) else obj


def _names_of(obj: Any) -> dict[int, str] | None:
    return obj.names if isinstance(obj, Bound) else None


def link_of(executor: Any) -> Link:
    """The executor's ``Link`` (made on first use)."""
    state = executor.__dict__
    if "_optim_link" not in state:
        state["_optim_link"] = Link(executor)
    return state["_optim_link"]


class Link:
    """What an executor knows of its optimiser (see the module docstring)."""

    def __init__(self, executor: Any) -> None:
        self._executor = weakref.ref(executor)
        self.tracker = AttrTracker()
        self.spec: Spec | None = None  # the optimiser as last read
        self.compiled: Spec | None = None  # the one the program was built with
        self.uploaded: tuple | None = None  # the key of the hyper-parameters on the device
        self.warned: set[type] = set()

    @property
    def executor(self) -> Any:
        return self._executor()

    def convert(self, obj: Any) -> Spec:
        executor = self.executor
        user = user_of(obj)
        if type(user) not in self.warned and is_subclassed(user):
            self.warned.add(type(user))
            warn_if_subclassed(user)
        options = executor._options
        options.training._adopt_optimizer(user, executor._built is not None)
        spec = to_spec(user, _names_of(obj), options.training.automatic_loss_scaling)
        self.tracker.check(user, spec.kind, options._relax_optimizer_checks)
        return spec

    def attach(self, obj: Any) -> None:
        """The executor was created with ``obj``: read it (PopTorch read it then too)."""
        self.spec = self.convert(obj)

    def built(self, spec: Spec, groups: dict[str, int]) -> None:
        """The program was built with ``spec``; ``groups``: weight -> its group."""
        self.compiled = spec
        self.uploaded = spec.key()
        log_update(spec, groups)

    # ---- setOptimizer -----------------------------------------------------------------------

    def set_optimizer(self, optimizer: Any) -> None:
        executor = self.executor
        old = executor._optimizer
        new = old.rebind(optimizer) if isinstance(old, Bound) else optimizer
        if not isinstance(new, optim.OPTIMIZERS):
            raise TypeError(
                f"setOptimizer needs a poptorch.optim optimizer (SGD, Adam, AdamW, RMSprop, "
                f"LAMB), got {type(optimizer).__name__}."
            )
        spec = self.convert(new)
        built = executor._built
        writes: dict[Any, Any] = {}
        if built is not None:
            compiled = self.compiled
            if compiled is None:
                raise InternalError(NO_COMPILED_SPEC_MSG)
            if spec.kind != compiled.kind:
                raise ValueError(
                    optim.OTHER_OPTIMIZER_MSG.format(
                        new=f"{spec.source} ({spec.kind})",
                        old=f"{compiled.source} ({compiled.kind})",
                    )
                )
            if len(spec.groups) != len(compiled.groups):
                raise ValueError(
                    optim.GROUP_COUNT_MSG.format(new=len(spec.groups), old=len(compiled.groups))
                )
            writes = hyper_writes(built, spec)
        old_user, new_user = user_of(old), user_of(new)
        if built is not None and new_user is not old_user and isinstance(old_user, optim.Optimizer):
            read_state(old_user)  # keep the old optimiser's last state, then let it go
            old_user._set_executor(None)
        executor._optimizer = new
        if isinstance(new, Bound):
            new._executor = weakref.ref(executor)
        if isinstance(new_user, optim.Optimizer):
            new_user._set_executor(executor)
        else:
            optim.mark_stepped(new_user)
        self.spec = spec
        if built is None or executor._session is None:
            return
        if spec.key() != self.uploaded:
            log_update(spec, built.groups)
            executor._session.write_variables_data(writes)
            self.uploaded = spec.key()
        pending = getattr(new_user, "_pending_state", None)
        if pending is not None:
            executor._load_optimizer_state(pending)
            new_user._pending_state = None


def log_update(spec: Spec, groups: dict[str, int]) -> None:
    """PopTorch's debug lines for hyper-parameters sent to the device."""
    logger.debug("Updating graph optimizer with %s", spec.describe(None))
    for i in range(len(spec.groups)):
        names = [n for n, g in groups.items() if g == i]
        logger.debug(
            "Updating group %d optimizer with %s for (tensors affected %s)",
            i,
            spec.describe(i),
            names,
        )


# ---- the program's variables ---------------------------------------------------------------------


def _per_weight(built: Any) -> list[tuple[str, str]]:
    """(weight, attr) keys of the program's per-weight hyper-parameters (variables and
    constants); int keys are the per-group views (see ``_program._Trainer``)."""
    keys = [k for k in [*built.hyper, *built.constants] if isinstance(k[0], str)]
    return list(dict.fromkeys(keys))


def hyper_writes(built: Any, spec: Spec) -> dict[Any, np.float32]:
    """The variable writes that give the program ``spec``'s hyper-parameters.

    Raises:
        ValueError: ``spec`` changes a value the program holds as a constant.
    """
    writes: dict[Any, np.float32] = {}

    def put(key: tuple, value: float) -> None:
        if key in built.hyper:
            writes[built.hyper[key]] = np.float32(value)
        elif key in built.constants and built.constants[key] != value:
            attr, old = key[1], built.constants[key]
            message = STRUCTURE_MSG if attr == "max_grad_norm" else optim.CONSTANT_CHANGED_MSG
            raise ValueError(message.format(attr=attr, cls=spec.source, old=old, new=value))

    for name, attr in _per_weight(built):
        put((name, attr), spec.groups[built.groups[name]][attr][0])
    put((0, "loss_scaling"), spec.loss_scaling[0])
    put((0, "max_grad_norm"), spec.max_grad_norm)
    return writes


def _state_keys(built: Any, spec: Spec) -> dict[str, Any]:
    """``ipu_state`` key -> program variable."""
    prefixes = rules.SLOT_PREFIXES[spec.rule.family]
    result = {
        f"{prefixes[slot]}{name}": var
        for name, slots in built.state.items()
        for slot, var in slots.items()
    }
    if built.step is not None:
        result[rules.STEP_VAR] = built.step
    factor = built.hyper.get((0, "loss_scale_update_factor"))
    if factor is not None:
        result[rules.UPDATE_FACTOR_VAR] = factor
        result[rules.GOOD_STEPS_VAR] = built.good_steps
    return result


def _sgd0(built: Any, spec: Spec, name: str) -> bool:
    """A weight updated by plain SGD (no momentum), whose PopART hyper-parameters are
    ``scaledLearningRate0 = lr / loss_scaling`` and ``weightDecayScaleFactor0 = 1 - lr *
    weight_decay``."""
    return spec.rule.family == "SGD" and not built.state.get(name)


def _param_keys(built: Any, spec: Spec) -> dict[str, Any]:
    """``ipu_param`` key -> program variable (plain hyper-parameters)."""
    result = {}
    for key, var in built.hyper.items():
        name, attr = key
        if isinstance(name, str) and not _sgd0(built, spec, name):
            result[rules.specific_name(attr, name)] = var
    if (0, "loss_scaling") in built.hyper:
        result[rules.LOSS_SCALING_VAR] = built.hyper[(0, "loss_scaling")]
    return result


def _value(built: Any, data: Mapping[Any, Any], key: tuple) -> float:
    if key in built.hyper:
        return float(data[built.hyper[key]])
    return float(built.constants[key])


def _sgd0_params(built: Any, spec: Spec, data: Mapping[Any, Any]) -> dict[str, float]:
    result = {}
    for name in built.groups:
        if not _sgd0(built, spec, name):
            continue
        keys = [(name, "lr"), (name, "weight_decay"), (0, "loss_scaling")]
        if all(k not in built.hyper for k in keys):
            continue
        lr, wd, ls = (_value(built, data, k) for k in keys)
        result[f"scaledLearningRate0___specific___{name}"] = lr / ls
        result[f"weightDecayScaleFactor0___specific___{name}"] = 1.0 - lr * wd
    return result


def _device_tensors(built: Any) -> list[Any]:
    tensors = [*built.hyper.values()]
    tensors += [v for slots in built.state.values() for v in slots.values()]
    tensors += [t for t in (built.step, built.good_steps) if t is not None]
    return list(dict.fromkeys(tensors))


def device_state(executor: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``({"ipu_state": ..., "ipu_param": ...}, previous layout)`` read from the device."""
    built, session = executor._built, executor._session
    spec = link_of(executor).compiled
    if spec is None:
        raise InternalError(NO_COMPILED_SPEC_MSG)
    data = session.get_tensors_data(_device_tensors(built))
    ipu_state = {k: np.array(data[v]) for k, v in _state_keys(built, spec).items()}
    ipu_param = {k: np.array(data[v]) for k, v in _param_keys(built, spec).items()}
    ipu_param.update(
        {k: np.array(np.float32(v)) for k, v in _sgd0_params(built, spec, data).items()}
    )
    legacy: dict[str, Any] = {
        "state": {
            name: {slot: np.array(data[v]) for slot, v in slots.items()}
            for name, slots in built.state.items()
        },
        "step": int(data[built.step]) if built.step is not None else 0,
    }
    factor = built.hyper.get((0, "loss_scale_update_factor"))
    if factor is not None:
        legacy["loss_scaling"] = _value(built, data, (0, "loss_scaling")) * float(data[factor])
        legacy["good_steps"] = int(data[built.good_steps])
    return {"ipu_state": ipu_state, "ipu_param": ipu_param}, legacy


def write_device_state(executor: Any, state: Mapping[str, Any]) -> None:
    """Write ``state`` (``ipu_state``/``ipu_param``, or the previous layout) to the device."""
    built, session = executor._built, executor._session
    spec = link_of(executor).compiled
    if spec is None:
        raise InternalError(NO_COMPILED_SPEC_MSG)
    writes: dict[Any, Any] = {}
    if state.get("ipu_state") is not None:
        state_keys = _state_keys(built, spec)
        for key, value in state["ipu_state"].items():
            _put(writes, state_keys.get(key), value, key)
        _write_params(built, spec, state.get("ipu_param") or {}, writes, session)
    else:
        for name, slots in state.get("state", {}).items():
            for slot, value in slots.items():
                _put(writes, built.state.get(name, {}).get(slot), value, f"{name}.{slot}")
        if built.step is not None:
            writes[built.step] = np.float32(state.get("step", 0))
        factor = built.hyper.get((0, "loss_scale_update_factor"))
        if factor is not None and "loss_scaling" in state:
            base = _value(
                built, session.get_tensors_data(list(built.hyper.values())), (0, "loss_scaling")
            )
            writes[factor] = np.float32(float(state["loss_scaling"]) / base)
            writes[built.good_steps] = np.float32(state.get("good_steps", 0))
    session.write_variables_data(writes)


def _put(writes: dict, var: Any, value: Any, key: str) -> None:
    if var is None:
        logger.warning(
            "The optimizer state holds %r, which this program does not have (a constant, or "
            "another model's state): ignored.",
            key,
        )
        return
    writes[var] = np.asarray(_numpy(value), var.dtype.as_numpy())


def _write_params(built: Any, spec: Spec, params: Mapping[str, Any], writes: dict, session: Any):
    keys = _param_keys(built, spec)
    compound = {}
    for key, value in params.items():
        if key in keys:
            _put(writes, keys[key], value, key)
        elif "0___specific___" in key:
            compound[key] = float(np.asarray(_numpy(value)))
        else:
            _put(writes, None, value, key)
    if not compound:
        return
    current = session.get_tensors_data(list(built.hyper.values()))
    for name in built.groups:
        if not _sgd0(built, spec, name):
            continue
        slr = compound.get(f"scaledLearningRate0___specific___{name}")
        wdsf = compound.get(f"weightDecayScaleFactor0___specific___{name}")
        ls_var = built.hyper.get((0, "loss_scaling"))
        ls = (
            float(writes[ls_var])
            if ls_var in writes
            else _value(built, current, (0, "loss_scaling"))
        )
        lr = _value(built, current, (name, "lr"))
        if slr is not None:
            lr = slr * ls
            _put(writes, built.hyper.get((name, "lr")), lr, f"scaledLearningRate0 of {name}")
        if wdsf is not None and lr != 0.0:
            wd = (1.0 - wdsf) / lr
            _put(
                writes,
                built.hyper.get((name, "weight_decay")),
                wd,
                f"weightDecayScaleFactor0 of {name}",
            )


def _numpy(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)


# ---- optimizer.state_dict() / load_state_dict() ------------------------------------------------


def _current(opt: Any) -> Any:
    """The compiled executor ``opt`` is the optimiser of (None if not in use)."""
    executor = opt._linked()
    if executor is None or user_of(executor.__dict__.get("_optimizer")) is not opt:
        return None
    if executor.__dict__.get("_built") is None or executor.__dict__.get("_session") is None:
        return None
    if executor._options.connection_type == ConnectionType.Never:
        return None
    return executor


def _as_torch(values: dict[str, np.ndarray] | None, tensors: bool) -> Any:
    if values is None or not tensors:
        return values
    import torch  # noqa: PLC0415 (optimisers of torch parameters)

    return {k: torch.from_numpy(np.array(v)) for k, v in values.items()}


def read_state(opt: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``opt``'s device state (read if the device changed it) and the previous layout."""
    executor = _current(opt)
    if executor is None or opt._ipu_dirty:
        return dict(opt._ipu), opt._legacy_layout(opt._legacy)
    session = executor._session
    cached_of = opt._cache_of  # (the session state the cache was read from,) or None
    fresh = cached_of is not None and cached_of[0] is session._state
    fresh = fresh and (not opt._named or opt._legacy is not None)
    if fresh and opt.has_state():
        logger.debug("Using cached optimiser state dict")
        return dict(opt._ipu), opt._legacy_layout(opt._legacy)
    logger.info("Writing optimiser state tensors from IPU to host.")
    ipu, legacy = device_state(executor)
    tensors = not opt._named
    opt._ipu = {k: _as_torch(v, tensors) for k, v in ipu.items()}
    opt._legacy = legacy
    opt._cache_of = (session._state,)
    return dict(opt._ipu), opt._legacy_layout(legacy)


def read_before_detach(executor: Any) -> None:
    """A ``poptorch.optim`` optimiser keeps the device's state on the host (later
    ``state_dict()`` calls use it while the model is detached)."""
    user = user_of(executor._optimizer)
    if isinstance(user, optim.Optimizer):
        read_state(user)
        user._cache_of = (None,)  # the detached session's state: fresh until re-attached


def write_loaded(opt: Any) -> None:
    """``opt.load_state_dict`` (which holds the state): write it to the device now if a
    compiled model uses the optimiser."""
    executor = _current(opt)
    if executor is not None:
        executor._load_optimizer_state(opt._loaded)
        opt._ipu_dirty = False


def attach(executor: Any, optimizer: Any) -> None:
    """``optimizer`` (a ``poptorch.optim`` optimiser of a popxl_addons model's named
    weights, or a torch model's ``Bound`` optimiser) becomes ``executor``'s."""
    if isinstance(optimizer, Bound):
        optimizer._link(executor)
        return
    if isinstance(optimizer, optim.Optimizer):
        optimizer._set_executor(executor)
    link_of(executor).attach(optimizer)


def load_into(executor: Any, state: Mapping[str, Any]) -> None:
    """``executor._load_optimizer_state``: write ``state`` to the device (the weights are
    brought to the host first, as PopTorch did), and remember it as what was read."""
    if executor._built is None or executor._session is None:
        return
    link = link_of(executor)
    user = user_of(executor._optimizer)
    if state.get("ipu_state") is not None:
        if executor.copyWeightsToHostIfNeeded():
            logger.debug(
                "copyWeightsToHost(): the weights were synced to the host before the "
                "optimiser state is written."
            )
        logger.info("Writing optimiser state tensors from host to IPU memory.")
        write_device_state(executor, state)
        if isinstance(user, optim.Optimizer):  # what was written is what a read would give
            ipu = {k: state.get(k) for k in ("ipu_state", "ipu_param")}
            user._ipu = {k: dict(v) if v is not None else None for k, v in ipu.items()}
            user._cache_of = (executor._session._state,)
        return
    write_device_state(executor, state)
    # The previous layout's hyper-parameters come from the optimiser (restored with it).
    spec = link.convert(executor._optimizer)
    link.spec = spec
    if spec.key() != link.uploaded:
        executor._session.write_variables_data(hyper_writes(executor._built, spec))
        link.uploaded = spec.key()
    if isinstance(user, optim.Optimizer):
        user._legacy = None


def after_detach(executor: Any) -> None:
    """The executor detached from its device: the optimiser state is read back (as
    PopTorch did), so ``state_dict()`` needs no device until the next attach."""
    opt = user_of(executor.__dict__.get("_optimizer"))
    if isinstance(opt, optim.Optimizer) and _current(opt) is not None:
        read_state(opt)


def build_spec(optimizer: Any, options: Any) -> Spec:
    """The ``Spec`` a program is built with: the optimiser as read when the model was
    wrapped or at the last ``setOptimizer``."""
    executor = optimizer._linked() if hasattr(optimizer, "_linked") else None
    if executor is not None:
        link = link_of(executor)
        if link.spec is None:
            link.spec = link.convert(optimizer)
        return link.spec
    return to_spec(
        user_of(optimizer), _names_of(optimizer), options.training.automatic_loss_scaling
    )


def program_built(optimizer: Any, spec: Spec, groups: dict[str, int]) -> None:
    executor = optimizer._linked() if hasattr(optimizer, "_linked") else None
    if executor is not None:
        link_of(executor).built(spec, groups)
    else:
        log_update(spec, groups)
