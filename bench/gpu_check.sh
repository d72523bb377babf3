#!/usr/bin/env bash
# The GPU checks of issue 38 in one run, for a lent GPU machine (whose image has jax with
# CUDA, torch, torchvision, transformers and timm; carry wheels for pydantic in .whl/):
#   1. the convolution, pool and model tests on JAX's GPU backend, against torch on the CPU;
#   2. bench/conv_lowering.py: XLA's own kernels (cuDNN; what the rules keep off the CPU)
#      against the CPU's forms traced on the GPU, and eager torch on CUDA;
#   3. bench/poptorch_zoo.py: poptorch and the hand-written JAX twin on the GPU against eager
#      torch on CUDA, steady calls and the first call.
# Results go to $OUT (default /tmp/gpu_check); PARTS picks some ("tests conv zoo").
# Each part has its own time limit.
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export JAX_PLATFORMS=${JAX_PLATFORMS:-cuda,cpu} PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
{
    nvidia-smi -L
    python3 -c "import jax, torch, torchvision, transformers, timm, pydantic
print('jax', jax.__version__, jax.devices(), 'torch', torch.__version__, 'torchvision',
      torchvision.__version__, 'transformers', transformers.__version__, 'timm', timm.__version__)"
} 2>&1 | tee "$OUT/env.txt"

part() { [[ " ${PARTS:-tests conv zoo} " == *" $1 "* ]]; }

part tests && {
timeout 150 python3 -m pytest -q -n 12 -p no:cacheprovider -p no:benchmark \
    tests/popxl/ops/test_conv_lowering.py tests/popxl/ops/test_pool_lowering.py \
    tests/poptorch/zoo/test_torchvision.py tests/poptorch/zoo/test_timm.py \
    tests/poptorch/zoo/test_transformers.py \
    "tests/poptorch/aten/test_table.py" -k "not test_table or conv or pool or norm or matmul" \
    >"$OUT/tests.txt" 2>&1
echo "tests: rc $?"; tail -n 30 "$OUT/tests.txt"
}

part conv && {
timeout 120 python3 bench/conv_lowering.py --quick --torch-device cuda \
    >"$OUT/conv.txt" 2>&1
echo "conv_lowering: rc $?"; grep -A40 "^device" "$OUT/conv.txt" || tail -n 20 "$OUT/conv.txt"
}

part zoo && {
zoo() { timeout "$1" python3 bench/poptorch_zoo.py --torch-device cuda --calls 20 "${@:2}"; }
{
    zoo 80 --models resnet18 --sides poptorch,eager,jax
    zoo 120 --models mobilenet_v2,efficientnet_b0,gpt2 --sides poptorch,eager
    zoo 50 --models resnet50 --batch 32 --size 224 --sides poptorch,eager
} >"$OUT/zoo.txt" 2>&1
echo "zoo: rc $?"; cat "$OUT/zoo.txt"
}
