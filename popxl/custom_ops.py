"""Custom ops written in Python: one registry for popxl, popxl-addons and PopTorch.

In PopXL and PopTorch a custom op was C++ (PopART ``Op``/``Opx`` subclasses compiled into
a shared library for the IPU). Here a custom op is a JAX function, registered once under
its name, domain and version with its typed attributes and, optionally, its gradient and
shape inference:

>>> import jax.numpy as jnp
>>> import popxl
>>> from popxl import custom_ops
>>> @custom_ops.register("Scale", domain="doc.example", attributes={"factor": 2.0})
... def scale(x, *, factor):
...     return x * factor
>>> ir = popxl.Ir()
>>> with ir.main_graph:
...     y = scale(popxl.constant([1.0, 2.0]), factor=3.0)
>>> y.shape, ir.main_graph._ops[-1].type
((2,), 'Scale')
>>> custom_ops.unregister("Scale", domain="doc.example")

The op is then an ordinary op of the IR: printed under its name in schedules and DOT
output, differentiated by ``popxl.transforms.autodiff`` (``jax.vjp`` of the function, or
the registered ``vjp``), part of the compiled step's cache key, replicated and placed on
IPUs like any other. PopTorch reaches the same entries with ``poptorch.custom_op(inputs,
name, domain, domain_version, example_outputs, attributes)`` and, for ``torch.library``
ops, ``poptorch.lower_torch_op``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import _op
from ._custom_attrs import REQUIRED, Attribute, AttributeKind, declare, resolve
from .dtypes import dtype as DType
from .errors import InternalError
from .ops._base import jax, record
from .tensor import Tensor
from .tensor_spec import TensorSpec

__all__ = [
    "REQUIRED",
    "Attribute",
    "AttributeKind",
    "CustomOp",
    "call",
    "get",
    "register",
    "registered",
    "unregister",
]

DEFAULT_DOMAIN = "custom.ops"

NOT_FOUND_MSG = (
    "No custom op {name!r} in domain {domain!r}, version {version} is registered. "
    "Registered custom ops (domain::name:version): {listing}. Register it with "
    "popxl.custom_ops.register(name, impl, domain=..., version=...) before building the "
    "program."
)
TWICE_MSG = (
    "A custom op {name!r} in domain {domain!r}, version {version} is already registered "
    "(by {owner}). Use another version, or pass replace=True to redefine it."
)
INFER_MSG = (
    "custom op {op}: shape inference returned {got!r}; it must return a popxl.TensorSpec "
    "(or a list of them), one per output."
)
VJP_COUNT_MSG = (
    "custom op {op}: the vjp returned {got} gradients for {want} inputs; return one per "
    "input (None for inputs without a gradient)."
)

Key = tuple[str, str, int]
_REGISTRY: dict[Key, CustomOp] = {}


class CustomOp:
    """A registered custom op. Call it on popxl tensors to record it in the current graph:
    ``op(x, y, alpha=0.1)`` returns one tensor, or a tuple when the op has several outputs.

    Attributes:
        name, domain, version: its identity (``name`` is the type printed in schedules).
        attributes: the declared attributes by name (``Attribute``: kind and default).
        impl: ``impl(*arrays, **attributes) -> array | tuple``: the JAX implementation.
        vjp: ``vjp(inputs, outputs, cotangents, **attributes) -> gradients`` or None (then
            the gradient is JAX's own derivative of ``impl``).
        opdef: the op kind this op is recorded as in the IR.
    """

    def __init__(
        self,
        name: str,
        impl: Callable[..., Any],
        domain: str,
        version: int,
        attributes: Mapping[str, Any],
        infer: Callable[..., Any] | None,
        vjp: Callable[..., Any] | None,
        nondiff_inputs: Sequence[int],
    ) -> None:
        self.name, self.domain, self.version = name, domain, version
        self.impl, self.vjp, self._infer = impl, vjp, infer
        self.attributes = {k: declare(self.qualname, k, v) for k, v in attributes.items()}
        self.nondiff_inputs = tuple(nondiff_inputs)
        self.opdef = _op.define(
            self.op_key,
            name,
            self._infer_specs,
            self.lower,
            nondiff_inputs=self.nondiff_inputs,
            doc=impl.__doc__ or "",
        )
        functools.update_wrapper(self, impl, updated=())

    # -- identity -----------------------------------------------------------------------

    @property
    def key(self) -> Key:
        return (self.domain, self.name, self.version)

    @property
    def qualname(self) -> str:
        return f"{self.domain}::{self.name}:{self.version}"

    @property
    def op_key(self) -> str:
        return f"custom::{self.qualname}"

    def __repr__(self) -> str:
        return f"CustomOp({self.qualname})"

    # -- building -----------------------------------------------------------------------

    def __call__(self, *inputs: Tensor, **attributes: Any) -> Any:
        outs = self.apply(inputs, attributes)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def apply(
        self,
        inputs: Sequence[Tensor],
        attributes: Mapping[str, Any] | None = None,
        names: Sequence[str] | None = None,
    ) -> list[Tensor]:
        """Record the op on ``inputs`` in the current graph; returns its outputs.

        Raises:
            TypeError: an attribute value of the wrong kind, or an input that is no tensor.
            ValueError: an unknown or missing attribute, or inputs of another graph.
        """
        attrs = self.check_attributes(attributes or {})
        named = {f"input{i}": t for i, t in enumerate(inputs)}
        default_names = [f"{self.name}_out{i}" for i in range(8)]
        return record(self.opdef, named, attrs, list(names or default_names))

    def check_attributes(self, attributes: Mapping[str, Any]) -> dict[str, Any]:
        """The full attribute values of a call (defaults filled in), checked by kind."""
        return resolve(self.qualname, self.attributes, attributes)

    def infer(self, specs: Sequence[TensorSpec], attributes: Mapping[str, Any]) -> list[TensorSpec]:
        """The output specs for inputs of ``specs`` (attributes already checked)."""
        return self._infer_specs(*specs, **attributes)

    def _infer_specs(self, *specs: TensorSpec, **attrs: Any) -> list[TensorSpec]:
        if self._infer is not None:
            got = self._infer(*specs, **attrs)
            outs = [got] if isinstance(got, TensorSpec) else list(got)
            if not all(isinstance(s, TensorSpec) for s in outs):
                raise TypeError(INFER_MSG.format(op=self.qualname, got=got))
            return outs
        key = tuple((s.shape, s.dtype.name) for s in specs)
        return list(_eval_shape(self, key, tuple(sorted(attrs.items()))))

    # -- lowering -----------------------------------------------------------------------

    def lower(self, *arrays: Any, **attrs: Any) -> Any:
        """The op's JAX lowering (also usable directly on JAX arrays)."""
        if self.vjp is None:
            return _tupled(self.impl(*arrays, **attrs))
        return _with_vjp(self, tuple(sorted(attrs.items())))(*arrays)


def _tupled(result: Any) -> Any:
    return tuple(result) if isinstance(result, list) else result


@functools.lru_cache(maxsize=4096)
def _eval_shape(op: CustomOp, specs: tuple, attrs: tuple) -> tuple[TensorSpec, ...]:
    """Shape inference by tracing ``impl`` abstractly (cached per input specs)."""
    args = [jax.ShapeDtypeStruct(shape, DType.from_name(dt).as_numpy()) for shape, dt in specs]
    out = jax.eval_shape(lambda *a: op.impl(*a, **dict(attrs)), *args)
    leaves = out if isinstance(out, (tuple, list)) else (out,)
    return tuple(TensorSpec(tuple(o.shape), DType.as_dtype(o.dtype)) for o in leaves)


@functools.lru_cache(maxsize=1024)
def _with_vjp(op: CustomOp, attrs_items: tuple) -> Callable[..., Any]:
    """``impl`` with the registered gradient (a ``jax.custom_vjp`` per attribute set)."""
    attrs = dict(attrs_items)

    @jax.custom_vjp
    def fn(*xs: Any) -> Any:
        return _tupled(op.impl(*xs, **attrs))

    def fwd(*xs: Any) -> tuple:
        out = fn(*xs)
        return out, (xs, out)

    def bwd(res: tuple, cts: Any) -> tuple:
        xs, out = res
        vjp = op.vjp
        if vjp is None:
            raise InternalError(f"custom op {op.name} has no gradient but was lowered with one")
        grads = vjp(xs, out, cts, **attrs)
        if not isinstance(grads, (tuple, list)):
            grads = (grads,)
        if len(grads) != len(xs):
            raise ValueError(VJP_COUNT_MSG.format(op=op.qualname, got=len(grads), want=len(xs)))
        return tuple(_grad_or_zero(g, x, op.qualname, i) for i, (g, x) in enumerate(zip(grads, xs)))

    fn.defvjp(fwd, bwd)
    return fn


GRAD_SHAPE_MSG = (
    "custom op {op}: the vjp's gradient for input {index} has shape {got}, which is neither "
    "the input's shape {want} nor a shape the input broadcasts to. Return a gradient of the "
    "input's shape."
)


def _grad_or_zero(g: Any, x: Any, op: str, index: int) -> Any:
    """The gradient the vjp returned for input ``x``: zeros for None (and float0 for integer
    inputs); a gradient of a broadcast shape is summed back to the input's shape."""
    jnp = jax.numpy
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        import numpy as np  # noqa: PLC0415

        return np.zeros(x.shape, jax.dtypes.float0)
    if g is None:
        return jnp.zeros_like(x)
    g = jnp.asarray(g, x.dtype)
    if g.shape == x.shape:
        return g
    if g.size == x.size:
        return g.reshape(x.shape)
    lead = g.ndim - x.ndim
    padded = (1,) * lead + tuple(x.shape)
    if lead < 0 or any(p not in (1, d) for p, d in zip(padded, g.shape)):
        raise ValueError(GRAD_SHAPE_MSG.format(op=op, index=index, got=g.shape, want=x.shape))
    axes = tuple(i for i, (p, d) in enumerate(zip(padded, g.shape)) if p == 1 and d != 1)
    return g.sum(axis=axes, keepdims=True).reshape(x.shape) if axes else g.reshape(x.shape)


# The registry -------------------------------------------------------------------------------


def register(
    name: str,
    impl: Callable[..., Any] | None = None,
    *,
    domain: str = DEFAULT_DOMAIN,
    version: int = 1,
    attributes: Mapping[str, Any] | None = None,
    infer: Callable[..., Any] | None = None,
    vjp: Callable[..., Any] | None = None,
    nondiff_inputs: Sequence[int] = (),
    replace: bool = False,
) -> Any:
    """Register the custom op ``domain::name`` version ``version``, implemented by ``impl``.

    Use it as a decorator (``@register("Cube", domain="com.acme")``) or call it with
    ``impl``. Returns the ``CustomOp``.

    Args:
        name: the op's type name (printed in schedules, used by ``poptorch.custom_op``).
        impl: ``impl(*arrays, **attributes)``: JAX arrays in, one array or a tuple out.
        domain, version: with ``name``, the op's identity (PopART's ``OperatorIdentifier``).
        attributes: the typed attributes by name. Each is an ``Attribute(kind, default)``,
            a kind (``"Float"``, ``"Floats"``, ``"Int"``, ``"Ints"``, ``"String"``,
            ``"Strings"``), a type (``float``, ``int``, ``str``, ``[float]`` ...), or a
            default value whose type gives the kind. Values are checked when the op is
            built into a program.
        infer: ``infer(*input_specs, **attributes) -> TensorSpec | [TensorSpec]``; by
            default ``jax.eval_shape`` of ``impl`` (cached per input shapes).
        vjp: ``vjp(inputs, outputs, cotangents, **attributes) -> gradient per input`` (a
            tuple, or one array for a one-input op; ``None`` for no gradient). ``inputs`` is
            a tuple; ``outputs``/``cotangents`` are arrays for a one-output op, tuples
            otherwise. Without it the gradient is JAX's derivative of ``impl``.
        nondiff_inputs: input indices that never get a gradient (indices, masks).
        replace: redefine an op already registered under the same identity.

    Raises:
        ValueError: the identity is taken (without ``replace``).
        TypeError / NotImplementedError: a malformed attribute declaration (``Graph``
            attributes are not supported).
    """
    if impl is None:
        return functools.partial(
            register,
            name,
            domain=domain,
            version=version,
            attributes=attributes,
            infer=infer,
            vjp=vjp,
            nondiff_inputs=nondiff_inputs,
            replace=replace,
        )
    key = (domain, name, int(version))
    if key in _REGISTRY:
        if not replace:
            owner = getattr(_REGISTRY[key].impl, "__qualname__", "?")
            raise ValueError(
                TWICE_MSG.format(name=name, domain=domain, version=version, owner=owner)
            )
        unregister(name, domain, version)
    op = CustomOp(name, impl, domain, int(version), attributes or {}, infer, vjp, nondiff_inputs)
    _REGISTRY[key] = op
    return op


def unregister(name: str, domain: str = DEFAULT_DOMAIN, version: int = 1) -> None:
    """Remove a registered op (programs already built keep their reference to it)."""
    op = get(name, domain, version)
    del _REGISTRY[op.key]
    _op.REGISTRY.pop(op.op_key, None)
    _eval_shape.cache_clear()
    _with_vjp.cache_clear()


def get(name: str, domain: str = DEFAULT_DOMAIN, version: int = 1) -> CustomOp:
    """The op registered as ``domain::name`` version ``version``.

    Raises:
        ValueError: nothing is registered under that identity; the message lists what is.
    """
    op = _REGISTRY.get((domain, name, int(version)))
    if op is None:
        listing = ", ".join(f"{d}::{n}:{v}" for d, n, v in registered()) or "none"
        raise ValueError(
            NOT_FOUND_MSG.format(name=name, domain=domain, version=version, listing=listing)
        )
    return op


def registered() -> list[Key]:
    """The identities ``(domain, name, version)`` of every registered op, sorted."""
    return sorted(_REGISTRY)


def call(
    name: str,
    inputs: Sequence[Tensor],
    domain: str = DEFAULT_DOMAIN,
    version: int = 1,
    attributes: Mapping[str, Any] | None = None,
) -> list[Tensor]:
    """Record the registered op ``domain::name:version`` on ``inputs`` (PopXL's way of
    calling an op by identity); returns its outputs as a list."""
    return get(name, domain, version).apply(list(inputs), attributes)
