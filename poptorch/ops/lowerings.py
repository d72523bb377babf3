"""PopTorch's own ops (``torch.ops.poptorch.*``, see ``poptorch.ops.torch_ops``)."""

from __future__ import annotations

import json
import sys
import weakref
from typing import Any

import numpy as np
import torch

import popxl
from popxl import custom_ops, ops
from popxl._op import AMP_HINT, define
from popxl.errors import InternalError
from popxl.ops._base import jax, record
from popxl.ops.conv import CONV
from popxl.transforms.autodiff import register_adjoint

from ..aten.loss import _ctc, _record
from ..aten.registry import TABLE, NodeContext, lowering, popxl_dtype
from ..errors import Error
from . import torch_ops as _torch_ops
from .ctc_search import ctc_beam_search
from .torch_ops import NOT_INPUT_MSG, NOT_OUTPUT_MSG


@lowering(torch.ops.poptorch.identity_loss.default)
def _lower_identity_loss(ctx: NodeContext, x: popxl.Tensor, reduction: int) -> popxl.Tensor:
    """The loss reduced as asked; the last one marked is the loss ``trainingModel``
    differentiates."""
    if reduction == 0:
        loss = ops.sum(x) if x.rank else ops.identity(x)
    elif reduction == 1:
        loss = ops.mean(x) if x.rank else ops.identity(x)
    else:
        loss = ops.identity(x)
    ctx.translator.losses.append(loss)
    return loss


_FLOAT_FORMATS = ("auto", "fixed", "scientific", "none")


@lowering(torch.ops.poptorch.ipu_print_tensor.default)
def _lower_ipu_print_tensor(
    ctx: NodeContext,
    x: popxl.Tensor,
    title: str,
    print_gradient: int,
    summarise_threshold: int,
    edge_items: int,
    max_line_width: int,
    digits: int,
    float_format: int,
    separator: str,
    open_bracket: str,
    close_bracket: str,
) -> popxl.Tensor:
    """A ``PrintTensor`` op printing in Poplar's layout (``format_poplar``), with
    PopTorch's separators and brackets (which may be several characters)."""
    attrs = {
        "title": title,
        "print_gradient": bool(print_gradient),
        "summarise_threshold": int(summarise_threshold),
        "edge_items": int(edge_items),
        "max_line_width": int(max_line_width),
        "digits": int(digits),
        "float_format": _FLOAT_FORMATS[float_format],
        "separator": separator,
        "open_bracket": open_bracket,
        "close_bracket": close_bracket,
    }
    return record(PRINT_TENSOR, {"t": x}, attrs, ["print_out"])[0]


def _identity(x: Any) -> Any:
    return x


@lowering(torch.ops.poptorch.nop.default)
def _lower_nop(ctx: NodeContext, x: popxl.Tensor) -> popxl.Tensor:
    return ctx.jax("poptorch::nop", _identity, x)


@lowering(torch.ops.poptorch.set_overlap_for_input.default)
def _lower_overlap_input(ctx: NodeContext, x: popxl.Tensor, mode: str) -> popxl.Tensor:
    """The input itself: ``_program`` loads it on the IO tiles."""
    if ctx.node not in ctx.translator.overlap_marks:
        raise Error(NOT_INPUT_MSG, "poptorch_cpp_error")
    return x


@lowering(torch.ops.poptorch.set_overlap_for_output.default)
def _lower_overlap_output(ctx: NodeContext, x: popxl.Tensor, mode: str) -> popxl.Tensor:
    """The output itself: ``_program`` stores it from the IO tiles."""
    if ctx.node not in ctx.translator.overlap_marks:
        raise Error(NOT_OUTPUT_MSG, "poptorch_cpp_error")
    return x


@lowering(torch.ops.poptorch.recomputation_checkpoint.default)
def _lower_recomputation_checkpoint(ctx: NodeContext, x: popxl.Tensor) -> popxl.Tensor:
    return ctx.jax("poptorch::recomputation_checkpoint", _identity, x)


@lowering(torch.ops.poptorch.set_available_memory.default)
def _lower_set_available_memory(
    ctx: NodeContext, x: popxl.Tensor, proportion: float
) -> popxl.Tensor:
    """The hint goes on the op that made ``x`` (as PopART's ``availableMemoryProportion``)."""
    if not 0.0 <= proportion <= 1.0:
        raise ValueError(
            f"set_available_memory: the proportion must be between 0 and 1, got {proportion}."
        )
    producer = x._producer
    if producer is not None:
        producer.hints[AMP_HINT] = float(proportion)
    return x


@lowering(torch.ops.poptorch.set_matmul_serialization.default)
def _lower_set_matmul_serialization(
    ctx: NodeContext, x: popxl.Tensor, mode: str, factor: int, keep_precision: bool
) -> popxl.Tensor:
    producer = x._producer
    if producer is not None:
        producer.hints["serialization"] = (mode, int(factor), bool(keep_precision))
    return x


def _check_slice_size(size: int) -> None:
    if size == 0:
        raise Error("The start and end of a slice must be different.", "poptorch")
    if size < 0:
        raise Error(
            "Taking a slice of a tensor with the end less than the start is not supported.",
            "poptorch",
        )


@lowering(torch.ops.poptorch.dynamic_slice.default)
def _lower_dynamic_slice(
    ctx: NodeContext, x: popxl.Tensor, dim: int, start: popxl.Tensor, size: int, step: int
) -> popxl.Tensor:
    d = dim % x.rank
    _check_slice_size(size)
    if x.shape[d] % size:
        raise Error(
            f"The size of the slice ({size}) must be a factor of the slicing dimension "
            f"({x.shape[d]}).",
            "poptorch",
        )
    index = ops.reshape(ctx.tensor(start, popxl.uint32), (1,))
    sliced = ops.dynamic_slice(x, index, [d], [size], no_overlap=False)
    if step == 1:
        return sliced
    return ops.slice(sliced, [0], [size], [step], [d])


@lowering(torch.ops.poptorch.dynamic_update.default)
def _lower_dynamic_update(
    ctx: NodeContext, x: popxl.Tensor, src: popxl.Tensor, dim: int, start: popxl.Tensor, size: int
) -> popxl.Tensor:
    d = dim % x.rank
    _check_slice_size(size)
    index = ops.reshape(ctx.tensor(start, popxl.uint32), (1,))
    if src.shape[d] != size:
        src = ops.slice(src, [0], [size], [1], [d])
    return ops.dynamic_update(x, index, src, [d], [size], no_overlap=False)


# Printing in Poplar's layout -------------------------------------------------------------------
#
# Poplar's PrintTensor writes ``title: `` then the tensor: a vector on one line,
# ``{1 2 3}``; a matrix as its rows on lines of their own, indented by depth,
# ``{\n {1 2}\n {3 4}\n}``. Elements are right-aligned to a common width and joined by
# the separator; a row longer than ``max_line_width`` continues on the next line, indented
# past its bracket. ``digits`` counts significant digits.


def _float_texts(values: np.ndarray, fmt: dict[str, Any]) -> list[str]:
    digits, kind = max(int(fmt["digits"]), 1), fmt["float_format"]
    values = values.astype(np.float32)
    if kind == "scientific":
        return [f"{v:.{digits - 1}e}" for v in values]
    if kind == "fixed":
        finite = np.abs(values[np.isfinite(values)])
        biggest = float(finite.max()) if finite.size else 0.0
        whole = len(str(int(biggest))) if biggest >= 1 else 1
        return [f"{v:.{max(digits - whole, 0)}f}" for v in values]
    if kind == "none":
        return [np.format_float_positional(v, unique=True, trim="-") for v in values]
    return [f"{v:.{digits}g}" for v in values]


def _texts(values: np.ndarray, fmt: dict[str, Any]) -> list[str]:
    if values.dtype.kind == "f":
        texts = _float_texts(values, fmt)
    elif values.dtype.kind == "b":
        texts = ["true" if v else "false" for v in values]
    else:
        texts = [str(int(v)) for v in values]
    width = max((len(t) for t in texts), default=0)
    return [t.rjust(width) for t in texts]


def _edges(n: int, fmt: dict[str, Any], summarise: bool) -> list[int | None]:
    """Indices to show along an axis of length ``n`` (None: the ``...`` gap)."""
    k = int(fmt["edge_items"])
    if not summarise or n <= 2 * k:
        return list(range(n))
    return [*range(k), None, *range(n - k, n)]


def _render(
    a: np.ndarray, texts: dict, index: tuple, depth: int, fmt: dict, summarise: bool
) -> str:
    open_, close, sep = fmt["open_bracket"], fmt["close_bracket"], fmt["separator"]
    axis = len(index)
    picks = _edges(a.shape[axis], fmt, summarise)
    if axis == a.ndim - 1:
        items = ["..." if i is None else texts[tuple(index) + (i,)] for i in picks]
        return _wrap(items, open_, close, sep, depth, int(fmt["max_line_width"]))
    pad = " " * (depth + 1)
    rows = [
        pad + ("..." if i is None else _render(a, texts, (*index, i), depth + 1, fmt, summarise))
        for i in picks
    ]
    return open_ + "\n" + "\n".join(rows) + "\n" + " " * depth + close


def _wrap(items: list[str], open_: str, close: str, sep: str, depth: int, width: int) -> str:
    indent = " " * (depth + len(open_) + 1)
    lines = [open_ + (items[0] if items else "")]
    column = depth + len(lines[0])
    for item in items[1:]:
        if column + len(sep) + len(item) > width:
            lines[-1] += sep
            lines.append(indent + item)
            column = len(lines[-1])
        else:
            lines[-1] += sep + item
            column += len(sep) + len(item)
    return "\n".join(lines) + close


def format_poplar(array: Any, fmt: dict[str, Any]) -> str:
    """``array`` as Poplar's PrintTensor wrote it (see the layout above)."""
    a = np.asarray(array)
    if a.dtype.kind == "f" and a.dtype != np.float64:
        a = a.astype(np.float32)
    if a.ndim == 0:
        return _texts(a.reshape(1), fmt)[0]
    summarise = a.size > int(fmt["summarise_threshold"])
    shown = [idx for idx in np.ndindex(a.shape) if _shown(idx, a.shape, fmt, summarise)]
    values = np.array([a[idx] for idx in shown], dtype=a.dtype)
    texts = dict(zip(shown, _texts(values, fmt)))
    return _render(a, texts, (), 0, fmt, summarise)


def _shown(idx: tuple, shape: tuple, fmt: dict[str, Any], summarise: bool) -> bool:
    return all(i in _edges(n, fmt, summarise) for i, n in zip(idx, shape))


def _print_poplar(t: Any, *, title: str, print_gradient: bool, **fmt: Any) -> Any:
    from popxl.ops.misc import _over_several_devices  # noqa: PLC0415

    def printer(value: Any) -> None:
        sys.stderr.write(f"{title}: {format_poplar(value, fmt)}\n")
        sys.stderr.flush()

    jax.debug.callback(printer, t, ordered=not _over_several_devices())
    return t


PRINT_TENSOR = define(
    "poptorch::print_tensor",
    "PrintTensor",
    lambda t, **_: [t],
    _print_poplar,
    effect=True,
    grad="adjoint",
)


def _print_adjoint(op: Any, cotangents: list[popxl.Tensor]) -> list[popxl.Tensor]:
    """Identity, printing the gradient as ``<title>_gradient`` if asked to."""
    (cot,) = cotangents
    if op.attrs["print_gradient"]:
        attrs = {**op.attrs, "title": f"{op.attrs['title']}_gradient", "print_gradient": False}
        cot = record(PRINT_TENSOR, {"t": cot}, attrs, ["print_out"])[0]
    return [cot]


register_adjoint(PRINT_TENSOR.key, _print_adjoint)


# Host callbacks (poptorch.CPU) ---------------------------------------------------------------


def _host_call(*arrays: Any, cpu_id: str, token: int, _out: tuple) -> tuple:
    """Run the registered host function on the inputs' values (once per execution, per
    replica under replication: unordered callbacks may be batched by ``vmap``)."""
    from jax.experimental import io_callback  # noqa: PLC0415

    dtypes = [popxl.dtypes.dtype.from_name(d).as_numpy() for _, d in _out]
    results = [jax.ShapeDtypeStruct(shape, dt) for (shape, _), dt in zip(_out, dtypes)]

    def on_host(*values: Any) -> tuple:
        outs = _torch_ops.CPU_CALLBACKS[token](*(torch.from_numpy(np.array(v)) for v in values))
        outs = outs if isinstance(outs, (tuple, list)) else [outs]
        if len(outs) != len(dtypes):
            raise ValueError(
                f"poptorch.CPU({cpu_id!r}) returned {len(outs)} tensors, not {len(dtypes)}."
            )
        return tuple(
            np.asarray(o.detach().cpu().numpy(), dt).reshape(r.shape)
            for o, dt, r in zip(outs, dtypes, results)
        )

    return tuple(io_callback(on_host, tuple(results), *arrays, ordered=False))


CPU_OP = define(
    "poptorch::cpu_op",
    "HostOp",
    lambda *_, _out, **__: [popxl.TensorSpec(s, popxl.dtypes.dtype.from_name(d)) for s, d in _out],
    _host_call,
    effect=True,
    grad="none",
)
CPU_INFERENCE_MSG = (
    "poptorch.CPU ops are only supported in inference models (CPU op {id!r}). Call the "
    "host function outside the model, or use an inferenceModel."
)
CPU_ID_MSG = (
    "Two different poptorch.CPU callables share the ID {id!r} in one model; give each its own ID."
)
_CPU_IDS: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()


@lowering(torch.ops.poptorch.call_cpu_op.default)
def _lower_call_cpu_op(
    ctx: NodeContext, inputs: list[popxl.Tensor], cpu_id: str, token: int, out_specs: str
) -> tuple:
    if ctx.training:
        raise Error(CPU_INFERENCE_MSG.format(id=cpu_id), "poptorch_py_error")
    ids = _CPU_IDS.setdefault(ctx.translator, {})
    if ids.setdefault(cpu_id, token) != token:
        raise Error(CPU_ID_MSG.format(id=cpu_id), "poptorch_py_error")
    out = tuple((tuple(s), d) for s, d in _popxl_specs(out_specs))
    named = {f"in{i}": t for i, t in enumerate(inputs)}
    attrs = {"cpu_id": cpu_id, "token": int(token), "_out": out}
    return tuple(record(CPU_OP, named, attrs, [f"{cpu_id}_out{i}" for i in range(len(out))]))


def _popxl_specs(out_specs: str) -> list[tuple[list[int], str]]:
    return [
        (shape, popxl_dtype(getattr(torch, dtype)).name) for shape, dtype in json.loads(out_specs)
    ]


# Custom ops (poptorch.custom_op, torch.library ops) ----------------------------------------------

EXAMPLE_MISMATCH_MSG = (
    "custom op {op}: example_outputs {given} disagree with the op's shape inference {inferred}."
)


@lowering(torch.ops.poptorch.custom_operation.default)
def _lower_custom_operation(
    ctx: NodeContext,
    inputs: list[popxl.Tensor],
    name: str,
    domain: str,
    domain_version: int,
    out_specs: str,
    attributes: str,
) -> tuple:
    """The registered op (``popxl.custom_ops``), recorded under its name."""
    op = custom_ops.get(name, domain, domain_version)
    outs = op.apply(list(inputs), json.loads(attributes))
    given = [f"{d}{tuple(s)}" for s, d in _popxl_specs(out_specs)]
    inferred = [f"{t.dtype.name}{t.shape}" for t in outs]
    if given != inferred:
        raise ValueError(
            EXAMPLE_MISMATCH_MSG.format(op=op.qualname, given=given, inferred=inferred)
        )
    return tuple(outs)


def register_torch_op(torch_op: Any, op: custom_ops.CustomOp) -> None:
    """Lower the ``torch.library`` operator ``torch_op`` with the custom op ``op``: tensor
    arguments are its inputs, other arguments its attributes of the same names."""
    overload = getattr(torch_op, "default", torch_op)
    if not isinstance(overload, torch._ops.OpOverload):
        raise TypeError(f"lower_torch_op expects a torch operator, got {torch_op!r}.")
    schema = overload._schema
    for arg in schema.arguments:
        if not _is_tensor_type(arg.type) and arg.name not in op.attributes:
            raise ValueError(
                f"lower_torch_op: argument '{arg.name}' of {schema.name} is not a tensor and "
                f"not an attribute of custom op {op.qualname} (it declares "
                f"{sorted(op.attributes) or 'none'})."
            )
    existing = TABLE.get(overload)
    if existing is not None:
        if not getattr(existing, "_torch_custom_op", False):
            raise ValueError(f"{overload} already has a lowering ({existing.__name__}).")
        del TABLE[overload]

    def _lower_torch_custom_op(ctx: NodeContext, *args: Any, **kwargs: Any) -> Any:
        inputs: list[Any] = []
        attrs: dict[str, Any] = {}
        for arg, value in _bind(schema, args, kwargs):
            if _is_tensor_type(arg.type):
                inputs.extend(value if isinstance(value, (list, tuple)) else [value])
            elif value is not None:
                attrs[arg.name] = value
        outs = op.apply(inputs, attrs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    _lower_torch_custom_op._torch_custom_op = True  # type: ignore[attr-defined]
    lowering(overload, preserve=True)(_lower_torch_custom_op)


def _is_tensor_type(t: Any) -> bool:
    text = str(t)
    return text.startswith("Tensor")


def _bind(schema: Any, args: tuple, kwargs: dict) -> list[tuple[Any, Any]]:
    bound = []
    for i, arg in enumerate(schema.arguments):
        if i < len(args):
            bound.append((arg, args[i]))
        elif arg.name in kwargs:
            bound.append((arg, kwargs[arg.name]))
        elif arg.has_default_value():
            bound.append((arg, arg.default_value))
    return bound


# MultiConv ------------------------------------------------------------------------------------


def _multi_conv_infer(*specs: Any, convs: tuple, **_: Any) -> list[popxl.TensorSpec]:
    out: list[popxl.TensorSpec] = []
    k = 0
    for attrs in convs:
        x, w = specs[k], specs[k + 1]
        k += 3 if dict(attrs)["bias"] else 2
        conv_attrs = {n: v for n, v in attrs if n != "bias"}
        out.extend(CONV.infer(x, w, **conv_attrs))
    return out


def _lower_multi_conv(*arrays: Any, convs: tuple, **_: Any) -> tuple:
    """Each convolution as popxl's ``Conv`` computes it, plus its bias."""
    conv = CONV.lower
    if conv is None:
        raise InternalError("popxl's Conv has no JAX lowering")
    out: list[Any] = []
    k = 0
    for attrs in convs:
        conv_attrs = {n: v for n, v in attrs if n != "bias"}
        y = conv(arrays[k], arrays[k + 1], **conv_attrs)
        if dict(attrs)["bias"]:
            bias = arrays[k + 2]
            y = y + bias.reshape((1, -1) + (1,) * (y.ndim - 2)).astype(y.dtype)
            k += 3
        else:
            k += 2
        out.append(y)
    return tuple(out)


MULTI_CONV = define("poptorch::multi_conv", "MultiConv", _multi_conv_infer, _lower_multi_conv)


def _ints(values: Any, n: int) -> tuple[int, ...]:
    values = [int(v) for v in values]
    return tuple(values * n if len(values) == 1 and n > 1 else values)


def multi_conv(
    args: list[list[Any]], dtypes: list[popxl.dtype], options: dict
) -> list[popxl.Tensor]:
    """One ``MultiConv`` op for the ``aten.convolution`` calls ``args`` (their arguments, with
    popxl tensors), with output dtypes ``dtypes``; ``options`` go to ``Op.hints``."""
    inputs: list[popxl.Tensor] = []
    convs = []
    for (x, w, b, stride, padding, dilation, _, _, groups), dtype in zip(args, dtypes):
        n = x.rank - 2
        x = x if x.dtype == dtype else ops.cast(x, dtype)
        w = w if w.dtype == dtype else ops.cast(w, dtype)
        inputs += [x, w] + (
            [b if b.dtype == dtype else ops.cast(b, dtype)] if b is not None else []
        )
        convs.append(
            (
                ("stride", _ints(stride, n)),
                ("padding", _ints(padding, n) * 2),
                ("dilation", _ints(dilation, n)),
                ("groups", int(groups)),
                ("pad_type", "not_set"),
                ("bias", b is not None),
            )
        )
    named = {f"in{i}": t for i, t in enumerate(inputs)}
    outs = record(MULTI_CONV, named, {"convs": tuple(convs)}, ["multi_conv_out"] * len(convs))
    producer = outs[0]._producer
    if producer is None:
        raise InternalError("record() returned MultiConv outputs without their op")
    producer.hints.update({k: v for k, v in options.items() if v is not None})
    return outs


def _ctc_lowering(probs: Any, lengths: Any, **attrs: Any) -> tuple:
    scores, plen, paths = ctc_beam_search(probs, lengths, **attrs)
    return scores.astype(probs.dtype), plen, paths


@lowering(torch.ops.poptorch.ctc_beam_search_decoder.default)
def _lower_ctc_beam_search_decoder(
    ctx: NodeContext,
    probs: popxl.Tensor,
    lengths: popxl.Tensor,
    blank: int,
    beam_width: int,
    top_paths: int,
) -> tuple:
    """Inference only: no gradient flows through the decoded paths."""
    return ctx.jax(
        "poptorch::ctc_beam_search_decoder",
        _ctc_lowering,
        probs,
        ops.detach(lengths) if lengths.dtype.is_floating_point else lengths,
        nondiff=(0, 1),
        blank=int(blank),
        beam_width=int(beam_width),
        top_paths=int(top_paths),
    )


# PopART's IR as JSON (PoplarExecutor._debugGetPopartIR) ------------------------------------------


def popart_ir_json(ir: popxl.Ir) -> str:
    """The program as PopART's IR JSON: ``{"maingraph": [op, ...], "<graph id>": [...]}``,
    each op ``{"type", "name", "inputs", "outputs", "attributes"}``. ``maingraph`` lists the
    ops the main program runs, with the ops of the graphs it calls, repeats or branches to
    listed after the op that runs them (PopART's main graph before outlining)."""
    graphs: dict[str, list] = {"maingraph": []}
    _list_ops(ir.main_graph, graphs["maingraph"], graphs)
    return json.dumps(graphs)


def _list_ops(graph: popxl.Graph, into: list, graphs: dict[str, list]) -> None:
    for op in graph._ops:
        into.append(_op_json(op))
        for called in op.called_graphs:
            _list_ops(called, into, graphs)
            if called.id not in graphs:
                graphs[called.id] = []
                _list_ops(called, graphs[called.id], graphs)


def _op_json(op: Any) -> dict:
    tensor = lambda t: {"name": t.id, "shape": list(t.shape), "type": t.dtype.name}  # noqa: E731
    return {
        "type": op.type,
        "name": f"{op.type}.{op.id}",
        "inputs": [tensor(t) for t in op.inputs],
        "outputs": [tensor(t) for t in op.outputs],
        "attributes": {k: str(v) for k, v in op.attrs.items() if k not in ("graphs", "recipe")},
    }


def _bincount(x: Any, *weights: Any, length: int) -> Any:
    import jax.numpy as jnp  # noqa: PLC0415

    w = weights[0] if weights else None
    return jnp.bincount(x, w, length=length)  # values >= length are dropped, as on the IPU


@lowering(torch.ops.poptorch.bincount.default)
def _lower_bincount(
    ctx: NodeContext, x: popxl.Tensor, weights: popxl.Tensor | None, minlength: int
) -> popxl.Tensor:
    x = ctx.tensor(x, popxl.int32)
    if weights is None:
        return ctx.jax("poptorch::bincount", _bincount, x, nondiff=(0,), length=minlength)
    w = ctx.tensor(weights, ctx.out_dtype)
    return ctx.jax("poptorch::bincount", _bincount, x, w, nondiff=(0,), length=minlength)


_CTC_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


@lowering(torch.ops.poptorch.ctc_loss.default)
def _lower_ctc_loss(
    ctx: NodeContext,
    log_probs: Any,
    targets: Any,
    input_lengths: Any,
    target_lengths: Any,
    blank: int,
    reduction: str,
    zero_infinity: bool,
) -> Any:
    ints = [ctx.tensor(t, popxl.int32) for t in (targets, input_lengths, target_lengths)]
    return _record(
        ctx,
        "ctc_loss",
        _ctc,
        log_probs,
        *ints,
        blank=int(blank),
        reduction=_CTC_REDUCTIONS[reduction],
        zero_infinity=bool(zero_infinity),
    )


# PopTorch's own ops that are a model's loss (see ``poptorch.aten.loss.LOSS_OPS``).
LOSS_OPS = frozenset(
    {torch.ops.poptorch.ctc_loss.default, torch.ops.poptorch.identity_loss.default}
)
