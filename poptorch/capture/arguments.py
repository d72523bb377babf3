"""A torch model's call arguments: bound to ``forward``'s signature, checked, flattened.

PopTorch binds every call to the parameters of ``forward`` (filling defaults), so that a
model compiled for ``model(x, y=None)`` can be checked against each later call: the same
structure, the same tensor dtypes and shapes, the same non-tensor values (those are
constants of the compiled program). Its messages are kept. Tensors are then flattened in
the order ``torch.export`` flattens the arguments; user types holding tensors take part
through ``registerCustomArgParser`` (or, for ``dict`` subclasses, automatically).
"""

from __future__ import annotations

import abc
import collections
import copy
import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .._log import logger
from ..errors import Error
from . import transformers_cache as _transformers

MISMATCH_END = (
    "\nThis error occurred because the inputs passed at runtime don't match the inputs used "
    "to compile the model.\nTo recompile the model for the new inputs create a new "
    "inferenceModel / trainingModel wrapper or call destroy() on the curent one and try again."
)
NOT_CONTIGUOUS_MSG = (
    "At least one input tensor is not contiguous: non-contiguous tensors will be converted."
)
DICT_INPUT_MSG = (
    "Dicts as inputs only have partial support, they can be accessed using literal keys, but "
    "full Python functionality is not enabled. Consider changing dict inputs to tuple."
)


class ICustomArgParser(abc.ABC):
    """How to find the tensors in, and rebuild, an argument of a user-defined type."""

    @abc.abstractmethod
    def yieldTensors(self, struct: Any) -> Iterator[torch.Tensor]:  # noqa: N802
        """Yield every tensor of ``struct`` in a deterministic order."""

    @abc.abstractmethod
    def reconstruct(self, original_structure: Any, tensor_iterator: Iterator[Any]) -> Any:
        """A new object like ``original_structure`` holding the next tensors of
        ``tensor_iterator`` in ``yieldTensors``' order."""


_PARSERS: dict[type, ICustomArgParser] = {}
_REGISTERED: set[type] = set()


def registerCustomArgParser(arg_data_type: type, arg_parser: ICustomArgParser | None) -> None:  # noqa: N802
    """Use ``arg_parser`` for arguments (and results) of type ``arg_data_type``; ``None``
    removes the type's parser."""
    if arg_parser is None:
        _PARSERS.pop(arg_data_type, None)
        return
    if not isinstance(arg_parser, ICustomArgParser):
        raise Error("arg_parser must inherit from ICustomArgParser", "poptorch_py_error")
    _PARSERS[arg_data_type] = arg_parser
    _register_with_pytree(arg_data_type)


class _Structure:
    """A custom-parser object as a pytree context: the object (to rebuild from) and its
    number of tensors. Two calls' structures match when their types and tensor counts do,
    not only when they are the same object."""

    def __init__(self, obj: Any, n: int) -> None:
        self.obj, self.n = obj, n

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Structure)
            and type(other.obj) is type(self.obj)
            and other.n == self.n
        )

    def __hash__(self) -> int:
        return hash((type(self.obj), self.n))

    def __deepcopy__(self, memo: dict) -> _Structure:
        return self  # read only, to rebuild from; its tensors may be torch.export's fakes

    def __repr__(self) -> str:
        return f"{type(self.obj).__qualname__}({self.n} tensors)"


def _register_with_pytree(cls: type) -> None:
    if cls in _REGISTERED or cls in pytree.SUPPORTED_NODES:
        return

    def flatten(obj: Any) -> tuple[list[Any], Any]:
        parser = _PARSERS.get(cls)
        if parser is not None:
            tensors = list(parser.yieldTensors(obj))
            return tensors, _Structure(copy.copy(obj), len(tensors))
        return list(obj.values()), list(obj.keys())

    def unflatten(values: Any, context: Any) -> Any:
        parser = _PARSERS.get(cls)
        if parser is not None:
            return parser.reconstruct(context.obj, iter(values))
        return cls(zip(context, values))

    def flatten_with_keys(obj: Any) -> tuple[list[tuple[Any, Any]], Any]:
        values, context = flatten(obj)
        if _PARSERS.get(cls) is not None:
            keys: list[Any] = [pytree.SequenceKey(i) for i in range(len(values))]
        else:
            keys = [pytree.MappingKey(k) for k in context]
        return list(zip(keys, values)), context

    pytree.register_pytree_node(
        cls,
        flatten,
        unflatten,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        flatten_with_keys_fn=flatten_with_keys,
    )
    _REGISTERED.add(cls)


def register_types(value: Any) -> None:
    """Make the containers in ``value`` (custom-parser types, dict subclasses) flattenable."""
    if isinstance(value, (tuple, list)):
        for v in value:
            register_types(v)
    elif isinstance(value, Mapping):
        if type(value) not in (dict, collections.OrderedDict, collections.defaultdict):
            _register_with_pytree(type(value))
        for v in value.values():
            register_types(v)
    elif type(value) in _PARSERS:
        _register_with_pytree(type(value))
    elif _transformers.is_cache(value):
        _transformers.register_cache(value)


@dataclass
class CallArgs:
    """One call's arguments bound to ``forward``'s parameters."""

    args: list[Any] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    # The caller's non-contiguous tensors, by the id of the contiguous copy that replaced
    # them: a forward that writes an input in place writes the caller's tensor.
    originals: dict[int, torch.Tensor] = field(default_factory=dict)

    def caller_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """The tensor the caller passed where the call holds ``t``."""
        return self.originals.get(id(t), t)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor, in the order ``torch.export`` flattens ``(args, kwargs)``."""
        if not self.kwargs and all(type(a) is torch.Tensor for a in self.args):
            return list(self.args)  # the common call: tensors only (no pytree walk)
        register_types(self.args)
        register_types(self.kwargs)
        leaves, _ = pytree.tree_flatten((tuple(self.args), self.kwargs))
        return [x for x in leaves if isinstance(x, torch.Tensor)]


class Binder:
    """Binds calls to a model's ``forward`` signature, as PopTorch did."""

    def __init__(self, model: Any) -> None:
        try:
            sig = inspect.signature(model.forward)
        except (TypeError, ValueError):
            sig = None
        if sig is None:
            self.names = ["args", "kwargs"]
            self.kinds: list[inspect._ParameterKind] = [
                inspect.Parameter.VAR_POSITIONAL,
                inspect.Parameter.VAR_KEYWORD,
            ]
            self.defaults: dict[str, Any] = {}
        else:
            self.names = list(sig.parameters)
            self.kinds = [p.kind for p in sig.parameters.values()]
            self.defaults = {
                n: p.default
                for n, p in sig.parameters.items()
                if p.default is not inspect.Parameter.empty
            }
        self.variadic = any(
            k in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            for k in self.kinds
        )
        self._warned_contiguous = False

    def bind(self, args: tuple, kwargs: dict[str, Any], check: bool = True) -> CallArgs:
        if not self.variadic and len(args) + len(kwargs) > len(self.names):
            raise Error(
                f"Too many arguments provided: expected {self.names} ({len(self.names)}) but "
                f"got {len(args) + len(kwargs)}",
                "poptorch_py_error",
            )
        if not self.variadic:
            for k in kwargs:
                if k not in self.names:
                    raise Error(
                        f"{k} is not a valid parameter.Allowed values are {self.names}",
                        "poptorch_py_error",
                    )
        call = CallArgs()
        after_varargs = False
        args = tuple(args)
        for i, name in enumerate(self.names):
            kind = self.kinds[i]
            if kind == inspect.Parameter.VAR_KEYWORD:
                for k, v in kwargs.items():
                    if k not in self.names[:i]:
                        call.kwargs[k] = v
            elif kind == inspect.Parameter.VAR_POSITIONAL:
                after_varargs = True
                for j, a in enumerate(args[i:]):
                    self._append(call, a, f"*{name}[{j}]", check)
                args = args[:i]
            elif i < len(args):
                if name in kwargs:
                    raise Error(f"Parameter {name} was passed more than once", "poptorch_py_error")
                self._append(call, args[i], name, check)
            elif name in kwargs:
                if check:
                    self._check_dict(kwargs[name])
                    _check_not_numpy(name, kwargs[name])
                if after_varargs:
                    call.kwargs[name] = kwargs[name]
                else:
                    call.args.append(kwargs[name])
                    call.names.append(name)
            elif name in self.defaults:
                if after_varargs:
                    call.kwargs[name] = self.defaults[name]
                else:
                    call.args.append(self.defaults[name])
                    call.names.append(name)
            else:
                raise Error(f"Mandatory parameter {name} missing", "poptorch_py_error")
        self._contiguous(call)
        return call

    def by_name(self, call: CallArgs) -> tuple[tuple, dict[str, Any]]:
        """``call`` as ``torch.export`` is given it: every argument bound to a parameter that
        takes keywords passed by name, in the same order, so the tensors flatten as they do
        from ``call`` (PopTorch binds keywords to positions; eager torch passes them as the
        user wrote them). transformers' ``merge_with_config_defaults`` looks for ``use_cache``
        among the keywords or by the position of the function it wraps, which for some
        models (M2M100) is another wrapper: a positional ``use_cache`` then came twice."""
        kinds = dict(zip(self.names, self.kinds))
        keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        if not all(kinds.get(name) in keyword for name in call.names):
            return tuple(call.args), dict(call.kwargs)
        return (), {**dict(zip(call.names, call.args)), **call.kwargs}

    def _append(self, call: CallArgs, value: Any, name: str, check: bool) -> None:
        if check:
            self._check_dict(value)
            _check_not_numpy(name, value)
        call.args.append(value)
        call.names.append(name)

    @staticmethod
    def _check_dict(value: Any) -> None:
        work = [value]
        while work:
            d = work.pop()
            if isinstance(d, (tuple, list)):
                work.extend(d)
            elif isinstance(d, dict):
                logger.warning(DICT_INPUT_MSG)
                return

    def _contiguous(self, call: CallArgs) -> None:
        found = [False]

        def fix(t: Any) -> Any:
            if isinstance(t, torch.Tensor) and not t.is_contiguous():
                found[0] = True
                copy = t.contiguous()
                call.originals[id(copy)] = t
                return copy
            return t

        call.args = [_map_tensors(a, fix) for a in call.args]
        call.kwargs = {k: _map_tensors(v, fix) for k, v in call.kwargs.items()}
        if found[0] and not self._warned_contiguous:
            logger.warning(NOT_CONTIGUOUS_MSG)
            self._warned_contiguous = True


NUMPY_INPUT_MSG = (
    "Argument {name} is a numpy.ndarray: a PopTorch model's tensor inputs must be torch "
    "tensors (a NumPy array would be compiled into the program as a constant). Convert it "
    "with torch.from_numpy(...)."
)


def _check_not_numpy(name: str, value: Any) -> None:
    work = [(name, value)]
    while work:
        label, v = work.pop()
        if type(v).__module__ == "numpy" and hasattr(v, "shape") and getattr(v, "ndim", 0) > 0:
            raise Error(NUMPY_INPUT_MSG.format(name=label), "poptorch_py_error")
        if isinstance(v, (tuple, list)):
            work.extend((f"{label}[{i}]", x) for i, x in enumerate(v))
        elif isinstance(v, dict):
            work.extend((f"{label}[{k!r}]", x) for k, x in v.items())


def _map_tensors(value: Any, fn: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    parser = _PARSERS.get(type(value))
    if parser is not None:
        return parser.reconstruct(value, iter([fn(t) for t in parser.yieldTensors(value)]))
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_map_tensors(v, fn) for v in value)
    if isinstance(value, list):
        return [_map_tensors(v, fn) for v in value]
    if type(value) in (dict, collections.OrderedDict):
        return type(value)((k, _map_tensors(v, fn)) for k, v in value.items())
    return value


def _fail(message: str) -> Error:
    return Error(message + MISMATCH_END, "poptorch_py_error")


def validate(compiled: CallArgs, given: CallArgs) -> None:
    """Raise PopTorch's error for the first difference between ``given`` and the arguments
    the model was compiled with."""
    if len(given.args) != len(compiled.args):
        raise _fail(
            "Number of positional arguments mismatch: expected "
            f"{len(compiled.args)} arguments but got {len(given.args)}."
        )
    for name, c, g in zip(compiled.names, compiled.args, given.args):
        _validate(name, c, g)
    _validate("named arguments", compiled.kwargs, given.kwargs, named=True)


def _validate(name: str, compiled: Any, given: Any, named: bool = False) -> None:
    if type(compiled) is not type(given):
        raise _fail(f"Type mismatch for {name}: expected {type(compiled)} but got {type(given)}.")
    if isinstance(compiled, (tuple, list)):
        if len(compiled) != len(given):
            raise _fail(
                f"Length mismatch for {name}: expected {len(compiled)} elements but got "
                f"{len(given)}."
            )
        for i, (c, g) in enumerate(zip(compiled, given)):
            _validate(f"{name}[{i}]", c, g)
    elif isinstance(compiled, dict):
        expected, provided = set(compiled), set(given)
        if expected != provided:
            details = []
            if provided - expected:
                details.append("Unexpected arguments: " + ", ".join(sorted(provided - expected)))
            if expected - provided:
                details.append("Missing arguments: " + ", ".join(sorted(expected - provided)))
            raise _fail(f"Keys mismatch for {name}: {'. '.join(details)}.")
        for k, v in compiled.items():
            _validate(k if named else f"{name}[{k}]", v, given[k])
    elif isinstance(compiled, torch.Tensor):
        if compiled.dtype != given.dtype:
            raise _fail(
                f"Data type mismatch for {name}: expected {compiled.dtype} but got {given.dtype}."
            )
        if compiled.shape != given.shape:
            raise _fail(
                f"Shape mismatch for {name}: expected {compiled.shape} but got {given.shape}."
            )
    elif type(compiled) in _PARSERS:
        parser = _PARSERS[type(compiled)]
        _validate(name, tuple(parser.yieldTensors(compiled)), tuple(parser.yieldTensors(given)))
    elif compiled != given:
        raise _fail(f"Value mismatch for {name}: expected {compiled} but got {given}.")


def in_compiled_order(compiled: CallArgs, given: CallArgs) -> CallArgs:
    """``given`` (already validated against ``compiled``) with its dicts' keys in the order
    the model was compiled with: a dict's tensors are matched by key, not by position."""
    if not compiled.kwargs and all(type(a) is torch.Tensor for a in compiled.args):
        return given  # nothing to reorder

    def order(c: Any, g: Any) -> Any:
        if isinstance(c, dict) and type(c) in (dict, collections.OrderedDict):
            return type(g)((k, order(c[k], g[k])) for k in c)
        if isinstance(c, (tuple, list)) and type(c) in (tuple, list):
            return type(g)(order(a, b) for a, b in zip(c, g))
        return g

    return CallArgs(
        [order(c, g) for c, g in zip(compiled.args, given.args)],
        list(given.names),
        {k: order(c, given.kwargs[k]) for k, c in compiled.kwargs.items()},
    )


def metadata(call: CallArgs) -> CallArgs:
    """``call`` with every tensor replaced by an empty tensor of its dtype and shape (what
    later calls are checked against, without keeping the data alive)."""

    def meta(t: torch.Tensor) -> torch.Tensor:
        return torch.empty(t.shape, dtype=t.dtype, device="meta")

    return CallArgs(
        [_map_tensors(a, meta) if type(a) not in _PARSERS else a for a in call.args],
        list(call.names),
        {
            k: _map_tensors(v, meta) if type(v) not in _PARSERS else v
            for k, v in call.kwargs.items()
        },
    )
