"""Runnable tutorials (numbered folders) and their shared data helper."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_tutorial(folder: str, script: str = "mnist.py") -> ModuleType:
    """Import a tutorial script (whose folder name is not a valid package name) as a module,
    once per process: a script that registers ops or models is executed only once."""
    name = f"tutorials._{folder}"
    if script != "mnist.py":
        name += "_" + Path(script).stem
    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).resolve().parent / folder / script
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
