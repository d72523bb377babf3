"""PopTorch's ops for ``torch.nn`` models: printing, no-ops, memory hints, dynamic slices.

Each is a torch operator (``torch.ops.poptorch.*``) that runs in plain PyTorch and becomes
one recorded op of the captured program (lowered in ``poptorch/ops/lowerings.py``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Callable
from typing import Any

from ..errors import Error

_FLOAT_FORMATS = {"auto": 0, "fixed": 1, "scientific": 2, "none": 3}


def _device_dtype(dtype: Any) -> Any:
    """The dtype a tensor has on the device while the model is captured (64-bit types run
    as 32-bit ones, as PopTorch converted them); in plain PyTorch, ``dtype`` itself."""
    import torch  # noqa: PLC0415

    from .. import _state  # noqa: PLC0415

    if not _state.TRACING.get():
        return dtype
    return {torch.int64: torch.int32, torch.float64: torch.float32}.get(dtype, dtype)


def _torch_ops() -> Any:
    from . import torch_ops as _torch_ops  # noqa: PLC0415 (torch only for torch models)

    return _torch_ops


def _is_tensor(x: Any) -> bool:
    import torch  # noqa: PLC0415

    return isinstance(x, torch.Tensor)


def ipu_print_tensor(
    tensor: Any,
    title: str = "",
    print_gradient: bool = True,
    summarise_threshold: int = 1000,
    edge_items: int = 3,
    max_line_width: int = 80,
    digits: int = 4,
    float_format: str = "auto",
    separator: str = ", ",
    open_bracket: str = "(",
    close_bracket: str = ")",
) -> Any:
    """Print ``tensor`` (after ``title``) each time the program runs; returns it unchanged.

    Differentiable as the identity; with ``print_gradient`` the backward pass prints the
    gradient too, titled ``<title>_gradient``. Use the returned tensor, as in PopTorch.
    """
    if not _is_tensor(tensor):
        raise Error(
            f"ipu print tensor must take a torch.tensor argument. {type(tensor)} is not supported.",
            "poptorch_py_error",
        )
    if float_format not in _FLOAT_FORMATS:
        raise ValueError(
            f"float_format must be one of {sorted(_FLOAT_FORMATS)}, got {float_format!r}."
        )
    return _torch_ops().ipu_print_tensor(
        tensor,
        title,
        int(print_gradient),
        summarise_threshold,
        edge_items,
        max_line_width,
        digits,
        _FLOAT_FORMATS[float_format],
        separator,
        open_bracket,
        close_bracket,
    )


def nop(tensor: Any) -> Any:
    """A no-op that stays in the program (useful to see a value in the printed IR)."""
    if not _is_tensor(tensor):
        raise Error(
            f"nop must take a torch.tensor argument. {type(tensor)} is not supported.",
            "poptorch_py_error",
        )
    return _torch_ops().nop(tensor)


def set_available_memory(tensor: Any, available_memory_proportion: float) -> Any:
    """Record the proportion of tile memory the op producing ``tensor`` (a matmul,
    convolution, gather...) may use for temporaries; an identity otherwise. The hint is
    kept in the IR (``Op.hints``); XLA plans memory itself."""
    if not _is_tensor(tensor):
        raise Error(
            "You may only set available memory for torch.tensor values. "
            f"{type(tensor)} is not supported.",
            "poptorch_py_error",
        )
    return _torch_ops().set_available_memory(tensor, float(available_memory_proportion))


def set_overlap_for_input(input_tensors: Any, mode: Any) -> Any:
    """Mark model inputs whose host transfers overlap compute (``mode``, an
    ``OverlapMode``): their loads run on the IO tiles (reserve them with
    ``Options().TensorLocations.numIOTiles``). Apply it first to each such input of
    ``forward`` and use what it returns; ``input_tensors`` may be a tensor or any
    tuple, list or dict of them."""
    return _mark_overlap(input_tensors, mode, "input")


def set_overlap_for_output(output_tensors: Any, mode: Any) -> Any:
    """Mark model outputs whose host transfers overlap compute, as
    ``set_overlap_for_input`` marks inputs: apply it last, to tensors ``forward``
    returns."""
    return _mark_overlap(output_tensors, mode, "output")


def _mark_overlap(tensors: Any, mode: Any, kind: str) -> Any:
    from ..enums import OverlapMode  # noqa: PLC0415

    if not isinstance(mode, OverlapMode):
        raise ValueError(f"mode must be a poptorch.OverlapMode, got {mode!r}.")
    mark = getattr(_torch_ops(), f"set_overlap_for_{kind}")

    def marked(leaf: Any) -> Any:
        if not _is_tensor(leaf):
            raise Error(
                f"You may only set overlap for torch.tensor {kind}s. "
                f"{type(leaf)} is not supported.",
                "poptorch_py_error",
            )
        return mark(leaf, mode.value)

    return _map_structure(marked, tensors)


def _map_structure(fn: Callable[[Any], Any], value: Any) -> Any:
    """``value`` (a leaf, or tuples, lists and dicts of them) with ``fn`` applied to each leaf."""
    if isinstance(value, dict):
        return {k: _map_structure(fn, v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_map_structure(fn, v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_map_structure(fn, v) for v in value)
    return fn(value)


def recomputationCheckpoint(*tensors: Any) -> Any:  # noqa: N802 (PopTorch's name)
    """Mark tensors to keep (not recompute) between the forward and backward passes."""
    if len(tensors) == 1 and isinstance(tensors[0], (tuple, list)):
        return type(tensors[0])(recomputationCheckpoint(*tensors[0]))
    out = []
    for t in tensors:
        if not _is_tensor(t):
            raise ValueError("All inputs must be tensors")
        out.append(_torch_ops().recomputation_checkpoint(t))
    return out[0] if len(out) == 1 else tuple(out)


def serializedMatMul(  # noqa: N802 (PopTorch's name)
    lhs: Any, rhs: Any, mode: Any, factor: int = 0, keep_precision: bool = False
) -> Any:
    """``lhs @ rhs``, with PopTorch's serialisation mode and factor recorded on the op (the
    numbers are those of the plain matmul; XLA schedules the product itself)."""
    import torch  # noqa: PLC0415

    from ..enums import MatMulSerializationMode  # noqa: PLC0415

    if not isinstance(keep_precision, bool):
        raise TypeError("keep_precision must be a bool.")
    if not isinstance(factor, int):
        raise TypeError("factor must be an int.")
    if not isinstance(mode, MatMulSerializationMode):
        raise TypeError(f"mode must be a poptorch.MatMulSerializationMode, got {type(mode)}.")
    _check_serialization(lhs, rhs, mode, factor)
    out = torch.matmul(lhs, rhs)
    return _torch_ops().set_matmul_serialization(out, mode.name, factor, keep_precision)


def _check_serialization(lhs: Any, rhs: Any, mode: Any, factor: int) -> None:
    sizes = {
        "InputChannels": lhs.shape[-2] if lhs.dim() > 1 else 1,
        "ReducingDim": lhs.shape[-1],
        "OutputChannels": rhs.shape[-1] if rhs.dim() > 1 else 1,
    }
    if mode.name in sizes and factor > 0 and sizes[mode.name] % factor:
        raise ValueError(
            f"serializedMatMul: factor {factor} must divide the {mode.name} dimension "
            f"({sizes[mode.name]})."
        )


def dynamic_slice(tensor: Any, dim: int, start: Any, size: int, step: int) -> Any:
    """``tensor`` sliced along ``dim`` from the (device) index ``start``, ``size`` elements
    with ``step``."""
    if not _is_tensor(tensor):
        raise Error(
            f"dynamic_slice must take a torch.tensor input. {type(tensor)} is not supported.",
            "poptorch_py_error",
        )
    if not isinstance(dim, int):
        raise Error("Dimension must be an integer.", "poptorch_py_error")
    if not _is_tensor(start):
        raise Error(
            "Slice start argument to dynamic_slice must be a torch.tensor. "
            f"{type(tensor)} is not supported.",
            "poptorch_py_error",
        )
    if not isinstance(size, int):
        raise Error("Size must be an integer.", "poptorch_py_error")
    if not isinstance(step, int):
        raise Error("Step must be an integer.", "poptorch_py_error")
    return _torch_ops().dynamic_slice(tensor, dim, start, size, step)


def dynamic_update(input: Any, src: Any, dim: int, start: Any, size: int) -> Any:  # noqa: A002
    """``input`` with ``size`` elements along ``dim`` from the (device) index ``start``
    replaced by ``src``."""
    if not _is_tensor(input):
        raise Error(
            f"dynamic_update must take a torch.tensor input. {type(input)} is not supported.",
            "poptorch_py_error",
        )
    if not isinstance(dim, int):
        raise Error("Dimension must be an integer.", "poptorch_py_error")
    if not _is_tensor(start):
        raise Error(
            "Slice start argument to dynamic_update must be a torch.tensor. "
            f"{type(start)} is not supported.",
            "poptorch_py_error",
        )
    if not _is_tensor(src):
        raise Error(
            f"Src argument to dynamic_update must be a torch.tensor. {type(src)} is not supported.",
            "poptorch_py_error",
        )
    if not isinstance(size, int):
        raise Error("Size must be an integer.", "poptorch_py_error")
    if input.dim() != src.dim():
        raise Error(
            "input and src tensors must have same dimensionality. "
            f"({input.dim()}) vs ({src.dim()})",
            "poptorch_py_error",
        )
    if input.dtype != src.dtype:
        a, b = _device_dtype(input.dtype), _device_dtype(src.dtype)
        raise Error(f"input and src tensor must have same dtype. ({a} vs {b})", "poptorch_py_error")
    return _torch_ops().dynamic_update(input, src, dim, start, size)


class ArgumentError(Error, ValueError):
    """A ``poptorch.Error`` that is also the ``ValueError`` PopTorch raised for a bad
    argument, so it reaches the caller unchanged from inside a captured ``forward``."""


class ArgumentTypeError(Error, TypeError):
    """A ``poptorch.Error`` that is also a ``TypeError`` (see ``ArgumentError``)."""


def _tracing() -> bool:
    from .. import _state  # noqa: PLC0415

    return _state.TRACING.get()


def _as_list(result: Any) -> list:
    return list(result) if isinstance(result, (list, tuple)) else [result]


# Device-side control flow ---------------------------------------------------------------------

FOR_LOOP_LIST_MSG = (
    "poptorch.for_loop expects input tensors (inputs) to be a list of tensors. (Object is not list)"
)
FOR_LOOP_ITEM_MSG = (
    "poptorch.for_loop expects input tensors (inputs) to be a list of tensors. "
    "(Object contained in list at index {index} is not torch.tensor)"
)
COND_LIST_MSG = (
    "poptorch.cond expects then_inps and else_inps tensors to be a list of tensors. "
    "(Object is not list)"
)
COND_OUTPUTS_MSG = (
    "poptorch.cond: then_body returned {n_then} tensors and else_body {n_else}; both "
    "branches must return the same number of tensors, with the same shapes and dtypes."
)


def for_loop(count: int, body: Any, inputs: list) -> list:
    """Run ``body`` ``count`` times on the device; output ``i`` of one iteration is input
    ``i`` of the next. Returns the last iteration's outputs, as a list.

    The body is traced once and becomes a popxl subgraph run by one ``repeat`` op (a
    device-side loop, not unrolled). It must return as many tensors as it takes, of the
    same shapes and dtypes. Inputs are passed by value (in-place ops in the body do not
    modify them); tensors of the enclosing ``forward`` (and the model's weights) may be
    used in the body directly. Inference only, as in PopTorch.

    Raises:
        ValueError: ``inputs`` is not a list of tensors.
    """
    if not isinstance(inputs, list):
        raise ArgumentError(FOR_LOOP_LIST_MSG, "poptorch_py_error")
    for index, t in enumerate(inputs):
        if not _is_tensor(t):
            raise ArgumentError(FOR_LOOP_ITEM_MSG.format(index=index), "poptorch_py_error")
    if not isinstance(count, int) or count < 0:
        raise ArgumentError(
            f"poptorch.for_loop: count must be an int >= 0, got {count!r}.", "poptorch_py_error"
        )
    if not _tracing():
        values = list(inputs)
        for _ in range(count):
            values = _as_list(body(*values))
        return [t.clone() for t in values]
    ops = _torch_ops()
    body_inputs = ops.start_for_loop(inputs)
    outputs = _as_list(body(*body_inputs))
    return list(ops.end_for_loop(outputs, body_inputs, count))


def cond(condition: Any, then_body: Any, then_inps: list, else_body: Any, else_inps: list) -> list:
    """Run ``then_body(*then_inps)`` if the one-element ``condition`` is true, else
    ``else_body(*else_inps)``, deciding on the device. Returns the branch's outputs.

    Both branches are traced and become popxl subgraphs of one ``conditional`` op. They
    must return the same number of tensors with equal shapes and dtypes. Tensors of the
    enclosing ``forward`` may be used in the branches directly; everything is passed by
    value. Inference only, as in PopTorch.

    Raises:
        ValueError: ``then_inps`` or ``else_inps`` is not a list.
        poptorch.Error: the branches return different numbers of tensors.
    """
    if not isinstance(then_inps, list) or not isinstance(else_inps, list):
        raise ArgumentError(COND_LIST_MSG, "poptorch_py_error")
    if not _tracing():
        if bool(condition):
            return _as_list(then_body(*then_inps))
        return _as_list(else_body(*else_inps))
    ops = _torch_ops()
    condition = ops.start_if_block(condition)
    then_outputs = ops.start_else_block(_as_list(then_body(*then_inps)))
    else_outputs = _as_list(else_body(*else_inps))
    if len(then_outputs) != len(else_outputs):
        raise Error(
            COND_OUTPUTS_MSG.format(n_then=len(then_outputs), n_else=len(else_outputs)),
            "poptorch_py_error",
        )
    return list(ops.end_if_block(then_outputs, else_outputs, condition))


# Host callbacks ------------------------------------------------------------------------------

_CPU_TOKENS = itertools.count(1)


class CPU:
    """Run ``layer_to_call`` on the host in the middle of the device program.

    Calling the wrapper inside ``forward`` records one host-callback op, named by ``ID``:
    each time the program reaches it (once per device iteration and per replica), the
    inputs are copied to the host, ``layer_to_call`` runs on them as CPU torch tensors, and
    its outputs (a tensor or a tuple of tensors) go back to the device. Their shapes and
    dtypes are those of a trial call made while the model is captured. ``ID`` names the op
    in the program; two different callables may not share one ``ID`` in a model. Inference
    only, as in PopTorch.

    >>> class Model(torch.nn.Module):  # doctest: +SKIP
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.cpu = poptorch.CPU(self.on_host, "MyCPUOp")
    ...     def on_host(self, x):
    ...         return x * 2.0
    ...     def forward(self, x):
    ...         return self.cpu(x) + 1
    """

    def __init__(self, layer_to_call: Any, ID: str) -> None:  # noqa: N803 (PopTorch's name)
        import torch  # noqa: PLC0415

        if not callable(layer_to_call):
            raise TypeError(f"poptorch.CPU: layer_to_call must be callable, got {layer_to_call!r}.")
        if not isinstance(ID, str):
            raise TypeError(f"poptorch.CPU: ID must be a str, got {ID!r}.")
        if isinstance(layer_to_call, torch.nn.Module):
            layer_to_call.requires_grad_(False)
        self._layer_to_call = layer_to_call
        self._ID = ID
        self._token = next(_CPU_TOKENS)
        self.in_shapes: list | None = None
        self.out_shapes: list | None = None
        _torch_ops().CPU_CALLBACKS[self._token] = self._run_on_host

    @property
    def ID(self) -> str:  # noqa: N802 (PopTorch's name)
        return self._ID

    def _run_on_host(self, *inputs: Any) -> Any:
        import torch  # noqa: PLC0415

        with torch.no_grad():
            return self._layer_to_call(*inputs)

    def __call__(self, *inputs: Any) -> Any:
        import torch  # noqa: PLC0415

        if not _tracing():
            return self._layer_to_call(*inputs)
        for i, t in enumerate(inputs):
            if not _is_tensor(t):
                raise ArgumentTypeError(
                    f"poptorch.CPU({self._ID!r}): argument {i} is a {type(t).__name__}; "
                    "the host function takes tensors only (bind other values with "
                    "functools.partial).",
                    "poptorch_py_error",
                )
        # A trial call on zeros gives the outputs' shapes and dtypes; its ops are dead code
        # in the captured graph.
        trial = self._layer_to_call(*(torch.zeros_like(t) for t in inputs))
        single = not isinstance(trial, (list, tuple))
        trial = _as_list(trial)
        self.in_shapes = [tuple(t.shape) for t in inputs]
        self.out_shapes = [tuple(t.shape) for t in trial]
        ops = _torch_ops()
        outs = ops.call_cpu_op(list(inputs), self._ID, self._token, ops.specs_to_json(trial))
        return outs[0] if single else list(outs)


# Custom ops ----------------------------------------------------------------------------------

ATTR_KEY_MSG = "All attribute keys must be strings."
ATTR_VALUE_MSG = (
    "Attribute values must be floats, ints, strings or a list/tuple of float, ints of strings."
)
ATTR_MIXED_MSG = "The types in a list/tuple attribute must all be the same."
EXAMPLE_OUTPUTS_MSG = (
    "poptorch.custom_op({name!r}, {domain!r}, {version}): example_outputs {given} disagree "
    "with the op's shape inference {inferred}. Pass example outputs of the shapes and "
    "dtypes the op returns."
)


def _check_attribute_dict(attributes: Any) -> dict:
    """PopTorch's checks of an attribute dictionary (before the op's typed checks)."""
    if attributes is None:
        return {}
    for key, value in attributes.items():
        if not isinstance(key, str):
            raise ValueError(ATTR_KEY_MSG)
        if isinstance(value, bool) or not isinstance(value, (float, int, str, list, tuple)):
            raise ValueError(ATTR_VALUE_MSG)
        if isinstance(value, (list, tuple)) and any(type(v) is not type(value[0]) for v in value):
            raise ValueError(ATTR_MIXED_MSG)
        for text in [key, *(value if isinstance(value, (list, tuple)) else [value])]:
            if isinstance(text, str) and not text.isascii():
                raise ValueError(f"{text} contains non-ASCII characters.")
    return dict(attributes)


def _spec_of(t: Any) -> Any:
    import popxl  # noqa: PLC0415

    from ..aten.registry import popxl_dtype  # noqa: PLC0415

    return popxl.TensorSpec(tuple(t.shape), popxl_dtype(t.dtype))


def custom_op(
    inputs: Any,
    name: str,
    domain: str,
    domain_version: int,
    example_outputs: Any,
    attributes: dict | None = None,
) -> list:
    """Apply the custom op registered as ``domain::name`` version ``domain_version`` (with
    ``popxl.custom_ops.register``: a JAX function) to ``inputs``; returns its outputs.

    As in PopTorch (seed listings 4.24-4.26): ``example_outputs`` give the outputs' shapes
    and dtypes (their values do not matter) and ``attributes`` maps names to floats, ints,
    strs or lists of one of them. In a ``trainingModel`` the op is differentiated (its
    registered VJP, or JAX's derivative). In plain PyTorch it runs its JAX implementation.

    Raises:
        ValueError: an unregistered op (the message lists the registered ones), a malformed
            attribute dictionary, or example outputs that disagree with the op's inference.
        TypeError: an attribute whose type differs from the op's declaration.
    """
    try:
        return _custom_op(inputs, name, domain, domain_version, example_outputs, attributes)
    except Error:
        raise
    except ValueError as error:
        raise ArgumentError(str(error), "poptorch_py_error") from error
    except TypeError as error:
        raise ArgumentTypeError(str(error), "poptorch_py_error") from error


def _custom_op(
    inputs: Any,
    name: str,
    domain: str,
    domain_version: int,
    example_outputs: Any,
    attributes: dict | None,
) -> list:
    from popxl import custom_ops  # noqa: PLC0415

    inputs = list(inputs)
    example_outputs = list(example_outputs)
    given = _check_attribute_dict(attributes)
    op = custom_ops.get(name, domain, domain_version)
    attrs = op.check_attributes(given)
    inferred = op.infer([_spec_of(t) for t in inputs], attrs)
    expected = [_spec_of(t) for t in example_outputs]
    if [s.to_tuple() for s in inferred] != [s.to_tuple() for s in expected]:
        describe = lambda specs: [f"{s.dtype.name}{s.shape}" for s in specs]  # noqa: E731
        raise ValueError(
            EXAMPLE_OUTPUTS_MSG.format(
                name=name,
                domain=domain,
                version=domain_version,
                given=describe(expected),
                inferred=describe(inferred),
            )
        )
    ops = _torch_ops()
    return list(
        ops.custom_operation(
            inputs,
            name,
            domain,
            int(domain_version),
            ops.specs_to_json(example_outputs),
            json.dumps(given),
        )
    )


def lower_torch_op(torch_op: Any, op: Any, domain: str | None = None, version: int = 1) -> None:
    """Lower the ``torch.library`` operator ``torch_op`` with a registered custom op, so a
    model calling it compiles without a graph break.

    ``op`` is a ``popxl.custom_ops.CustomOp`` or the name of one (in ``domain``, version
    ``version``). The torch op's tensor arguments become the custom op's inputs, in order;
    its other arguments become the attributes of the same names.
    """
    from popxl import custom_ops  # noqa: PLC0415

    from .lowerings import register_torch_op  # noqa: PLC0415

    if isinstance(op, str):
        op = custom_ops.get(op, domain or custom_ops.DEFAULT_DOMAIN, version)
    register_torch_op(torch_op, op)


# CTC decoding -------------------------------------------------------------------------------


def ctc_beam_search_decoder(
    probs: Any, lengths: Any, blank: int = 0, beam_width: int = 100, top_paths: int = 1
) -> list:
    """The ``top_paths`` most likely label sequences of each batch item, by CTC prefix beam
    search over ``probs`` (log probabilities ``[input_length, batch_size, num_classes]``)
    for the first ``lengths[b]`` steps.

    Returns:
        ``[log_probabilities [batch, top_paths], path_lengths [batch, top_paths] (int32),
        paths [batch, top_paths, input_length] (int32, zero after each path's length)]``.
    """
    if not _is_tensor(probs):
        raise Error(
            "ctc_beam_search_decoder: probs must be a torch.tensor argument. "
            f"{type(probs)} is not supported.",
            "poptorch_py_error",
        )
    if not _is_tensor(lengths):
        raise Error(
            "ctc_beam_search_decoder: lengths must be a torch.tensor argument. "
            f"{type(lengths)} is not supported.",
            "poptorch_py_error",
        )
    if probs.dim() != 3:
        raise ArgumentError(
            "ctc_beam_search_decoder: probs must be [input_length, batch_size, num_classes], "
            f"got shape {tuple(probs.shape)}.",
            "poptorch_py_error",
        )
    num_classes = probs.shape[2]
    if not 0 <= blank < num_classes:
        raise ArgumentError(
            f"ctc_beam_search_decoder: blank {blank} is not a class of {num_classes}.",
            "poptorch_py_error",
        )
    if not 1 <= top_paths <= beam_width:
        raise ArgumentError(
            f"ctc_beam_search_decoder: top_paths ({top_paths}) must be between 1 and "
            f"beam_width ({beam_width}).",
            "poptorch_py_error",
        )
    return list(_torch_ops().ctc_beam_search_decoder(probs, lengths, blank, beam_width, top_paths))


# MultiConv ----------------------------------------------------------------------------------

MULTICONV_KEY = "poptorch_multiconv"
NESTED_MULTICONV_MSG = "Nested poptorch.MultiConv is not supported"
EMPTY_MULTICONV_MSG = (
    "Unexpected end_multi_conv: the poptorch.MultiConv block contains no convolution. Put "
    "the convolutions to combine inside `with poptorch.MultiConv():`, or remove the block."
)
_CONV_NAMES = frozenset(
    {"conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_transpose1d",
     "conv_transpose2d", "conv_transpose3d"}
)  # fmt: skip
_MULTICONV_IDS = itertools.count(1)
_MULTICONV_ACTIVE: list[bool] = []


class MultiConv:
    """Combine the convolutions evaluated in this scope into one ``MultiConv`` op.

    The convolutions must be data-independent. The numbers are those of the plain
    convolutions; the options (PopLibs' multi-convolution planning options) are validated
    and recorded on the op (``Op.hints``), since XLA plans convolutions itself. Each
    per-convolution option takes one value for all convolutions or one per convolution.

    >>> with poptorch.MultiConv():  # doctest: +SKIP
    ...     y = self.convA(x)
    ...     v = self.convB(u)
    """

    def __init__(self) -> None:
        self._available_memory_proportions: tuple | None = None
        self._partials_types: tuple | None = None
        self._plan_type: Any = None
        self._per_conv_reserved_tiles: int | None = None
        self._cycle_back_off: float | None = None
        self._enable_conv_ditherings: tuple | None = None
        self._stack: contextlib.ExitStack | None = None
        self._counter: Any = None

    @staticmethod
    def _per_conv(name: str, value: Any, scalar_type: type) -> tuple | None:
        if value is None:
            return None
        if isinstance(value, scalar_type):
            return (value,)
        if (
            isinstance(value, (list, tuple))
            and value
            and all(isinstance(v, scalar_type) for v in value)
        ):
            return tuple(value)
        raise AssertionError(f"Invalid {name}!")

    def availableMemoryProportions(self, value: Any) -> MultiConv:  # noqa: N802
        """The available memory proportion per convolution, each in [0, 1)."""
        values = self._per_conv("available memory proportion", value, float)
        if values is not None and not all(0.0 <= v < 1.0 for v in values):
            raise ValueError(f"availableMemoryProportions must be in [0, 1), got {value}.")
        self._available_memory_proportions = values
        return self

    def partialsTypes(self, value: Any) -> MultiConv:  # noqa: N802
        """The partials type (torch.float or torch.half) per convolution."""
        import torch  # noqa: PLC0415

        def encode(dtype: Any) -> str:
            if dtype in (torch.float, torch.float32):
                return "float"
            if dtype in (torch.half, torch.float16):
                return "half"
            raise ValueError("Invalid partials types. Expecting torch.float or torch.half")

        values = value if isinstance(value, (list, tuple)) else [value]
        self._partials_types = tuple(encode(v) for v in values)
        return self

    def enableConvDithering(self, value: Any) -> MultiConv:  # noqa: N802
        """Enable convolution dithering, for all convolutions or per convolution."""
        if value is None:
            self._enable_conv_ditherings = None
        elif isinstance(value, bool):
            self._enable_conv_ditherings = (value,)
        elif isinstance(value, (list, tuple)) and all(isinstance(v, bool) for v in value):
            self._enable_conv_ditherings = tuple(value)
        else:
            raise ValueError("value must be bool or list of bools")
        return self

    def planType(self, value: Any) -> MultiConv:  # noqa: N802
        """The multi-convolution strategy: a ``poptorch.MultiConvPlanType``."""
        from ..enums import MultiConvPlanType  # noqa: PLC0415

        if value is not None and not isinstance(value, MultiConvPlanType):
            raise AssertionError("Invalid plan type!")
        self._plan_type = value
        return self

    def perConvReservedTiles(self, value: int) -> MultiConv:  # noqa: N802
        """Tiles to reserve for each convolution."""
        if not isinstance(value, int) or isinstance(value, bool):
            raise AssertionError(f"perConvReservedTiles must be an int, got {value!r}.")
        self._per_conv_reserved_tiles = value
        return self

    def cycleBackOff(self, value: float) -> MultiConv:  # noqa: N802
        """Cycle back-off proportion, between 0 and 1."""
        if not isinstance(value, float):
            raise AssertionError(f"cycleBackOff must be a float, got {value!r}.")
        self._cycle_back_off = value
        return self

    def options(self) -> tuple:
        """The options as a hashable record (the captured convolutions carry it)."""
        plan = self._plan_type.name if self._plan_type is not None else None
        return (
            ("available_memory_proportions", self._available_memory_proportions),
            ("partials_types", self._partials_types),
            ("plan_type", plan),
            ("per_conv_reserved_tiles", self._per_conv_reserved_tiles),
            ("cycle_back_off", self._cycle_back_off),
            ("enable_conv_dithering", self._enable_conv_ditherings),
        )

    def __enter__(self) -> MultiConv:
        if _MULTICONV_ACTIVE:
            raise Error(NESTED_MULTICONV_MSG, "poptorch_py_error")
        _MULTICONV_ACTIVE.append(True)
        if _tracing():
            from torch.fx import traceback as fx_traceback  # noqa: PLC0415

            self._stack = contextlib.ExitStack()
            self._counter = self._stack.enter_context(_ConvCounter())
            annotation = {MULTICONV_KEY: (next(_MULTICONV_IDS), self.options())}
            self._stack.enter_context(fx_traceback.annotate(annotation))
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        _MULTICONV_ACTIVE.pop()
        stack, counter = self._stack, self._counter
        self._stack = self._counter = None
        if stack is not None:
            stack.close()
            if exc_type is None and counter.count == 0:
                raise Error(EMPTY_MULTICONV_MSG, "poptorch_py_error")


def _ConvCounter() -> Any:  # noqa: N802 (a class made on first use: torch is optional)
    from torch.overrides import TorchFunctionMode  # noqa: PLC0415

    class ConvCounter(TorchFunctionMode):
        """Counts the convolutions called while a ``MultiConv`` is being captured."""

        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            if getattr(func, "__name__", "") in _CONV_NAMES:
                self.count += 1
            return func(*args, **(kwargs or {}))

    return ConvCounter()
