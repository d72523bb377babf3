"""The machinery shared by ``poptorch.Options`` and its sub-objects: PopTorch's freezing,
its attribute errors and ``set(**kwargs)``, the argument checks of the setters, and
``Options._Popart`` (PopART session options by name)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

POSITIVE_MSG = "{name} must be a positive integer, got {value!r}."
TYPE_MSG = "{name} expects {expected}, got {got!r}."
FROZEN_MSG = "Can't modify frozen Options"
INVALID_ATTRIBUTE_MSG = "Invalid attribute {name}."
INVALID_OPTION_MSG = "Invalid option {name}, valid options are {valid}"
UNEXPECTED_TYPE_MSG = "Unexpected type {got} for option {name}. Expected {expected}"


class OptionValueError(ValueError, AssertionError):
    """An invalid option value. A ``ValueError``; also an ``AssertionError``, which PopTorch
    raised for these checks, so code written for it keeps catching them."""


class ConfigFileError(OptionValueError):
    """A malformed options file (``loadFromFile``) or options JSON (``from_json``)."""


def _check(ok: bool, name: str, expected: str, got: Any) -> None:
    if not ok:
        raise OptionValueError(TYPE_MSG.format(name=name, expected=expected, got=got))


def _bool(name: str, value: Any) -> bool:
    _check(isinstance(value, bool), name, "a bool", value)
    return value


def _int(name: str, value: Any, minimum: int = 0) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    _check(ok, name, f"an integer >= {minimum}", value)
    return value


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionValueError(POSITIVE_MSG.format(name=name, value=value))
    return value


def _str(name: str, value: Any) -> str:
    _check(isinstance(value, str), name, "a string", value)
    return value


def _enum_member(cls: type[enum.Enum], value: Any, name: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        members = ", ".join(f"{cls.__name__}.{m}" for m in cls.__members__)
        raise OptionValueError(f"{name} expects one of {members}, got {value!r}.") from None


class _Base(BaseModel):
    """Validated assignment, no unknown fields, PopTorch's freezing and attribute errors."""

    model_config = ConfigDict(
        validate_assignment=True, extra="forbid", arbitrary_types_allowed=True
    )
    _frozen: bool = PrivateAttr(False)

    def _is_frozen(self) -> bool:
        private = getattr(self, "__pydantic_private__", None) or {}
        return bool(private.get("_frozen", False))

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "__class__" and self._is_frozen():
            raise AttributeError(FROZEN_MSG)
        super().__setattr__(name, value)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # type: ignore[misc]  # pydantic's private attrs
        except AttributeError:
            if name.startswith("__"):
                raise
            raise AttributeError(INVALID_ATTRIBUTE_MSG.format(name=name)) from None

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Any:
        copied = super().__deepcopy__(memo)
        copied._set_frozen(False)
        return copied

    def __str__(self) -> str:
        return repr(self)

    def _children(self) -> list[_Base]:
        values = [getattr(self, name) for name in type(self).model_fields]
        return [v for v in values if isinstance(v, _Base)]

    def _set_frozen(self, state: bool) -> None:
        if self.__pydantic_private__ is not None:
            self.__pydantic_private__["_frozen"] = state
        for child in self._children():
            child._set_frozen(state)

    def _freeze(self) -> None:
        """Make this object and its sub-objects read-only (PopTorch froze the options a
        model or data loader was created with)."""
        self._set_frozen(True)

    def _unfreeze(self) -> None:
        self._set_frozen(False)

    def checkIsFrozen(self, option: str | None = None) -> None:  # noqa: N802
        """Raise ``AttributeError("Can't modify frozen Options")`` if frozen."""
        if self._is_frozen() and option != "_is_frozen":
            raise AttributeError(FROZEN_MSG)

    def set(self, **kwargs: Any) -> Any:
        """Set fields by name, as PopTorch's ``OptionsDict.set``: the name must exist and
        the value have the current value's type (an enum also takes its number)."""
        self.checkIsFrozen()
        for name, value in kwargs.items():
            field = self._set_aliases().get(name, name)
            if field not in type(self).model_fields:
                valid = sorted(type(self).model_fields)
                raise AttributeError(INVALID_OPTION_MSG.format(name=name, valid=valid))
            current = getattr(self, field)
            setattr(self, field, _same_type(name, current, value))
        return self

    @classmethod
    def _set_aliases(cls) -> dict[str, str]:
        return {}


def _same_type(name: str, current: Any, value: Any) -> Any:
    if current is None or value is None:
        return value
    if isinstance(current, int) and type(current) is not int and not isinstance(current, bool):
        if isinstance(value, int) and not isinstance(value, bool):
            return type(current)(value)  # an IntEnum field given its number
    expected = type(current)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
        raise OptionValueError(
            UNEXPECTED_TYPE_MSG.format(got=type(value), name=name, expected=expected)
        )
    return value


class _PopartOptions(_Base):
    """``Options._Popart``: PopART session options by name (advanced users only).

    ``set("autoRecomputation", 3)`` stores a value; names and types are checked when the
    model is built (or by ``poptorch.poptorch_core._validateOptions(opts.toDict())``), as
    PopTorch did: an unknown name is stored here and refused there. PopART's enumerations
    are given as integers or as ``popart``'s members (``IntEnum``s), e.g.
    ``set("syntheticDataMode", int(popart.SyntheticDataMode.RandomNormal))``.

    Most PopART options are checked and recorded without effect here. These act:

    * ``syntheticDataMode`` (also ``Options.enableSyntheticData``): anything but ``Off``
      runs without host transfers; the model reads data made on the device (zeros, random
      normal or random uniform draws, by the mode) instead of the host's, and returns zeros.
    * The options the typed setters own: ``enableStochasticRounding``,
      ``partialsTypeMatMuls``, ``enableEngineCaching`` / ``cachePath`` and
      ``automaticLossScalingSettings.enabled``.

    ``autoRecomputation`` (``popart.RecomputationType``) is recorded, also on the IR's
    session options (``ir.session_options.autoRecomputation``). Any value but
    ``NoRecompute`` makes a pipelined model's backward stages recompute each block's
    forward instead of stashing its activations (``Options.recomputes``), as unset does for
    a pipeline over more than one IPU (PopTorch's default); elsewhere the
    runtime differentiates through JAX and XLA's compiler chooses what to keep. Which type
    is set does not matter here: recomputation changes memory use, never values.
    """

    options: dict[str, Any] = Field(
        default_factory=lambda: {
            "instrumentWithHardwareCycleCounter": False,
            "rearrangeAnchorsOnHost": False,
        }
    )

    def set(self, key: str, value: Any) -> _PopartOptions:  # type: ignore[override]
        """Set PopART session option ``key`` (checked when the model is built)."""
        self.checkIsFrozen()
        _str("_Popart.set key", key)
        self.options[key] = value
        return self

    def _merge(self, key: str, values: Mapping[str, Any]) -> None:
        """Add ``values`` to map option ``key`` (keeping its other entries)."""
        current = self.options.get(key)
        merged = dict(current) if isinstance(current, Mapping) else {}
        merged.update(values)
        self.set(key, merged)

    def setEngineOptions(self, engine_options: dict[str, str]) -> _PopartOptions:  # noqa: N802
        """Poplar engine options (accepted without effect here: no Poplar engine)."""
        _check(isinstance(engine_options, Mapping), "setEngineOptions", "a dict", engine_options)
        return self.set("engineOptions", dict(engine_options))

    def setPatterns(self, patterns: dict[str, bool], level: int = 2) -> _PopartOptions:  # noqa: N802
        """Enable / disable PopART patterns over ``popart.PatternsLevel`` ``level``
        (accepted without effect here: no PopART pattern passes)."""
        _check(isinstance(level, int) and not isinstance(level, bool), "level", "an int", level)
        _check(isinstance(patterns, dict), "patterns", "a dict", patterns)
        self.set("patterns_level", level)
        return self.set("patterns", dict(patterns))

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({body})"
