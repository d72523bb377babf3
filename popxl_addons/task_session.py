"""``TaskSession``: a ``popxl.Session`` with named streams and state, and checkpoints.

A checkpoint is a directory::

    <dir>/model/<flat_key>.npz   one per variable of ``state``, the array stored under the key
    <dir>/dataloader.bin         ``dataloader.save(path)``, when a dataloader is set
    <dir>/session_info.json      ``session_state`` ({"steps": ..., plus added info})

Saving is atomic: everything is written into a hidden temporary directory next to the target
(``.<name>.tmp-<random>``), which is renamed into place only once complete. A failure while
saving removes the temporary directory and leaves an existing checkpoint of the same name
untouched. When overwriting, the old directory is first renamed aside
(``.<name>.old-<random>``) and deleted after the new one is in place, so a crash between the
two renames still keeps the old data under the hidden name.

Differences from the original:

* Under popdist, instance 0 writes (all instances read the global state first) and the
  others return once the checkpoint is complete, or raise its error.
* Every variable is saved as ``.npz``, also memory-mapped ones (the original copied their raw ``.npy`` file, which ``load_checkpoint``
  then ignored); ``skip_memmap`` is accepted and unused, as in the original.
* Old checkpoints are deleted after the new one is complete, not before.
* ``wandb://`` paths and the ``wandb_histogram`` / ``wandb_variable_histograms`` helpers are
  omitted: wandb is not a dependency of this project.
* Missing-key reports with ``report_missing="warn"`` go to ``logging.warning`` (as in the
  original), not ``warnings.warn``, so strict test settings do not turn them into errors.
* ``load_checkpoint`` falls back to ``{"steps": 0}`` without ``session_info.json`` and only
  resumes the dataloader when ``dataloader.bin`` exists.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

import numpy as np

import popxl

from .dot_tree import to_mapping
from .named_tensors import NamedTensorData, NamedTensors
from .streams import InputStreams, OutputStreams
from .utils import timer

logger = logging.getLogger("popxl_addons")

ReportMissing = Literal["none", "warn", "error"]
ReportMissingMethods = ReportMissing  # the original's name
MODEL_DIR = "model"
DATALOADER_FILE = "dataloader.bin"
SESSION_FILE = "session_info.json"
REPORT_MODES = ("none", "warn", "error")
NO_DATALOADER_MSG = (
    "No dataloader set. Checkpoint support is incomplete: training cannot be resumed at the "
    "same data position. Set session.dataloader to an object with save(path) and "
    "resume(filename=...) methods."
)
BAD_DATALOADER_MSG = (
    "A dataloader must have save(path) and resume(filename=...) methods; {type} lacks {missing}."
)


def write_variables_pb(session: popxl.Session, weights: Mapping[popxl.Tensor, np.ndarray]) -> None:
    """Write variable values into ``session``: here the same as ``session.write_variables_data``.

    The original went through PopART's weights IO as a workaround; it is kept for
    compatibility.
    """
    session.write_variables_data(weights)


def _report_missing(found: Iterable[str], expected: Iterable[str], method: str, what: str) -> None:
    """Log (``"warn"``) or raise (``"error"``) when ``found`` and ``expected`` differ."""
    if method not in REPORT_MODES:
        raise ValueError(f"report_missing must be one of {REPORT_MODES}, got {method!r}.")
    if method == "none":
        return
    found, expected = set(found), set(expected)
    lines = []
    if found - expected:
        lines.append(f"{what} not in the session state: {sorted(found - expected)}")
    if expected - found:
        lines.append(
            f"Session state keys missing from the {what.lower()}: {sorted(expected - found)}"
        )
    if not lines:
        return
    message = "\n".join(lines)
    if method == "error":
        raise ValueError(message)
    logger.warning(message)


@contextlib.contextmanager
def _atomic_dir(target: str) -> Iterator[str]:
    """A temporary directory next to ``target`` that replaces it when the block succeeds."""
    parent, name = os.path.split(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{name}.tmp-{uuid.uuid4().hex}")
    os.makedirs(tmp)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _replace_dir(tmp, os.path.join(parent, name))


def _replace_dir(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``; an existing ``dst`` is moved aside first, then deleted."""
    if not os.path.exists(dst):
        os.replace(src, dst)
        return
    parent, name = os.path.split(dst)
    old = os.path.join(parent, f".{name}.old-{uuid.uuid4().hex}")
    os.replace(dst, old)
    try:
        os.replace(src, dst)
    except BaseException:
        os.replace(old, dst)
        shutil.rmtree(src, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _restore_dtype(array: np.ndarray, var: popxl.Tensor) -> np.ndarray:
    """Checkpoints that stored float8 data as raw bytes (``V1``, as ``.npz`` files keep
    ml_dtypes arrays) are viewed as the variable's host dtype (the structured float8 form)."""
    want = var.dtype.as_numpy()
    if array.dtype.kind == "V" and array.dtype.itemsize == want.itemsize:
        return array.view(want)
    return array


class TaskSession(popxl.Session):
    """A session that knows its streams and named state, counts steps and checkpoints.

    Args:
        inputs: ``InputStreams``, or host-to-device streams (keyed by ``tensor_id``).
        outputs: ``OutputStreams``, or device-to-host streams (keyed by ``tensor_id``).
        state: the variables to checkpoint; their flat keys name the checkpoint files.
        max_checkpoints: keep at most this many checkpoint directories written by this
            object, deleting the oldest (``None`` keeps all).
        *args, **kwargs: for ``popxl.Session``: ``ir``, ``device_desc``,
            ``weights_to_host_on_exit``. Compilation is timed with ``timer``.

    Attributes:
        session_state: ``{"steps": <runs so far>, ...}``, saved as ``session_info.json``.
    """

    def __init__(
        self,
        inputs: InputStreams | Iterable[popxl.HostToDeviceStream],
        outputs: OutputStreams | Iterable[popxl.DeviceToHostStream],
        state: NamedTensors,
        max_checkpoints: int | None = 1,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        if max_checkpoints is not None and max_checkpoints < 1:
            raise ValueError(
                f"max_checkpoints must be at least 1 (or None), got {max_checkpoints}."
            )
        with timer("PopXL compilation"):
            super().__init__(*args, **kwargs)
        self.inputs = (
            inputs if isinstance(inputs, InputStreams) else InputStreams.from_streams(inputs)
        )
        self.outputs = (
            outputs if isinstance(outputs, OutputStreams) else OutputStreams.from_streams(outputs)
        )
        self.state = state
        self.session_state: dict[str, Any] = {"steps": 0}
        self.max_checkpoints = max_checkpoints
        self._dataloader: Any = None
        self._checkpoints: collections.deque[str] = collections.deque()

    # Dataloader --------------------------------------------------------------------------

    @property
    def dataloader(self) -> Any:
        """The object whose position is checkpointed (``save(path)``, ``resume(filename=...)``)."""
        if self._dataloader is None:
            logger.warning(NO_DATALOADER_MSG)
        return self._dataloader

    @dataloader.setter
    def dataloader(self, dataloader: Any) -> None:
        missing = [m for m in ("save", "resume") if not callable(getattr(dataloader, m, None))]
        if missing:
            raise ValueError(
                BAD_DATALOADER_MSG.format(
                    type=type(dataloader).__name__, missing=" and ".join(missing)
                )
            )
        self._dataloader = dataloader

    # State -------------------------------------------------------------------------------

    def add_session_state_info(self, info: Mapping[str, Any]) -> None:
        """Merge ``info`` (JSON-serialisable) into ``session_state``, e.g. the model config."""
        self.session_state.update(info)

    def get_named_tensors_data(self) -> NamedTensorData:
        """The host values of ``state``'s variables (read from the device when stale), keyed like ``state``."""
        named = self.state.to_dict()
        data = self.get_tensors_data(named.values())
        return NamedTensorData.from_dict({key: data[t] for key, t in named.items()})

    def load_from_session(self, src: TaskSession, report_missing: ReportMissing = "none") -> None:
        """Copy the values of ``src``'s state variables into the variables with the same keys."""
        _report_missing(
            src.state.keys_flat(), self.state.keys_flat(), report_missing, "Source keys"
        )
        src_to_dst = to_mapping(src.state, self.state)
        data = src.get_tensors_data(src_to_dst)
        self.write_variables_data({dst: data[s] for s, dst in src_to_dst.items()})

    def run(
        self,
        inputs: Mapping[popxl.HostToDeviceStream, Any] | None = None,
        downcast_inputs: bool = True,
    ) -> dict[popxl.DeviceToHostStream, np.ndarray]:
        """``popxl.Session.run``, counting the step in ``session_state["steps"]`` first."""
        self.session_state["steps"] += 1
        return super().run(inputs, downcast_inputs)

    # Checkpoints ---------------------------------------------------------------------------

    def save_checkpoint(self, checkpoint_dir: str | os.PathLike) -> None:
        """Save variables, dataloader position and ``session_state`` to ``checkpoint_dir``.

        The directory appears complete or not at all (see the module docstring). Then the
        oldest checkpoints written by this object beyond ``max_checkpoints`` are deleted.
        """
        target = os.path.abspath(os.fspath(checkpoint_dir))
        with timer("Reading the session state"):
            state = self.get_named_tensors_data().to_dict()
        dataloader = self.dataloader

        def write() -> None:
            with timer(f"Saving checkpoint {target}"), _atomic_dir(target) as tmp:
                os.makedirs(os.path.join(tmp, MODEL_DIR))
                for key, value in state.items():
                    arrays: dict[str, Any] = {key: np.asarray(value)}
                    np.savez(os.path.join(tmp, MODEL_DIR, f"{key}.npz"), **arrays)
                if dataloader is not None:
                    dataloader.save(os.path.join(tmp, DATALOADER_FILE))
                with open(os.path.join(tmp, SESSION_FILE), "w") as f:
                    json.dump(self.session_state, f)
            self._remember_checkpoint(target)

        # Under popdist every instance holds the same global state: instance 0 writes it.
        from runtime.distributed.instances import on_first_instance

        on_first_instance(self.ir, write, f"save checkpoint {target}")

    def _remember_checkpoint(self, path: str) -> None:
        if path in self._checkpoints:
            self._checkpoints.remove(path)
        self._checkpoints.append(path)
        while self.max_checkpoints is not None and len(self._checkpoints) > self.max_checkpoints:
            old = self._checkpoints.popleft()
            logger.info("Deleting old checkpoint %s", old)
            shutil.rmtree(old, ignore_errors=True)

    def load_checkpoint(
        self,
        checkpoint_dir: str | os.PathLike,
        report_missing: ReportMissing = "warn",
        skip_memmap: bool = False,
    ) -> None:
        """Load a checkpoint written by ``save_checkpoint``.

        Variables whose ``<key>.npz`` exists are written with ``write_variables_data``;
        the dataloader resumes from ``dataloader.bin`` when both exist; ``session_state``
        becomes the saved one (``{"steps": 0}`` without ``session_info.json``).

        Args:
            report_missing: ``"none"``, ``"warn"`` (``logging.warning``) or ``"error"``
                (``ValueError``) for files and state keys that do not match, both for the
                model files (listed as full paths) and for the session-state keys.
            skip_memmap: accepted for compatibility; unused.

        Raises:
            ValueError: mismatches with ``report_missing="error"``, or (from
                ``write_variables_data``) arrays of the wrong shape.
            TypeError: arrays of the wrong dtype.
            FileNotFoundError: ``checkpoint_dir`` does not exist.
        """
        root = os.fspath(checkpoint_dir)
        if not os.path.isdir(root):
            raise FileNotFoundError(f"Checkpoint directory {root} does not exist.")
        with timer(f"Loading checkpoint {root}"):
            self._load_model(root, report_missing)
            self._load_dataloader(root)
            self._load_session_info(root, report_missing)

    def _load_model(self, root: str, report_missing: str) -> None:
        model_dir = os.path.join(root, MODEL_DIR)
        found = set()
        if os.path.isdir(model_dir):
            found = {
                os.path.join(model_dir, f) for f in os.listdir(model_dir) if f.endswith(".npz")
            }
        variables = self.state.to_dict()
        expected = {os.path.join(model_dir, f"{key}.npz"): key for key in variables}
        _report_missing(found, expected, report_missing, "Checkpoint files")
        data = {}
        for path in sorted(found & expected.keys()):
            key = expected[path]
            with np.load(path, allow_pickle=False) as npz:
                array = npz[key] if key in npz.files else npz[npz.files[0]]
            data[variables[key]] = _restore_dtype(array, variables[key])
        self.write_variables_data(data)

    def _load_dataloader(self, root: str) -> None:
        path = os.path.join(root, DATALOADER_FILE)
        if self._dataloader is not None and os.path.exists(path):
            self._dataloader.resume(filename=path)

    def _load_session_info(self, root: str, report_missing: str) -> None:
        path = os.path.join(root, SESSION_FILE)
        loaded: dict[str, Any] = {"steps": 0}
        if os.path.exists(path):
            with open(path) as f:
                loaded = json.load(f)
        _report_missing(
            loaded.keys(), self.session_state.keys(), report_missing, "Session info keys"
        )
        self.session_state = loaded


def initialise_memmap_dir_from_checkpoint(
    checkpoint_dir: str | os.PathLike, memmap_dir: str | os.PathLike, prefix: str | None = None
) -> list[str]:
    """Fill ``memmap_dir`` with the variables of a checkpoint, so that factories initialised
    with ``init(prefix, memmap_dir=memmap_dir)`` map the checkpoint's values.

    Raw ``model/*.npy`` files (the original's checkpoints of memory-mapped variables) are
    copied as they are. Each ``model/<key>.npz`` (``save_checkpoint`` here) becomes
    ``<prefix>.<key>.npy`` (``<key>.npy`` without a prefix): the file name
    ``VariableFactory.create_tensor`` memory-maps for the variable named ``<prefix>.<key>``.
    ``prefix`` is this function's addition; the original took only the two directories.

    Returns:
        The paths written, sorted.

    Raises:
        FileNotFoundError: ``checkpoint_dir`` has no ``model`` directory.
    """
    model_dir = os.path.join(os.fspath(checkpoint_dir), MODEL_DIR)
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(
            f"{model_dir} does not exist: checkpoint_dir must be a directory written by "
            "TaskSession.save_checkpoint."
        )
    target = os.fspath(memmap_dir)
    os.makedirs(target, exist_ok=True)
    written = []
    for name in sorted(os.listdir(model_dir)):
        src = os.path.join(model_dir, name)
        if name.endswith(".npy"):
            dst = os.path.join(target, name)
            shutil.copyfile(src, dst)
        elif name.endswith(".npz"):
            key = name[: -len(".npz")]
            dst = os.path.join(target, f"{prefix}.{key}.npy" if prefix else f"{key}.npy")
            with np.load(src, allow_pickle=False) as npz:
                np.save(dst, npz[key] if key in npz.files else npz[npz.files[0]])
        else:
            continue
        written.append(dst)
    return written


__all__ = ["TaskSession", "write_variables_pb"]
