"""The progress bar of a model's first call, as PopTorch drew one while it compiled.

The first call of a ``poptorch.inferenceModel``/``trainingModel`` captures the model,
builds the program, compiles it and runs it once; each can take a while. With
``Options.showCompilationProgressBar`` (on by default) and a terminal on stderr, a ``tqdm``
bar names the stage running and the time spent so far (ticking each second); when stderr is
not a terminal nothing is printed.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

STAGES = ("capture", "building the program", "compiling", "first run")
_FORMAT = "Graph compilation: {desc} [{n_fmt}/{total_fmt}] {elapsed}"
_TICK_SECONDS = 1.0


class CompileProgress:
    """A bar over ``STAGES`` (a no-op when not ``enabled``)."""

    def __init__(
        self, enabled: bool, stream: IO[str] | None = None, stages: tuple[str, ...] = STAGES
    ) -> None:
        self._bar: Any = None
        # Seconds each stage took, drawn or not (``bench/poptorch_zoo.py`` reads them).
        self.seconds: dict[str, float] = {}
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if not enabled:
            return
        from tqdm import tqdm  # noqa: PLC0415 (only drawn in a terminal)

        self._bar = tqdm(total=len(stages), bar_format=_FORMAT, file=stream or sys.stderr)
        self._ticker = threading.Thread(target=self._tick, daemon=True)
        self._ticker.start()

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Show ``name`` while the block runs; count it done after. An error closes the bar."""
        start = time.perf_counter()
        bar = self._bar
        if bar is None:
            yield
            self.seconds[name] = time.perf_counter() - start
            return
        bar.set_description_str(name)
        try:
            yield
        except BaseException:
            self.close()
            raise
        self.seconds[name] = time.perf_counter() - start
        bar.update(1)

    def close(self) -> None:
        if self._bar is None:
            return
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        self._bar.close()
        self._bar = None

    def _tick(self) -> None:
        while not self._stop.wait(_TICK_SECONDS):
            bar = self._bar
            if bar is not None:
                bar.refresh()


def for_options(options: Any, stages: tuple[str, ...] = STAGES) -> CompileProgress:
    """The bar ``options`` ask for: drawn when ``showCompilationProgressBar`` is on and
    stderr is a terminal."""
    stream = sys.stderr
    isatty = getattr(stream, "isatty", None)
    enabled = bool(options.show_compilation_progress_bar and isatty is not None and isatty())
    return CompileProgress(enabled, stream, stages)
