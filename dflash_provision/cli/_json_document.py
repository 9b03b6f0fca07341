"""``--json``: one JSON document on stdout for every outcome, with its status and exit code.

A command given ``--json`` prints its document itself when it gets a result; ``main`` holds
stdout until the command ends and adds ``exit_code`` (and ``status``, the exit code's name, where
the document has no status of its own) to it. When the command ends in an exception instead (the
host unreachable, a login refused, a usage error, a Hub failure, a Ctrl-C), ``main`` prints a
document of its own, so ``verify ... --json | jq .status`` always has one to read: the command,
its target when known, the status (the fleet report's word for a host that could not be reached
or logged in to, as ``audit --json`` says it; else the exit code's name), the exit code and the
error line. The ``error:`` line still goes to stderr for a human.
"""

from __future__ import annotations

import json
from typing import IO, Any

import click

from dflash_provision.errors import (
    ConnectionFailure,
    ContainerError,
    DflashProvisionError,
    ExitCode,
    RemoteStepFailed,
)

JSON_FLAG = "--json"
_GLOBAL_FLAGS = ("--debug",)  # the group's own options, before the command name
# The parameters that name what a command reads: TARGET, [TARGET]..., validate's SOURCE (diff
# has two SOURCEs: it names the one it is reading itself, with name_target).
_TARGET_PARAMS = ("target_spec", "targets", "source")


def json_command(group: click.Group, argv: list[str]) -> str | None:
    """The command ``argv`` runs, when the user asked it for ``--json`` and it has that flag.

    Read from the arguments as typed, so a usage error found while parsing them still gets its
    document."""
    words = list(argv)
    while words and words[0] in _GLOBAL_FLAGS:
        words.pop(0)
    if not words or words[0].startswith("-"):
        return None
    name, rest = words[0], words[1:]
    if JSON_FLAG not in (rest[: rest.index("--")] if "--" in rest else rest):
        return None
    try:
        command = group.get_command(click.Context(group), name)
    except Exception:  # a command that cannot even be loaded: no document to promise
        return None
    if command is None:
        return None
    has_flag = any(JSON_FLAG in getattr(p, "opts", ()) for p in command.params)
    return name if has_flag else None


def name_target(ctx: click.Context, spec: str) -> None:
    """What the error document's ``target`` names from now on: what the command was given and
    is reading (``diff`` names the SOURCE it was loading or parsing when it failed)."""
    root = ctx.find_root().obj
    if isinstance(root, dict):
        root["target"] = spec


def remember_target(command: click.Command, state: dict[str, Any]) -> None:
    """Keep the command's TARGET (validate: its SOURCE) in ``state`` as it is parsed, for the
    document (a parse that fails before it leaves the target unknown: null)."""
    for param in command.params:
        # TARGET, or the fleet commands' [TARGET]... when it is one (their single form).
        if param.name not in _TARGET_PARAMS or getattr(param, "_remembers", False):
            continue
        original = param.callback

        def keep(ctx: click.Context, p: click.Parameter, value: Any, _cb: Any = original) -> Any:
            one = value[0] if isinstance(value, tuple) and len(value) == 1 else value
            if isinstance(one, str):
                name_target(ctx, one)
            return _cb(ctx, p, value) if _cb is not None else value

        param.callback = keep
        param._remembers = True  # type: ignore[attr-defined]  # wrapped once per process


def status_word(exc: BaseException | None, code: int) -> str:
    """What the document's ``status`` says: audit's word for a host it could not read (so a
    script handles one vocabulary), else the exit code's name (``usage``, ``invalid``,
    ``hub_unreachable``, ``interrupted``...)."""
    if isinstance(exc, ConnectionFailure | ContainerError | RemoteStepFailed):
        from dflash_provision.fleet.classify import classify_exception

        status, _ = classify_exception(exc)
        if status.value != "error":
            return status.value
    try:
        return ExitCode(code).name.lower()
    except ValueError:
        return "error"


def error_document(
    command: str, state: dict[str, Any], exc: BaseException | None, code: int, line: str
) -> dict[str, Any]:
    reason = getattr(exc, "reason", None) if isinstance(exc, DflashProvisionError) else None
    return {
        "command": command,
        "target": state.get("target"),
        "status": status_word(exc, code),
        "exit_code": code,
        "error": line.removeprefix("error: ").strip(),
        "reason": reason,
    }


def render_document(doc: Any) -> str:
    """The one layout of every ``--json`` output: indented by two, UTF-8 as it is (no ``\\u``
    escapes), keys in the order the command built them, one newline at the end. Strict JSON: a
    NaN or an infinity is an error here, never ``NaN``/``Infinity`` on stdout (not JSON: ``jq``
    refuses it). A value JSON has no type for (a path, a time) is written as its text."""
    return json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False, default=str) + "\n"


def echo_document(doc: Any) -> None:
    """Print ``doc`` on stdout as a command's ``--json`` document (``render_document``)."""
    click.echo(render_document(doc), nl=False)


def completed(text: str, code: int) -> str:
    """The command's own document with its exit code (and a status when it has none); text that
    is not one JSON object (a list: history; anything else) is passed on as it was."""
    try:
        doc = json.loads(text)
    except ValueError:
        return text
    if not isinstance(doc, dict):
        return text
    doc.setdefault("status", status_word(None, code))
    doc.setdefault("exit_code", code)
    return render_document(doc)


class HeldStdout:
    """sys.stdout for a --json run: what the command writes is held until it ends (its document
    is completed then), and it is no terminal; everything else (encoding, fileno) is the real
    stream's."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.held: list[str] = []

    def write(self, text: str) -> int:
        if not isinstance(text, str):  # a text stream, as click probes with write(b"")
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.held.append(text)
        return len(text)

    def flush(self) -> None:
        """Nothing reaches the real stream before the command ends."""

    def isatty(self) -> bool:
        """Held output is no terminal: no progress bar or colour codes in the document."""
        return False

    def text(self) -> str:
        return "".join(self.held)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)
