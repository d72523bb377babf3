"""Options written as text: ``Options.loadFromFile`` (one setter call per line) and
``Options.from_json`` / ``POPTORCH_DEFAULT_OPTIONS`` (``{"Setter.path": value}``).

A config line is parsed, never executed: it must be one call of an ``Options`` setter
(dotted through the sub-objects, e.g. ``Training.gradientAccumulation(4)``) whose
arguments are Python literals, enum members (``poptorch.OutputMode.All``,
``OutputMode.All``), torch dtypes (``torch.float16``) or calls of PopTorch's option
classes (``poptorch.ShardedExecution()``, ``poptorch.TensorLocationSettings()
.useOnChipStorage(False)``, ``poptorch.Stage("A")``), so a file cannot run arbitrary code.
The whole file is parsed before any line is applied: a syntax error changes nothing.
As in PopTorch, a syntax error names the option line (blank and comment lines are not
counted) and shows it with its ``options.`` prefix.
"""

from __future__ import annotations

import ast
import codeop
import json
import os
from dataclasses import dataclass
from typing import Any

from popxl.errors import InternalError

from .. import enums, strategies
from .base import ConfigFileError
from .groups import TensorLocationSettings

CONFIG_LINE_MSG = (
    "{path}:{line}: {text!r} is not an option call. Each line must be one setter call "
    "without the 'options.' prefix, e.g. deviceIterations(10) or "
    "Training.gradientAccumulation(4)."
)
CONFIG_NAME_MSG = "{path}:{line}: Options has no setter {name!r}."
SYNTAX_MSG = "SyntaxError at line {number} of {file}: {detail}\n> options.{text}"
UNKNOWN_NAME_MSG = (
    "Unknown name {name!r} in an options file: arguments are literals, enum members "
    "(poptorch.OutputMode.All), torch dtypes (torch.float16) or PopTorch option classes "
    "(poptorch.ShardedExecution(), poptorch.TensorLocationSettings())."
)
JSON_NAME_MSG = "POPTORCH_DEFAULT_OPTIONS / from_json: Options has no setter {name!r}."

# Option classes a config line may construct (``poptorch.<name>(...)``).
CLASS_NAMES = frozenset(
    (
        "PipelinedExecution",
        "ShardedExecution",
        "SerialPhasedExecution",
        "ParallelPhasedExecution",
        "Phase",
        "Stage",
        "TensorLocationSettings",
    )
)
TORCH_DTYPES = frozenset(
    ("float", "float32", "half", "float16", "bfloat16", "int", "int32", "int64", "bool")
)
# Setter paths may go through these private names (``_Popart.set(...)``), as in PopTorch.
PRIVATE_PATH_NAMES = frozenset(("_Popart",))


def config_error(message: str) -> Exception:
    return ConfigFileError(message)


@dataclass
class _Line:
    number: int  # 1-based count of option lines, as PopTorch numbered them
    file_line: int
    text: str
    call: ast.Call


def parse_file(path: str) -> list[_Line]:
    """Every option line of ``path``, parsed (raises ``ConfigFileError`` before any is
    applied if one is malformed)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    parsed: list[_Line] = []
    for file_line, raw in enumerate(lines, 1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        parsed.append(_parse_line(path, len(parsed) + 1, file_line, text))
    return parsed


def _parse_line(path: str, number: int, file_line: int, text: str) -> _Line:
    try:
        tree = ast.parse(text, mode="exec")
    except SyntaxError as err:
        raise config_error(
            SYNTAX_MSG.format(
                number=number, file=os.path.basename(path), detail=_detail(text, err), text=text
            )
        ) from None
    body = tree.body[0] if len(tree.body) == 1 else None
    call = body.value if isinstance(body, ast.Expr) else None
    if not isinstance(call, ast.Call) or _dotted(call.func) is None:
        raise config_error(CONFIG_LINE_MSG.format(path=path, line=file_line, text=text))
    return _Line(number, file_line, text, call)


def _detail(text: str, err: SyntaxError) -> str:
    """The syntax error's reason; an unfinished line (an unclosed bracket or string) reads
    "unexpected EOF while parsing" whatever Python's version calls it."""
    try:
        incomplete = codeop.compile_command(text, symbol="eval") is None
    except (SyntaxError, ValueError, OverflowError):
        incomplete = False
    return "unexpected EOF while parsing" if incomplete else str(err.msg)


def apply_lines(options: Any, path: str, lines: list[_Line]) -> None:
    for line in lines:
        names = _dotted(line.call.func)
        if names is None:
            raise InternalError(f"option line {line!r} passed _parse_line without a dotted name")
        setter = resolve_setter(options, names)
        if setter is None:
            raise config_error(
                CONFIG_NAME_MSG.format(path=path, line=line.file_line, name=".".join(names))
            )
        args = [_value(a) for a in line.call.args]
        kwargs = {k.arg: _value(k.value) for k in line.call.keywords if k.arg}
        setter(*args, **kwargs)


def resolve_setter(options: Any, names: list[str]) -> Any:
    """The bound setter ``options.<names...>``, or None when it is not a public setter."""
    target: Any = options
    for name in names:
        if name.startswith("_") and name not in PRIVATE_PATH_NAMES:
            return None
        try:
            target = getattr(target, name)
        except AttributeError:
            return None
    return target if callable(target) and not isinstance(target, type) else None


def _dotted(node: ast.expr) -> list[str] | None:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else [*head, node.attr]
    return None


def _value(node: ast.expr) -> Any:
    """A config argument's value: literals, enum members, torch dtypes, option classes."""
    if isinstance(node, ast.Call):
        return _call(node)
    names = _dotted(node)
    if names is not None:
        return _named(names)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [_value(e) for e in node.elts]
        return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values) if k is not None}
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise config_error(UNKNOWN_NAME_MSG.format(name=ast.unparse(node))) from None


def _named(names: list[str]) -> Any:
    if names in (["True"], ["False"], ["None"]):
        return {"True": True, "False": False, "None": None}[names[0]]
    if names[0] == "torch" and len(names) == 2 and names[1] in TORCH_DTYPES:
        import torch  # noqa: PLC0415 (only files naming torch dtypes need it)

        return getattr(torch, names[1])
    rest = names[1:] if names[0] == "poptorch" else names
    if rest and rest[0] == "enums":
        rest = rest[1:]
    if len(rest) == 2 and rest[0] in enums.ENUMS and rest[1] in enums.ENUMS[rest[0]].__members__:
        return enums.ENUMS[rest[0]][rest[1]]
    raise config_error(UNKNOWN_NAME_MSG.format(name=".".join(names)))


def _call(node: ast.Call) -> Any:
    """``poptorch.<OptionClass>(...)`` or a public method call on such an object."""
    args = [_value(a) for a in node.args]
    kwargs = {k.arg: _value(k.value) for k in node.keywords if k.arg}
    func = node.func
    names = _dotted(func)
    if names is not None:
        rest = names[1:] if names[0] == "poptorch" else names
        if len(rest) == 1 and rest[0] in CLASS_NAMES:
            return _option_class(rest[0])(*args, **kwargs)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call):
        if func.attr.startswith("_"):
            raise config_error(UNKNOWN_NAME_MSG.format(name=func.attr))
        method = getattr(_call(func.value), func.attr, None)
        if callable(method):
            return method(*args, **kwargs)
    raise config_error(UNKNOWN_NAME_MSG.format(name=ast.unparse(func)))


def _option_class(name: str) -> Any:
    """One of ``CLASS_NAMES``: an execution strategy, a stage or phase, or
    ``TensorLocationSettings``."""
    if name == "TensorLocationSettings":
        return TensorLocationSettings
    return getattr(strategies, name)


def apply_json(options: Any, text: str) -> None:
    """Apply ``{"Setter.path": value}``: a list value is the argument list, any other value
    the only argument; strings ``"Enum.Member"`` name PopTorch enum members."""
    values = json.loads(text)
    if not isinstance(values, dict):
        raise config_error(f"Options JSON must be an object, got {type(values).__name__}.")
    for path, value in values.items():
        setter = resolve_setter(options, path.split("."))
        if setter is None:
            raise config_error(JSON_NAME_MSG.format(name=path))
        value = _json_enum(value)
        if isinstance(value, list):
            setter(*[_json_enum(v) for v in value])
        else:
            setter(value)


def _json_enum(value: Any) -> Any:
    if isinstance(value, str) and value.count(".") == 1:
        cls, member = value.split(".")
        if cls in enums.ENUMS and member in enums.ENUMS[cls].__members__:
            return enums.ENUMS[cls][member]
    return value
