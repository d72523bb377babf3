"""Where a node of a captured graph came from, in the user's terms: the module that made it
and the user's line (``module path (Class), file:line``), for errors that point at the model."""

from __future__ import annotations

from torch.fx import Node


def user_frame(node: Node) -> str | None:
    """The last frame of the node's stack trace outside torch itself (the user's line)."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    lines = [ln for ln in trace.strip().splitlines() if ln.strip().startswith("File ")]
    for line in reversed(lines):
        if "/torch/" not in line and "/poptorch/" not in line:
            return line.strip()
    return lines[-1].strip() if lines else None


def module_path(node: Node) -> str:
    """``path.to.module (Class)`` of the innermost module that made the node."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "the model's forward"
    path, cls = list(stack.values())[-1]
    name = cls.__name__ if isinstance(cls, type) else str(cls).rsplit(".", 1)[-1]
    return f"{path or '<model>'} ({name})"


def describe_node(node: Node) -> str:
    frame = user_frame(node)
    where = module_path(node)
    return f"{where}, {frame}" if frame else where
