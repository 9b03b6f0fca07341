"""Entry point. Commands live in sibling modules and are imported only when invoked, so that
``dflash-provision --help`` stays fast and never imports paramiko, transformers or huggingface_hub.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from importlib.util import find_spec
from typing import Any

import click

from dflash_provision import __version__
from dflash_provision.cli._json_document import (
    HeldStdout,
    completed,
    echo_document,
    error_document,
    json_command,
    remember_target,
)
from dflash_provision.errors import DflashProvisionError, ExitCode

# command name -> (module under dflash_provision.cli, one-line help shown by --help)
COMMANDS: dict[str, tuple[str, str]] = {
    "fetch": ("fetch", "Download a drafter's config.json from the Hub, pinned to a commit sha."),
    "validate": ("validate", "Check a config: JSON, schema, DFlash invariants, loader effects."),
    "diff": ("diff", "Semantic diff of two configs (files, dirs, repo ids, remote targets)."),
    "push": ("push", "Write the authoritative config to a target atomically and read it back."),
    "verify": ("verify", "Read a target's config back and compare it, without writing."),
    "rollback": ("rollback", "Restore a target's config from one of its backups."),
    "audit": ("audit", "Check a whole fleet for drift in parallel."),
    "repair": ("repair", "Audit a fleet, then push to every host that drifted."),
    "history": ("history", "Show the local history of pushes, repairs, rollbacks and audits."),
    "launch": ("launch", "Start vLLM with the drafter on a target after a pre-flight, detached."),
    "status": ("status", "Show the vLLM server on a target's port: pid, command, record, health."),
    "stop": ("stop", "Stop the vLLM server launch started on a port (TERM, then KILL)."),
    "logs": ("logs", "Print the last lines of a launched server's log."),
    "runtime-check": (
        "runtime_check",
        "Prove the server runs the provisioned drafter and its drafts are accepted (a-e).",
    ),
    "doctor": ("doctor", "Trace the config pipeline for one target; name the first broken link."),
    "rollout": ("rollout", "Roll a new drafter config across a fleet in gated batches."),
    "init": ("init", "In a pod's init container: the pinned drafter config, validated, written."),
}

DEBUG_ENV = "DFLASH_PROVISION_DEBUG"


class _CtrlC(Exception):
    """A Ctrl-C on its way out of a command, past click (which would print a blank line and
    turn it into Abort): _run says ``interrupted``, as the docs promise."""


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            raise _CtrlC from exc

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, (module, _) in COMMANDS.items() if _module_exists(module)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None or not _module_exists(entry[0]):
            return None
        module = importlib.import_module(f"dflash_provision.cli.{entry[0]}")
        command: click.Command = module.command
        if isinstance(ctx.find_root().obj, dict):  # main's state: the --json error document
            remember_target(command, ctx.find_root().obj)
        if command.epilog is None:  # the forms and exit codes, from one table (cli/_help.py)
            from dflash_provision.cli._help import epilog

            command.epilog = epilog(cmd_name)
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            import difflib  # only for a mistyped command

            typed = args[0] if args else ""
            close = difflib.get_close_matches(typed, self.list_commands(ctx), n=1, cutoff=0.6)
            if not close or typed.startswith("-"):
                raise
            raise click.UsageError(
                f"No such command {typed!r}. Did you mean {close[0]!r}?", ctx
            ) from exc

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help text comes from the table above so --help imports no command module.
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _module_exists(module: str) -> bool:
    return find_spec(f"dflash_provision.cli.{module}") is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="dflash-provision")
@click.option(
    "--debug",
    is_flag=True,
    envvar=DEBUG_ENV,
    help=f"Show full tracebacks for errors (also {DEBUG_ENV}=1).",
)
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Make a DFlash drafter's config.json exactly right on every inference host, and prove it."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def main(argv: list[str] | None = None) -> None:
    """Run the CLI, turning expected errors into one line on stderr and a documented exit code."""
    # The group's callback records --debug here; the errors below are caught after its context
    # has ended, so this dict is how the flag reaches them.
    state: dict[str, Any] = {"debug": os.environ.get(DEBUG_ENV, "") not in ("", "0")}
    try:
        code = _run(argv, state)
    except (KeyboardInterrupt, Exception) as exc:
        # A Ctrl-C outside the command's own handlers (finding the --json command imports its
        # module first: the soak caught a traceback there) ends as any other Ctrl-C.
        if not (isinstance(exc, KeyboardInterrupt) or _wraps_ctrl_c(exc)):
            raise
        click.echo("interrupted", err=True)
        code = int(ExitCode.INTERRUPTED)
    sys.exit(code)


def _run(argv: list[str] | None, state: dict[str, Any]) -> int:
    """The exit code; every error has printed its one line by then (and, for a command given
    --json, its JSON document is on stdout, with that code: cli/_json_document.py)."""
    args = list(sys.argv[1:] if argv is None else argv)
    json_for = json_command(cli, args)
    if json_for is None:
        return _after_run(_run_command(args, state))
    held = HeldStdout(sys.stdout)
    sys.stdout = held  # released, completed, when the command ends
    try:
        code = _after_run(_run_command(args, state))
    finally:
        sys.stdout = held.stream
    printed = held.text()
    failure = state.get("failure")
    if printed.strip():
        click.echo(completed(printed, code), nl=False)
    elif failure is not None:
        exc, line = failure
        echo_document(error_document(json_for, state, exc, code, line))
    return code


def _run_command(argv: list[str], state: dict[str, Any]) -> int:
    def debug() -> bool:
        return bool(state["debug"])

    def failed(exc: BaseException | None, line: str, code: int) -> int:
        click.echo(line, err=True)
        state["failure"] = (exc, line)
        return code

    try:
        rv = cli.main(args=argv, standalone_mode=False, obj=state)
    except DflashProvisionError as exc:
        if debug():
            traceback.print_exc()
        return failed(exc, f"error: {exc.message}", int(exc.exit_code))
    except _CtrlC:
        return failed(None, "interrupted", int(ExitCode.INTERRUPTED))
    except click.exceptions.Abort as exc:
        if debug():  # click turns an EOFError or Ctrl-C into Abort: show what it was
            traceback.print_exc()
        ctrl_c = isinstance(exc.__cause__, KeyboardInterrupt)
        return failed(None, "interrupted" if ctrl_c else "aborted", int(ExitCode.INTERRUPTED))
    except click.ClickException as exc:
        exc.show()
        state["failure"] = (exc, f"error: {exc.format_message()}")
        return int(ExitCode.USAGE if isinstance(exc, click.UsageError) else exc.exit_code)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except KeyboardInterrupt:
        return failed(None, "interrupted", int(ExitCode.INTERRUPTED))
    except Exception as exc:  # the last net: a bug still ends in one line
        if debug():
            traceback.print_exc()
        if _wraps_ctrl_c(exc):
            return failed(None, "interrupted", int(ExitCode.INTERRUPTED))
        return failed(exc, unexpected_error_line(exc, traceback_shown=debug()), int(ExitCode.ERROR))
    return int(rv) if isinstance(rv, int) else 0


def _wraps_ctrl_c(exc: BaseException) -> bool:
    """A Ctrl-C that Python wrapped in another exception on its way out: one that lands while a
    lazily imported module defines a class comes out as "RuntimeError: Error calling
    __set_name__ ..." with the KeyboardInterrupt as its cause. It is an interrupt, not a bug."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _after_run(code: int) -> int:
    """Say so when the history could not record this run (the command's own outcome was already
    reported); exit 9 unless the command has more urgent news (any other non-zero code)."""
    # not imported: nothing was recorded
    history = sys.modules.get("dflash_provision.history.store")
    problem = history.default_store_problem() if history is not None else None
    if problem is None:
        return code
    click.echo(f"error: not recorded in the history: {problem}", err=True)
    return code or int(ExitCode.LOCAL_WRITE)


def unexpected_error_line(exc: BaseException, *, traceback_shown: bool) -> str:
    """One line for an exception nobody expected (a bug): what it was, and how to see more."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    what = type(exc).__name__ + (f": {lines[0][:300]}" if lines else "")
    hint = "" if traceback_shown else f"; run with --debug (or {DEBUG_ENV}=1) for the traceback"
    return f"error: unexpected {what} (a bug in dflash-provision){hint}"


if __name__ == "__main__":
    main()
