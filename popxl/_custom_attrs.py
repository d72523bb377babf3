"""Typed attributes of custom ops: the PopART attribute kinds of PopTorch's Table 4.1.

A custom op declares each attribute once (its kind and, optionally, a default); a call's
values are checked against the declaration and normalised to hashable Python values that
the op record keeps: ``Float`` -> a float rounded to float32 (as PopART stored it),
``Int`` -> an int in the signed 64-bit range, ``String`` -> an ASCII str, and the plural
kinds -> tuples of those. ``Graph`` attributes, which PopTorch did not support either, are
refused.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

_INT64 = (-(2**63), 2**63 - 1)

ATTR_TYPE_MSG = (
    "custom op {op}: attribute '{name}' must be {expected} (a {kind} attribute), got "
    "{value!r} of type {type}."
)
ATTR_UNKNOWN_MSG = (
    "custom op {op}: unknown attribute '{name}'. It declares: {declared}. Declare the "
    "attribute when registering the op, or drop it from the call."
)
ATTR_MISSING_MSG = (
    "custom op {op}: attribute '{name}' ({kind}) has no default and was not given. Pass "
    "it, e.g. attributes={{'{name}': ...}}."
)
GRAPH_ATTR_MSG = (
    "custom op {op}: attribute '{name}' is of kind Graph, which custom ops do not support "
    "(nor did PopTorch). Use popxl.ops.call / repeat / conditional for subgraphs."
)


class AttributeKind(enum.Enum):
    """PopART's attribute kinds (``popart::Attributes::Float`` ...)."""

    FLOAT = "Float"
    FLOATS = "Floats"
    INT = "Int"
    INTS = "Ints"
    STRING = "String"
    STRINGS = "Strings"
    GRAPH = "Graph"

    @property
    def is_list(self) -> bool:
        return self in (AttributeKind.FLOATS, AttributeKind.INTS, AttributeKind.STRINGS)

    @property
    def element(self) -> AttributeKind:
        """The scalar kind of a list kind (itself for scalar kinds)."""
        return {
            AttributeKind.FLOATS: AttributeKind.FLOAT,
            AttributeKind.INTS: AttributeKind.INT,
            AttributeKind.STRINGS: AttributeKind.STRING,
        }.get(self, self)


_EXPECTED = {
    AttributeKind.FLOAT: "a float (or int)",
    AttributeKind.INT: "an int",
    AttributeKind.STRING: "an ASCII str",
}
_BY_PYTHON_TYPE = {
    float: AttributeKind.FLOAT,
    int: AttributeKind.INT,
    str: AttributeKind.STRING,
}
_LIST_OF = {
    AttributeKind.FLOAT: AttributeKind.FLOATS,
    AttributeKind.INT: AttributeKind.INTS,
    AttributeKind.STRING: AttributeKind.STRINGS,
}


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Attribute:
    """One declared attribute: its kind and default (``REQUIRED`` if it has none).

    >>> Attribute("Float", 0.01)
    Attribute(kind=<AttributeKind.FLOAT: 'Float'>, default=0.009999999776482582)
    """

    kind: AttributeKind
    default: Any = REQUIRED

    def __init__(self, kind: AttributeKind | str, default: Any = REQUIRED) -> None:
        object.__setattr__(self, "kind", AttributeKind(kind))
        if default is not REQUIRED:
            default = check_value("<declaration>", "default", self.kind, default)
        object.__setattr__(self, "default", default)


def declare(op: str, name: str, spec: Any) -> Attribute:
    """An ``Attribute`` from the shorthand a registration accepts: an ``Attribute``, a kind
    (``AttributeKind`` or its name), a Python type (``float``, ``int``, ``str``), a
    one-element list of one (``[float]`` means Floats), or a default value whose type gives
    the kind (``0.01`` is a Float defaulting to 0.01)."""
    if not isinstance(name, str):
        raise TypeError(f"custom op {op}: attribute names must be str, got {name!r}.")
    if isinstance(spec, Attribute):
        attr = spec
    elif isinstance(spec, AttributeKind) or (
        isinstance(spec, str) and spec in AttributeKind._value2member_map_
    ):
        attr = Attribute(spec)
    elif isinstance(spec, type) and spec in _BY_PYTHON_TYPE:
        attr = Attribute(_BY_PYTHON_TYPE[spec])
    elif isinstance(spec, list) and len(spec) == 1 and isinstance(spec[0], type):
        attr = Attribute(_LIST_OF[_BY_PYTHON_TYPE[spec[0]]])
    else:
        attr = Attribute(kind_of(op, name, spec), spec)
    if attr.kind is AttributeKind.GRAPH:
        raise NotImplementedError(GRAPH_ATTR_MSG.format(op=op, name=name))
    return attr


def kind_of(op: str, name: str, value: Any) -> AttributeKind:
    """The kind a Python value stands for (as PopTorch read attribute dictionaries)."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise TypeError(
                f"custom op {op}: attribute '{name}' is an empty list, whose kind cannot be "
                "told; declare it with Attribute('Floats'|'Ints'|'Strings', default=[])."
            )
        return _LIST_OF[kind_of(op, name, value[0])]
    for py_type, kind in _BY_PYTHON_TYPE.items():
        if isinstance(value, py_type) or (
            py_type is not str and isinstance(value, np.generic) and _np_kind(value) is kind
        ):
            return kind
    raise TypeError(
        f"custom op {op}: attribute '{name}' has value {value!r} of type "
        f"{type(value).__name__}; attributes are floats, ints, strs or lists of one of them."
    )


def _np_kind(value: np.generic) -> AttributeKind | None:
    if isinstance(value, np.floating):
        return AttributeKind.FLOAT
    if isinstance(value, np.integer):
        return AttributeKind.INT
    return None


def check_value(op: str, name: str, kind: AttributeKind, value: Any) -> Any:
    """``value`` normalised for ``kind``; raises ``TypeError`` when it is of another kind."""
    if kind.is_list:
        if not isinstance(value, (list, tuple, np.ndarray)):
            raise TypeError(_type_error(op, name, kind, value))
        return tuple(_scalar(op, name, kind, v) for v in value)
    return _scalar(op, name, kind, value)


def _scalar(op: str, name: str, kind: AttributeKind, value: Any) -> Any:
    element = kind.element
    if element is AttributeKind.FLOAT:
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
            value, (bool, np.bool_)
        ):
            return float(np.float32(value))
    elif element is AttributeKind.INT:
        if isinstance(value, (int, np.integer)) and _INT64[0] <= int(value) <= _INT64[1]:
            return int(value)
    elif isinstance(value, str):
        if not value.isascii():
            raise ValueError(f"custom op {op}: attribute '{name}': {value} contains non-ASCII characters.")
        return value
    raise TypeError(_type_error(op, name, kind, value))


def _type_error(op: str, name: str, kind: AttributeKind, value: Any) -> str:
    expected = _EXPECTED[kind.element]
    if kind.is_list:
        expected = f"a list of {expected.split(' ', 1)[1]}s"
    return ATTR_TYPE_MSG.format(
        op=op, name=name, expected=expected, kind=kind.value, value=value, type=type(value).__name__
    )


def resolve(op: str, declared: Mapping[str, Attribute], given: Mapping[str, Any]) -> dict[str, Any]:
    """The full, checked attribute values of one call: ``given`` over the defaults."""
    for name in given:
        if name not in declared:
            listing = ", ".join(f"{n} ({a.kind.value})" for n, a in declared.items()) or "none"
            raise ValueError(ATTR_UNKNOWN_MSG.format(op=op, name=name, declared=listing))
    values = {}
    for name, attr in declared.items():
        if name in given:
            values[name] = check_value(op, name, attr.kind, given[name])
        elif attr.default is REQUIRED:
            raise ValueError(ATTR_MISSING_MSG.format(op=op, name=name, kind=attr.kind.value))
        else:
            values[name] = attr.default
    return values
