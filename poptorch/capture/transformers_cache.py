"""HuggingFace ``transformers`` values a model's ``forward`` takes or returns.

A decoder returns its key/value cache (``DynamicCache``, ``EncoderDecoderCache``) in its
``ModelOutput`` unless called with ``use_cache=False``. ``torch.export`` flattens only types
registered with pytree; transformers' own exporter (5.x) registers its caches, and poptorch
does the same (with transformers' flatten functions) the first time a forward takes or
returns one. Older releases have no exporter: there poptorch flattens a cache the same way, by
its state (the tensors anywhere in its attributes). The program then returns the cache's tensors and the caller gets the cache back, as in eager
torch.

Caches are read here through what both the 4.x and 5.x releases offer (``len``,
``get_seq_length``, an encoder-decoder cache's ``self_attention_cache`` and
``cross_attention_cache``), so ``blocks`` needs no release's internals.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree

# Where an encoder-decoder cache keeps the keys and values of each kind of attention.
SELF_ATTENTION = "self_attention_cache"
CROSS_ATTENTION = "cross_attention_cache"


def is_cache(value: Any) -> bool:
    """Whether ``value`` is one of transformers' caches."""
    cls = type(value)
    return cls.__module__.startswith("transformers.") and cls.__name__.endswith("Cache")


def register_cache(value: Any) -> None:
    """Make the type of the cache ``value`` flattenable by ``torch.export``."""
    register_pytree_node: Callable[[type], Any]
    try:
        from transformers.exporters.exporter_dynamo import (  # noqa: PLC0415 (optional library)
            register_pytree_node,
        )
    except ImportError:  # transformers 4.x
        register_pytree_node = _register_legacy
    register_pytree_node(type(value))
    for inner in attention_caches(value).values():  # an encoder-decoder cache's two
        if inner is not value:
            register_pytree_node(type(inner))


def _register_legacy(cls: type) -> None:
    """Register ``cls`` (a 4.x cache) with pytree by its state, as transformers 5.x's
    exporter does: the tensors anywhere in its attributes are the children, the rest is the
    context. Unflattening rebuilds the object without calling its constructor or ``update``,
    which would add ops (4.x layers start from ``torch.tensor([])``) to the program."""
    if cls in pytree.SUPPORTED_NODES:
        return

    def flatten(cache: Any) -> tuple[list[Any], Any]:
        tensors: list[Any] = []
        return tensors, _state_context(cache, tensors)

    def unflatten(tensors: Any, context: Any) -> Any:
        return _from_context(context, iter(tensors))

    def flatten_with_keys(cache: Any) -> tuple[list[tuple[Any, Any]], Any]:
        tensors, context = flatten(cache)
        return [(pytree.SequenceKey(i), t) for i, t in enumerate(tensors)], context

    pytree.register_pytree_node(
        cls,
        flatten,
        unflatten,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        flatten_with_keys_fn=flatten_with_keys,
    )


_TENSOR = "tensor"
_VALUE = "value"


def _state_context(value: Any, tensors: list[Any]) -> tuple:
    """``value`` as nested tuples that compare by value, its tensors moved to ``tensors``:
    lists, tuples and dicts by their items, transformers' objects by their attributes."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return (_TENSOR,)
    if type(value) in (list, tuple):
        return (type(value), tuple(_state_context(v, tensors) for v in value))
    if type(value) in (dict, collections.OrderedDict):  # an nn.Module's too (4.4x caches)
        return (type(value), tuple((k, _state_context(v, tensors)) for k, v in value.items()))
    if type(value).__module__.startswith("transformers.") and hasattr(value, "__dict__"):
        state = tuple((k, _state_context(v, tensors)) for k, v in vars(value).items())
        return (object, type(value), state)
    return (_VALUE, value)


def _from_context(context: tuple, tensors: Iterator[Any]) -> Any:
    kind = context[0]
    if kind == _TENSOR:
        return next(tensors)
    if kind in (list, tuple):
        return kind(_from_context(c, tensors) for c in context[1])
    if kind in (dict, collections.OrderedDict):
        return kind((k, _from_context(c, tensors)) for k, c in context[1])
    if kind is object:
        cls, state = context[1], context[2]
        obj = cls.__new__(cls)
        obj.__dict__.update({k: _from_context(c, tensors) for k, c in state})
        return obj
    return context[1]


def is_encoder_decoder_cache_type(cls: type) -> bool:
    return any(c.__name__ == "EncoderDecoderCache" for c in cls.__mro__)


def attention_caches(cache: Any) -> dict[str | None, Any]:
    """The key/value caches in ``cache`` by where they are: an encoder-decoder cache's two
    (``SELF_ATTENTION``, ``CROSS_ATTENTION``), or the cache itself (``None``)."""
    if is_encoder_decoder_cache_type(type(cache)):
        return {part: getattr(cache, part) for part in (SELF_ATTENTION, CROSS_ATTENTION)}
    return {None: cache}


def layer_holds_keys(cache: Any, layer: int) -> bool:
    """Whether layer ``layer`` of ``cache`` holds keys (False past its last layer)."""
    return cache.get_seq_length(layer) > 0


def holds_keys(cache: Any) -> bool:
    """Whether any layer of any key/value cache in ``cache`` holds keys."""
    return any(
        layer_holds_keys(c, i) for c in attention_caches(cache).values() for i in range(len(c))
    )


def layer_kinds(cache: Any) -> set[str]:
    """The class names of the layers of ``cache`` (a key/value cache): 5.x caches hold
    layer objects (``DynamicLayer``, a state-space model's layers); 4.x ``DynamicCache``s hold
    lists of keys and values, for which this is empty."""
    return {type(layer).__name__ for layer in getattr(cache, "layers", ())}


def layer_kind(cache: Any, layer: int) -> str | None:
    """The class name of layer ``layer`` of ``cache`` (None where it has no layer objects or
    no such layer yet)."""
    layers = getattr(cache, "layers", ())
    return type(layers[layer]).__name__ if layer < len(layers) else None
