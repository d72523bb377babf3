"""Surfaces that mirror PopTorch's and PopART's internals, for code written against them.

* ``upstream``: ``poptorch.poptorch_core``, ``poptorch._impl`` and ``poptorch._logging``, the
  private modules PopTorch's tests and some applications reach into;
* ``popart_ir``: the program's ops as PopART's serialized IR (``_debugGetPopartIR``);
* ``lowering_log``: PopTorch's DEBUG account of where each op runs;
* ``checkpoints``: ``torch.load`` of the checkpoints PopTorch-era scripts wrote (their
  ``argparse.Namespace``) under torch's weights-only default.

Each is thin, over the real code; nothing else in ``poptorch`` depends on their shapes.
"""

from __future__ import annotations
