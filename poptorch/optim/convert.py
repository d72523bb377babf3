"""Read a ``poptorch.optim`` or ``torch.optim`` optimiser into the program's ``Spec``.

PopTorch's rules, kept here:

* The optimiser type: SGD (``SGD1`` combined, ``SGD2`` separate), Adam, AdamW (with or
  without bias correction), RMSprop (centered or not), LAMB (with or without bias
  correction). Other optimisers are refused; subclasses get a warning (their Python code
  does not run).
* Constant or variable: for ``poptorch.optim`` optimisers, ``variable_attrs`` decides
  (attributes passed to the constructor are variable); for ``torch.optim`` optimisers an
  attribute left at torch's default value is constant (``alpha``, ``betas`` and
  ``nesterov`` always are) and ``lr`` is always variable. Automatic loss scaling makes
  the loss scaling variable.
* The separate SGD variant has no velocity scaling of its own (PopTorch logged its loss
  scaling as its velocity scaling; its velocity is kept unscaled here).
* Attributes the optimiser (or a group) gains after it was first read are ignored with a
  warning, once (``Options.relaxOptimizerAttributesChecks`` turns it into a debug message).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .._log import logger
from . import optimizers as optim
from . import rules
from .rules import Pair, Spec

try:
    import torch
except ImportError:
    torch = None  # type: ignore[assignment]

UNKNOWN_OPTIMIZER_MSG = (
    "Unsupported optimizer type {got}: use poptorch.optim (SGD, Adam, AdamW, RMSprop, LAMB) or "
    "torch.optim.SGD, Adam, AdamW or RMSprop."
)
FOREIGN_PARAM_MSG = (
    "The optimizer holds a parameter of shape {shape} that is not a parameter of the model "
    "being trained. Build the optimizer from model.parameters()."
)
TENSOR_PARAMS_MSG = (
    "The optimizer's parameter groups hold torch parameters, but the model is a "
    "popxl_addons Module whose weights are named: build the optimizer with params=None "
    "(every weight) or lists of weight names / glob patterns."
)
CENTERED_MSG = (
    "All parameter groups of RMSprop must have the same value of 'centered' (group 0: "
    "{first}, group {i}: {other})."
)
NUMBER_MSG = "Expected a number for the optimizer attribute {name!r}, but got {value!r}."
NAN_MSG = "max_grad_norm (the maximum norm of the gradients) must not be NaN."
SUBCLASS_MSG = (
    "Optimizer `{name}` is a subclass of a poptorch.optim or torch.optim optimizer. Poptorch "
    "does not run Python optimizer code directly: the program implements the built-in "
    "optimizer, so the subclass's own behaviour has no effect (only its attributes do)."
)

# The torch name of each attribute whose constness ``variable_attrs`` tracks.
_TORCH_NAME = {"beta1": "betas", "beta2": "betas"}


def _is(x: float, ref: float) -> bool:
    return x == ref


# torch.optim optimisers: whether a value is a constant (left at torch's default).
_NATIVE_CONST = {
    "lr": lambda v: False,
    "momentum": lambda v: _is(v, 0.0),
    "dampening": lambda v: _is(v, 0.0),
    "velocity_scaling": lambda v: _is(v, 1.0),
    "eps": lambda v: _is(v, 1e-8),
    "max_weight_norm": lambda v: _is(v, 65500.0),
    "alpha": lambda v: True,
    "nesterov": lambda v: True,
    "beta1": lambda v: True,
    "beta2": lambda v: True,
}


def _classes() -> list[tuple[str, tuple[type, ...]]]:
    """(family, classes) in the order they are tested: AdamW before Adam (torch's AdamW
    may subclass its Adam)."""

    def both(name: str) -> tuple[type, ...]:
        ours = getattr(optim, name)
        return (ours, getattr(torch.optim, name)) if torch is not None else (ours,)

    return [
        ("LAMB", (optim.LAMB,)),
        ("SGD", both("SGD")),
        ("AdamW", both("AdamW")),
        ("Adam", both("Adam")),
        ("RMSprop", both("RMSprop")),
    ]


def kind_of(opt: Any) -> str:
    """PopTorch's optimiser type of ``opt``."""
    family = next((f for f, classes in _classes() if isinstance(opt, classes)), None)
    if family is None:
        raise TypeError(UNKNOWN_OPTIMIZER_MSG.format(got=type(opt).__name__))
    if family == "SGD":
        return "SGD1" if getattr(opt, "use_combined_accum", False) else "SGD2"
    if family == "AdamW":
        return "ADAMW" if getattr(opt, "bias_correction", True) else "ADAMW_NO_BIAS"
    if family == "Adam":
        return "ADAM"
    if family == "LAMB":
        return "LAMB" if getattr(opt, "bias_correction", True) else "LAMB_NO_BIAS"
    centered = [bool(g.get("centered", False)) for g in opt.param_groups]
    for i, c in enumerate(centered):
        if c != centered[0]:
            raise ValueError(CENTERED_MSG.format(first=centered[0], i=i, other=c))
    return "RMSPROP_CENTERED" if centered and centered[0] else "RMSPROP"


def is_subclassed(opt: Any) -> bool:
    """A user's subclass of a supported optimiser (not one of torch's or PopTorch's own
    classes). An unsupported optimiser (``torch.optim.Adagrad``) is not one: it is refused
    by ``kind_of``."""
    classes = [c for _, group in _classes() for c in group]
    return isinstance(opt, tuple(classes)) and type(opt) not in classes


def warn_if_subclassed(opt: Any) -> None:
    if is_subclassed(opt):
        logger.warning(SUBCLASS_MSG.format(name=type(opt).__name__))


def _number(value: Any, name: str) -> float:
    if torch is not None and isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, bool):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(NUMBER_MSG.format(name=name, value=value)) from None


def _value(group: Mapping[str, Any], attr: str, kind: str) -> float:
    if attr in ("beta1", "beta2"):
        betas = group["betas"]
        return _number(betas[0 if attr == "beta1" else 1], "betas")
    if attr == "velocity_scaling":
        return _number(group.get(attr, 1.0), attr)
    if attr == "max_weight_norm":
        value = group.get(attr)
        return 65500.0 if value is None else _number(value, attr)
    if attr == "maximize":
        return float(bool(group.get("maximize", False)))
    if attr == "decoupled":
        decoupled = kind.startswith("ADAMW") or bool(group.get("decoupled_weight_decay", False))
        return float(decoupled)
    return _number(group[attr], attr)


def _const(opt: Any, attr: str, value: float, kind: str) -> bool:
    attrs = getattr(opt, "variable_attrs", None)
    if attrs is not None:
        return attrs.isConstant(_TORCH_NAME.get(attr, attr))
    if attr == "weight_decay":
        return value == (1e-2 if kind.startswith("ADAMW") else 0.0)
    return _NATIVE_CONST[attr](value)


def _pairs(opt: Any, group: Mapping[str, Any], rule: rules.Rule, kind: str) -> dict[str, Pair]:
    pairs: dict[str, Pair] = {}
    for attr in rule.attrs:
        value = _value(group, attr, kind)
        pairs[attr] = (value, _const(opt, attr, value, kind))
    for attr in rule.internal:
        pairs[attr] = (_value(group, attr, kind), True)
    return pairs


def _check_amsgrad(opt: Any) -> None:
    for group in [opt.defaults, *opt.param_groups]:
        if group.get("amsgrad", False):
            raise ValueError(optim.AMSGRAD_MSG.format(cls=type(opt).__name__))


def _group_params(opt: Any, names_by_id: dict[int, str] | None) -> tuple[list, bool]:
    """Each group's weights: names or patterns (named weights), or the torch
    parameters' names in the model."""
    if getattr(opt, "_named", False):
        return [g["params"] for g in opt.param_groups], False
    if names_by_id is None:
        raise TypeError(TENSOR_PARAMS_MSG)
    params = []
    for group in opt.param_groups:
        names = []
        for p in group["params"]:
            if id(p) not in names_by_id:
                raise ValueError(FOREIGN_PARAM_MSG.format(shape=tuple(p.shape)))
            names.append(names_by_id[id(p)])
        params.append(names)
    return params, True


def to_spec(opt: Any, names_by_id: dict[int, str] | None, auto_loss_scaling: bool) -> Spec:
    """``opt`` as the program sees it (see the module docstring for the rules)."""
    kind = kind_of(opt)
    if kind.startswith("ADAM"):
        _check_amsgrad(opt)
    rule = rules.rule_for(
        kind,
        centered=kind == "RMSPROP_CENTERED",
        tf_variant=bool(getattr(opt, "use_tf_variant", False)) and kind.startswith("RMSPROP"),
    )
    attrs = getattr(opt, "variable_attrs", None)
    if attrs is not None and auto_loss_scaling:
        attrs.markAsVariable("loss_scaling")
    ls_value = _number(getattr(opt, "loss_scaling", 1.0), "loss_scaling")
    if attrs is not None:
        ls_const = attrs.isConstant("loss_scaling")
    else:
        ls_const = ls_value == 1.0
    loss_scaling = (ls_value, ls_const and not auto_loss_scaling)
    defaults = _pairs(opt, opt.defaults, rule, kind)
    groups = [_pairs(opt, g, rule, kind) for g in opt.param_groups]
    if kind == "SGD2":  # the separate variant has no velocity scaling of its own
        for pairs in [defaults, *groups]:
            pairs["velocity_scaling"] = (1.0, True)
    params, exact = _group_params(opt, names_by_id)
    max_grad_norm = _number(getattr(opt, "max_grad_norm", math.inf), "max_grad_norm")
    if math.isnan(max_grad_norm):
        raise ValueError(NAN_MSG)
    second = "velocity_accum_type" if rule.family == "SGD" else "first_order_momentum_accum_type"
    return Spec(
        kind=kind,
        rule=rule,
        defaults=defaults,
        groups=groups,
        params=params,
        exact=exact,
        loss_scaling=loss_scaling,
        max_grad_norm=max_grad_norm,
        accum_type=optim.as_dtype(getattr(opt, "accum_type", None)) or rules.popxl.float32,
        first_order_type=optim.as_dtype(getattr(opt, second, None)) or rules.popxl.float32,
        second_order_type=optim.as_dtype(getattr(opt, "second_order_momentum_accum_type", None))
        or rules.popxl.float32,
        use_tf_variant=rule.family == "RMSprop" and bool(getattr(opt, "use_tf_variant", False)),
        source=type(opt).__name__,
    )


class AttrTracker:
    """PopTorch's check of optimiser attributes: those present when the optimiser is first
    read are expected; any added later is reported once (it has no effect)."""

    _IGNORED = ("defaults", "state", "param_groups", "variable_attrs")

    def __init__(self) -> None:
        self.group_attrs: list[str] | None = None
        self.optim_attrs: list[str] = []
        self.printed: set[str] = set()

    @classmethod
    def _optimizer_attrs(cls, opt: Any) -> list[str]:
        names = []
        for key, value in vars(opt).items():
            if key in cls._IGNORED or key.startswith("_"):
                continue
            if getattr(value, "_wrapped_by_lr_sched", False):
                continue  # an LR scheduler's wrapper of step()
            names.append(key)
        return names

    def check(self, opt: Any, kind: str, relax: bool) -> None:
        default_keys = list(opt.defaults)
        opt_keys = self._optimizer_attrs(opt)
        group_keys = [[k for k in g if k != "params"] for g in opt.param_groups]
        if self.group_attrs is None:
            seen = list(dict.fromkeys(default_keys + [k for g in group_keys for k in g]))
            self.group_attrs, self.optim_attrs = seen, opt_keys
            return
        self._report(default_keys, self.group_attrs, "default group variable", kind, relax)
        self._report(opt_keys, self.optim_attrs, "optimizer attribute", kind, relax)
        for i, keys in enumerate(group_keys):
            self._report(keys, self.group_attrs, f"group {i} attribute", kind, relax)

    def _report(self, keys: list[str], expected: list[str], what: str, kind: str, relax: bool):
        extra = [k for k in keys if k not in expected]
        if not extra:
            return
        message = f"Ignoring unexpected {what} in {kind} optimizer: {extra}"
        if message not in self.printed:
            self.printed.add(message)
            (logger.debug if relax else logger.warning)(message)
