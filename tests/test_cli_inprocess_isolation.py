"""``run_cli_in_process`` keeps each run to itself as a process of its own would: what one
command changes in the interpreter (environment, working directory, loggers, signal handlers,
umask, the history store, threads) does not reach the test or the next run, and what it
writes, including raw bytes, and how it ends reach the test as a subprocess's would.

Each case adds a hidden command that makes the change, runs it in-process, then looks.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest

from dflash_provision.cli import main as cli_main
from dflash_provision.cli.main import LazyGroup
from dflash_provision.errors import ExitCode
from tests.fixtures import cli as cli_fixture
from tests.fixtures.cli import run_cli_in_process

Body = Callable[[], None]


@pytest.fixture
def command(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Body], None]]:
    """Sets the body of a hidden command ``do-it``."""
    bodies: list[Body] = []

    @click.command("do-it")
    def do_it() -> None:
        bodies[-1]()

    original = LazyGroup.get_command

    def get_command(self: LazyGroup, ctx: click.Context, name: str) -> click.Command | None:
        return do_it if name == "do-it" else original(self, ctx, name)

    monkeypatch.setattr(LazyGroup, "get_command", get_command)
    yield bodies.append


def test_the_environment_is_the_runs_own_and_what_it_sets_is_gone_after(
    command: Callable[[Body], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DFLASH_PROVISION_DEBUG", "1")  # the developer's shell: not passed on
    before = dict(os.environ)

    def body() -> None:
        click.echo(f"{os.environ.get('DFLASH_PROVISION_DEBUG')} {os.environ.get('GIVEN')}")
        os.environ["SET_BY_THE_COMMAND"] = "1"
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

    command(body)
    done = run_cli_in_process("do-it", env={"GIVEN": "yes"})
    assert (done.returncode, done.stdout) == (0, "None yes\n")
    assert dict(os.environ) == before


def test_the_working_directory_is_given_and_put_back_even_if_the_command_moves(
    command: Callable[[Body], None], tmp_path: Path
) -> None:
    here = Path.cwd()

    def body() -> None:
        click.echo(Path.cwd())
        os.chdir("/")

    command(body)
    done = run_cli_in_process("do-it", cwd=tmp_path)
    assert done.stdout == f"{tmp_path}\n"
    assert Path.cwd() == here


def test_loggers_signal_handlers_and_umask_are_put_back(
    command: Callable[[Body], None],
) -> None:
    root, paramiko = logging.getLogger(), logging.getLogger("paramiko")
    handlers = (list(root.handlers), list(paramiko.handlers))
    levels = (root.level, paramiko.level)
    sigterm = signal.getsignal(signal.SIGTERM)
    umask = os.umask(0o022)
    os.umask(umask)

    def body() -> None:
        logging.basicConfig(level=logging.DEBUG, force=True)
        paramiko.addHandler(logging.StreamHandler())
        paramiko.setLevel(logging.DEBUG)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.umask(0o077)

    command(body)
    assert run_cli_in_process("do-it").returncode == 0
    assert (list(root.handlers), list(paramiko.handlers)) == handlers
    assert (root.level, paramiko.level) == levels
    assert signal.getsignal(signal.SIGTERM) is sigterm
    assert os.umask(umask) == umask


def test_text_and_raw_bytes_on_both_streams_arrive_decoded_in_order(
    command: Callable[[Body], None],
) -> None:
    def body() -> None:
        click.echo("ü ", nl=False)
        sys.stdout.flush()
        sys.stdout.buffer.write("é\n".encode())
        click.echo("to stderr", err=True)

    command(body)
    done = run_cli_in_process("do-it")
    assert (done.stdout, done.stderr) == ("ü é\n", "to stderr\n")


def test_an_exception_that_escapes_main_is_exit_1_and_a_traceback_as_python_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(argv: list[str] | None, state: dict[str, object]) -> int:
        raise LookupError("escaped")

    monkeypatch.setattr(cli_main, "_run", broken)
    done = run_cli_in_process("--version")
    assert done.returncode == 1
    assert done.stderr.startswith("Traceback (most recent call last):")
    assert done.stderr.endswith("LookupError: escaped\n")


def test_a_command_that_leaves_a_thread_running_fails_the_run(
    command: Callable[[Body], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_fixture, "THREADS_END_S", 0.2)
    release = threading.Event()
    command(lambda: threading.Thread(target=release.wait, name="left-behind").start())
    try:
        with pytest.raises(AssertionError, match="left threads running: \\['left-behind'\\]"):
            run_cli_in_process("do-it")
    finally:
        release.set()


def test_a_command_shown_alone_after_a_run_has_its_own_help_option() -> None:
    """click keeps on a command the --help option of its first context: after a run as a
    subcommand (the group's ``-h, --help``) the command rendered alone (docs/cli.md) showed
    ``-h`` too, so test_cli_docs failed when it ran after an in-process run."""
    from dflash_provision.cli.validate import command as validate

    assert run_cli_in_process("validate", "--help").returncode == 0
    page = validate.get_help(click.Context(validate, info_name="validate"))
    assert "  --help  " in page and "-h, --help" not in page


def test_each_run_opens_its_own_history_store(tmp_path: Path) -> None:
    """A history that failed in one run is not reported by the next (as a new process's)."""
    (tmp_path / "a-file").write_text("")
    broken = run_cli_in_process("history", home=tmp_path / "a-file")
    assert broken.returncode == ExitCode.LOCAL_WRITE
    assert run_cli_in_process("history", home=tmp_path / "home").returncode == 0
