"""Models people bring, through ``poptorch`` against eager torch and ``torch.compile``.

For each model (torchvision, transformers, timm; random weights, nothing downloaded) and
mode (inference, one SGD training step per call), each side runs in its own process so that
nothing else shares the cores while it is timed (torch's OpenMP threads and XLA's would slow
each other):

* ``poptorch``: the first call, split into its stages (capture, building the program,
  compiling, first run), then steady calls;
* ``eager``: the first call and steady calls of the plain torch model;
* ``compile``: ``torch.compile``'s first call (its compilation, with a fresh Inductor cache
  folder: cold, as a user's first run) and steady calls;
* ``jax``: the same network written by hand in JAX (``bench/_vision_jax.py``; ResNet-18
  only), its first call being ``jax.jit``'s trace, compilation and first run.

Steady figures are medians; peak memory is the process's VmHWM. Say the machine's load
with the figures (``uptime``): under load eager torch's threads collapse.

Run: python bench/poptorch_zoo.py [--models resnet18,mobilenet_v2] [--modes infer,train]
     [--sides poptorch,eager,compile] [--batch 8] [--size 64] [--calls 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import first_and_median, peak_rss_mb, run_variant  # noqa: E402

SIDES = ("poptorch", "eager", "compile")


def _vision(builder: Callable[[int], Any]) -> Callable[[int, int], tuple]:
    def make(batch: int, size: int) -> tuple:
        import torch  # noqa: PLC0415

        model = builder(size)
        x = torch.randn(batch, 3, size, size)
        y = torch.randint(0, 10, (batch,))
        return model, (x,), y

    return make


def _torchvision(name: str) -> Callable[[int, int], tuple]:
    def build(size: int) -> Any:
        import torchvision  # noqa: PLC0415

        return getattr(torchvision.models, name)(num_classes=10)

    return _vision(build)


def _timm(name: str, sized: bool = False) -> Callable[[int, int], tuple]:
    """A timm model; ``sized``: built for the bench's image side (a ViT's position
    embeddings are made for one size, and its forward refuses any other)."""

    def build(size: int) -> Any:
        import timm  # noqa: PLC0415

        extra = {"img_size": size} if sized else {}
        return timm.create_model(name, pretrained=False, num_classes=10, **extra)

    return _vision(build)


def _video(name: str, frames: int = 8) -> Callable[[int, int], tuple]:
    def make(batch: int, size: int) -> tuple:
        import torch  # noqa: PLC0415
        import torchvision  # noqa: PLC0415

        model = getattr(torchvision.models.video, name)(num_classes=10)
        x = torch.randn(batch, 3, frames, size, size)
        return model, (x,), torch.randint(0, 10, (batch,))

    return make


def _causal_lm(
    config: str, model: str, vocab: int = 512, **settings: Any
) -> Callable[[int, int], tuple]:
    """A small HuggingFace decoder and a batch of token ids."""

    def make(batch: int, size: int) -> tuple:
        import torch  # noqa: PLC0415
        import transformers  # noqa: PLC0415

        built = getattr(transformers, model)(
            getattr(transformers, config)(vocab_size=vocab, **settings)
        )
        return built, (torch.randint(0, vocab, (batch, size)),), None

    return make


def _bert(batch: int, size: int) -> tuple:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    config = transformers.BertConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=512,
        num_labels=10,
    )
    model = transformers.BertForSequenceClassification(config)
    ids = torch.randint(0, 512, (batch, size))
    return model, (ids,), torch.randint(0, 10, (batch,))


MODELS: dict[str, Callable[[int, int], tuple]] = {
    "resnet18": _torchvision("resnet18"),
    "resnet50": _torchvision("resnet50"),
    "convnext_tiny": _torchvision("convnext_tiny"),
    "mobilenet_v2": _torchvision("mobilenet_v2"),
    "efficientnet_b0": _torchvision("efficientnet_b0"),
    "r3d_18": _video("r3d_18"),
    "vit_tiny": _timm("vit_tiny_patch16_224", sized=True),
    "gpt2": _causal_lm("GPT2Config", "GPT2LMHeadModel", n_layer=2, n_embd=64, n_head=4),
    # the same with GPT-2's own vocabulary: logits of 50,257 words per token (103 MB a call)
    "gpt2_vocab": _causal_lm(
        "GPT2Config", "GPT2LMHeadModel", vocab=50257, n_layer=2, n_embd=64, n_head=4
    ),
    "llama": _causal_lm(
        "LlamaConfig",
        "LlamaForCausalLM",
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
    ),
    "bert": _bert,
}


class _Trained:
    """The model with its loss computed inside, as PopTorch training models return it."""

    def __new__(cls, model: Any, labels: Any) -> Any:
        import torch  # noqa: PLC0415

        class WithLoss(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *inputs: Any) -> Any:
                out = self.model(*inputs)
                logits = getattr(out, "logits", out)
                if labels is None:  # a language model: next-token loss on its own input
                    target = inputs[0][:, 1:].reshape(-1)
                    logits = logits[:, :-1].reshape(-1, logits.shape[-1])
                else:
                    target = labels
                return torch.nn.functional.cross_entropy(logits, target)

        return WithLoss()


def _jax_worker(name: str, mode: str, model: Any, inputs: tuple, labels: Any, calls: int) -> dict:
    from bench import _vision_jax  # noqa: PLC0415

    if name not in _vision_jax.MODELS:
        raise SystemExit(
            f"no hand-written JAX twin of {name!r}; there are {list(_vision_jax.MODELS)}"
        )
    infer, train = _vision_jax.MODELS[name]
    host = [np.asarray(x) for x in inputs]
    if mode == "infer":
        model.eval()
        forward = infer(model)
        call: Callable[[], Any] = lambda: forward(*host).block_until_ready()  # noqa: E731
    else:
        model.train()
        step = train(model)
        targets = np.asarray(labels)
        call = lambda: float(step(*host, targets))  # noqa: E731
    first, steady = first_and_median(call, calls)
    return {"first_s": first, "steady_ms": steady, "peak_mb": peak_rss_mb()}


def worker(
    name: str, mode: str, side: str, batch: int, size: int, calls: int, device: str = "cpu"
) -> dict:
    """One side's figures. ``device``: where eager torch and ``torch.compile`` run (poptorch
    and the JAX twin run on JAX's default backend, fed from the host as PopTorch was)."""
    if side == "compile":
        # a cold cache, as a user's first run meets it: Inductor otherwise finds the kernels
        # of earlier runs in its default folder (first calls of 3-7 s against 25-120 cold)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="zoo-inductor-")
    import torch  # noqa: PLC0415

    import poptorch  # noqa: PLC0415

    torch.manual_seed(0)
    model, inputs, labels = MODELS[name](batch, size)
    result: dict[str, Any] = {}
    if side == "jax":
        return _jax_worker(name, mode, model, inputs, labels, calls)
    if side != "poptorch" and device != "cpu":
        model.to(device)
        inputs = tuple(x.to(device) for x in inputs)
        labels = None if labels is None else labels.to(device)
    if mode == "infer":
        model.eval()
        if side == "poptorch":
            pm = poptorch.inferenceModel(
                model, poptorch.Options().showCompilationProgressBar(False)
            )
            call: Callable[[], Any] = lambda: pm(*inputs)  # noqa: E731
        else:
            target = torch.compile(model) if side == "compile" else model

            def call() -> Any:
                with torch.no_grad():
                    return target(*inputs)
    else:
        trained = _Trained(model, labels)
        trained.train()
        if side == "poptorch":
            opts = poptorch.Options().showCompilationProgressBar(False)
            optimizer = torch.optim.SGD(trained.parameters(), lr=0.01)
            pm = poptorch.trainingModel(trained, opts, optimizer)
            call = lambda: pm(*inputs)  # noqa: E731
        else:
            target = torch.compile(trained) if side == "compile" else trained
            optimizer = torch.optim.SGD(trained.parameters(), lr=0.01)

            def call() -> Any:
                optimizer.zero_grad()
                loss = target(*inputs)
                loss.backward()
                optimizer.step()
                return loss

    if device.startswith("cuda") and side != "poptorch":
        unsynced = call

        def call() -> Any:
            out = unsynced()
            torch.cuda.synchronize()
            return out

    first, steady = first_and_median(call, calls)
    result.update(first_s=first, steady_ms=steady, peak_mb=peak_rss_mb())
    if side == "poptorch":
        result["stages_s"] = dict(getattr(pm, "_first_call_seconds", {}) or {})
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="resnet18,mobilenet_v2,efficientnet_b0,gpt2,bert")
    parser.add_argument("--modes", default="infer,train")
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=64, help="image side or sequence length")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--torch-device", default="cpu", help="eager torch's device (cuda)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="processes per side, the sides alternated: speed on the shared host moves by a "
        "third between processes, and a step's peak memory can differ by one of its "
        "temporary buffers (glibc keeping a freed block split)",
    )
    parser.add_argument("--worker", nargs=3, metavar=("MODEL", "MODE", "SIDE"))
    args = parser.parse_args()
    if args.worker:
        name, mode, side = args.worker
        print(
            json.dumps(
                worker(name, mode, side, args.batch, args.size, args.calls, args.torch_device)
            )
        )
        return
    print(
        f"load: {os.getloadavg()[0]:.2f} (1-minute average), batch {args.batch}, size {args.size}, "
        f"eager torch on {args.torch_device}"
    )
    header = "| model | mode | side | first call s | stages s | steady ms | steady ms / poptorch's | peak MiB |"
    print(header + "\n|" + "---|" * 8)
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            for _ in range(args.rounds):
                _round(args, name, mode)


def _round(args: argparse.Namespace, name: str, mode: str) -> None:
    """One process per side for ``name`` in ``mode``, and their table rows."""
    rows = {}
    for side in args.sides.split(","):
        common = ["--batch", str(args.batch), "--size", str(args.size)]
        common += ["--calls", str(args.calls), "--torch-device", args.torch_device]
        common += ["--worker", name, mode, side]
        rows[side] = run_variant(__file__, *common)
    ours = rows.get("poptorch", {}).get("steady_ms")
    for side, r in rows.items():
        stages = ", ".join(f"{k} {v:.1f}" for k, v in r.get("stages_s", {}).items())
        speed = f"{r['steady_ms'] / ours:.2f}" if ours else "-"
        print(
            f"| {name} | {mode} | {side} | {r['first_s']:.1f} | {stages or '-'} | "
            f"{r['steady_ms']:.1f} | {speed} | {r['peak_mb']:.0f} |"
        )


if __name__ == "__main__":
    main()
