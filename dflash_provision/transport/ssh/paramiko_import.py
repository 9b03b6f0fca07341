"""paramiko without invoke: the first import of paramiko in this process, and ``Match exec``.

paramiko's config module runs ``try: import invoke`` at import time, only so that an ssh_config
``Match exec`` line can later run its command through ``invoke.run``. Importing invoke (and the
YAML, asyncio and unittest.mock it pulls in) is a third of an SSH command's start-up, for a line
almost no config has. So paramiko is first imported with invoke hidden, and invoke is brought in
only when an ssh_config that is read has a ``Match ... exec`` line (``enable_match_exec``):
paramiko then behaves exactly as if it had imported invoke itself.
"""

from __future__ import annotations

import re
import sys

# A Match line with an exec criterion (``exec`` or ``!exec``), as paramiko reads keywords: any
# case, after optional blanks, ``=`` or blanks after the keyword. Erring towards a match only
# costs the import this module avoids.
_MATCH_EXEC = re.compile(r"^\s*match\b.*\bexec\b", re.IGNORECASE | re.MULTILINE)


def import_paramiko() -> None:
    """Import paramiko with ``import invoke`` failing fast, unless something imported invoke
    already. ``sys.modules["invoke"] = None`` is Python's documented way to make one import
    raise ImportError; it is removed again, so a later ``import invoke`` anywhere works."""
    if "paramiko" in sys.modules:
        return
    hide = "invoke" not in sys.modules
    if hide:
        sys.modules["invoke"] = None  # type: ignore[assignment]
    try:
        import paramiko  # noqa: F401 -- imported for its side effect: loaded, without invoke
    finally:
        if hide and "invoke" in sys.modules and sys.modules["invoke"] is None:
            del sys.modules["invoke"]


def needs_match_exec(config_text: str) -> bool:
    return _MATCH_EXEC.search(config_text) is not None


def enable_match_exec() -> None:
    """Give paramiko's config module the invoke it would have imported (or the ImportError it
    would have kept, when invoke is not installed), before a ``Match exec`` is evaluated."""
    import paramiko.config

    if paramiko.config.invoke is not None:  # type: ignore[attr-defined]
        return
    try:
        import invoke
    except ImportError as exc:
        paramiko.config.invoke_import_error = exc
        return
    paramiko.config.invoke = invoke  # type: ignore[attr-defined]
