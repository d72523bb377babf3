"""transformers' caches as poptorch reads them: by what the 4.x and 5.x releases both offer,
and, where a release has no exporter (4.x), flattened for ``torch.export`` by their state."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from poptorch.capture import transformers_cache as tc

tf = pytest.importorskip("transformers")


def _pair(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(1, 2, length, 4), torch.randn(1, 2, length, 4)


def _encoder_decoder_cache(layers: int = 2) -> object:
    """The cache of a Whisper decoder of ``layers`` layers after its first call."""
    own, cross = tf.DynamicCache(), tf.DynamicCache()
    for i in range(layers):
        own.update(*_pair(3), i)
        cross.update(*_pair(5), i)
    return tf.EncoderDecoderCache(own, cross)


def _held(cache: object) -> list[torch.Tensor]:
    """The keys and values of each layer of the cache's two caches."""
    parts = tc.attention_caches(cache).values()
    return [t for part in parts for layer in part for t in layer if isinstance(t, torch.Tensor)]


class _Calls(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[object] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(func)
        return func(*args, **(kwargs or {}))


def test_an_encoder_decoder_cache_is_read_through_its_two_caches():
    cache = _encoder_decoder_cache()
    parts = tc.attention_caches(cache)
    assert list(parts) == [tc.SELF_ATTENTION, tc.CROSS_ATTENTION]
    assert [c.get_seq_length() for c in parts.values()] == [3, 5]
    assert tc.holds_keys(cache)
    assert tc.layer_holds_keys(parts[tc.SELF_ATTENTION], 1)
    assert not tc.layer_holds_keys(parts[tc.SELF_ATTENTION], 2)  # past its last layer
    assert not tc.holds_keys(tf.EncoderDecoderCache(tf.DynamicCache(), tf.DynamicCache()))
    plain = tf.DynamicCache()
    assert tc.attention_caches(plain) == {None: plain}


def test_a_cache_rebuilt_from_its_state_holds_its_tensors_and_computes_nothing():
    """The 4.x flatten: a rebuilt cache is the same object graph around the same tensors, made
    without its constructor or ``update`` (whose ops would enter the program)."""
    cache = _encoder_decoder_cache()
    tensors: list[torch.Tensor] = []
    context = tc._state_context(cache, tensors)
    held = _held(cache)
    assert len(held) == 8 and {id(t) for t in held} <= {id(t) for t in tensors}
    assert tc._state_context(cache, []) == context  # one cache's specs compare equal
    with _Calls() as mode:
        rebuilt = tc._from_context(context, iter(tensors))
    assert mode.calls == []
    assert type(rebuilt) is type(cache)
    assert rebuilt.is_updated == cache.is_updated
    assert rebuilt.get_seq_length() == 3
    assert all(a is b for a, b in zip(_held(rebuilt), held, strict=True))
