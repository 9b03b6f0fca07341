"""The first import of paramiko in this process, without what it imports for rare cases.

invoke: paramiko's config module runs ``try: import invoke`` at import time, only so that an
ssh_config ``Match exec`` line can later run its command through ``invoke.run``. Importing invoke
(and the YAML, asyncio and unittest.mock it pulls in) is a third of paramiko's import, for a line
almost no config has. So paramiko is first imported with invoke hidden, and invoke is brought in
only when an ssh_config that is read has a ``Match ... exec`` line (``enable_match_exec``):
paramiko then behaves exactly as if it had imported invoke itself.

importlib.metadata: paramiko's ``__init__`` sets ``__version__`` from
``importlib.metadata.version("paramiko")``, and importing importlib.metadata brings email,
zipfile, csv and importlib.resources, a tenth of an SSH command's imports. While paramiko is
imported, a stand-in answers that one question from the ``Version:`` line of the
``paramiko-*.dist-info`` beside the package, and hands everything else (another name, another
function, no single dist-info found) to the real module, imported then. The real module is the
one in ``sys.modules`` afterwards, as if the stand-in had never been there.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types
from pathlib import Path

# A Match line with an exec criterion (``exec`` or ``!exec``), as paramiko reads keywords: any
# case, after optional blanks, ``=`` or blanks after the keyword. Erring towards a match only
# costs the import this module avoids.
_MATCH_EXEC = re.compile(r"^\s*match\b.*\bexec\b", re.IGNORECASE | re.MULTILINE)


_METADATA = "importlib.metadata"
_MAX_METADATA_BYTES = 1024 * 1024


def import_paramiko() -> None:
    """Import paramiko with ``import invoke`` failing fast, unless something imported invoke
    already, and with importlib.metadata stood in for unless it is imported already.
    ``sys.modules["invoke"] = None`` is Python's documented way to make one import raise
    ImportError; both entries are removed again, so later imports of either work as usual."""
    if "paramiko" in sys.modules:
        return
    hide = "invoke" not in sys.modules
    stand_in = _MetadataStandIn() if _METADATA not in sys.modules else None
    if hide:
        sys.modules["invoke"] = None  # type: ignore[assignment]
    if stand_in is not None:
        sys.modules[_METADATA] = stand_in
    try:
        import paramiko  # noqa: F401 -- imported for its side effect: loaded, light
    finally:
        if hide and "invoke" in sys.modules and sys.modules["invoke"] is None:
            del sys.modules["invoke"]
        if stand_in is not None:
            stand_in.leave()


class _MetadataStandIn(types.ModuleType):
    """importlib.metadata while paramiko is imported: ``version("paramiko")`` from its
    dist-info; anything else from the real module."""

    def __init__(self) -> None:
        super().__init__(_METADATA)

    def version(self, name: str) -> str:
        found = _dist_info_version(name) if name == "paramiko" else None
        return found if found is not None else str(self._real().version(name))

    def __getattr__(self, attribute: str) -> object:
        return getattr(self._real(), attribute)

    def leave(self) -> None:
        """Out of sys.modules and of the importlib package, unless the real module is there."""
        if sys.modules.get(_METADATA) is self:
            del sys.modules[_METADATA]
        if importlib.__dict__.get("metadata") is self:
            del importlib.__dict__["metadata"]

    def _real(self) -> types.ModuleType:
        self.leave()
        return importlib.import_module(_METADATA)


def _dist_info_version(name: str) -> str | None:
    """The ``Version:`` of the one ``NAME-*.dist-info`` beside package ``name``, or None when
    there is not exactly one (importlib.metadata then decides, as it would have)."""
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if len(locations) != 1:
        return None
    found = list(Path(locations[0]).parent.glob(f"{name}-*.dist-info/METADATA"))
    if len(found) != 1:
        return None
    try:
        with found[0].open("rb") as handle:
            text = handle.read(_MAX_METADATA_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    for line in text.splitlines():
        if not line.strip():
            return None  # the headers end at the first blank line
        if line.startswith("Version:"):
            return line.removeprefix("Version:").strip() or None
    return None


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
