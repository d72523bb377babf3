"""The package import graph: ``popxl`` never imports ``runtime``, JAX or torch at import time."""

import ast
import json
import pathlib
import subprocess
import sys

import pytest

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
        _modules_after("import popxl\nassert popxl.Session.__module__ == 'runtime.session.session'")
    )
    assert "runtime" in roots


def test_import_runtime_is_light_and_its_session_imports_popxl():
    # ``import runtime`` alone (as ``import popdist`` does) loads neither JAX nor popxl;
    # its Session does.
    roots = _roots(_modules_after("import runtime"))
    assert not roots & {"popxl", "jax", "jaxlib"}
    roots = _roots(_modules_after("import runtime\nruntime.Session"))
    assert {"popxl", "jax"} <= roots


def test_import_popxl_addons_imports_popxl():
    roots = _roots(_modules_after("import popxl_addons"))
    assert "popxl" in roots
    assert "torch" not in roots


# The package layout, checked from the source (every import, at module level or in a
# function): the modules of poptorch and runtime form no circle, and poptorch's stages
# import in one direction: capture -> aten -> popxl; ops, options, optim and data know
# nothing of execution, and compat (upstream's internals) is never imported below it.

ROOT = pathlib.Path(__file__).resolve().parents[2]
STAGES = ("aten", "capture", "ops", "options", "optim", "data", "execution", "compat")
# stage -> the stages it must not import
FORBIDDEN = {
    "aten": {"capture", "ops", "options", "optim", "data", "execution", "compat"},
    "capture": {"options", "optim", "data", "execution", "compat"},
    "ops": {"capture", "options", "optim", "data", "execution", "compat"},
    "options": {"capture", "ops", "data", "execution", "compat"},
    "optim": {"capture", "ops", "data", "execution", "compat"},
    "data": {"ops", "optim", "execution", "compat"},
    "compat": {"execution"},
}


def _module_files(package: str) -> dict[str, pathlib.Path]:
    files = {}
    for path in (ROOT / package).rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        files[name] = path
    return files


def _imports(name: str, path: pathlib.Path, known: dict) -> set[str]:
    """The modules of ``known`` that ``name`` imports (a name imported from a package
    counts as its submodule when it is one)."""
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            heads = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            head = node.module or ""
            if node.level:
                head = ".".join(base[: len(base) - node.level + 1] + ([head] if head else []))
            heads = [f"{head}.{a.name}" for a in node.names] + [head]
        else:
            continue
        for head in heads:
            while head and head not in known:
                head = head.rpartition(".")[0]
            if head and head != name:
                found.add(head)
    return found


def _graph(package: str) -> dict[str, set[str]]:
    """Imports between the package's modules; a package's ``__init__`` (its face, which only
    hands names on) is left out."""
    files = _module_files(package)
    faces = {n for n, p in files.items() if p.name == "__init__.py"}
    return {n: _imports(n, p, files) - faces for n, p in files.items() if n not in faces}


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    reach = {n: set() for n in graph}
    for start in graph:
        todo = list(graph[start])
        while todo:
            m = todo.pop()
            if m not in reach[start]:
                reach[start].add(m)
                todo.extend(graph.get(m, ()))
    return [{n, m} for n in graph for m in reach[n] if n < m and n in reach[m]]


@pytest.mark.parametrize("package", ["poptorch", "runtime"])
def test_no_import_circle(package):
    assert _circles(_graph(package)) == []


def _stage(module: str, stages: tuple[str, ...] = STAGES) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in stages else None


def _wrong_imports(package: str, stages: tuple[str, ...], forbidden: dict) -> list[str]:
    """Imports of a stage the table forbids to the importing module's stage."""
    return sorted(
        f"{module} imports {target}"
        for module, targets in _graph(package).items()
        for target in targets
        if _stage(target, stages) in forbidden.get(_stage(module, stages) or "", set())
    )


def test_poptorch_stages_import_in_one_direction():
    assert _wrong_imports("poptorch", STAGES, FORBIDDEN) == []


def test_every_poptorch_stage_says_what_it_owns():
    for stage in STAGES:
        doc = ast.get_docstring(ast.parse((ROOT / "poptorch" / stage / "__init__.py").read_text()))
        assert doc and len(doc) > 40, stage


# runtime's stages: the backend's forms know no IR; the interpreter lowers ops and graphs;
# devices place them; distributed joins processes; the session builds and runs the step.
RUNTIME_STAGES = ("backend", "lowering", "devices", "distributed", "session")
RUNTIME_FORBIDDEN = {
    "backend": {"lowering", "devices", "distributed", "session"},
    "lowering": {"devices", "distributed", "session"},
    "devices": {"distributed", "session"},
    "distributed": {"backend", "lowering", "devices", "session"},
}


def test_runtime_stages_import_in_one_direction():
    assert _wrong_imports("runtime", RUNTIME_STAGES, RUNTIME_FORBIDDEN) == []
    modules = _graph("runtime")
    assert {_stage(m, RUNTIME_STAGES) for m in modules} == set(RUNTIME_STAGES)  # none loose


def test_every_runtime_stage_says_what_it_owns():
    for stage in RUNTIME_STAGES:
        doc = ast.get_docstring(ast.parse((ROOT / "runtime" / stage / "__init__.py").read_text()))
        assert doc and len(doc) > 40, stage


def test_runtime_never_imports_popdist():
    # popdist is PopDist's face over runtime/distributed/environment: the arrow goes one way.
    files = _module_files("runtime")
    known = {**files, "popdist": ROOT / "popdist" / "__init__.py"}
    assert not [name for name, path in files.items() if "popdist" in _imports(name, path, known)]
