"""Shrink a disagreeing torch program and print it as a standalone pytest case.

Edits, biggest first, tried by the popxl shrinker's greedy loop: replace a statement by a
constant of its shape and dtype (later statements read the same name), delete a statement
nobody reads (or all of them, with the submodules, methods and inputs only they used),
drop an output, simplify the mode (one call, one device iteration, no accumulation or
replication, the default output mode, plain SGD, inference), delete an unused submodule
or input, make an input contiguous. A candidate counts only if it fails the same way (an
unread statement can matter: a refused dtype, an effect).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable

from ..differential.shrink import greedy
from .program import Program, Stmt
from .runner import Outcome, check

Edit = Callable[[Program], None]
SIMPLE_OPTIMIZER = "torch.optim.SGD(params, lr=0.05)"


def constant(stmt: Stmt) -> Stmt:
    """A statement giving ``stmt``'s name a constant of its shape and dtype."""
    spec = stmt.spec
    fill = {"bool": "True", "int32": "1", "int64": "1"}.get(spec.dtype, "0.5")
    template = f"torch.full({spec.shape}, {fill}, dtype=torch.{spec.dtype})"
    return Stmt(stmt.out, template, (), "creation", spec)


def _mode_edits() -> list[tuple[str, object]]:
    return [
        ("calls", 1),
        ("set_optimizer", ""),
        ("device_iterations", 1),
        ("accumulation", 1),
        ("replicas", 1),
        ("output_mode", "Default"),
        ("optimizer", SIMPLE_OPTIMIZER),
    ]


def _edits(program: Program) -> list[Edit]:
    pruned = dead_code(copy.deepcopy(program))
    edits: list[Edit] = [dead_code] if pruned.source() != program.source() else []
    used = _read(program)
    for i, stmt in reversed(list(enumerate(program.stmts))):
        if stmt.template.startswith("torch.full("):
            continue

        def replace(p: Program, i: int = i) -> None:
            old = p.stmts[i]
            if old.effect or old.out not in _read(p):
                del p.stmts[i]
            else:
                p.stmts[i] = constant(old)

        edits.append(replace)
    for k in range(len(program.outputs)):
        if len(program.outputs) > 1 or program.mode.kind == "training":

            def drop(p: Program, k: int = k) -> None:
                del p.outputs[k]

            edits.append(drop)
    training = program.mode.kind == "training"
    for field, value in _mode_edits():
        if getattr(program.mode, field) != value and (training or field != "optimizer"):
            edits.append(lambda p, f=field, v=value: setattr(p.mode, f, v))
    if training:
        edits.append(_to_inference)
    for k, line in enumerate(program.init):
        if _attribute(line) not in _text(program):
            edits.append(lambda p, k=k: p.init.__delitem__(k))
    for k, spec in enumerate(program.inputs):
        if spec.layout != "contiguous":
            edits.append(lambda p, k=k: p.inputs.__setitem__(k, _contiguous(p.inputs[k])))
        if spec.name not in used:
            edits.append(lambda p, k=k: p.inputs.__delitem__(k))
    return edits


def _read(program: Program) -> set[str]:
    """The names the program reads (statement arguments, outputs, the loss)."""
    return {a for s in program.stmts for a in s.args} | set(program.outputs) | {program.loss}


def _text(program: Program) -> str:
    return "\n".join(s.line() for s in program.stmts) + "\n".join(program.methods)


def _to_inference(p: Program) -> None:
    p.mode.kind, p.mode.optimizer, p.mode.set_optimizer, p.mode.accumulation = (
        "inference",
        "",
        "",
        1,
    )
    p.loss = ""
    if not p.outputs and p.stmts:
        p.outputs = [p.stmts[-1].out or p.inputs[0].name]


def _contiguous(spec):  # noqa: ANN001, ANN202
    from dataclasses import replace  # noqa: PLC0415

    return replace(spec, layout="contiguous")


def dead_code(program: Program) -> Program:
    """Remove what nothing reads: statements, ``__init__`` attributes, methods, inputs."""
    used = set(program.outputs) | ({program.loss} if program.loss else set())
    keep: list[Stmt] = []
    for stmt in reversed(program.stmts):
        if stmt.effect or stmt.out in used:
            keep.append(stmt)
            used |= set(stmt.args)
    program.stmts = keep[::-1]
    text = _text(program)
    program.init = [line for line in program.init if _attribute(line) in text]
    program.methods = [m for m in program.methods if _method_name(m) in text.replace(m, "")]
    program.inputs = [i for i in program.inputs if i.name in _read(program)] or program.inputs[:1]
    return program


def _attribute(line: str) -> str:
    found = re.match(r'self\.register_buffer\("(\w+)"|self\.(\w+)', line)
    name = found.group(1) or found.group(2)
    return f"self.{name}"


def _method_name(source: str) -> str:
    return "self." + source.split("(", 1)[0].removeprefix("def ")


def kind(message: str) -> str:
    """A failure's kind: the exception type of a crash, else what differed (values, shape,
    dtype) and where (an output or the state)."""
    first = message.splitlines()[0]
    if first.startswith(("poptorch failed", "reference failed")):
        last = message.rstrip().splitlines()[-1]
        return first.split()[0] + " " + last[:60]
    if first.startswith("refusal"):
        return first.split(":", 1)[0]
    where = "state" if first.startswith("state") else "output"
    what = first.split(": ", 1)[-1].split()[0] if ": " in first else first
    return f"{where} {what}"


def shrink(outcome: Outcome, check_program: Callable = check, budget: int = 80) -> Outcome:
    """A smaller program failing the same way as ``outcome`` (see the module doc)."""
    target = kind(outcome.message)

    def attempt(candidate: Program) -> Outcome | None:
        if not candidate.stmts and not candidate.outputs:
            return None
        try:
            result = check_program(candidate)
        except Exception:  # noqa: BLE001 (an edit made an invalid program)
            return None
        if isinstance(result, Outcome) and kind(result.message) == target:
            return result
        return None

    return greedy(outcome, _edits, attempt, budget)


def as_pytest(outcome: Outcome, name: str = "") -> str:
    """The failing program as a standalone pytest function (with its failure in the
    docstring)."""
    p = outcome.program
    name = name or f"test_program_{p.seed}"
    inputs = ",\n        ".join(
        f"Input({i.name!r}, Spec({i.spec.shape}, {i.spec.dtype!r}), {i.layout!r}, {i.low}, {i.high})"
        for i in p.inputs
    )
    mode_fields = {k: v for k, v in vars(p.mode).items() if v != getattr(type(p.mode)(), k)}
    mode = ", ".join(f"{k}={v!r}" for k, v in mode_fields.items())
    message = "\n    ".join(outcome.message.splitlines()[:6])
    families = tuple(sorted({s.family for s in p.stmts}))
    source = "\n".join("        " + line for line in p.source().splitlines())
    return (
        f"def {name}():\n"
        f'    """{message}\n    """\n'
        f"    source = '''\n{source}\n'''\n"
        f"    assert_agrees(\n        source,\n        [{inputs}],\n        Mode({mode}),\n"
        f"        seed={p.seed},\n        families={families!r},\n    )\n"
    )
