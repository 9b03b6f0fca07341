"""The console script's first module: as small as it can be, so that a Ctrl-C that arrives while
the CLI is still importing (click, the command module) ends like any other Ctrl-C, with
"interrupted" and exit 130, instead of Python's KeyboardInterrupt traceback.

It also spares a short command the garbage collector's work on what it imported (a fifth of the
CPU of a second ``push``): the modules, classes and functions loaded at start-up live until the
process ends, so collecting while importing finds nothing, and neither does the interpreter's
last collection at exit, which walks every one of them. ``gc.freeze()`` moves them out of every
collection's sight; objects made later are collected as usual.
"""

from __future__ import annotations

#: errors.ExitCode.INTERRUPTED (tests/test_interrupt_at_start.py checks they agree). Nothing is
#: imported at module level: a Ctrl-C during an import here, outside main()'s try (errors.py,
#: even gc on a loaded machine: the soak saw it), ended with Python's traceback.
_INTERRUPTED = 130


def main() -> None:
    """Import the CLI and run it; a Ctrl-C during the import is reported like one during a run."""
    try:
        import gc

        gc.disable()
        try:
            from dflash_provision.cli.main import main as run
        finally:
            gc.freeze()
            gc.enable()
    except KeyboardInterrupt:
        import sys  # always loaded already: the interpreter's own

        sys.stderr.write("interrupted\n")
        sys.exit(_INTERRUPTED)
    try:
        run()
    except SystemExit as done:
        _end_now_if_abandoned(done.code)
        raise
    finally:
        gc.freeze()  # the process is ending: nothing left is worth a last walk


def _end_now_if_abandoned(code: object) -> None:
    """After a Ctrl-C that abandoned hosts in flight (a fleet command's second Ctrl-C), their
    threads would hold the process, and the prompt, until their own timeouts end (a host hung
    at the SSH banner: the whole --connect-timeout), and a third Ctrl-C would print Python's
    traceback from the interpreter's exit. What was done is printed and recorded by now (the
    history commits every row): end the process at once."""
    import contextlib
    import os
    import sys
    import threading

    if code != _INTERRUPTED:
        return
    others = [t for t in threading.enumerate() if t is not threading.main_thread()]
    if not any(t.is_alive() and not t.daemon for t in others):
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(_INTERRUPTED)
