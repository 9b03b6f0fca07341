"""A Ctrl-C that reaches the CLI while it is still importing ends like any Ctrl-C: one line,
exit 130, no Python traceback (the stress run saw a traceback and exit 1 for SIGINTs sent in the
first tens of milliseconds of a process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.cli import run_cli

# Sends SIGINT to the process itself the moment the CLI imports MODULE: the signal lands inside
# the import, exactly where a user's early Ctrl-C would, without any timing guesswork.
# SIGINT is first given Python's own handler: a shell starts a background job (`make test &`)
# with SIGINT ignored, which Python keeps, and the signal would then do nothing at all.
_INTERRUPT_ON_IMPORT = """
import os, signal, sys

signal.signal(signal.SIGINT, signal.default_int_handler)

class _InterruptOnImport:
    def find_spec(self, name, path=None, target=None):
        if name == MODULE:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, _InterruptOnImport())
"""


# click: the CLI's own imports; dflash_provision.errors and gc: the entry module's imports, which
# ran outside main()'s except KeyboardInterrupt (issue 35 finding 3; gc: seen by the soak on a
# loaded machine); the entry module itself (python -m: __main__.py's import of it).
# (The console script's import of the entry module is pip's generated code, out of reach.)
@pytest.mark.parametrize(
    ("module", "entry_point"),
    [
        *[
            (module, entry_point)
            for module in ("click", "dflash_provision.errors", "gc")
            for entry_point in (True, False)
        ],
        ("dflash_provision.cli.entry", False),
    ],
)
def test_ctrl_c_while_importing_is_exit_130_without_traceback(
    tmp_path: Path, entry_point: bool, module: str
) -> None:
    (tmp_path / "sitecustomize.py").write_text(f"MODULE = {module!r}\n" + _INTERRUPT_ON_IMPORT)
    done = run_cli(
        "--version", env={"PYTHONPATH": str(tmp_path)}, entry_point=entry_point, home=tmp_path
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "interrupted"
    assert "Traceback" not in done.stderr


def test_the_entry_modules_own_interrupted_code_is_the_exit_code_tables() -> None:
    from dflash_provision.cli import entry
    from dflash_provision.errors import ExitCode

    assert entry._INTERRUPTED == ExitCode.INTERRUPTED
