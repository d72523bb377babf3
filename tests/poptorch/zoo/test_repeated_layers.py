"""A HuggingFace model's N layers are one subgraph called N times, as a torchvision stage's are.

HF layers differ in one attribute, ``layer_idx`` (their slot in the key/value cache), so they
are repeated blocks only while nothing but a cache update reads it: the block returns the keys
and values it would have stored and the parent stores them under each layer's own index.
"""

from __future__ import annotations

import collections
import copy
import re

import pytest
import torch

import poptorch

from ._compare import assert_trains_as_eager

tf = pytest.importorskip("transformers")


def _llama(layers: int = 3) -> torch.nn.Module:
    config = tf.LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
    return tf.LlamaForCausalLM(config).eval()


def _gpt2(**kwargs) -> torch.nn.Module:
    config = tf.GPT2Config(vocab_size=100, n_positions=16, n_embd=32, n_layer=3, n_head=2, **kwargs)
    return tf.GPT2LMHeadModel(config).eval()


def _subgraph_calls(pm) -> list[str]:
    return re.findall(r"Call\.\d+\((\w+_subgraph\(\d+\))\)", pm.print_schedule())


def _infer(model: torch.nn.Module, **inputs):
    """poptorch's outputs, eager torch's (from copies of the inputs) and the model's calls."""
    want = model(**copy.deepcopy(inputs))
    pm = poptorch.inferenceModel(model)
    got = pm(**inputs)
    return got, want, _subgraph_calls(pm)


def test_llama_layers_are_one_subgraph_and_fill_the_cache_as_eager():
    ids = torch.randint(0, 100, (2, 8))
    got, want, calls = _infer(_llama(3), input_ids=ids, attention_mask=torch.ones_like(ids))
    layer_calls = [c for c in calls if c.startswith("LlamaDecoderLayer_subgraph")]
    assert len(layer_calls) == 3 and len(set(layer_calls)) == 1
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-5)
    # The cache the user gets back holds each layer's keys and values, as eager torch's does.
    assert len(got.cache.layers) == len(want.cache.layers) == 3
    for g, w in zip(got.cache.layers, want.cache.layers):
        torch.testing.assert_close(g.keys, w.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(g.values, w.values, rtol=1e-4, atol=1e-5)
    assert not torch.equal(got.cache.layers[0].keys, got.cache.layers[1].keys)


def test_llama_training_with_one_layer_subgraph_updates_as_eager():
    ids = torch.randint(0, 100, (2, 8))
    assert_trains_as_eager(_llama(3), kwargs={"input_ids": ids, "labels": ids})


def test_a_layer_computing_with_its_index_is_captured_inline():
    """GPT-2's ``scale_attn_by_inverse_layer_idx`` divides by ``layer_idx + 1``: the layers
    compute different things, so each is captured inline."""
    ids = torch.randint(0, 100, (2, 8))
    got, want, calls = _infer(_gpt2(scale_attn_by_inverse_layer_idx=True), input_ids=ids)
    assert not any(c.startswith("GPT2Block_subgraph") for c in calls)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-5)
    got, want, calls = _infer(_gpt2(), input_ids=ids)
    assert sum(c.startswith("GPT2Block_subgraph") for c in calls) == 3
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-5)


def test_a_cache_holding_keys_already_is_used_inline():
    """Called with the cache of an earlier call, a layer's attention reads that layer's past
    keys: the layers are captured inline, and the result is eager torch's."""
    model = _llama(2)
    ids = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        past = model(input_ids=ids).cache
    got, want, calls = _infer(model, input_ids=ids, cache=past)
    assert not any(c.startswith("LlamaDecoderLayer_subgraph") for c in calls)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-5)
    for g, w in zip(got.cache.layers, want.cache.layers):
        assert g.keys.shape[-2] == w.keys.shape[-2] == 16
        torch.testing.assert_close(g.keys, w.keys, rtol=1e-4, atol=1e-5)


def _whisper(decoder_layers: int = 3) -> torch.nn.Module:
    config = tf.WhisperConfig(
        vocab_size=100,
        num_mel_bins=8,
        d_model=32,
        encoder_layers=2,
        decoder_layers=decoder_layers,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=16,
        max_target_positions=16,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    return tf.WhisperForConditionalGeneration(config).eval()


def _whisper_inputs() -> dict[str, torch.Tensor]:
    return {"input_features": torch.randn(2, 8, 32), "labels": torch.randint(3, 100, (2, 8))}


def test_whisper_layers_are_one_subgraph_each_and_fill_the_encoder_decoder_cache_as_eager():
    """Whisper's decoder layers are passed an ``EncoderDecoderCache`` (a self-attention and a
    cross-attention cache): inside the block both record their updates, and the parent
    stores each layer's keys and values in the cache's two caches and marks its
    cross-attention keys stored, as eager torch does."""
    torch.manual_seed(0)
    got, want, calls = _infer(_whisper(3), **_whisper_inputs())
    decoder = [c for c in calls if c.startswith("WhisperDecoderLayer_subgraph")]
    encoder = [c for c in calls if c.startswith("WhisperEncoderLayer_subgraph")]
    assert (len(decoder), len(set(decoder)), len(encoder), len(set(encoder))) == (3, 1, 2, 1)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-4, atol=1e-5)
    assert type(got.cache) is type(want.cache)
    assert got.cache.is_updated == want.cache.is_updated == {0: True, 1: True, 2: True}
    layers = list(zip(got.cache, want.cache, strict=True))
    assert len(layers) == 3
    for g, w in layers:  # each layer's self- then cross-attention keys and values
        assert len(g) == len(w)
        for a, b in zip(g, w):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert not torch.equal(layers[0][0][0], layers[1][0][0])


def test_whisper_training_with_one_layer_subgraph_updates_as_eager():
    torch.manual_seed(0)
    assert_trains_as_eager(_whisper(2), kwargs=_whisper_inputs())


class _Stage(torch.nn.Module):
    """Three identical convolution and batch-norm blocks, as a torchvision stage."""

    def __init__(self) -> None:
        super().__init__()
        block = lambda: torch.nn.Sequential(  # noqa: E731
            torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU()
        )
        self.blocks = torch.nn.Sequential(block(), block(), block())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x).mean()


def test_blocks_updating_batch_norm_statistics_are_captured_inline_with_one_export(monkeypatch):
    """In training a batch norm writes its running statistics, which a block cannot do: such
    children are not blocks, known before exporting, so the model is exported once; in
    evaluation they are one subgraph called three times."""
    from poptorch.capture import export  # noqa: PLC0415

    exports = []
    original = export._export
    monkeypatch.setattr(export, "_export", lambda *a: exports.append(1) or original(*a))
    torch.manual_seed(0)
    model, x = _Stage(), torch.randn(2, 4, 8, 8)
    assert_trains_as_eager(model, args=(x,))
    assert len(exports) == 1
    eval_model = _Stage().eval()
    got, want, calls = _infer(eval_model, x=x)
    assert sum(c.startswith("Sequential_subgraph") for c in calls) == 3
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


class _Norms(torch.nn.Module):
    """Two identical batch norms in a ``ModuleList``: a group of its own when exported alone."""

    def __init__(self) -> None:
        super().__init__()
        self.norms = torch.nn.ModuleList([torch.nn.BatchNorm2d(4), torch.nn.BatchNorm2d(4)])
        self.scale = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norms[1](self.norms[0](x)) * self.scale


class _Nested(torch.nn.Module):
    """Repeated convolutions, then repeated blocks that hold repeated norms of the same input
    shape (Res2Net's bottlenecks: their convolutions and norms are ``ModuleList``s)."""

    def __init__(self) -> None:
        super().__init__()
        conv = lambda: torch.nn.Conv2d(4, 4, 3, padding=1, bias=False)  # noqa: E731
        self.convs = torch.nn.ModuleList([conv(), conv()])
        self.blocks = torch.nn.ModuleList([_Norms(), _Norms()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in [*self.convs, *self.blocks]:
            x = module(x)
        return x


def test_groups_inside_a_repeated_block_are_not_taken_for_the_parents_groups():
    """Each block's subgraph is found by its group: the norms grouped inside one block's own
    capture are another group than the parent's convolutions, called with the same shapes."""
    torch.manual_seed(0)
    model = _Nested().eval()
    for norm in model.modules():
        if isinstance(norm, torch.nn.BatchNorm2d):  # statistics that make the norm count
            norm.running_mean.uniform_(-1.0, 1.0)
            norm.running_var.uniform_(0.5, 2.0)
    got, want, calls = _infer(model, x=torch.randn(2, 4, 8, 8))
    assert sum(c.startswith("Conv2d_subgraph") for c in calls) == 2
    assert sum(c.startswith("_Norms_subgraph") for c in calls) == 2
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def _mamba() -> torch.nn.Module:
    config = tf.MambaConfig(vocab_size=100, hidden_size=32, state_size=8, num_hidden_layers=2)
    return tf.MambaForCausalLM(config).eval()


def test_state_space_layers_are_captured_inline_and_fill_their_cache_as_eager():
    """Mamba's cache holds each layer's convolution and recurrent states, not keys and
    values a block could return: its layers are captured inline and write that cache."""
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 8))
    got, want, calls = _infer(_mamba(), input_ids=ids)
    assert not any(c.startswith("MambaBlock") for c in calls)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-5)
    for g, w in zip(got.cache.layers, want.cache.layers, strict=True):
        for states in ("conv_states", "recurrent_states"):
            torch.testing.assert_close(getattr(g, states), getattr(w, states), rtol=1e-4, atol=1e-5)
    assert_trains_as_eager(_mamba(), kwargs={"input_ids": ids, "labels": ids})


class _Patches(torch.nn.Module):
    """A convolution before three alike linear blocks (a ViT's patch embedding and layers),
    or with ``convolving`` alike convolution blocks; the mean square of the result as its
    loss."""

    def __init__(self, convolving: bool = False) -> None:
        super().__init__()
        self.embed = torch.nn.Conv2d(2, 2, 3, padding=1)
        layer = torch.nn.Conv2d(2, 2, 3, padding=1) if convolving else torch.nn.Linear(5, 5)
        block = torch.nn.Sequential(layer, torch.nn.ReLU())
        self.blocks = torch.nn.Sequential(block, copy.deepcopy(block), copy.deepcopy(block))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.embed(x)).pow(2).mean()


def test_trained_layers_are_lowered_inline_on_the_cpu_unless_they_convolve(monkeypatch):
    """The calls of a trained model's layers are inlined where XLA:CPU runs them faster
    than their scan (``runtime.lowering.runs.prefer_inline``), a convolution before the layers (a
    ViT's patch embedding) included; layers that convolve keep the scan, and so does
    inference. ``test_llama_training_with_one_layer_subgraph_updates_as_eager`` checks the
    inlined layers' values."""
    import jax  # noqa: PLC0415

    from runtime.lowering import runs  # noqa: PLC0415
    from runtime.lowering.graphs import reachable_graphs  # noqa: PLC0415

    monkeypatch.setattr(runs, "_policy", None)
    monkeypatch.delenv("POPXL_CALLS", raising=False)
    ids = torch.randint(0, 100, (2, 8))
    llama = _llama(3)
    want = llama(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    pm = poptorch.inferenceModel(llama)
    got = pm(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert runs.policy(pm.ir) == "scan"  # inference

    built = []
    prefer = runs.prefer_inline
    monkeypatch.setattr(runs, "prefer_inline", lambda ir: built.append(ir) or prefer(ir))
    x = torch.randn(1, 2, 5, 5)
    assert_trains_as_eager(_Patches(), (x,))
    (ir,) = built
    called = (g for graph in reachable_graphs(ir) for op in graph._ops for g in op.called_graphs)
    assert 3 in collections.Counter(called).values()  # the blocks: one graph
    assert runs.policy(ir) == ("inline" if jax.default_backend() == "cpu" else "scan")

    built.clear()
    assert_trains_as_eager(_Patches(convolving=True), (x,))
    (ir,) = built
    assert runs.policy(ir) == "scan"
