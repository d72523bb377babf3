"""``DotTree``: an ordered tree of named leaves, addressed with dotted keys (``fc1.weight``).

Rules (as in popxl-addons):

* Keys are Python identifiers or digit strings; ints are stored as strings. A negative int
  key in ``get`` counts back from the largest numeric key + 1.
* ``to_dict``/``keys_flat``/``map`` use insertion order; ``unpack`` sorts by flat key.
* ``insert("a.b", v)`` into an existing ``a`` needs ``overwrite=True`` (then the subtrees
  merge); ``update(other, overwrite=True)`` replaces clashing top-level subtrees wholesale.
* ``copy`` is structural: leaves are shared.

>>> t = DotTree.from_dict({"fc1.weight": 1, "fc1.bias": 2})
>>> t.fc1.weight, t["fc1.bias"], t.to_dict()
(1, 2, {'fc1.weight': 1, 'fc1.bias': 2})
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

L = TypeVar("L")
V = TypeVar("V")
T = TypeVar("T", bound="DotTree")

_NON_WORD = re.compile(r"\W|^(?=\d)")


def sanitise(name: str) -> str:
    """Replace non-word characters (and a leading digit position) with ``_``."""
    return _NON_WORD.sub("_", name)


def to_mapping(key: DotTree[L], value: DotTree[V]) -> dict[L, V]:
    """``{key_leaf: value_leaf}`` for every flat key present in both trees."""
    keys = key.to_dict()
    values = value.to_dict()
    return {keys[k]: values[k] for k in keys if k in values}


def _segment(key: str | int) -> str:
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise TypeError(f"DotTree keys must be str or int, got {type(key).__name__}.")
    return str(key)


def _check_segment(segment: str) -> None:
    if not (segment.isdigit() or segment.isidentifier()):
        raise ValueError(f"'{segment}' is not a valid python identifier")


class DotTree(Generic[L]):
    """An ordered tree of named leaves. See the module docstring for the rules."""

    def __init__(self, **kwargs: L | DotTree[L]) -> None:
        self._map: dict[str, Any] = {}
        for key, value in kwargs.items():
            self.insert(key, value)

    # Access ------------------------------------------------------------------------------

    def _numeric_key(self, key: int) -> str:
        if key >= 0:
            return str(key)
        numbers = [int(k) for k in self._map if k.isdigit()]
        if not numbers:
            raise KeyError(
                f"No numeric keys to index with {key}. Available Keys: {list(self._map)}"
            )
        return str(max(numbers) + 1 + key)

    def get(self, key: str | int) -> L | DotTree[L]:
        """The leaf or subtree at ``key`` (dotted keys walk into subtrees)."""
        if isinstance(key, int) and not isinstance(key, bool):
            key = self._numeric_key(key)
        first, _, rest = _segment(key).partition(".")
        if first not in self._map:
            raise KeyError(f"'{first}' is not a key. Available Keys: {list(self._map)}")
        value = self._map[first]
        if not rest:
            return value
        if not isinstance(value, type(self)):
            raise KeyError(
                f"'{first}' is not a {type(self).__name__}, so '{rest}' cannot be looked up in it."
            )
        return value.get(rest)

    def __getitem__(self, key: str | int) -> L | DotTree[L]:
        return self.get(key)

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__") or key == "_map":
            raise AttributeError(key)
        try:
            return self.get(key)
        except KeyError:
            raise AttributeError(
                f"No attribute '{key}'. Available Keys: {list(self._map)}"
            ) from None

    def __contains__(self, key: object) -> bool:
        try:
            self.get(key)  # type: ignore[arg-type]
        except (KeyError, TypeError):
            return False
        return True

    # Mutation ----------------------------------------------------------------------------

    def insert(self, key: str | int, value: L | DotTree[L], overwrite: bool = False) -> None:
        """Add ``value`` at ``key``; with ``overwrite`` an existing subtree is merged into.

        Raises:
            ValueError: a negative int key, a segment that is not an identifier or digits,
                or an existing key without ``overwrite``.
        """
        if isinstance(key, int) and not isinstance(key, bool) and key < 0:
            raise ValueError(f"Negative keys cannot be inserted: {key}")
        segments = _segment(key).split(".")
        for segment in segments:
            _check_segment(segment)
        first, rest = segments[0], ".".join(segments[1:])
        if first in self._map and not overwrite:
            raise ValueError(f"'{first}' already exists")
        if not rest:
            self._map[first] = value
            return
        existing = self._map.get(first)
        subtree = existing.copy() if isinstance(existing, DotTree) else type(self)()
        subtree.insert(rest, value, overwrite)
        self._map[first] = subtree

    def update(self, values: DotTree[L], overwrite: bool = False) -> None:
        """Insert every top-level entry of ``values`` (clashing subtrees are replaced, not merged)."""
        incoming = values.copy()
        clashes = [k for k in incoming._map if k in self._map]
        if clashes and not overwrite:
            raise ValueError(f"'{clashes[0]}' already exists")
        for k, v in incoming._map.items():
            self.insert(k, v, overwrite)

    def pop(self, key: str | int) -> L | DotTree[L]:
        """Remove and return the leaf or subtree at ``key``."""
        head, _, last = _segment(key).rpartition(".")
        parent = self.get(head) if head else self
        if not isinstance(parent, DotTree) or last not in parent._map:
            raise KeyError(f"'{key}' is not a key.")
        return parent._map.pop(last)

    def copy(self: T) -> T:
        """A new tree of the same class; subtrees are copied, leaves shared."""
        new = type(self)()
        for k, v in self._map.items():
            new._map[k] = v.copy() if isinstance(v, DotTree) else v
        return new

    def _clear(self) -> None:
        """Remove every leaf, keeping (now empty) subtrees."""
        for k in list(self._map):
            if isinstance(self._map[k], DotTree):
                self._map[k]._clear()
            else:
                del self._map[k]

    # Views -------------------------------------------------------------------------------

    def keys(self) -> list[str]:
        return list(self._map.keys())

    def values(self) -> list[L | DotTree[L]]:
        return list(self._map.values())

    def items(self) -> list[tuple[str, L | DotTree[L]]]:
        return list(self._map.items())

    def len(self) -> int:
        return len(self._map)

    def __len__(self) -> int:
        return len(self._map)

    def __bool__(self) -> bool:
        # As in the original, a tree is always truthy (it defined no __len__), so
        # ``assert tree.sub`` checks that the subtree exists even after ``_clear()`` emptied it.
        return True

    def to_dict(self) -> dict[str, L]:
        """Flat ``{dotted key: leaf}`` in insertion order (empty subtrees contribute nothing)."""
        flat: dict[str, L] = {}
        for k, v in self._map.items():
            if isinstance(v, DotTree):
                for sub_key, leaf in v.to_dict().items():
                    flat[f"{k}.{sub_key}"] = leaf
            else:
                flat[k] = v
        return flat

    def keys_flat(self) -> list[str]:
        return list(self.to_dict().keys())

    def values_flat(self) -> list[L]:
        return list(self.to_dict().values())

    def len_flat(self) -> int:
        return len(self.to_dict())

    def map(self: T, fn: Callable[[L], Any]) -> T:
        """A tree of the same class with ``fn`` applied to every leaf."""
        return self.from_dict({k: fn(v) for k, v in self.to_dict().items()})

    def filter_keys(self: T, keys: Iterable[str]) -> T:
        """A new tree holding only ``keys`` (leaf paths or subtrees).

        Raises:
            ValueError: a key listed twice.
        """
        keys = list(keys)
        repeated = {k for k in keys if keys.count(k) > 1}
        if repeated:
            raise ValueError(f"Duplicate keys in filter_keys: {sorted(repeated)}")
        new = type(self)()
        for k in keys:
            value = self.get(k)
            new.insert(k, value.copy() if isinstance(value, DotTree) else value, overwrite=True)
        return new

    # Serialisation ------------------------------------------------------------------------

    @classmethod
    def from_dict(cls: type[T], d: Mapping[Any, Any]) -> T:
        """Build a tree from flat dotted keys (str or int), in ``d``'s order."""
        tree = cls()
        for key, value in d.items():
            head, _, last = _segment(key).rpartition(".")
            node: DotTree[Any] = tree
            for segment in head.split(".") if head else ():
                child = node._map.get(segment)
                if child is None:
                    _check_segment(segment)
                    child = node._map[segment] = cls()
                elif not isinstance(child, DotTree):
                    raise ValueError(
                        f"'{segment}' is a leaf, so '{key}' cannot be inserted under it."
                    )
                node = child
            node.insert(last, value)
        return tree

    def unpack(self) -> Any:
        """``(keys, leaves)`` sorted by flat key (a lazy ``zip`` when not empty)."""
        items = sorted(self.to_dict().items(), key=lambda kv: kv[0])
        if not items:
            return [], []
        return zip(*items)

    @classmethod
    def pack(cls: type[T], keys: Iterable[str | int], values: Iterable[Any]) -> T:
        """The tree with ``keys[i] -> values[i]`` (extra elements are dropped)."""
        return cls.from_dict(dict(zip(keys, values)))

    def to_mapping(self, value: DotTree[V]) -> dict[L, V]:
        """``{my_leaf: other_leaf}`` for every flat key the two trees share."""
        return to_mapping(self, value)

    def __repr__(self) -> str:
        return repr(dict(self.to_dict()))


__all__ = ["DotTree", "sanitise", "to_mapping"]
