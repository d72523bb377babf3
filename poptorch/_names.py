"""Torch's parameter and buffer names as the keys of popxl-addons' trees.

torch accepts any string as a submodule name (torchvision's RegNet has ``block1-0``), but a
``DotTree`` key segment must be a Python identifier or digits. The program names each weight
by ``tree_key(torch name)``, which is the torch name itself whenever it is already a valid
key, and reads and writes the torch model through the same map; ``torch_name`` turns a key
back into the name the user knows (for printing).

>>> tree_key("trunk_output.block1-0.proj.weight")
'trunk_output.block1_2d_0.proj.weight'
>>> torch_name(tree_key("trunk_output.block1-0.proj.weight"))
'trunk_output.block1-0.proj.weight'
"""

from __future__ import annotations

import re

_NOT_A_WORD_CHARACTER = re.compile(r"\W")
# Each escaped segment, mapped back to torch's (escaping is deterministic, so one map serves
# every model of the process).
_ORIGINAL: dict[str, str] = {}


def _segment_key(segment: str) -> str:
    if segment.isdigit() or segment.isidentifier():
        return segment
    key = _NOT_A_WORD_CHARACTER.sub(lambda m: f"_{ord(m.group()):x}_", segment)
    if not key.isidentifier():  # it starts with a digit
        key = f"_{key}"
    _ORIGINAL[key] = segment
    return key


def tree_key(name: str) -> str:
    """The ``DotTree`` key naming the torch parameter or buffer ``name``."""
    return ".".join(_segment_key(s) for s in name.split("."))


def torch_name(key: str) -> str:
    """The torch name that ``tree_key`` mapped to ``key``."""
    return ".".join(_ORIGINAL.get(s, s) for s in key.split("."))
