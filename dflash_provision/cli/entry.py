"""The console script's first module: as small as it can be, so that a Ctrl-C that arrives while
the CLI is still importing (click, the command module) ends like any other Ctrl-C, with
"interrupted" and exit 130, instead of Python's KeyboardInterrupt traceback.
"""

from __future__ import annotations

import sys

INTERRUPTED_EXIT = 130  # the shell's 128 + SIGINT, as cli.main uses for a Ctrl-C during a command


def main() -> None:
    """Import the CLI and run it; a Ctrl-C during the import is reported like one during a run."""
    try:
        from dflash_provision.cli.main import main as run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(INTERRUPTED_EXIT)
    run()
