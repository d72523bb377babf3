"""A run's outputs as host arrays for torch: the large ones taken over, not copied.

``Session.run`` copies every output into a fresh host array; a PopTorch call hands its
outputs to torch, which can take a device buffer's memory over instead (DLPack), as the
buffer is the run's own (``Session.run_to_buffers``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

# dtypes whose buffers torch takes over through DLPack (others are copied, as ``run`` does)
DLPACK_DTYPES = frozenset(
    "float16 bfloat16 float32 float64 int8 uint8 int16 int32 int64 bool".split()
)
# Taking a buffer over costs about 15 us whatever its size; a copy costs 3 us at 4 KiB, 11 at
# 256 KiB, 60 at 1 MiB and 420 at 4 MiB (2026-11-29, the 2-core host): smaller ones are copied.
TAKEN_OVER_BYTES = 512 * 1024


def owned_host_array(buffer: Any, nht: int) -> np.ndarray:
    """A step's output buffer as a writable host array in ``session.run``'s host layout,
    a large one without a copy: torch takes the buffer over (DLPack) and NumPy views
    torch's tensor.

    The buffer is the run's own (``Session.run_to_buffers``), so nothing else reads or
    writes that memory; a 50,257-word GPT-2's logits for 8 x 64 tokens are 103 MB, which
    ``run``'s host copy would copy on every call."""
    if isinstance(buffer, np.ndarray):
        return buffer
    if buffer.nbytes < TAKEN_OVER_BYTES or str(buffer.dtype) not in DLPACK_DTYPES:
        from runtime.session.stream_io import host_copy  # noqa: PLC0415 (runtime loaded by now)

        return host_copy(buffer, nht, may_spread=False)
    buffer.block_until_ready()
    host = torch.from_dlpack(buffer).numpy()
    return host if nht > 1 else host[0]
