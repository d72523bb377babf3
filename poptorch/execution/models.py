"""``trainingModel``, ``inferenceModel`` and ``load``: a model wrapped in the executor that fits
it (``torch_executor`` for ``torch.nn`` models, the plain executor for popxl_addons ones)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from ..errors import Error
from ..optim.optimizers import SGD
from ..options import Options
from .executor import PoplarExecutor
from .export import import_step


def trainingModel(  # noqa: N802
    model: Any, options: Options | None = None, optimizer: Any = None
) -> PoplarExecutor:
    """Wrap ``model`` for training: each call runs forward, backward and the optimiser for
    every micro-batch of the combined batch.

    ``model`` is a ``torch.nn.Module`` whose ``forward`` returns the loss (marked with
    ``poptorch.identity_loss`` or as its last scalar output), or a popxl_addons ``Module``.
    ``optimizer`` defaults to ``SGD(lr=0.01)``; ``torch.optim`` and ``poptorch.optim``
    optimizers are accepted.
    """
    if _is_torch_module(model):
        from .torch_executor import new_executor  # noqa: PLC0415 (capture loads with the first torch model)

        return new_executor(_unwrap_executor(model), options, True, optimizer)
    return PoplarExecutor(
        model, options, True, optimizer if optimizer is not None else SGD(lr=0.01)
    )


def inferenceModel(model: Any, options: Options | None = None) -> PoplarExecutor:  # noqa: N802
    """Wrap ``model`` (a ``torch.nn.Module`` or popxl_addons ``Module``) for inference:
    each call runs the forward pass on every micro-batch of the combined batch."""
    if _is_torch_module(model):
        from .torch_executor import new_executor  # noqa: PLC0415 (capture loads with the first torch model)

        return new_executor(_unwrap_executor(model), options, False, None)
    return PoplarExecutor(model, options, False)


def _is_torch_module(model: Any) -> bool:
    if isinstance(model, PoplarExecutor):
        return _is_torch_module(model.model)
    return any(c.__module__ == "torch.nn.modules.module" for c in type(model).__mro__)


def _unwrap_executor(model: Any) -> Any:
    return model.model if isinstance(model, PoplarExecutor) else model


def load(filename: str, edit_opts_fn: Callable[[Options], None] | None = None) -> PoplarExecutor:
    """Restore a model saved by ``save`` or ``compileAndExport`` (with ``export_model``)."""
    with open(filename, "rb") as f:
        data = pickle.load(f)  # noqa: S301 (files this module wrote)
    if data.get("model") is None:
        raise Error(
            f"{filename} was saved with export_model=False: build the model with "
            "trainingModel/inferenceModel and call loadExecutable instead.",
            "poptorch",
        )
    options = Options.model_validate_json(data["options"])
    if edit_opts_fn is not None:
        edit_opts_fn(options)
    optimizer = data["optimizer_object"]
    if "torch_call" in data:  # a torch.nn model: captured again from the saved module
        if data["training"]:
            ex = trainingModel(data["model"], options, optimizer)
        else:
            ex = inferenceModel(data["model"], options)
    else:
        ex = PoplarExecutor(data["model"], options, data["training"], optimizer)
    if data["specs"] is not None:
        ex._compile_from_checkpoint(data)
        if data["weights"] is not None:
            ex.load_state_dict(data["weights"])
        if data["optimizer"] is not None:
            ex._load_optimizer_state(data["optimizer"])
        if "executable" in data:
            import_step(ex._require_session("load"), data["executable"], filename)
    return ex
