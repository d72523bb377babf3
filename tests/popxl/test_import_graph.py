"""The package import graph: ``popxl`` never imports ``runtime``, JAX or torch at import time."""

import json
import subprocess
import sys

PROBE = """
import json, pkgutil, importlib, sys
{body}
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('popxl', 'runtime', 'popxl_addons', 'poptorch', 'jax', 'jaxlib', 'torch'))))
"""


def _modules_after(body: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(body=body)], capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _roots(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_import_popxl_is_light():
    roots = _roots(_modules_after("import popxl"))
    assert "popxl" in roots
    assert not roots & {"runtime", "jax", "jaxlib", "popxl_addons", "torch"}


def test_no_popxl_module_imports_runtime_or_jax():
    body = (
        "import popxl\n"
        "for info in pkgutil.walk_packages(popxl.__path__, 'popxl.'):\n"
        "    importlib.import_module(info.name)\n"
    )
    roots = _roots(_modules_after(body))
    assert not roots & {"runtime", "jax", "jaxlib"}


def test_session_is_provided_lazily_by_the_runtime():
    roots = _roots(
        _modules_after("import popxl\nassert popxl.Session.__module__ == 'runtime.session'")
    )
    assert "runtime" in roots


def test_import_runtime_imports_popxl():
    roots = _roots(_modules_after("import runtime"))
    assert "popxl" in roots


def test_import_popxl_addons_imports_popxl():
    roots = _roots(_modules_after("import popxl_addons"))
    assert "popxl" in roots
    assert "torch" not in roots
