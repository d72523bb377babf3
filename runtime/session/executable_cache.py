"""The persistent executable cache: compiled steps saved to disk and loaded by later sessions,
in this process or another (PopART's engine caching).

It is on when the session options say ``enableEngineCaching`` (folder ``cachePath``) or the
``POPXL_CACHE_DIR`` environment variable names a folder. Each compiled step is one file,
``<hash>.popef``, named after the hash of what determines the executable: the IR's
structure, the engine options, the device and the JAX version and backend. A file holds a
header line with its hash, then the serialized XLA executable. A session looks through the
folder's ``.popef`` files, loads the one whose recorded hash is its own, and otherwise
compiles and saves. Files that are not executables, or whose name and recorded hash
disagree, are reported and ignored. ``POPART_PRELOAD_POPEF=full-preload`` reads each
candidate file whole into memory while looking (otherwise only headers are read until one
matches).

The log (``POPART_LOG_LEVEL=DEBUG``) keeps PopART's wording: "Starting compilation",
"PopEF file inferred to have hash <h>", "Loading serialized PopART executable <h>".
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
from jax.experimental import serialize_executable

from popxl import _log

MAGIC = b"POPXL-JAX-EXECUTABLE\n"
SUFFIX = ".popef"
PRELOAD_ENV = "POPART_PRELOAD_POPEF"


def directory(options: Any) -> Path | None:
    """The cache folder the session options or ``POPXL_CACHE_DIR`` ask for, or None."""
    if options.enableEngineCaching:
        return Path(options.cachePath)
    env = os.environ.get("POPXL_CACHE_DIR")
    return Path(env) if env else None


def executable_hash(program_key: str, engine_options: Mapping[str, str], device: str) -> str:
    """The hash naming a compiled step."""
    h = hashlib.blake2b(digest_size=16)
    parts = (program_key, sorted(engine_options.items()), device, jax.__version__)
    h.update(repr((*parts, jax.default_backend())).encode())
    return h.hexdigest()


def _read_header(path: Path) -> dict[str, Any] | None:
    try:
        with path.open("rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                return None
            header = json.loads(f.readline())
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) and isinstance(header.get("hash"), str) else None


def _payload(path: Path, preloaded: bytes | None) -> bytes:
    data = preloaded if preloaded is not None else path.read_bytes()
    body = data[len(MAGIC) :]
    return body[body.index(b"\n") + 1 :]


def _preload(path: Path) -> bytes | None:
    if os.environ.get(PRELOAD_ENV) != "full-preload":
        return None
    _log.debug(f"Performing preload of popef file {path}")
    data = path.read_bytes()
    _log.debug(f"Completed preload of popef file {path}")
    return data


def _find(folder: Path, wanted: str) -> tuple[Path, bytes | None] | None:
    """The cache file holding ``wanted``, reporting the others as PopART did."""
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob(f"*{SUFFIX}")):
        preloaded = _preload(path)
        header = _read_header(path)
        if header is None:
            _log.log(
                _log.WARN,
                f"Ignoring cache file because it does not contain a valid executable: {path}",
            )
            continue
        found = header["hash"]
        _log.debug(f"PopEF file inferred to have hash {found}")
        if path.stem == wanted and found != wanted:
            _log.log(
                _log.WARN,
                f"Cache file hash did not match the IR hash: {path} records {found}, "
                f"the IR's is {wanted}. Ignoring it.",
            )
        if found == wanted:
            return path, preloaded
    return None


def _load(path: Path, preloaded: bytes | None, devices: Sequence[Any]) -> Any | None:
    try:
        payload, in_tree, out_tree = pickle.loads(_payload(path, preloaded))
        return serialize_executable.deserialize_and_load(
            payload, in_tree, out_tree, execution_devices=list(devices)
        )
    except Exception as err:  # noqa: BLE001 (a stale or foreign file must not stop the session)
        _log.log(_log.WARN, f"Could not load cached executable {path} ({err}); compiling.")
        return None


def _save(folder: Path, wanted: str, compiled: Any) -> None:
    try:
        body = pickle.dumps(serialize_executable.serialize(compiled))
    except Exception as err:  # noqa: BLE001 (some backends cannot serialize)
        _log.log(_log.WARN, f"This backend cannot save compiled executables ({err}).")
        return
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{wanted}{SUFFIX}"
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(MAGIC + json.dumps({"hash": wanted}).encode() + b"\n" + body)
    tmp.replace(path)
    _log.debug(f"Saved serialized PopART executable {path}")


def load_or_compile(
    folder: Path, wanted: str, compile_step: Callable[[], Any], devices: Sequence[Any]
) -> Any:
    """The executable with hash ``wanted``: loaded from ``folder`` (to run on ``devices``, in
    the order the compiled step used them) or compiled and saved."""
    found = _find(folder, wanted)
    if found is not None:
        _log.debug(f"Loading serialized PopART executable {wanted}")
        loaded = _load(*found, devices)
        if loaded is not None:
            return loaded
    _log.debug("Starting compilation")
    compiled = compile_step()
    _log.debug("Compilation complete")
    _save(folder, wanted, compiled)
    return compiled
