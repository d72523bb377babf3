"""``popxl_addons.GIT_COMMIT``: the short commit of the git repository the program runs in."""

from __future__ import annotations

import functools
import subprocess


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The 7-character sha of ``HEAD`` of the repository containing the working directory
    (searching parent directories), or ``None`` outside a repository or without git.

    Applications log it to tie results to code. Computed once, on first access of
    ``popxl_addons.GIT_COMMIT``, so importing the package runs no subprocess.
    """
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=7", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and sha else None
