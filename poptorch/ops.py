"""PopTorch's ops for ``torch.nn`` models: printing, no-ops, memory hints, dynamic slices.

Each is a torch operator (``torch.ops.poptorch.*``) that runs in plain PyTorch and becomes
one recorded op of the captured program (lowered in ``poptorch/_aten/poptorch_ops.py``).
"""

from __future__ import annotations

from typing import Any

from .errors import Error

_FLOAT_FORMATS = {"auto": 0, "fixed": 1, "scientific": 2, "none": 3}


def _torch_ops() -> Any:
    from . import _torch_ops  # noqa: PLC0415 (torch only for torch models)

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
            "ipu print tensor must take a torch.tensor argument. "
            f"{type(tensor)} is not supported.",
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

    from .enums import MatMulSerializationMode  # noqa: PLC0415

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
            f"Src argument to dynamic_update must be a torch.tensor. {type(src)} is not "
            "supported.",
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
        raise Error(
            f"input and src tensor must have same dtype. ({input.dtype} vs {src.dtype})",
            "poptorch_py_error",
        )
    return _torch_ops().dynamic_update(input, src, dim, start, size)
