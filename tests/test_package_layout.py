"""The shipped package stands on its own: nothing outside the test bed imports it (the wheel
leaves `dflash_provision/testbed` out, see pyproject.toml)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "dflash_provision"
TESTBED = PACKAGE / "testbed"


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_shipped_module_imports_the_test_bed() -> None:
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if TESTBED not in path.parents
        and any(name.startswith("dflash_provision.testbed") for name in _imported_modules(path))
    ]
    assert offenders == []


def test_exit_codes_come_from_one_table_not_from_the_console_entry() -> None:
    """The console entry (cli/entry.py) is the process's start, not a table of constants: no
    module imports it (the Ctrl-C code 130 is ExitCode.INTERRUPTED, beside every other code)."""
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "__main__.py" and "dflash_provision.cli.entry" in _imported_modules(path)
    ]
    assert offenders == []


def _private_imports(path: Path) -> list[str]:
    """``from dflash_provision.X import _name``: another module's private name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dflash_provision")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]


def test_no_module_imports_another_modules_private_name() -> None:
    """What one module shares with another is public (the remote protocol's reply parser, the
    Prometheus label writer, launch's env rules): a private name imported elsewhere is a home
    that was never made one."""
    offenders = {
        str(path.relative_to(PACKAGE)): names
        for path in PACKAGE.rglob("*.py")
        if (names := _private_imports(path))
    }
    assert offenders == {}
