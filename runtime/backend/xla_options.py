"""The options the runtime compiles its programs with, per backend and machine.

XLA:CPU (jaxlib 0.10) hands convolutions, dots and reductions to YNNPACK by default. Its
convolution runs on one thread: the intra-op pool it is given stays idle, where Eigen's
convolution kernel splits the same work over every core. On the 2-core AVX-512 CPU of
2026-11-25 a 3x3 convolution of 8x32x32x64 took 3.9 ms through YNNPACK on one core or two,
and through Eigen 4.5 ms on one core, 2.4 ms on two. Whole steps there, 2 cores, medians of
three interleaved rounds (ms, YNNPACK's convolutions -> Eigen's):

* ResNet-18 SGD step 75.0 -> 66.7, inference 16.1 -> 15.0;
* MobileNetV2 65.9 -> 62.6, 11.1 -> 8.4; EfficientNet-B0 93.2 -> 87.3, 19.6 -> 16.9;
* R3D-18 inference 757 -> 540.

So where the process may use more than one core, programs compile with YNNPACK kept for
dots and reductions (taking reductions from it too made the training steps up to 1.9x
slower) and convolutions left to Eigen. A user's own ``XLA_FLAGS`` setting of the option
wins, and a jaxlib that does not know the option compiles with its defaults.

XLA:CPU copies every donated weight that anything besides its update reads (the input
gradient of a matmul or convolution reads the weight) at the start of each step, even
where the reads are ordered before the update: a plain two-layer SGD step in ``jax.jit``
copies both weights. With XLA's region analysis in copy insertion the update writes in
place, as it already does for weights nothing else reads (training steps, 2 cores, two
interleaved rounds, ms: ResNet-18 64.9 -> 60.7, MobileNetV2 58.6 -> 54.8; 2026-11-26). That
analysis gets loops wrong in jaxlib 0.10 (a step scanning its layers read weights its
updates had already overwritten), so ``jit(..., in_place=True)`` asks for it only for
steps that neither loop nor branch (``runtime.session.program``'s convolution programs, whose
traced step is looked at first).

Products with many rows run faster on Eigen than on YNNPACK here, and YNNPACK refuses the
weight gradient's product anyway (its left operand is column-major), which Eigen then runs
at up to 1.5x YNNPACK's speed on the same shapes. A linear layer's forward, input-gradient
and weight-gradient products (us, 2026-11-28, the two libraries' programs alternated):
512 rows x 128 features 1,451 (YNNPACK) / 914 (Eigen), 256 x 128 632 / 416, 128 x 128
549 / 469, but 8 x 512 746 / 948 and 32 x 512 870 / 1,488. Whole steps, medians of 8
alternated rounds (ms, YNNPACK's products -> Eigen's): the 12-layer encoder's SGD step
(512-row products) 155 -> 136; the zoo's BERT 20.2 -> 16.8 (Eigen ahead in 8 of 8), GPT-2
23.5 -> 21.1 (7 of 8), BERT inference 4.8 -> 4.2. But popxl's MNIST MLP (batch-8 products)
1,042 -> 596 steps/s, and ConvNeXt-T's step (its channel MLPs have 2,048 rows) 531 -> 576.
So a program without convolutions whose products are mostly (by multiply-adds) of
``LARGE_PRODUCT_ROWS`` rows or more compiles with ``large_products=True``: dots on Eigen.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterable
from typing import Any

import jax

YNN_OPTION = "xla_cpu_experimental_ynn_fusion_type"
# YNNPACK for dots and reductions, not for convolutions (jaxlib 0.10's default is all three)
YNN_WITHOUT_CONVOLUTIONS = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"
# YNNPACK for reductions only: convolutions and dots on Eigen
YNN_REDUCTIONS_ONLY = "LIBRARY_FUSION_TYPE_REDUCE"
LARGE_PRODUCT_ROWS = 128


def jit(fun: Callable, in_place: bool = False, large_products: bool = False, **kwargs: Any) -> Any:
    """``jax.jit(fun, **kwargs)``, compiled with this backend's options; ``in_place``: with
    donated inputs updated in place (only for a function that neither loops nor branches);
    ``large_products``: its products are mostly of many rows (on the CPU, dots on Eigen).

    JAX takes ``compiler_options`` on top-level jits only: to see such a function's jaxpr,
    use its ``.trace(*args).jaxpr`` rather than tracing it inside ``jax.make_jaxpr``.
    """
    options = dict(compiler_options(large_products))
    if in_place:
        options.update(in_place_options())
    if options:
        kwargs["compiler_options"] = options
    return jax.jit(fun, **kwargs)


COPY_OPTION = "xla_cpu_copy_insertion_use_region_analysis"


def large_products(ops: Iterable[Any]) -> bool:
    """Whether most of the multiply-adds of the ``matmul`` ops among ``ops`` (a program's)
    are in products of at least ``LARGE_PRODUCT_ROWS`` rows: a batched product's rows are
    its own, a product with a plain matrix on the right counts every leading row of the
    left."""
    large = total = 0
    for op in ops:
        if op.opdef.key != "matmul" or not op.inputs[0].shape:
            continue
        a, b = op.inputs[0].shape, op.inputs[1].shape
        work = math.prod(op.outputs[0].shape) * a[-1]
        rows = math.prod(a[:-1]) if len(b) <= 2 else a[-2]
        total += work
        large += work if rows >= LARGE_PRODUCT_ROWS else 0
    return total > 0 and 2 * large > total


@functools.cache
def compiler_options(large_products: bool = False) -> dict[str, Any]:
    """The XLA options for programs on the default backend (empty: XLA's defaults);
    ``large_products``: for a program whose products are mostly of many rows."""
    if jax.default_backend() != "cpu" or _cores() < 2:
        return {}
    return _wanted(
        {YNN_OPTION: YNN_REDUCTIONS_ONLY if large_products else YNN_WITHOUT_CONVOLUTIONS}
    )


@functools.cache
def in_place_options() -> dict[str, Any]:
    """The options for a step without loops or branches whose donated inputs are updated
    in place (empty where XLA does not need or know them)."""
    if jax.default_backend() != "cpu":
        return {}
    return _wanted({COPY_OPTION: True})


def _wanted(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` but those the user's ``XLA_FLAGS`` set and those this jaxlib lacks."""
    chosen = os.environ.get("XLA_FLAGS", "")
    return {k: v for k, v in options.items() if k not in chosen and _known({k: v})}


def _known(options: dict[str, Any]) -> bool:
    """Whether this jax and jaxlib compile with ``options``."""
    try:
        jax.jit(lambda x: x + 1, compiler_options=options).lower(1.0).compile()
    except Exception:  # an older jax (no ``compiler_options``) or jaxlib (no such option)
        return False
    return True


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
