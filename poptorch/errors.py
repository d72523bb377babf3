"""PopTorch's error model: the runtime's ``Error`` classes under PopTorch's names.

``Error`` carries ``message``, ``type`` and ``location``; ``RecoverableError`` adds
``recovery_action`` (``"IPU_RESET"``, ``"LINK_RESET"``, ``"PARTITION_RESET"``,
``"FULL_RESET"``); ``UnrecoverableError`` marks a session that cannot be used again.
They are the classes ``popxl.errors`` defines, so one ``except`` catches failures from
either API.
"""

from __future__ import annotations

from popxl.errors import Error as Error
from popxl.errors import RecoverableError as RecoverableError
from popxl.errors import UnrecoverableError as UnrecoverableError

__all__ = ["Error", "RecoverableError", "UnrecoverableError"]
