"""``poptorch.optim``: SGD, Adam, AdamW, RMSprop and LAMB as explicit update graphs.

An optimiser here is a description: hyper-parameters per parameter group, loss scaling,
accumulation types, and which attributes are *variable* (stored as device variables that
``setOptimizer`` rewrites without recompiling) or *constant* (baked into the program).
``trainingModel`` asks it to add the update of every weight to the program
(``build_step``); the optimiser state lives in ordinary variables named
``optim.<param>.<slot>`` that ``state_dict()`` reads back and ``load_state_dict()`` writes.

Parameter groups: ``params`` is ``None`` (every weight), a list of weight names or glob
patterns, or a list of dicts ``{"params": [...patterns], "lr": ...}`` as in PyTorch. Weight
names are those of ``executor.state_dict()`` (e.g. ``"fc1.weight"``).

Update rules follow ``torch.optim`` (gradients are first divided by ``loss_scaling`` and
clipped to ``max_grad_norm``); see each class.
"""

from __future__ import annotations

import contextlib
import contextvars
import fnmatch
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

import popxl
from popxl import ops

CONSTANT_CHANGED_MSG = (
    "Attribute {attr!r} of {cls} was constant when the model was compiled (value {old}), so "
    "it cannot become {new}. Mark it variable before compiling "
    "(optimizer.variable_attrs.markAsVariable({attr!r})) or pass it to the constructor."
)
UNKNOWN_ATTR_MSG = "{cls} has no attribute {attr!r}; its attributes are: {allowed}."
AMSGRAD_MSG = (
    "{cls}(amsgrad=True) is not supported (PopTorch did not support it either); use amsgrad=False."
)
GROUP_MATCH_MSG = (
    "Parameter group {i} (params={patterns!r}) matches no weight of the model. Weight names: "
    "{names}."
)
OTHER_OPTIMIZER_MSG = (
    "setOptimizer got a {new}, but the model was compiled with a {old}. The optimiser type is "
    "part of the program; build a new trainingModel to change it."
)
GROUP_COUNT_MSG = (
    "setOptimizer got {new} parameter groups but the model was compiled with {old}; the "
    "groups are part of the program."
)
DTYPE_MSG = "Accumulation type must be float32 or float16 (or None), got {got!r}."

_DTYPES = {
    "float": popxl.float32,
    "float32": popxl.float32,
    "half": popxl.float16,
    "float16": popxl.float16,
}


def as_dtype(value: Any) -> popxl.dtype | None:
    """An accumulation type from a popxl/NumPy/torch dtype or its name; ``None`` stays."""
    if value is None:
        return None
    if isinstance(value, popxl.dtype):
        return value
    text = str(getattr(value, "name", value)).lower().replace("torch.", "")
    if text not in _DTYPES:
        try:
            text = np.dtype(value).name
        except TypeError:
            raise ValueError(DTYPE_MSG.format(got=value)) from None
    if text not in _DTYPES:
        raise ValueError(DTYPE_MSG.format(got=value))
    return _DTYPES[text]


class VariableAttributes:
    """Which attributes are variables (updatable by ``setOptimizer``) or constants.

    >>> attrs = VariableAttributes(["lr"], ["lr", "momentum"])
    >>> attrs.isConstant("momentum"), attrs.isConstant("lr")
    (True, False)
    """

    def __init__(self, variable_attributes: Iterable[str], allowed_attributes: Iterable[str]):
        self._allowed = list(allowed_attributes)
        self._variable = set(variable_attributes) & set(self._allowed)

    def _check(self, attr: str) -> None:
        if attr not in self._allowed:
            raise ValueError(
                UNKNOWN_ATTR_MSG.format(cls="optimizer", attr=attr, allowed=self._allowed)
            )

    def isConstant(self, attr: str) -> bool:  # noqa: N802
        self._check(attr)
        return attr not in self._variable

    def markAsConstant(self, attr: str) -> None:  # noqa: N802
        self._check(attr)
        self._variable.discard(attr)

    def markAsVariable(self, attr: str) -> None:  # noqa: N802
        self._check(attr)
        self._variable.add(attr)


Hyper = Any  # a Python float (constant) or a scalar float32 popxl tensor (variable)


class Optimizer:
    """Base class: parameter groups, attributes, state and the program's update step."""

    # Per-group attributes and their defaults; subclasses extend.
    group_defaults: dict[str, Any] = {"lr": 0.01, "weight_decay": 0.0}
    # Attributes of the whole optimiser (same for every group).
    global_defaults: dict[str, Any] = {"loss_scaling": 1.0, "max_grad_norm": float("inf")}
    # Attributes that are always variable whatever was passed.
    always_variable: tuple[str, ...] = ("lr",)
    # Optimiser state slots: name -> attribute holding its dtype.
    slots: dict[str, str] = {}

    def __init__(self, params: Any = None, **kwargs: Any) -> None:
        passed = {k: v for k, v in kwargs.items() if v is not None}
        self.accum_type = as_dtype(passed.pop("accum_type", None)) or popxl.float32
        self._dtypes = {
            key: as_dtype(passed.pop(key, None)) or popxl.float32
            for key in set(self.slots.values())
        }
        allowed = [*self.group_defaults, *self.global_defaults]
        for key in passed:
            if key not in allowed:
                raise ValueError(
                    UNKNOWN_ATTR_MSG.format(cls=type(self).__name__, attr=key, allowed=allowed)
                )
        self.defaults = {k: passed.get(k, v) for k, v in self.group_defaults.items()}
        for key, default in self.global_defaults.items():
            setattr(self, key, passed.get(key, default))
        self.param_groups = _param_groups(params, self.defaults)
        variable = set(passed) | set(self.always_variable)
        for group in self.param_groups[1:] if len(self.param_groups) > 1 else []:
            variable |= {k for k in group if k != "params"}
        self.variable_attrs = VariableAttributes(variable, allowed)
        self._executor: Callable[[], Any] | None = None
        self._pending_state: dict[str, Any] | None = None

    # ---- attributes --------------------------------------------------------------------

    def attributes(self, group: int) -> dict[str, float]:
        """Every attribute's value for parameter group ``group``."""
        values = {k: self.param_groups[group][k] for k in self.group_defaults}
        values.update({k: getattr(self, k) for k in self.global_defaults})
        return {k: float(v) for k, v in values.items()}

    # ---- state --------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_executor"] = None
        return state

    def _link(self, executor: Any) -> None:
        self._executor = weakref.ref(executor)

    def _linked(self) -> Any:
        return self._executor() if self._executor is not None else None

    def state_dict(self) -> dict[str, Any]:
        """Hyper-parameters and (after training) the optimiser state read from the device.

        ``{"state": {weight: {slot: array}}, "step": n, "param_groups": [...],
        "optimizer": {...}}``; the layout differs from PyTorch's, as in PopTorch.
        """
        executor = self._linked()
        state = executor._optimizer_state() if executor is not None else {}
        groups = [{k: v for k, v in g.items()} for g in self.param_groups]
        result = {
            "param_groups": groups,
            "optimizer": {k: getattr(self, k) for k in self.global_defaults},
            "state": state.get("state", {}),
            "step": state.get("step", 0),
        }
        if "loss_scaling" in state:  # automatic loss scaling: the running scale
            result["loss_scaling"] = state["loss_scaling"]
            result["good_steps"] = state["good_steps"]
        return result

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore hyper-parameters and optimiser state (written to the device if a model
        uses this optimiser, otherwise when one is built with it)."""
        for group, saved in zip(self.param_groups, state_dict.get("param_groups", [])):
            group.update({k: v for k, v in saved.items() if k != "params"})
        for key, value in state_dict.get("optimizer", {}).items():
            setattr(self, key, value)
        executor = self._linked()
        if executor is not None:
            executor._load_optimizer_state(state_dict)
        else:
            self._pending_state = dict(state_dict)

    # ---- program building ---------------------------------------------------------------

    def active_slots(self) -> list[str]:
        """The state slots this configuration needs (one variable per weight each)."""
        return list(self.slots)

    def dtype_of(self, slot: str) -> popxl.dtype:
        return self._dtypes[self.slots[slot]]

    def update(
        self, w: popxl.Tensor, g: popxl.Tensor, state: dict[str, Any], h: dict, t: Any
    ) -> popxl.Tensor:
        """The new weight (float32) from weight ``w`` and gradient ``g`` (float32),
        updating ``state`` in place. ``h`` holds the hyper-parameters, ``t`` the 1-based
        step number (a float32 scalar tensor)."""
        raise TypeError(f"{type(self).__name__} defines no update rule.")


def _param_groups(params: Any, defaults: dict[str, Any]) -> list[dict[str, Any]]:
    if params is None:
        return [{"params": None, **defaults}]
    items = list(params)
    if items and all(isinstance(p, Mapping) for p in items):
        return [{**defaults, **dict(p), "params": _patterns(p.get("params"))} for p in items]
    return [{"params": _patterns(items), **defaults}]


def _patterns(params: Any) -> list[str] | None:
    if params is None:
        return None
    if isinstance(params, str):
        return [params]
    return [str(p) for p in params]


def group_of_each(optimizer: Optimizer, names: list[str]) -> dict[str, int]:
    """Weight name -> index of the first parameter group whose patterns match it; weights
    no group names belong to the group with ``params=None`` if any, else to no group
    (they are not trained)."""
    result: dict[str, int] = {}
    catch_all = None
    for i, group in enumerate(optimizer.param_groups):
        patterns = group["params"]
        if patterns is None:
            catch_all = i if catch_all is None else catch_all
            continue
        hits = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        if not hits:
            raise ValueError(GROUP_MATCH_MSG.format(i=i, patterns=patterns, names=names))
        for n in hits:
            result.setdefault(n, i)
    if catch_all is not None:
        for n in names:
            result.setdefault(n, catch_all)
    return result


def _f32(x: Hyper) -> popxl.Tensor:
    if isinstance(x, popxl.Tensor):
        return x
    return popxl.constant(np.float32(x), popxl.float32)


_NORM_GROUP: contextvars.ContextVar[popxl.ReplicaGrouping | None] = contextvars.ContextVar(
    "poptorch_norm_group", default=None
)


@contextlib.contextmanager
def sharded_update(group: popxl.ReplicaGrouping | None) -> Iterator[None]:
    """Within: ``update`` sees replica shards of ``group`` (``None``: whole tensors), so
    whole-tensor sums (LAMB's norms) add up the shards of every replica of the group."""
    token = _NORM_GROUP.set(group)
    try:
        yield
    finally:
        _NORM_GROUP.reset(token)


def whole_sum(t: popxl.Tensor) -> popxl.Tensor:
    """The sum of every element of the whole tensor ``t`` (a shard in ``sharded_update``)."""
    total = ops.sum(t)
    group = _NORM_GROUP.get()
    if group is None:
        return total
    return ops.collectives.replicated_all_reduce(total, "add", group)


def _write(slot: popxl.Tensor, value: popxl.Tensor) -> None:
    ops.var_updates.copy_var_update_(slot, value)


def _read(slot: popxl.Tensor) -> popxl.Tensor:
    return slot if slot.dtype == popxl.float32 else ops.cast(slot, popxl.float32)


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, dampening, Nesterov and weight decay.

    With ``d = g + weight_decay * w``: ``v = d`` on the first step, then
    ``v = momentum * v + (1 - dampening) * d``; the step is ``d + momentum * v``
    (Nesterov) or ``v``, and ``w -= lr * step`` (``torch.optim.SGD``). The velocity is
    stored multiplied by ``velocity_scaling`` (the combined variant's scaling; the result
    is the same, only the stored magnitude changes).
    """

    group_defaults = {
        "lr": 0.01,
        "momentum": 0.0,
        "dampening": 0.0,
        "weight_decay": 0.0,
        "nesterov": False,
        "velocity_scaling": 1.0,
    }
    slots = {"momentum_buffer": "velocity_accum_type"}

    def __init__(
        self,
        params: Any = None,
        lr: float = 0.01,
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
        if maximize:
            raise ValueError("SGD(maximize=True) is not supported; negate the loss instead.")
        self.use_combined_accum = bool(use_combined_accum)
        super().__init__(
            params,
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            loss_scaling=loss_scaling,
            velocity_scaling=velocity_scaling,
            accum_type=accum_type,
            velocity_accum_type=velocity_accum_type,
            max_grad_norm=max_grad_norm,
        )
        nest = self.param_groups[0]["nesterov"]
        if nest and (self.defaults["momentum"] <= 0 or self.defaults["dampening"] != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening.")

    def active_slots(self) -> list[str]:
        return ["momentum_buffer"] if _uses(self, "momentum") else []

    def update(self, w: Any, g: Any, state: dict, h: dict, t: Any) -> popxl.Tensor:
        d = g + w * h["weight_decay"] if _nonzero(h["weight_decay"]) else g
        if "momentum_buffer" not in state:
            return w - d * h["lr"]
        scale = _f32(h["velocity_scaling"])
        first = ops.cast(ops.equal(t, popxl.constant(np.float32(1.0))), popxl.float32)
        keep = _f32(h["momentum"]) * (1.0 - first)
        new = (1.0 - _f32(h["dampening"])) * (1.0 - first) + first
        v = _read(state["momentum_buffer"]) * keep + d * (new * scale)
        _write(state["momentum_buffer"], v)
        v = v / scale
        step = d + v * h["momentum"] if self.param_groups[0]["nesterov"] else v
        return w - step * h["lr"]


def _uses(opt: Optimizer, attr: str) -> bool:
    """Whether ``attr`` can be non-zero at run time (set, or variable)."""
    return not opt.variable_attrs.isConstant(attr) or any(g[attr] for g in opt.param_groups)


def _nonzero(x: Hyper) -> bool:
    return isinstance(x, popxl.Tensor) or float(x) != 0.0


class Adam(Optimizer):
    """Adam (``torch.optim.Adam``): L2 weight decay added to the gradient, bias-corrected
    moments, ``w -= lr * m_hat / (sqrt(v_hat) + eps)``."""

    group_defaults = {
        "lr": 0.001,
        "beta1": 0.9,
        "beta2": 0.999,
        "eps": 1e-8,
        "weight_decay": 0.0,
    }
    slots = {
        "exp_avg": "first_order_momentum_accum_type",
        "exp_avg_sq": "second_order_momentum_accum_type",
    }
    decoupled = False
    bias_correction = True

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
        bias_correction: bool | None = None,
    ) -> None:
        if amsgrad:
            raise ValueError(AMSGRAD_MSG.format(cls=type(self).__name__))
        if maximize:
            raise ValueError(f"{type(self).__name__}(maximize=True) is not supported.")
        if bias_correction is not None:
            self.bias_correction = bool(bias_correction)
        b1, b2 = betas if betas is not None else (None, None)
        super().__init__(
            params,
            lr=lr,
            beta1=b1,
            beta2=b2,
            eps=eps,
            weight_decay=weight_decay,
            loss_scaling=loss_scaling,
            accum_type=accum_type,
            first_order_momentum_accum_type=first_order_momentum_accum_type,
            second_order_momentum_accum_type=second_order_momentum_accum_type,
            max_grad_norm=max_grad_norm,
        )

    @property
    def betas(self) -> tuple[float, float]:
        return (self.defaults["beta1"], self.defaults["beta2"])

    def _moments(self, g: Any, state: dict, h: dict, t: Any) -> tuple[Any, Any]:
        b1, b2 = _f32(h["beta1"]), _f32(h["beta2"])
        m = _read(state["exp_avg"]) * b1 + g * (1.0 - b1)
        v = _read(state["exp_avg_sq"]) * b2 + g * g * (1.0 - b2)
        _write(state["exp_avg"], m)
        _write(state["exp_avg_sq"], v)
        if self.bias_correction:
            m = m / (1.0 - ops.pow(b1, t))
            v = v / (1.0 - ops.pow(b2, t))
        return m, v

    def update(self, w: Any, g: Any, state: dict, h: dict, t: Any) -> popxl.Tensor:
        wd = h["weight_decay"]
        if _nonzero(wd) and not self.decoupled:
            g = g + w * wd
        m, v = self._moments(g, state, h, t)
        if _nonzero(wd) and self.decoupled:
            w = w - w * (_f32(h["lr"]) * wd)
        return w - m / (ops.sqrt(v) + h["eps"]) * h["lr"]


class AdamW(Adam):
    """AdamW (``torch.optim.AdamW``): decoupled weight decay ``w -= lr * wd * w`` (default
    0.01), then the Adam step; ``bias_correction=False`` drops the bias correction."""

    group_defaults = {**Adam.group_defaults, "weight_decay": 0.01}
    decoupled = True


class RMSprop(Optimizer):
    """RMSprop (``torch.optim.RMSprop``): ``v = alpha v + (1-alpha) g^2``; centered
    subtracts the squared mean gradient; with momentum a buffer ``b = momentum b +
    g / (sqrt(v) + eps)``. ``use_tf_variant`` puts ``eps`` inside the square root."""

    group_defaults = {
        "lr": 0.01,
        "alpha": 0.99,
        "eps": 1e-8,
        "weight_decay": 0.0,
        "momentum": 0.0,
    }
    slots = {
        "square_avg": "second_order_momentum_accum_type",
        "momentum_buffer": "first_order_momentum_accum_type",
        "grad_avg": "first_order_momentum_accum_type",
    }

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
        if maximize:
            raise ValueError("RMSprop(maximize=True) is not supported.")
        self.centered = bool(centered)
        self.use_tf_variant = bool(use_tf_variant)
        super().__init__(
            params,
            lr=lr,
            alpha=alpha,
            eps=eps,
            weight_decay=weight_decay,
            momentum=momentum,
            loss_scaling=loss_scaling,
            accum_type=accum_type,
            first_order_momentum_accum_type=first_order_momentum_accum_type,
            second_order_momentum_accum_type=second_order_momentum_accum_type,
            max_grad_norm=max_grad_norm,
        )

    def active_slots(self) -> list[str]:
        slots = ["square_avg"] + (["grad_avg"] if self.centered else [])
        return slots + (["momentum_buffer"] if _uses(self, "momentum") else [])

    def update(self, w: Any, g: Any, state: dict, h: dict, t: Any) -> popxl.Tensor:
        if _nonzero(h["weight_decay"]):
            g = g + w * h["weight_decay"]
        a = _f32(h["alpha"])
        v = _read(state["square_avg"]) * a + g * g * (1.0 - a)
        _write(state["square_avg"], v)
        if self.centered:
            ga = _read(state["grad_avg"]) * a + g * (1.0 - a)
            _write(state["grad_avg"], ga)
            v = v - ga * ga
        denom = ops.sqrt(v + h["eps"]) if self.use_tf_variant else ops.sqrt(v) + h["eps"]
        step = g / denom
        if "momentum_buffer" not in state:
            return w - step * h["lr"]
        buf = _read(state["momentum_buffer"]) * h["momentum"] + step
        _write(state["momentum_buffer"], buf)
        return w - buf * h["lr"]


RMSProp = RMSprop


class LAMB(Adam):
    """LAMB: Adam's bias-corrected ratio plus decoupled weight decay ``r = m_hat /
    (sqrt(v_hat) + eps) + wd * w``, scaled by the trust ratio ``min(||w||, max_weight_norm)
    / ||r||`` (1 when either norm is 0): ``w -= lr * ratio * r``."""

    group_defaults = {**Adam.group_defaults, "weight_decay": 1e-2, "max_weight_norm": 65500.0}

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
        self._max_weight_norm = max_weight_norm
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            loss_scaling=loss_scaling,
            accum_type=accum_type,
            first_order_momentum_accum_type=first_order_momentum_accum_type,
            second_order_momentum_accum_type=second_order_momentum_accum_type,
            max_grad_norm=max_grad_norm,
            bias_correction=bias_correction,
        )
        if max_weight_norm is not None:
            for group in self.param_groups:
                group["max_weight_norm"] = float(max_weight_norm)
            self.defaults["max_weight_norm"] = float(max_weight_norm)
            self.variable_attrs.markAsVariable("max_weight_norm")

    def update(self, w: Any, g: Any, state: dict, h: dict, t: Any) -> popxl.Tensor:
        m, v = self._moments(g, state, h, t)
        r = m / (ops.sqrt(v) + h["eps"])
        if _nonzero(h["weight_decay"]):
            r = r + w * h["weight_decay"]
        w_norm = ops.sqrt(whole_sum(w * w))
        w_norm = _min(w_norm, _f32(h["max_weight_norm"]))
        r_norm = ops.sqrt(whole_sum(r * r))
        zero = popxl.constant(np.float32(0.0))
        valid = ops.logical_and(ops.greater(w_norm, zero), ops.greater(r_norm, zero))
        safe = ops.maximum(r_norm, popxl.constant(np.float32(1e-30)))
        ratio = ops.where(valid, w_norm / safe, popxl.constant(np.float32(1.0)))
        return w - r * (ratio * h["lr"])


def _min(a: popxl.Tensor, b: popxl.Tensor) -> popxl.Tensor:
    return ops.where(ops.greater(a, b), b, a)


OPTIMIZERS = (SGD, Adam, AdamW, RMSprop, LAMB)

__all__ = ["VariableAttributes", "Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "RMSProp", "LAMB"]
