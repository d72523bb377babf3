"""HuggingFace ``transformers`` values a model's ``forward`` takes or returns.

A decoder returns its key/value cache (``DynamicCache``, ``EncoderDecoderCache``) in its
``ModelOutput`` unless called with ``use_cache=False``. ``torch.export`` flattens only types
registered with pytree; transformers' own exporter registers its caches, and poptorch does the
same (with transformers' flatten functions) the first time a forward returns one. The program
then returns the cache's tensors and the caller gets the cache back, as in eager torch.
"""

from __future__ import annotations

from typing import Any


def is_cache(value: Any) -> bool:
    """Whether ``value`` is one of transformers' caches."""
    cls = type(value)
    return cls.__module__.startswith("transformers.") and cls.__name__.endswith("Cache")


def register_cache(value: Any) -> None:
    """Make the type of the cache ``value`` flattenable by ``torch.export``."""
    from transformers.exporters.exporter_dynamo import (  # noqa: PLC0415 (optional library)
        register_pytree_node,
    )

    register_pytree_node(type(value))
