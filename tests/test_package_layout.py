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


def test_exit_codes_come_from_the_one_table_not_from_the_console_entry() -> None:
    # cli/entry.py is the console script's first module; it holds no constant for others.
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "__main__.py" and "dflash_provision.cli.entry" in _imported_modules(path)
    ]
    assert offenders == []
