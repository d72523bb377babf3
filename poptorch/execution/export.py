"""Compiled steps written to and read from files (``compileAndExport``, ``loadExecutable``,
``poptorch.load``): the session's lowered step serialised with JAX, and checked against the
program it is loaded into."""

from __future__ import annotations

import pickle

import popxl

from ..errors import Error

EXPORT_MISMATCH_MSG = (
    "{path} holds an executable for a different program (its structure key differs). Build "
    "the model with the same module, options and input shapes before loadExecutable."
)


def export_step(session: popxl.Session) -> bytes:
    """The session's compiled step, serialised (``jax.experimental.serialize_executable``)."""
    from jax.experimental.serialize_executable import serialize  # noqa: PLC0415

    # The session's own lowering: the step as it is called (state, scratch, inputs).
    compiled = session._lowered().compile()
    return pickle.dumps({"key": session._program.key, "step": serialize(compiled)})


def import_step(session: popxl.Session, blob: bytes, path: str) -> None:
    """Make ``session`` run the serialised step instead of its own compilation."""
    import dataclasses  # noqa: PLC0415

    from jax.experimental.serialize_executable import deserialize_and_load  # noqa: PLC0415

    data = pickle.loads(blob)  # noqa: S301 (files this module wrote)
    program = session._program
    if data["key"] != program.key:
        raise Error(EXPORT_MISMATCH_MSG.format(path=path), "poptorch")
    devices = list(session._sharding._device_assignment)
    payload, in_tree, out_tree = data["step"]
    step = deserialize_and_load(payload, in_tree, out_tree, execution_devices=devices)
    session._program = dataclasses.replace(program, step=step)
