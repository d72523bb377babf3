"""The product packages raise typed errors, never ``assert``.

An ``assert`` disappears under ``python -O`` and, when it fires, reads as a bare
``AssertionError`` that says nothing about the program. User mistakes get PopXL's typed
errors; internal inconsistencies raise ``popxl.errors.InternalError`` naming the op and graph.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("popxl", "runtime", "popxl_addons", "poptorch", "popdist")


def _asserts(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = path.relative_to(ROOT)
    return [f"{rel}:{node.lineno}" for node in ast.walk(tree) if isinstance(node, ast.Assert)]


@pytest.mark.parametrize("package", PACKAGES)
def test_product_code_has_no_assert_statements(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no sources found for {package}"
    found = [site for path in files for site in _asserts(path)]
    assert not found, (
        "assert statements in product code (raise popxl.errors.InternalError for internal "
        "inconsistencies, a typed error for user mistakes): " + ", ".join(found)
    )


def _raised_assertion_errors(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = path.relative_to(ROOT)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id == "AssertionError":
                found.append(f"{rel}:{node.lineno}")
    return found


# PopTorch raises AssertionError where the original did (its option checks), so it is left out.
@pytest.mark.parametrize("package", ("popxl", "runtime", "popxl_addons", "popdist"))
def test_product_code_raises_no_bare_assertion_error(package):
    found = [
        s for path in sorted((ROOT / package).rglob("*.py")) for s in _raised_assertion_errors(path)
    ]
    assert not found, "raise InternalError (or a typed error) instead: " + ", ".join(found)
