"""The packages type-check with mypy under the ``[tool.mypy]`` settings of pyproject.toml."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("popxl", "runtime", "popxl_addons", "poptorch", "popart")


def test_packages_type_check():
    result = subprocess.run(
        [sys.executable, "-m", "mypy", *PACKAGES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"mypy failed:\n{result.stdout}{result.stderr}"
