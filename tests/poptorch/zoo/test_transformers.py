"""HuggingFace transformers models through poptorch, called as their users call them:
keyword inputs (``input_ids=..., attention_mask=..., labels=...``), ``ModelOutput`` results,
the loss computed inside the model.

Each model is built from its config (random weights, nothing downloaded) at a tiny width
and two layers; dropout is off. BERT and GPT-2 are in the fast sample; every other family
runs with ``-m zoo_full`` (see ``conftest``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import transformers as tf

import poptorch

from ._compare import assert_trains_as_eager, inference_error

V = 100  # vocabulary
N = 8  # sequence length

_TEXT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
_DECODER = {**_TEXT, "hidden_size": 64, "intermediate_size": 128, "num_key_value_heads": 1}


def _config(cls: type, **kwargs: Any) -> Any:
    """``cls(**kwargs)`` with every dropout probability zero."""
    config = cls(vocab_size=V, **kwargs) if "vocab_size" not in kwargs else cls(**kwargs)
    for key, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in key or "pdrop" in key):
            setattr(config, key, 0.0)
    return config


def _text() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, V, (2, N))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def _image(size: int = 32, labels: int = 4) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(2, 3, size, size), "labels": torch.randint(0, labels, (2,))}


def _whisper() -> dict[str, torch.Tensor]:
    return {"input_features": torch.randn(2, 8, 32), "labels": torch.randint(3, V, (2, N))}


def _clip() -> dict[str, Any]:
    ids = torch.randint(3, V, (2, N))
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "pixel_values": torch.randn(2, 3, 32, 32),
        "return_loss": True,
    }


class MarkedLoss(torch.nn.Module):
    """The model with its ``out.loss`` marked by ``poptorch.identity_loss``, as PopTorch
    requires of a model whose loss adds independent losses (CLIP: text and image)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **kwargs: Any) -> Any:
        out = self.model(**kwargs)
        out.loss = poptorch.identity_loss(out.loss, reduction="none")
        return out


@dataclass(frozen=True)
class Case:
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[], dict[str, Any]] = _text
    fast: bool = False
    marks_loss: bool = False  # trained through ``MarkedLoss``


_SPECIAL = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_ENC_DEC = {
    "d_model": 32,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "decoder_start_token_id": 1,
    **_SPECIAL,
}
_VISION = {**_TEXT, "intermediate_size": 64, "image_size": 32, "patch_size": 8, "num_labels": 4}
_MLM = {**_TEXT, "intermediate_size": 64, "max_position_embeddings": 32}

CASES: dict[str, Case] = {
    # Encoders (masked-LM heads: the decoder weight is tied to the word embeddings).
    "bert": Case(lambda: tf.BertForMaskedLM(_config(tf.BertConfig, **_MLM)), fast=True),
    "roberta": Case(
        lambda: tf.RobertaForMaskedLM(
            _config(tf.RobertaConfig, **{**_MLM, "max_position_embeddings": 34})
        )
    ),
    "distilbert": Case(
        lambda: tf.DistilBertForMaskedLM(
            _config(
                tf.DistilBertConfig,
                dim=32,
                n_layers=2,
                n_heads=2,
                hidden_dim=64,
                max_position_embeddings=32,
            )
        )
    ),  # fmt: skip
    "albert": Case(
        lambda: tf.AlbertForMaskedLM(_config(tf.AlbertConfig, embedding_size=16, **_MLM))
    ),
    "deberta_v2": Case(
        lambda: tf.DebertaV2ForMaskedLM(
            _config(
                tf.DebertaV2Config,
                relative_attention=True,
                pos_att_type=["p2c", "c2p"],
                max_relative_positions=16,
                **_MLM,
            )
        )
    ),  # fmt: skip
    "electra": Case(
        lambda: tf.ElectraForMaskedLM(_config(tf.ElectraConfig, embedding_size=16, **_MLM))
    ),
    # Decoders.
    "gpt2": Case(
        lambda: tf.GPT2LMHeadModel(
            _config(tf.GPT2Config, n_positions=16, n_embd=64, n_layer=2, n_head=2)
        ),
        fast=True,
    ),
    "gpt_neo": Case(
        lambda: tf.GPTNeoForCausalLM(
            _config(
                tf.GPTNeoConfig,
                max_position_embeddings=16,
                hidden_size=64,
                num_layers=2,
                num_heads=2,
                attention_types=[[["global", "local"], 1]],
                window_size=4,
            )
        )
    ),  # fmt: skip
    "gptj": Case(
        lambda: tf.GPTJForCausalLM(
            _config(tf.GPTJConfig, n_positions=16, n_embd=64, n_layer=2, n_head=2, rotary_dim=16)
        )
    ),
    "opt": Case(
        lambda: tf.OPTForCausalLM(
            _config(
                tf.OPTConfig,
                max_position_embeddings=16,
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                ffn_dim=128,
                word_embed_proj_dim=64,
            )
        )
    ),  # fmt: skip
    "bloom": Case(
        lambda: tf.BloomForCausalLM(_config(tf.BloomConfig, hidden_size=64, n_layer=2, n_head=2))
    ),
    "llama": Case(
        lambda: tf.LlamaForCausalLM(_config(tf.LlamaConfig, max_position_embeddings=16, **_DECODER))
    ),
    "mistral": Case(
        lambda: tf.MistralForCausalLM(
            _config(tf.MistralConfig, max_position_embeddings=16, **_DECODER)
        )
    ),
    "qwen2": Case(
        lambda: tf.Qwen2ForCausalLM(_config(tf.Qwen2Config, max_position_embeddings=16, **_DECODER))
    ),
    "phi": Case(
        lambda: tf.PhiForCausalLM(
            _config(
                tf.PhiConfig, max_position_embeddings=16, **{**_DECODER, "num_key_value_heads": 2}
            )
        )
    ),
    "gemma": Case(
        lambda: tf.GemmaForCausalLM(
            _config(tf.GemmaConfig, head_dim=32, max_position_embeddings=16, **_DECODER)
        )
    ),
    # A mixture of experts: tokens sorted by expert, counted (``histc``) and multiplied by
    # their expert's weights in one grouped product (transformers' ``grouped_mm_fallback``).
    "mixtral": Case(
        lambda: tf.MixtralForCausalLM(
            _config(
                tf.MixtralConfig,
                max_position_embeddings=16,
                num_local_experts=4,
                num_experts_per_tok=2,
                **_DECODER,
            )
        ),
        fast=True,
    ),
    # Encoder-decoders.
    "t5": Case(
        lambda: tf.T5ForConditionalGeneration(
            _config(
                tf.T5Config,
                d_model=32,
                d_kv=8,
                d_ff=64,
                num_layers=2,
                num_heads=4,
                decoder_start_token_id=0,
                pad_token_id=0,
            )
        )
    ),  # fmt: skip
    "bart": Case(
        lambda: tf.BartForConditionalGeneration(
            _config(tf.BartConfig, max_position_embeddings=32, **_ENC_DEC)
        )
    ),
    # Its forward's decorators find ``use_cache`` among the keywords only. LayerDrop (on by
    # default: a random branch per layer) off, as every dropout here.
    "m2m100": Case(
        lambda: tf.M2M100ForConditionalGeneration(
            _config(
                tf.M2M100Config,
                max_position_embeddings=32,
                encoder_layerdrop=0.0,
                decoder_layerdrop=0.0,
                **_ENC_DEC,
            )
        )
    ),
    "whisper": Case(
        lambda: tf.WhisperForConditionalGeneration(
            _config(
                tf.WhisperConfig,
                num_mel_bins=8,
                max_source_positions=16,
                max_target_positions=16,
                **_ENC_DEC,
            )
        ),
        _whisper,
    ),  # fmt: skip
    # Vision and multimodal encoders.
    "vit": Case(lambda: tf.ViTForImageClassification(_config(tf.ViTConfig, **_VISION)), _image),
    "deit": Case(lambda: tf.DeiTForImageClassification(_config(tf.DeiTConfig, **_VISION)), _image),
    "swin": Case(
        lambda: tf.SwinForImageClassification(
            _config(
                tf.SwinConfig,
                image_size=32,
                patch_size=4,
                embed_dim=16,
                depths=[1, 1],
                num_heads=[1, 2],
                window_size=4,
                num_labels=4,
            )
        ),
        _image,
    ),  # fmt: skip
    "convnext": Case(
        lambda: tf.ConvNextForImageClassification(
            _config(
                tf.ConvNextConfig, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=4
            )
        ),
        _image,
    ),
    "clip": Case(
        lambda: tf.CLIPModel(
            _config(
                tf.CLIPConfig,
                text_config={**_MLM, "vocab_size": V, "max_position_embeddings": 16},
                vision_config={**_VISION, "num_labels": 2},
                projection_dim=16,
            )
        ),
        _clip,
        marks_loss=True,
    ),
}


def _params() -> list[Any]:
    return [
        pytest.param(name, marks=() if case.fast else pytest.mark.zoo_full, id=name)
        for name, case in CASES.items()
    ]


@pytest.mark.parametrize("name", _params())
def test_inference_matches_eager(name: str) -> None:
    case = CASES[name]
    assert inference_error(case.build(), (), case.inputs()) < 1e-3


@pytest.mark.parametrize("name", _params())
def test_a_training_step_matches_eager(name: str) -> None:
    case = CASES[name]
    model = MarkedLoss(case.build()) if case.marks_loss else case.build()
    assert_trains_as_eager(model, (), case.inputs())


class _Experts(torch.nn.Module):
    """transformers' grouped product on rows sorted by expert: an expert with no rows, and
    rows past the last expert's end (zeros, as transformers' own product leaves them)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3, 4, 5))

    def forward(self, x: torch.Tensor, ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:

        y = torch.ops.transformers.grouped_mm_fallback(x, self.weight, ends)
        return y, (y * torch.arange(5.0)).square().mean()


def test_grouped_products_of_experts_match_transformers_own():
    x = torch.randn(7, 4)
    ends = torch.tensor([2, 2, 6], dtype=torch.int32)
    model = _Experts()
    got, _ = poptorch.inferenceModel(copy.deepcopy(model))(x, ends)
    want, _ = model(x, ends)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got[6].abs().max() == 0
    assert_trains_as_eager(model, (x.requires_grad_(False), ends), loss_of=lambda out: out[1])


@pytest.mark.zoo_full
def test_efficientnets_pool_wider_than_its_map_trains_as_eager():
    # EfficientNet pools its last map (1x1 here) with AvgPool2d(hidden_dim, ceil_mode=True):
    # a 320-wide window (2560 in the default config, whose first call took over 10 minutes
    # when the lowering padded the map to the window's size).
    config = _config(
        tf.EfficientNetConfig,
        image_size=32,
        width_coefficient=0.25,
        depth_coefficient=0.25,
        hidden_dim=320,
        num_labels=4,
        drop_connect_rate=0.0,
    )
    model = tf.EfficientNetForImageClassification(config)
    assert model.efficientnet.pooler.kernel_size == 320
    assert_trains_as_eager(model, (), _image())
