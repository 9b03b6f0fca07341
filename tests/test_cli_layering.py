"""The CLI's layering: a command module parses, calls the core and renders; it never imports
another command module (shared pieces live in the ``cli/_*.py`` helpers or below ``cli/``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dflash_provision.cli as cli_package
from dflash_provision.cli.main import COMMANDS

CLI_DIR = Path(cli_package.__file__).parent
COMMAND_MODULES = sorted({module for module, _ in COMMANDS.values()})


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports (at any depth: lazy imports inside functions count)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_a_command_module_imports_no_other_command_module(module: str) -> None:
    others = {f"dflash_provision.cli.{m}" for m in COMMAND_MODULES if m != module}
    found = sorted(_imported(CLI_DIR / f"{module}.py") & others)
    assert found == [], f"cli/{module}.py imports {found}: move what they share to cli/_*.py"
