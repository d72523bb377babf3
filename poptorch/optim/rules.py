"""What the program's optimiser step computes: a ``Spec`` (the compiled description of an
optimiser) and the update rule of each optimiser kind.

The public optimisers (``poptorch.optim``, ``torch.optim``) are read into a ``Spec`` by
``_optim_convert``; ``_program._Trainer`` builds the step from it. A ``Spec`` holds, per
parameter group, every hyper-parameter as a pair ``(value, is_const)``: constants are baked
into the program, variables are scalar float32 variables of the program (one per weight, as
PopART's "specific" optimiser tensors) that ``setOptimizer`` and ``load_state_dict`` rewrite.

Update rules follow ``torch.optim`` step for step (gradients arrive unscaled, reduced and
clipped); each gets the weight ``w`` and gradient ``g`` as float32 tensors, its state slots
(read and written in place), its hyper-parameters ``h`` (Python floats for constants,
float32 scalar tensors for variables) and ``t``, the 1-based step number.
"""

from __future__ import annotations

import contextlib
import contextvars
import fnmatch
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import popxl
from popxl import ops

Pair = tuple[float, bool]  # (value, is_const)
Hyper = Any  # a Python float (constant) or a scalar float32 popxl tensor (variable)

GROUP_MATCH_MSG = (
    "Parameter group {i} (params={patterns!r}) matches no weight of the model. Weight names: "
    "{names}."
)

# PopART's names of the hyper-parameters (the keys of ``state_dict()["ipu_param"]``).
POPART_NAMES = {
    "lr": "learningRate",
    "weight_decay": "weightDecay",
    "momentum": "momentum",
    "dampening": "dampening",
    "velocity_scaling": "velocityScaling",
    "nesterov": "nesterov",
    "beta1": "beta1",
    "beta2": "beta2",
    "eps": "eps",
    "alpha": "alpha",
    "max_weight_norm": "maxWeightNorm",
    "loss_scaling": "lossScaling",
}
# Optimiser state slots and PopART's prefixes for them (``state_dict()["ipu_state"]``).
SLOT_PREFIXES = {
    "SGD": {"momentum_buffer": "Accl___"},
    "Adam": {"exp_avg": "Accl1___", "exp_avg_sq": "Accl2___"},
    "LAMB": {"exp_avg": "Accl1___", "exp_avg_sq": "Accl2___"},
    "RMSprop": {"square_avg": "Accl1___", "grad_avg": "Accl2___", "momentum_buffer": "Accl3___"},
}
LOSS_SCALING_VAR = "lossScaling_FLOAT"
UPDATE_FACTOR_VAR = "lossScaleUpdateFactor"
STEP_VAR = "optim.step"
GOOD_STEPS_VAR = "optim.good_steps"


def specific_name(attr: str, weight: str) -> str:
    """The program variable (and ``ipu_param`` key) of ``attr`` for one weight."""
    return f"{POPART_NAMES[attr]}___specific___{weight}"


# ---- the rules -------------------------------------------------------------------------------


def _f32(x: Hyper) -> popxl.Tensor:
    if isinstance(x, popxl.Tensor):
        return x
    return popxl.constant(np.float32(x), popxl.float32)


def _nonzero(x: Hyper) -> bool:
    """Whether ``x`` may be non-zero when the program runs."""
    return isinstance(x, popxl.Tensor) or float(x) != 0.0


def _is_one(x: Hyper) -> Any:
    """``x == 1`` as a float (0./1.), or a float32 tensor for a variable."""
    if isinstance(x, popxl.Tensor):
        return ops.cast(ops.equal(x, popxl.constant(np.float32(1.0))), popxl.float32)
    return 1.0 if float(x) == 1.0 else 0.0


def _write(slot: popxl.Tensor, value: popxl.Tensor) -> None:
    ops.var_updates.copy_var_update_(slot, value)


def _read(slot: popxl.Tensor) -> popxl.Tensor:
    return slot if slot.dtype == popxl.float32 else ops.cast(slot, popxl.float32)


def _min(a: popxl.Tensor, b: popxl.Tensor) -> popxl.Tensor:
    return ops.where(ops.greater(a, b), b, a)


_NORM_GROUP: contextvars.ContextVar[popxl.ReplicaGrouping | None] = contextvars.ContextVar(
    "poptorch_norm_group", default=None
)


@contextlib.contextmanager
def sharded_update(group: popxl.ReplicaGrouping | None) -> Iterator[None]:
    """Within: rules see replica shards of ``group`` (``None``: whole tensors), so
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


class Rule:
    """An update rule: its hyper-parameters, state slots and the update itself."""

    family = ""
    # Hyper-parameters the log and ``ipu_param`` show (torch's names); ``internal`` ones
    # (flags of torch's API) are always constant and never shown.
    attrs: tuple[str, ...] = ()
    internal: tuple[str, ...] = ("maximize",)

    def slots(self, h: dict[str, Pair]) -> list[str]:
        """The state slots one weight with hyper-parameters ``h`` needs."""
        return list(SLOT_PREFIXES[self.family])

    def initial(self, slot: str) -> float:
        """The initial value of every element of ``slot``."""
        return 0.0

    def update(self, w: Any, g: Any, state: dict, h: dict, t: Any) -> popxl.Tensor:
        raise NotImplementedError


def _signed(g: Any, h: dict) -> Any:
    """``maximize``: torch steps along the gradient instead of against it."""
    return -g if h.get("maximize", 0.0) else g


class SGDRule(Rule):
    """``torch.optim.SGD``. With ``d = g + weight_decay * w``: the velocity is ``d`` on the
    first step (and whenever momentum is 0), then ``momentum * v + (1 - dampening) * d``;
    the step is ``d + momentum * v`` (Nesterov) or ``v``, ``w -= lr * step``. The velocity
    is stored multiplied by ``velocity_scaling`` (only its stored magnitude changes)."""

    family = "SGD"
    attrs = ("lr", "weight_decay", "momentum", "dampening", "velocity_scaling", "nesterov")

    def slots(self, h: dict[str, Pair]) -> list[str]:
        value, const = h["momentum"]
        return [] if const and value == 0.0 else ["momentum_buffer"]

    def update(self, w: Any, g: Any, state: dict, h: dict, t: Any) -> popxl.Tensor:
        g = _signed(g, h)
        d = g + w * h["weight_decay"] if _nonzero(h["weight_decay"]) else g
        if "momentum_buffer" not in state:
            return w - d * h["lr"]
        momentum = h["momentum"]
        first = _is_one(t)
        if isinstance(momentum, popxl.Tensor):
            zero = ops.cast(ops.equal(momentum, popxl.constant(np.float32(0.0))), popxl.float32)
            first = ops.maximum(first, zero)
        elif float(momentum) == 0.0:
            first = 1.0
        keep = _f32(momentum) * (1.0 - first)
        new = (1.0 - _f32(h["dampening"])) * (1.0 - first) + first
        scale = _f32(h["velocity_scaling"])
        v = _read(state["momentum_buffer"]) * keep + d * (new * scale)
        _write(state["momentum_buffer"], v)
        v = v / scale
        if _nonzero(h["nesterov"]):
            v = v + (d + v * momentum - v) * h["nesterov"]
        return w - v * h["lr"]


class AdamRule(Rule):
    """``torch.optim.Adam`` / ``AdamW``: L2 weight decay added to the gradient (Adam) or
    decoupled ``w -= lr * weight_decay * w`` (AdamW, or Adam's ``decoupled_weight_decay``),
    moments with optional bias correction, ``w -= lr * m_hat / (sqrt(v_hat) + eps)``."""

    family = "Adam"
    attrs: tuple[str, ...] = ("lr", "weight_decay", "beta1", "beta2", "eps")
    internal: tuple[str, ...] = ("maximize", "decoupled")

    def __init__(self, bias_correction: bool = True) -> None:
        self.bias_correction = bias_correction

    def moments(self, g: Any, state: dict, h: dict, t: Any) -> tuple[Any, Any]:
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
        g = _signed(g, h)
        wd = h["weight_decay"]
        decoupled = bool(h.get("decoupled", 0.0))
        if _nonzero(wd) and not decoupled:
            g = g + w * wd
        m, v = self.moments(g, state, h, t)
        if _nonzero(wd) and decoupled:
            w = w - w * (_f32(h["lr"]) * wd)
        return w - m / (ops.sqrt(v) + h["eps"]) * h["lr"]


class RMSpropRule(Rule):
    """``torch.optim.RMSprop``: ``v = alpha v + (1 - alpha) g^2`` (minus the squared mean
    gradient when centered), ``step = g / (sqrt(v) + eps)``, with momentum a buffer
    ``b = momentum b + step``; ``w -= lr * b``. The TensorFlow variant starts ``v`` at
    ones, puts ``eps`` inside the square root and accumulates ``lr * step`` in the
    momentum buffer."""

    family = "RMSprop"
    attrs = ("lr", "weight_decay", "alpha", "momentum", "eps")

    def __init__(self, centered: bool = False, tf_variant: bool = False) -> None:
        self.centered = centered
        self.tf_variant = tf_variant

    def slots(self, h: dict[str, Pair]) -> list[str]:
        value, const = h["momentum"]
        slots = ["square_avg"] + (["grad_avg"] if self.centered else [])
        return slots + ([] if const and value == 0.0 else ["momentum_buffer"])

    def initial(self, slot: str) -> float:
        return 1.0 if slot == "square_avg" and self.tf_variant else 0.0

    def update(self, w: Any, g: Any, state: dict, h: dict, t: Any) -> popxl.Tensor:
        g = _signed(g, h)
        if _nonzero(h["weight_decay"]):
            g = g + w * h["weight_decay"]
        a = _f32(h["alpha"])
        v = _read(state["square_avg"]) * a + g * g * (1.0 - a)
        _write(state["square_avg"], v)
        if self.centered:
            mean = _read(state["grad_avg"]) * a + g * (1.0 - a)
            _write(state["grad_avg"], mean)
            v = v - mean * mean
        denom = ops.sqrt(v + h["eps"]) if self.tf_variant else ops.sqrt(v) + h["eps"]
        step = g / denom
        if "momentum_buffer" not in state:
            return w - step * h["lr"]
        if self.tf_variant:
            buf = _read(state["momentum_buffer"]) * h["momentum"] + step * h["lr"]
            _write(state["momentum_buffer"], buf)
            return w - buf
        buf = _read(state["momentum_buffer"]) * h["momentum"] + step
        _write(state["momentum_buffer"], buf)
        return w - buf * h["lr"]


class LAMBRule(AdamRule):
    """LAMB: Adam's (optionally bias-corrected) ratio plus decoupled weight decay
    ``r = m_hat / (sqrt(v_hat) + eps) + wd * w``, scaled by the trust ratio
    ``min(||w||, max_weight_norm) / ||r||`` (1 when either norm is 0): ``w -= lr * ratio * r``."""

    family = "LAMB"
    attrs = ("lr", "weight_decay", "beta1", "beta2", "eps", "max_weight_norm")
    internal = ()

    def update(self, w: Any, g: Any, state: dict, h: dict, t: Any) -> popxl.Tensor:
        m, v = self.moments(g, state, h, t)
        r = m / (ops.sqrt(v) + h["eps"])
        if _nonzero(h["weight_decay"]):
            r = r + w * h["weight_decay"]
        w_norm = _min(ops.sqrt(whole_sum(w * w)), _f32(h["max_weight_norm"]))
        r_norm = ops.sqrt(whole_sum(r * r))
        zero = popxl.constant(np.float32(0.0))
        valid = ops.logical_and(ops.greater(w_norm, zero), ops.greater(r_norm, zero))
        safe = ops.maximum(r_norm, popxl.constant(np.float32(1e-30)))
        ratio = ops.where(valid, w_norm / safe, popxl.constant(np.float32(1.0)))
        return w - r * (ratio * h["lr"])


# ---- the compiled description ----------------------------------------------------------------


@dataclass
class Spec:
    """An optimiser as the program sees it.

    ``kind`` is PopTorch's optimiser type (``SGD1`` combined / ``SGD2`` separate SGD,
    ``ADAM``, ``ADAMW``, ``ADAMW_NO_BIAS``, ``RMSPROP``, ``RMSPROP_CENTERED``, ``LAMB``,
    ``LAMB_NO_BIAS``): changing it needs a new program. ``params[i]`` names group ``i``'s
    weights: exact names (``exact``, torch models) or glob patterns (``None``: every weight
    no other group names).
    """

    kind: str
    rule: Rule
    defaults: dict[str, Pair]
    groups: list[dict[str, Pair]]
    params: list[list[str] | None]
    exact: bool = False
    loss_scaling: Pair = (1.0, True)
    max_grad_norm: float = float("inf")
    accum_type: popxl.dtype = popxl.float32
    first_order_type: popxl.dtype = popxl.float32
    second_order_type: popxl.dtype = popxl.float32
    use_tf_variant: bool = False
    source: str = ""  # the optimiser's class name, for messages
    extra: dict[str, Any] = field(default_factory=dict)

    def slot_dtype(self, slot: str) -> popxl.dtype:
        second = {"exp_avg_sq", "square_avg"}
        if self.rule.family == "SGD" or slot not in second:
            return self.first_order_type
        return self.second_order_type

    def key(self) -> tuple:
        """Equal keys: nothing to upload to the device (PopTorch's optimiser dictionary)."""
        return (
            self.kind,
            tuple(sorted(self.defaults.items())),
            tuple(tuple(sorted(g.items())) for g in self.groups),
            self.loss_scaling,
            self.max_grad_norm,
            self.accum_type,
            self.first_order_type,
            self.second_order_type,
            self.use_tf_variant,
        )

    # ---- PopART's debug text of the optimiser -------------------------------------------

    def _shown(self, values: dict[str, Pair], default: bool) -> dict[str, Pair]:
        """PopART's attribute map: group attributes (``default`` + name for the defaults,
        with the loss scaling); the separate SGD variant uses the loss scaling as its
        velocity scaling."""
        shown: dict[str, Pair] = {}
        for attr in self.rule.attrs:
            pair = values[attr]
            if attr == "velocity_scaling" and self.kind == "SGD2":
                pair = self.loss_scaling
            name = POPART_NAMES[attr]
            if default and attr != "nesterov":
                name = "default" + name[0].upper() + name[1:]
            shown[name] = pair
        if default:
            shown["lossScaling"] = self.loss_scaling
        return shown

    def describe(self, group: int | None) -> str:
        """``SGD2, defaultDampening=0 (const), ...``: the defaults (``group=None``) or
        one group, as PopTorch logged them."""
        values = self.defaults if group is None else self.groups[group]
        text = [self.kind]
        for name, (value, const) in sorted(self._shown(values, group is None).items()):
            text.append(f"{name}={_cpp_float(value)}" + (" (const)" if const else ""))
        text.append(f"accumType={self.accum_type.name}")
        text.append(f"firstOrderMomentumAccumType={self.first_order_type.name}")
        text.append(f"secondOrderMomentumAccumType={self.second_order_type.name}")
        text.append(f"useTfVariant={int(self.use_tf_variant)}")
        text.append(f"maxGradNorm={_cpp_float(self.max_grad_norm)}")
        return ", ".join(text)


def _cpp_float(value: float) -> str:
    """A float as C++ streams print it (6 significant digits)."""
    return f"{np.float32(value):g}"


def group_of_each(spec: Spec, names: list[str]) -> dict[str, int]:
    """Weight name -> its parameter group: the first group naming it (exactly, or by glob
    pattern); weights no group names belong to the group with ``params=None`` if any,
    else to none (they are not trained). A group of patterns matching nothing is an error;
    a group of exact names may hold parameters the program does not train."""
    result: dict[str, int] = {}
    catch_all = None
    for i, patterns in enumerate(spec.params):
        if patterns is None:
            catch_all = i if catch_all is None else catch_all
            continue
        if spec.exact:
            hits = [n for n in patterns if n in names]
        else:
            hits = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
            if not hits:
                raise ValueError(GROUP_MATCH_MSG.format(i=i, patterns=patterns, names=names))
        for n in hits:
            result.setdefault(n, i)
    if catch_all is not None:
        for n in names:
            result.setdefault(n, catch_all)
    return result


def rule_for(kind: str, centered: bool = False, tf_variant: bool = False) -> Rule:
    """The update rule of PopTorch optimiser type ``kind``."""
    if kind in ("SGD1", "SGD2"):
        return SGDRule()
    if kind in ("ADAM", "ADAMW", "ADAMW_NO_BIAS"):
        return AdamRule(bias_correction=kind != "ADAMW_NO_BIAS")
    if kind in ("LAMB", "LAMB_NO_BIAS"):
        return LAMBRule(bias_correction=kind == "LAMB")
    return RMSpropRule(centered=centered, tf_variant=tf_variant)
