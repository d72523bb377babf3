"""``poptorch.optim``: PopTorch's SGD, Adam, AdamW, RMSprop and LAMB.

Each optimiser is a ``torch.optim`` optimiser (``SGD`` subclasses ``torch.optim.SGD``, LAMB
subclasses ``torch.optim.Optimizer``; a stand-in base when PyTorch is not installed) with
PopTorch's additions: loss scaling, velocity scaling, accumulation types, gradient clipping
(``max_grad_norm``), ``variable_attrs`` (which attributes ``setOptimizer`` may change without
recompiling) and a ``state_dict()`` that reads the optimiser state from the device.

PopTorch does not run the optimiser's Python code: ``trainingModel`` reads its
hyper-parameters into the program's update step (``_optim_convert``), which follows
``torch.optim``'s update rules (``_optim_rules``).

Parameters are given as in PyTorch (``model.parameters()`` or parameter-group dicts) for a
``torch.nn.Module``. For a popxl_addons ``Module``, whose weights are named, ``params`` is
``None`` (every weight), a list of weight names or glob patterns, or a list of dicts
``{"params": [...patterns], "lr": ...}``; names are those of ``executor.state_dict()``.

>>> opt = SGD(lr=0.01, momentum=0.9)
>>> opt.variable_attrs.isConstant("lr"), opt.variable_attrs.isConstant("dampening")
(False, True)
>>> opt.param_groups[0]["momentum"]
0.9
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

import popxl

from .rules import group_of_each as group_of_each
from .rules import sharded_update as sharded_update

try:
    import torch
except ImportError:  # PyTorch is optional: the optimisers then describe named weights only
    torch = None  # type: ignore[assignment]

CONSTANT_CHANGED_MSG = (
    "Attribute {attr!r} of {cls} was constant when the model was compiled (value {old}), so "
    "it cannot become {new}. Mark it variable before compiling "
    "(optimizer.variable_attrs.markAsVariable({attr!r})) or pass it to the constructor."
)
UNKNOWN_ATTR_MSG = "{cls} has no attribute {attr!r}; its attributes are: {allowed}."
AMSGRAD_MSG = (
    "{cls}(amsgrad=True) is not supported: PopTorch only supports non-amsgrad Adam/AdamW "
    "optimizers; use amsgrad=False."
)
OTHER_OPTIMIZER_MSG = (
    "setOptimizer got a {new}, but the model was compiled with a {old}. The optimiser type is "
    "part of the program; build a new trainingModel to change it."
)
GROUP_COUNT_MSG = (
    "setOptimizer got {new} parameter groups but the model was compiled with {old}; the "
    "groups are part of the program."
)
DTYPE_MSG = (
    "Accumulation types must be either torch.float32 or torch.float16 (or None), got {got!r}."
)
EMPTY_STATE_MSG = "Cannot load optimizer state dictionary because it is empty."
NOT_IPU_STATE_MSG = (
    "Only IPU optimizer states can be loaded onto the IPU: this state dictionary has no "
    "'ipu_state'/'ipu_param' (it was not produced by a poptorch.optim optimizer's "
    "state_dict() after compilation)."
)

_DTYPES = {"float": "float32", "float32": "float32", "half": "float16", "float16": "float16"}


def as_dtype(value: Any) -> popxl.dtype | None:
    """An accumulation type (popxl) from a torch/NumPy/popxl dtype or its name."""
    if value is None:
        return None
    if isinstance(value, popxl.dtype):
        name = value.name
    else:
        name = str(getattr(value, "name", value)).lower().replace("torch.", "")
        if name not in _DTYPES:
            try:
                name = np.dtype(value).name
            except TypeError:
                raise ValueError(DTYPE_MSG.format(got=value)) from None
    if _DTYPES.get(name) is None:
        raise ValueError(DTYPE_MSG.format(got=value))
    return popxl.float16 if _DTYPES[name] == "float16" else popxl.float32


def _user_dtype(value: Any) -> Any:
    """The accumulation type as the optimiser stores it: a torch dtype when PyTorch is
    installed (as PopTorch), else a popxl dtype; validated either way."""
    dtype = as_dtype(value) if value is not None else popxl.float32
    if torch is None:
        return dtype
    return torch.float16 if dtype == popxl.float16 else torch.float32


class VariableAttributes:
    """Which attributes are variables (changed by ``setOptimizer`` without recompiling) and
    which are constants baked into the program. Every optimiser has one: ``variable_attrs``.

    >>> attrs = VariableAttributes(["lr"], ["lr", "momentum"])
    >>> attrs.isConstant("momentum"), attrs.isConstant("lr")
    (True, False)
    >>> attrs.markAsVariable("momentum"); attrs.isConstant("momentum")
    False
    """

    def __init__(self, variable_attributes: Iterable[str], allowed_attributes: Iterable[str]):
        self._allowed_attributes = list(allowed_attributes)
        self._variable_attributes = [a for a in variable_attributes]

    def _check(self, attr: str) -> None:
        if attr not in self._allowed_attributes:
            raise ValueError(
                UNKNOWN_ATTR_MSG.format(
                    cls="optimizer", attr=attr, allowed=self._allowed_attributes
                )
            )

    def isConstant(self, attr: str) -> bool:  # noqa: N802 (PopTorch's name)
        """Whether ``attr`` is compiled as a constant."""
        return attr not in self._variable_attributes

    def markAsConstant(self, attr: str) -> None:  # noqa: N802
        """Compile ``attr`` as a constant (changing it later is an error)."""
        self._check(attr)
        self._variable_attributes = [a for a in self._variable_attributes if a != attr]

    def markAsVariable(self, attr: str) -> None:  # noqa: N802
        """Compile ``attr`` as a variable that ``setOptimizer`` can change."""
        self._check(attr)
        if attr not in self._variable_attributes:
            self._variable_attributes.append(attr)


# ---- the torch base classes ------------------------------------------------------------------


class _StandInOptimizer:
    """The base of the optimisers when PyTorch is not installed: torch's attributes
    (``defaults``, ``param_groups``, ``state``) for named weights only."""

    torch_defaults: dict[str, Any] = {}

    def __init__(self, params: Any, defaults: dict[str, Any] | None = None, **kwargs: Any):
        self.defaults = {**self.torch_defaults, **(defaults or {}), **kwargs}
        self.state: dict[Any, Any] = {}
        self.param_groups: list[dict[str, Any]] = []

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to clear: the device computes the gradients."""


def _stand_in(name: str, defaults: dict[str, Any]) -> type:
    return type(name, (_StandInOptimizer,), {"torch_defaults": defaults})


def _torch_base(name: str, defaults: dict[str, Any]) -> type:
    if torch is None:
        return _stand_in(name, defaults)
    return getattr(torch.optim, name)


_TORCH_OPTIMIZER: type[Any] = torch.optim.Optimizer if torch is not None else _StandInOptimizer


def _named(params: Any) -> tuple[bool, Any]:
    """Whether ``params`` names weights (None, names, or dicts of names), and ``params``
    as a list when it was an iterator."""
    if params is None or isinstance(params, str):
        return True, params
    items = list(params)
    if not items:
        return False, items

    def names(p: Any) -> bool:
        return (
            p is None
            or isinstance(p, str)
            or (isinstance(p, (list, tuple)) and all(isinstance(x, str) for x in p))
        )

    if all(isinstance(p, Mapping) for p in items):
        return all(names(p.get("params")) for p in items), items
    return all(isinstance(p, str) for p in items), items


def _patterns(params: Any) -> list[str] | None:
    if params is None:
        return None
    if isinstance(params, str):
        return [params]
    return [str(p) for p in params]


def _accepted(init: Callable[..., None], given: dict[str, Any]) -> dict[str, Any]:
    """The arguments of ``given`` that torch's ``init`` takes (torch versions differ)."""
    parameters = inspect.signature(init).parameters
    if any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
        return dict(given)
    return {k: v for k, v in given.items() if k in parameters and k != "params"}


def _given(args: dict[str, Any]) -> dict[str, Any]:
    """The constructor arguments the user passed (not None): PopTorch makes them variable."""
    return {
        k: v for k, v in args.items() if k not in ("self", "params", "__class__") and v is not None
    }


class Optimizer:
    """PopTorch's part of its optimisers (mixed into each ``torch.optim`` optimiser).

    ``state_dict()`` holds ``"ipu_state"`` (the optimiser state tensors, by PopART's names:
    ``Accl1___fc.weight``...) and ``"ipu_param"`` (the variable hyper-parameters:
    ``learningRate___specific___fc.weight``, ``lossScaling_FLOAT``...), read from the device
    of the model that uses the optimiser, besides torch's own entries (so LR schedulers
    work); both are ``None`` before the model is compiled. ``load_state_dict`` writes them
    back to the device (or when a model is compiled with the optimiser).
    """

    # PopTorch's lists: attributes not in torch's optimiser that are global but variable
    # (``_child_vars``), every attribute not in torch's optimiser (``_child_only``) and the
    # attributes a parameter group may set (``_group_vars``).
    _child_vars: tuple[str, ...] = ("loss_scaling",)
    _child_only: tuple[str, ...] = ()
    _group_vars: tuple[str, ...] = ()
    # Set by the torch (or stand-in) optimiser this class is mixed into.
    defaults: dict[str, Any]

    def _poptorch_init(
        self, params: Any, given: dict[str, Any], torch_init: Callable[..., None]
    ) -> None:
        """Build torch's part with the torch arguments in ``given``, or (named weights)
        with a placeholder parameter replaced by the named groups."""
        self._executor: Callable[[], Any] | None = None
        # The device state last read or loaded; a loaded state dict not yet written.
        self._ipu: dict[str, Any] = {"ipu_state": None, "ipu_param": None}
        self._loaded: dict[str, Any] | None = None
        self._ipu_dirty = False
        # The previous layout of a read (named weights), and the device state it is of.
        self._legacy: dict[str, Any] | None = None
        self._cache_of: Any = None
        named, params = _named(params)
        self._named = named
        torch_args = _accepted(torch_init, given)
        if not named:
            torch_init(self, params, **torch_args)
            return
        placeholder = [torch.zeros(1, requires_grad=True)] if torch is not None else []
        torch_init(self, placeholder, **torch_args)
        if params is None or isinstance(params, str) or not isinstance(params[0], Mapping):
            groups = [{"params": params}]
        else:
            groups = [dict(g) for g in params]
        self.param_groups = [
            {**self.defaults, **g, "params": _patterns(g.get("params"))} for g in groups
        ]

    def _finish_init(self, given: dict[str, Any]) -> None:
        self.variable_attrs = VariableAttributes(list(given), [*self.defaults, *self._child_vars])

    def _set_group_default(self, key: str, value: Any) -> None:
        """A PopTorch attribute parameter groups may set (velocity scaling, LAMB's maximum
        weight norm)."""
        self.defaults[key] = value
        for group in self.param_groups:
            group.setdefault(key, value)

    # ---- torch's API -----------------------------------------------------------------------

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch (the device computes the gradients; nothing to clear for named weights)."""
        if not self._named:
            super().zero_grad(set_to_none)  # type: ignore[misc]

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """torch's step on the host parameters (a no-op unless ``backward`` ran on the
        host): a ``trainingModel`` updates its weights on the device in every call."""
        if self._named:
            return closure() if closure is not None else None
        return super().step(closure)  # type: ignore[misc]

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state.get("_named"):  # torch's would walk the groups' (named) parameters
            self.__dict__.update(state)
        else:
            super().__setstate__(state)  # type: ignore[misc]

    def __getstate__(self) -> dict[str, Any]:
        if self.__dict__.get("_named"):
            state = {
                k: v
                for k, v in self.__dict__.items()
                if not getattr(v, "_wrapped_by_lr_sched", False)  # an LR scheduler's wrapper
            }
        elif isinstance(self, _TORCH_OPTIMIZER) and torch is not None:
            state = _TORCH_OPTIMIZER.__getstate__(self)
            own = {k: v for k, v in self.__dict__.items() if k in _OWN_KEYS}
            state = {**state, **own}
        else:
            state = dict(self.__dict__)
        state.update(_executor=None, _cache_of=None)
        return state

    # ---- the device's state ----------------------------------------------------------------

    def _set_executor(self, executor: Any) -> None:
        self._executor = weakref.ref(executor) if executor is not None else None
        if executor is not None:
            mark_stepped(self)

    def _linked(self) -> Any:
        return self._executor() if self._executor is not None else None

    def has_state(self) -> bool:
        """Whether the optimiser holds device state (read back, or loaded)."""
        return self._ipu.get("ipu_state") is not None and self._ipu.get("ipu_param") is not None

    @property
    def _pending_state(self) -> dict[str, Any] | None:
        """Loaded state not yet written to the device."""
        return self._loaded if self._ipu_dirty else None

    @_pending_state.setter
    def _pending_state(self, value: Any) -> None:
        if value is None:
            self._ipu_dirty = False

    def state_dict(self) -> dict[str, Any]:
        """``{"ipu_state": ..., "ipu_param": ..., **torch's state_dict()}``, the device's
        state read back if it changed since the last read (named weights: with the
        previous layout ``{"state": {weight: {slot: array}}, "step": n, ...}`` too)."""
        executor = self._linked()
        if executor is not None:  # the executor reads the device if it holds the state
            ipu, legacy = executor._read_optimizer_state(self)
        else:
            ipu, legacy = dict(self._ipu), self._legacy_layout(self._legacy)
        if self._named:
            return {**legacy, **ipu}
        return {**ipu, **_TORCH_OPTIMIZER.state_dict(self)}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()``: hyper-parameters (torch's part, so LR schedulers
        resume) and the device state, written to the device now if a compiled model uses
        this optimiser, else when one is compiled with it."""
        if not state_dict:
            raise RuntimeError(EMPTY_STATE_MSG)
        if self._named:
            self._load_named(state_dict)
        else:
            _TORCH_OPTIMIZER.load_state_dict(self, state_dict)
            if not ("ipu_state" in state_dict and "ipu_param" in state_dict):
                raise RuntimeError(NOT_IPU_STATE_MSG)
        self._keep_loaded(state_dict)
        executor = self._linked()
        if executor is not None:  # written now if a compiled model uses this optimiser
            executor._write_loaded_optimizer_state(self)

    def _keep_loaded(self, state_dict: Mapping[str, Any]) -> None:
        """Hold ``state_dict`` as the optimiser's state, to be written to the device."""
        self._loaded = dict(state_dict)
        if state_dict.get("ipu_state") is not None or not self._named:
            self._ipu = {
                "ipu_state": state_dict.get("ipu_state"),
                "ipu_param": state_dict.get("ipu_param"),
            }
        self._legacy = None
        self._cache_of = None
        self._ipu_dirty = True

    def _legacy_layout(self, device: dict[str, Any] | None) -> dict[str, Any]:
        """The previous layout of named-weight optimisers (hyper-parameters, then the
        state); empty for optimisers of torch parameters."""
        if not self._named:
            return {}
        groups = [dict(g) for g in self.param_groups]
        globals_ = {
            k: getattr(self, k) for k in ("loss_scaling", "max_grad_norm") if hasattr(self, k)
        }
        return {
            "param_groups": groups,
            "optimizer": globals_,
            "state": {},
            "step": 0,
            **(device or {}),
        }

    def _load_named(self, state_dict: Mapping[str, Any]) -> None:
        for group, saved in zip(self.param_groups, state_dict.get("param_groups", [])):
            group.update({k: v for k, v in saved.items() if k != "params"})
        for key, value in state_dict.get("optimizer", {}).items():
            setattr(self, key, value)


# Instance attributes PopTorch's optimisers keep besides torch's (saved by pickling/copy).
_OWN_KEYS = {
    "_executor",
    "_legacy",
    "_cache_of",
    "_named",
    "_ipu",
    "_loaded",
    "_ipu_dirty",
    "variable_attrs",
    "loss_scaling",
    "velocity_scaling",
    "use_combined_accum",
    "accum_type",
    "velocity_accum_type",
    "first_order_momentum_accum_type",
    "second_order_momentum_accum_type",
    "max_grad_norm",
    "bias_correction",
    "use_tf_variant",
    "max_weight_norm",
}


def mark_stepped(opt: Any) -> None:
    """A training model steps ``opt`` on the device at every call: torch's LR schedulers
    must not warn that ``optimizer.step()`` was never called."""
    opt._opt_called = True


def _accum_types(opt: Any, given: dict[str, Any], *names: str) -> None:
    for name in names:
        setattr(opt, name, _user_dtype(given.get(name)))


def _max_grad_norm(value: float | None) -> float:
    return float("inf") if value is None else float(value)


_SGD_DEFAULTS = {"lr": 1e-3, "momentum": 0, "dampening": 0, "weight_decay": 0, "nesterov": False}
_ADAM_DEFAULTS = {
    "lr": 1e-3,
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "weight_decay": 0,
    "amsgrad": False,
}
_RMSPROP_DEFAULTS = {
    "lr": 1e-2,
    "alpha": 0.99,
    "eps": 1e-8,
    "weight_decay": 0,
    "momentum": 0,
    "centered": False,
}


class SGD(Optimizer, _torch_base("SGD", _SGD_DEFAULTS)):  # type: ignore[misc]
    """Stochastic gradient descent with optional momentum (``torch.optim.SGD``), loss
    scaling and velocity scaling.

    ``use_combined_accum=False`` (default): the separate variant, whose velocity scaling
    is the loss scaling; ``True``: the combined variant, with its own ``velocity_scaling``
    (a per-group attribute). The result is the same; only the stored velocity's magnitude
    differs. ``accum_type`` is the gradient accumulators' type, ``velocity_accum_type`` the
    velocity's; ``max_grad_norm`` clips the global gradient norm.
    """

    _child_only = (
        "loss_scaling",
        "velocity_scaling",
        "use_combined_accum",
        "accum_type",
        "velocity_accum_type",
        "max_grad_norm",
    )
    _group_vars = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "velocity_scaling")

    def __init__(
        self,
        params: Any = None,
        lr: float | None = None,
        momentum: float | None = None,
        dampening: float | None = None,
        weight_decay: float | None = None,
        nesterov: bool | None = None,
        maximize: bool | None = None,
        foreach: bool | None = None,
        differentiable: bool | None = None,
        loss_scaling: float | None = None,
        velocity_scaling: float | None = None,
        use_combined_accum: bool | None = None,
        accum_type: Any = None,
        velocity_accum_type: Any = None,
        max_grad_norm: float | None = None,
    ) -> None:
        given = _given(locals())
        self._poptorch_init(params, given, _torch_init(SGD))
        self.loss_scaling = 1.0 if loss_scaling is None else loss_scaling
        self.use_combined_accum = bool(use_combined_accum)
        if use_combined_accum:
            vs = 1.0 if velocity_scaling is None else velocity_scaling
            self._set_group_default("velocity_scaling", vs)
        elif velocity_scaling is not None:
            from .._log import logger  # noqa: PLC0415

            logger.warning(
                "velocity_scaling is ignored by the separate SGD variant "
                "(use_combined_accum=False), whose velocity scaling is the loss scaling."
            )
        _accum_types(self, given, "accum_type", "velocity_accum_type")
        self.max_grad_norm = _max_grad_norm(max_grad_norm)
        self._finish_init(given)


class Adam(Optimizer, _torch_base("Adam", _ADAM_DEFAULTS)):  # type: ignore[misc]
    """Adam (``torch.optim.Adam``) with loss scaling, accumulation types and gradient
    clipping. ``amsgrad=True`` is refused when a model is built with it (as PopTorch)."""

    _child_only = (
        "loss_scaling",
        "accum_type",
        "first_order_momentum_accum_type",
        "second_order_momentum_accum_type",
        "max_grad_norm",
    )
    _group_vars = ("lr", "betas", "eps", "weight_decay", "amsgrad")

    def __init__(
        self,
        params: Any = None,
        lr: float | None = None,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        amsgrad: bool | None = None,
        foreach: bool | None = None,
        maximize: bool | None = None,
        capturable: bool | None = None,
        differentiable: bool | None = None,
        fused: bool | None = None,
        loss_scaling: float | None = None,
        accum_type: Any = None,
        first_order_momentum_accum_type: Any = None,
        second_order_momentum_accum_type: Any = None,
        max_grad_norm: float | None = None,
    ) -> None:
        given = _given(locals())
        self._poptorch_init(params, given, _torch_init(Adam))
        _adam_attributes(self, given, loss_scaling, max_grad_norm)


def _adam_attributes(opt: Any, given: dict, loss_scaling: Any, max_grad_norm: Any) -> None:
    opt.loss_scaling = 1.0 if loss_scaling is None else loss_scaling
    _accum_types(
        opt,
        given,
        "accum_type",
        "first_order_momentum_accum_type",
        "second_order_momentum_accum_type",
    )
    opt.max_grad_norm = _max_grad_norm(max_grad_norm)
    opt._finish_init(given)


class AdamW(Optimizer, _torch_base("AdamW", {**_ADAM_DEFAULTS, "weight_decay": 1e-2})):  # type: ignore[misc]
    """AdamW (``torch.optim.AdamW``: decoupled weight decay) with loss scaling,
    accumulation types and gradient clipping; ``bias_correction=False`` drops Adam's bias
    correction."""

    _child_only = (
        "loss_scaling",
        "bias_correction",
        "accum_type",
        "first_order_momentum_accum_type",
        "second_order_momentum_accum_type",
        "max_grad_norm",
    )
    _group_vars = ("lr", "betas", "weight_decay", "eps", "amsgrad")

    def __init__(
        self,
        params: Any = None,
        lr: float | None = None,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        amsgrad: bool | None = None,
        maximize: bool | None = None,
        foreach: bool | None = None,
        capturable: bool | None = None,
        differentiable: bool | None = None,
        fused: bool | None = None,
        loss_scaling: float | None = None,
        bias_correction: bool | None = None,
        accum_type: Any = None,
        first_order_momentum_accum_type: Any = None,
        second_order_momentum_accum_type: Any = None,
        max_grad_norm: float | None = None,
    ) -> None:
        given = _given(locals())
        self._poptorch_init(params, given, _torch_init(AdamW))
        self.bias_correction = True if bias_correction is None else bool(bias_correction)
        _adam_attributes(self, given, loss_scaling, max_grad_norm)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """torch's AdamW step on the host parameters (without the bias correction if
        ``bias_correction=False``, as the device runs it)."""
        if self._named or self.bias_correction or torch is None:
            return super().step(closure)
        loss = closure() if closure is not None else None
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        self._host_update(p, group)
        return loss

    def _host_update(self, p: Any, group: dict) -> None:
        state = self.state[p]
        if not state:
            state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        state["step"] += 1
        b1, b2 = group["betas"]
        g = -p.grad if group.get("maximize", False) else p.grad
        p.mul_(1 - group["lr"] * group["weight_decay"])
        state["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
        state["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = state["exp_avg_sq"].sqrt().add_(group["eps"])
        p.addcdiv_(state["exp_avg"], denom, value=-group["lr"])


class RMSprop(Optimizer, _torch_base("RMSprop", _RMSPROP_DEFAULTS)):  # type: ignore[misc]
    """RMSprop (``torch.optim.RMSprop``) with loss scaling and accumulation types.

    ``use_tf_variant=True`` follows TensorFlow instead: the mean square starts at ones,
    ``eps`` is added inside the square root and the momentum buffer accumulates the
    learning rate times the step.
    """

    _child_only = (
        "loss_scaling",
        "accum_type",
        "first_order_momentum_accum_type",
        "second_order_momentum_accum_type",
        "use_tf_variant",
    )
    _group_vars = ("lr", "momentum", "weight_decay", "alpha", "eps", "centered")

    def __init__(
        self,
        params: Any = None,
        lr: float | None = None,
        alpha: float | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        momentum: float | None = None,
        centered: bool | None = None,
        foreach: bool | None = None,
        maximize: bool | None = None,
        differentiable: bool | None = None,
        loss_scaling: float | None = None,
        accum_type: Any = None,
        first_order_momentum_accum_type: Any = None,
        second_order_momentum_accum_type: Any = None,
        use_tf_variant: bool | None = None,
        max_grad_norm: float | None = None,
    ) -> None:
        given = _given(locals())
        self._poptorch_init(params, given, _torch_init(RMSprop))
        self.use_tf_variant = bool(use_tf_variant)
        _adam_attributes(self, given, loss_scaling, max_grad_norm)


RMSProp = RMSprop


class LAMB(Optimizer, _TORCH_OPTIMIZER):
    """LAMB (Layer-wise Adaptive Moments, https://arxiv.org/abs/1904.00962): Adam's ratio
    plus decoupled weight decay, scaled per weight by the trust ratio
    ``min(||w||, max_weight_norm) / ||ratio||``; ``bias_correction=False`` drops Adam's
    bias correction, ``max_weight_norm=None`` the clamp. ``step()`` runs it on the host
    parameters' gradients (as PopTorch's ``LAMB.step``)."""

    _child_only = (
        "loss_scaling",
        "bias_correction",
        "accum_type",
        "first_order_momentum_accum_type",
        "second_order_momentum_accum_type",
    )
    _group_vars = ("lr", "weight_decay", "betas", "eps", "max_weight_norm")

    def __init__(
        self,
        params: Any = None,
        lr: float | None = None,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        bias_correction: bool | None = None,
        loss_scaling: float | None = None,
        max_weight_norm: float | None = None,
        accum_type: Any = None,
        first_order_momentum_accum_type: Any = None,
        second_order_momentum_accum_type: Any = None,
        max_grad_norm: float | None = None,
    ) -> None:
        given = _given(locals())
        defaults = {
            "lr": 1e-3 if lr is None else lr,
            "betas": (0.9, 0.999) if betas is None else tuple(betas),
            "eps": 1e-8 if eps is None else eps,
            "weight_decay": 1e-2 if weight_decay is None else weight_decay,
            "max_weight_norm": 65500.0 if max_weight_norm is None else max_weight_norm,
        }

        def torch_init(opt: Any, params: Any) -> None:
            _TORCH_OPTIMIZER.__init__(opt, params, defaults)

        self._poptorch_init(params, {}, torch_init)
        self.bias_correction = True if bias_correction is None else bool(bias_correction)
        self.max_weight_norm = defaults["max_weight_norm"]
        _adam_attributes(self, given, loss_scaling, max_grad_norm)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One LAMB step on the host parameters that have a gradient."""
        loss = closure() if closure is not None else None
        if self._named or torch is None:
            return loss
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        self._host_update(p, group)
        return loss

    def _host_update(self, p: Any, group: dict) -> None:
        state = self.state[p]
        if not state:
            state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        state["step"] += 1
        t = state["step"]
        b1, b2 = group["betas"]
        g = p.grad
        state["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
        state["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        if self.bias_correction:
            m, v = m / (1 - b1**t), v / (1 - b2**t)
        ratio = m / (v.sqrt() + group["eps"]) + group["weight_decay"] * p
        w_norm = min(float(p.norm()), float(group["max_weight_norm"]))
        r_norm = float(ratio.norm())
        trust = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0
        p.sub_(ratio, alpha=group["lr"] * trust)


def _torch_init(cls: type) -> Callable[..., None]:
    """The ``__init__`` of ``cls``'s torch base (its second base class)."""
    base: type[Any] = cls.__bases__[1]
    return base.__init__


class _Binding:
    """Base of ``_optim_link.Bound``: a torch model's optimiser bound to its weight names,
    which is what the executor of a torch model trains with."""


# What ``trainingModel``'s executor accepts as its optimiser.
OPTIMIZERS: tuple[type, ...] = (Optimizer, _Binding)

__all__ = ["VariableAttributes", "Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "RMSProp", "LAMB"]
