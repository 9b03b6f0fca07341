"""The CLI layer on its own, in-process (tests.fixtures.cli.run_cli(..., in_process=True)): how
every command parses bad flags (exit 2 and click's message), how each error class maps to its
documented exit code and one ``error:`` line, ``--debug``, and the mistyped-command hint.

No host, no network, no history write: each case runs the real ``main()`` in milliseconds. The
subprocess tests (test_cli_basics, test_cli_flags, test_exit_codes_and_messages) keep proving
the same through the real entry point; the parity test below checks both modes agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest

from dflash_provision.cli.main import COMMANDS, DEBUG_ENV, LazyGroup
from dflash_provision.errors import (
    AuthError,
    ConfigInvalid,
    ContainerError,
    DflashProvisionError,
    DriftFound,
    ExitCode,
    HubError,
    LocalWriteFailed,
    RemoteStepFailed,
    RuntimeFailure,
    UnreachableError,
    UsageError,
)
from testbed import samples
from tests.fixtures.cli import Cli, Done, run_cli, run_cli_in_process, the_error_line

EXIT_CODES_DOC = Path(__file__).resolve().parent.parent / "docs" / "exit-codes.md"
REF = str(samples.REFERENCE_DRAFTER)


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    """This module's runner: in-process, working in tmp_path, history under tmp_path/home."""
    return Cli(tmp_path, in_process=True)


def click_error(done: Done) -> str:
    """Assert a usage error (exit 2) and return click's ``Error: ...`` line."""
    assert done.returncode == ExitCode.USAGE, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, done.stderr
    assert done.stdout == ""
    return errors[0]


# -- parsing: every command ----------------------------------------------------------------------


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_refuses_an_unknown_option_with_exit_2(cli: Cli, command: str) -> None:
    line = click_error(cli.run(command, "--no-such-flag"))
    assert line == "Error: No such option '--no-such-flag'."


# The positional argument each command cannot do without (fleet commands take none or many).
REQUIRED_ARGUMENT = {
    "fetch": "REPO_ID",
    "validate": "SOURCE",
    "diff": "A",
    "push": "TARGET",
    "verify": "TARGET",
    "rollback": "TARGET",
    "launch": "TARGET",
    "status": "TARGET",
    "stop": "TARGET",
    "logs": "TARGET",
    "doctor": "TARGET",
}


@pytest.mark.parametrize("command", sorted(REQUIRED_ARGUMENT))
def test_a_missing_argument_is_named(cli: Cli, command: str) -> None:
    line = click_error(cli.run(command))
    assert line.startswith(f"Error: Missing argument '{REQUIRED_ARGUMENT[command]}'.")


def test_diff_names_its_second_source_when_only_one_is_given(cli: Cli) -> None:
    assert click_error(cli.run("diff", "a.json")) == "Error: Missing argument 'B'."


# One out-of-range or mistyped value per command, in the option that command owns.
BAD_VALUES = [
    ("fetch", ["o/n", "--timeout", "0"], "'--timeout': 0.0 is not in the range x>=0.1."),
    ("validate", [REF, "--num-speculative-tokens", "0"], "0 is not in the range x>=1."),
    ("diff", ["a", "b", "--connect-timeout", "abc"], "'abc' is not a valid float range."),
    ("push", ["/m", "--keep-backups", "-1"], "'--keep-backups': -1 is not in the range x>=0."),
    ("verify", ["/m", "--command-timeout", "0"], "0.0 is not in the range x>=0.1."),
    ("rollback", ["/m", "--keep-backups", "many"], "'many' is not a valid integer range."),
    ("audit", ["--workers", "0"], "'--workers': 0 is not in the range 1<=x<=1024."),
    ("repair", ["--max-failures", "0"], "'--max-failures': 0 is not in the range x>=1."),
    ("history", ["--op", "frob"], "'--op': 'frob' is not one of 'push', 'repair', "),
    ("launch", ["/m", "--port", "70000"], "'--port': 70000 is not in the range 1<=x<=65535."),
    ("status", ["/m", "--port", "0"], "'--port': 0 is not in the range 1<=x<=65535."),
    ("stop", ["/m", "--timeout", "-1"], "'--timeout': -1.0 is not in the range x>=0."),
    ("rollout", ["/m", "--min-acceptance", "2"], "'--min-acceptance': 2.0 is not in the range"),
    ("logs", ["/m", "--last", "0"], "'--last' / '-n': 0 is not in the range 1<=x<=100000."),
    ("runtime-check", ["--min-acceptance", "2"], "2.0 is not in the range 0.0<=x<=1.0."),
    ("doctor", ["/m", "--prompts", "65"], "'--prompts': 65 is not in the range 1<=x<=64."),
    (
        "init",
        ["/m", "--target-config", "t", "--keep-backups", "-1"],
        "-1 is not in the range x>=0.",
    ),
]


def test_the_bad_value_table_covers_every_command() -> None:
    assert sorted(command for command, _, _ in BAD_VALUES) == sorted(COMMANDS)


@pytest.mark.parametrize(("command", "args", "message"), BAD_VALUES, ids=lambda v: str(v)[:20])
def test_every_command_refuses_a_bad_value_before_doing_anything(
    cli: Cli, tmp_path: Path, command: str, args: list[str], message: str
) -> None:
    line = click_error(cli.run(command, *args))
    assert line.startswith("Error: Invalid value for ") and message in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, not even history


# Usage errors the commands raise themselves (after click has parsed): one line, exit 2.
CORE_USAGE_ERRORS = [
    (["push", "/m"], "no authoritative config: name one with --repo OWNER/NAME[@REV], --from"),
    (["doctor", "/m"], "no authoritative config: name one with --repo OWNER/NAME[@REV], --from"),
    (["push", "/m", "--from", REF, "--repo", "a/b"], "one authoritative source, not --repo and"),
    (["push", "x", "--from", REF], "target 'x' is neither an absolute path nor host:/path"),
    (["verify", "root@:/m", "--from", REF], "target 'root@:/m': empty host name"),
    (["audit"], "no hosts: give -i INVENTORY or one or more TARGETs"),
    (["repair", "--from", REF], "no hosts: give -i INVENTORY or one or more TARGETs"),
    (["runtime-check"], "no hosts: give -i INVENTORY or one or more TARGETs"),
    (["fetch", "notarepo"], "not a Hub repo id (expected owner/name or owner/name@rev)"),
    (["validate", "nofile.json"], "no such file, directory, Hub repo id (owner/name[@rev])"),
]


@pytest.mark.parametrize(("args", "words"), CORE_USAGE_ERRORS, ids=lambda v: str(v)[:30])
def test_usage_errors_found_by_the_commands_are_one_line_and_exit_2(
    cli: Cli, args: list[str], words: str
) -> None:
    the_error_line(cli.run(*args), ExitCode.USAGE, words)


def test_a_mistyped_command_or_option_names_the_closest_one(cli: Cli) -> None:
    assert click_error(cli.run("pussh", "x")).endswith(
        "No such command 'pussh'. Did you mean 'push'?"
    )
    far = click_error(cli.run("frobnicate"))
    assert far == "Error: No such command 'frobnicate'."
    assert click_error(cli.run("repair", "--dryrun")).endswith(
        "No such option '--dryrun'. Did you mean '--dry-run'?"
    )


def test_help_and_version_exit_0_on_stdout(cli: Cli) -> None:
    top = cli.run("--help")
    assert top.returncode == 0 and top.stderr == ""
    commands = top.stdout.split("Commands:", 1)[1]
    assert re.findall(r"^  (\S+)  ", commands, flags=re.M) == list(COMMANDS)
    version = cli.run("--version")
    assert version.returncode == 0 and version.stdout.startswith("dflash-provision, version ")
    for command in COMMANDS:
        done = cli.run(command, "--help")
        assert done.returncode == 0 and done.stderr == "", command
        assert "--help" in done.stdout


# -- the error -> exit code table ------------------------------------------------------------------


@pytest.fixture
def raising(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[BaseException], None]]:
    """Adds a hidden command ``raise-it`` that raises the exception given to the returned
    setter, so the mapping in cli.main runs on exactly that exception."""
    to_raise: list[BaseException] = []

    @click.command("raise-it")
    def raise_it() -> None:
        raise to_raise[-1]

    original = LazyGroup.get_command

    def get_command(self: LazyGroup, ctx: click.Context, name: str) -> click.Command | None:
        return raise_it if name == "raise-it" else original(self, ctx, name)

    monkeypatch.setattr(LazyGroup, "get_command", get_command)
    yield to_raise.append


E = ExitCode
ERROR_TABLE: list[tuple[DflashProvisionError, ExitCode]] = [
    (UsageError("bad target"), ExitCode.USAGE),
    (ConfigInvalid("schema failed"), ExitCode.INVALID),
    (DriftFound("differs"), ExitCode.DRIFT),
    (UnreachableError("refused", reason="refused"), ExitCode.UNREACHABLE),
    (AuthError("host key changed", reason="host-key-changed"), ExitCode.AUTH),
    (RemoteStepFailed("disk full", step="write"), ExitCode.REMOTE_FAILED),
    # a push cut off whose host could not be asked again (push's result carries the code)
    (
        RemoteStepFailed("outcome unknown", step="settle", exit_code=E.OUTCOME_UNKNOWN),
        ExitCode.OUTCOME_UNKNOWN,
    ),
    (ContainerError("not running"), ExitCode.CONTAINER),
    (LocalWriteFailed("history unwritable"), ExitCode.LOCAL_WRITE),
    # HubError carries the code of the way the Hub failed (10-16).
    *[(HubError(code.name, exit_code=code), code) for code in ExitCode if 10 <= code <= 16],
    (RuntimeFailure("exited"), ExitCode.LAUNCH_FAILED),
    *[
        (RuntimeFailure(code.name, exit_code=code), code)
        for code in (E.NOT_RUNNING, E.PORT_TAKEN, E.VLLM_UNUSABLE)
    ],
    # codes with no class of their own: the base class with the code given
    *[
        (DflashProvisionError(code.name, exit_code=code), code)
        for code in (E.RUNTIME_CHECK_FAILED, E.ACCEPTANCE_LOW, E.INCONCLUSIVE)
    ],
    *[
        (DflashProvisionError(code.name, exit_code=code), code)
        for code in (E.ROLLED_BACK, E.PAUSED, E.ABORTED, E.ROLLBACK_FAILED, E.ROLLOUT_REFUSED)
    ],
    (DflashProvisionError("plain"), ExitCode.ERROR),
]


def test_the_error_table_covers_every_exit_code_and_the_exit_code_page_documents_each() -> None:
    # Ctrl-C (130) is no error class's code: a KeyboardInterrupt or click's Abort (below).
    assert {code for _, code in ERROR_TABLE} == set(ExitCode) - {ExitCode.OK, ExitCode.INTERRUPTED}
    section = EXIT_CODES_DOC.read_text().split("# Exit codes", 1)[1].split("\n## ", 1)[0]
    documented = {int(n) for n in re.findall(r"^\| (\d+) \|", section, flags=re.M)}
    assert documented == {int(code) for code in ExitCode}


@pytest.mark.parametrize(("error", "code"), ERROR_TABLE, ids=lambda v: getattr(v, "name", ""))
def test_each_error_class_exits_with_its_code_and_one_error_line(
    cli: Cli, raising: Callable[[BaseException], None], error: Exception, code: ExitCode
) -> None:
    raising(error)
    done = cli.run("raise-it")
    assert the_error_line(done, code) == f"error: {error}"
    assert done.stdout == ""


def _wrapped_ctrl_c() -> RuntimeError:
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as interrupt:
            raise RuntimeError("Error calling __set_name__ on 'cached_property'") from interrupt
    except RuntimeError as wrapped:
        return wrapped


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        # A Ctrl-C inside a command: "interrupted", as docs/exit-codes.md says (click would
        # turn it into Abort, "aborted", after a blank line: issue 35).
        (KeyboardInterrupt(), 130, "interrupted"),
        (click.exceptions.Abort(), 130, "aborted"),
        (click.UsageError("--a and --b do not go together"), 2, "Error: --a and --b do not"),
        (click.ClickException("click says no"), 1, "Error: click says no"),
        (
            ValueError("oops\nsecond line"),
            1,
            "error: unexpected ValueError: oops (a bug in dflash-provision); run with --debug "
            f"(or {DEBUG_ENV}=1) for the traceback",
        ),
        # A Ctrl-C while a lazily imported module defines a class (seen in the crash stress
        # run: ipaddress's cached_property), wrapped by Python in a RuntimeError.
        (_wrapped_ctrl_c(), 130, "interrupted"),
    ],
    ids=["ctrl-c", "abort", "click-usage", "click-exception", "bug", "wrapped-ctrl-c"],
)
def test_interrupts_click_errors_and_bugs_map_to_their_codes(
    cli: Cli,
    raising: Callable[[BaseException], None],
    error: BaseException,
    code: int,
    line: str,
) -> None:
    raising(error)
    done = cli.run("raise-it")
    assert done.returncode == code
    assert line in done.stderr.splitlines()[-1]
    assert "Traceback" not in done.stderr
    if line == "interrupted":
        assert done.stderr == "interrupted\n"  # one line: no blank line before it


# -- a history that cannot record: exit 9 unless the command has more urgent news -------------


def test_a_history_that_cannot_record_turns_success_into_exit_9_and_says_so(
    cli: Cli, tmp_path: Path
) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_bytes(samples.REFERENCE_DRAFTER.read_bytes())
    (tmp_path / "not-a-dir").write_text("")
    unwritable = {"DFLASH_PROVISION_HOME": str(tmp_path / "not-a-dir")}
    done = cli.run("push", str(tmp_path / "model"), "--from", REF, env=unwritable)
    assert "unchanged: " in done.stdout  # the push itself was done and reported
    line = the_error_line(done, ExitCode.LOCAL_WRITE, "not recorded in the history")
    assert "is not a directory" in line

    # A command that failed keeps its own code; the history line comes after its error line.
    failed = cli.run("rollback", str(tmp_path / "model"), env=unwritable)
    assert failed.returncode == ExitCode.USAGE
    lines = failed.stderr.splitlines()
    assert len(lines) == 2 and "no backups" in lines[0]
    assert lines[1].startswith("error: not recorded in the history: ")


# -- --debug -----------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["flag", "env", "neither", "env=0"])
@pytest.mark.parametrize("error", [UsageError("bad target"), ValueError("a bug")], ids=str)
def test_debug_flag_or_variable_shows_the_traceback_behind_the_error_line(
    cli: Cli, raising: Callable[[BaseException], None], how: str, error: Exception
) -> None:
    raising(error)
    args = ["--debug", "raise-it"] if how == "flag" else ["raise-it"]
    env = {"env": {DEBUG_ENV: "1"}, "env=0": {DEBUG_ENV: "0"}}.get(how, {})
    done = cli.run(*args, env=env)
    shown = how in ("flag", "env")
    assert ("Traceback (most recent call last)" in done.stderr) is shown
    last = done.stderr.splitlines()[-1]
    assert last.startswith("error: ")
    if shown:
        assert f"{type(error).__name__}: {error}" in done.stderr  # the traceback's last line
        assert "run with --debug" not in last  # no hint to do what was done


def test_debug_applies_to_errors_raised_inside_a_real_command(cli: Cli) -> None:
    done = cli.run("--debug", "verify", "--from", REF, "root@:/models/x")
    assert done.returncode == ExitCode.USAGE
    assert "Traceback (most recent call last)" in done.stderr
    assert done.stderr.rstrip().endswith("error: target 'root@:/models/x': empty host name")


# -- the two modes agree -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["push", "/m", "--keep-backups", "-1"],
        ["verify", "root@:/models/x", "--from", REF],
        ["pussh"],
        ["history", "-n", "3"],
    ],
    ids=["click-error", "core-error", "mistyped", "ok"],
)
def test_in_process_and_subprocess_runs_give_the_same_code_and_error(
    tmp_path: Path, args: list[str]
) -> None:
    home = tmp_path / "home"
    inside = run_cli_in_process(*args, cwd=tmp_path, home=home)
    # The installed console script: click names the program "dflash-provision" in both.
    outside = run_cli(*args, cwd=tmp_path, home=home, entry_point=True)
    assert (inside.returncode, inside.stdout, inside.stderr) == (
        outside.returncode,
        outside.stdout,
        outside.stderr,
    )
