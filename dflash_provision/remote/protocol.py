"""The one protocol of the remote scripts: loading their text, the argv that runs one, and the
parse of what it answers. ``remote/ops.py`` (read, write, backups), ``remote/settle.py``,
``remote/weights_read.py``, ``server/process.py`` and ``server/bounded.py`` all run their
scripts through this module; none has a loader or parser of its own.

Each operation is ONE exec: ``sh -c SCRIPT dflash-NAME ARG...``. The script text is a constant
read from a ``scripts/*.sh`` folder with ``remote/scripts/common.sh`` prepended; every variable
part (paths, sizes, hashes) is a positional argument, so a path holding spaces, quotes,
``$(...)``, ``;`` is only ever data.

Output: a first line ``dflash-NAME 1``, then ``key value`` lines, then optionally a line
``data`` followed by raw bytes up to EOF. Lines are parsed until ``data``, so the bytes may
hold anything. A script that sends more than one file (write.sh: the read-back and the old
file) frames them: a line ``part NAME LENGTH`` for each before ``data``, the bytes in that
order, nothing after them; :func:`reply_parts` takes them apart strictly.

Timeouts: a caller passes none and gets the transport's ``command_timeout`` (the CLI's
``--command-timeout``), which also bounds the host side (each script's watchdog, or
server/bounded.py around it); no module here has a number of seconds of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from dflash_provision.errors import RemoteStepFailed
from dflash_provision.transport.base import CommandResult, Transport

_PACKAGE = Path(__file__).resolve().parent.parent
#: The scripts' folders: the file protocol's and the server's (files beside the modules: the
#: wheel installs them as files, and importlib.resources would cost every command a few
#: milliseconds of imports for the same read).
REMOTE_SCRIPTS = _PACKAGE / "remote" / "scripts"
RUNTIME_SCRIPTS = _PACKAGE / "server" / "scripts"

#: What a script needs besides common.sh, read before it: the push's own directory and its
#: trust test for every script that works in it, and the push's lock for the write and for the
#: settle step that must wait for an interrupted write; the runtime helpers for every runtime
#: script; the symlink-stays-inside test for the two scripts that read a drafter's files.
_FRAGMENTS = {
    "write": ("own_dir", "lock"),
    "settle": ("own_dir", "lock"),
    "place": ("own_dir", "lock"),
    "backups": ("own_dir",),
    "files": ("inside",),
    "weights": ("inside",),
}


class RemoteProtocolError(RemoteStepFailed):
    """The remote side answered with something that is not our protocol (e.g. a killed shell)."""


@cache
def script_text(name: str) -> str:
    """The full text run for script ``name``: common.sh, its fragments, then it; a runtime
    script ("state", "start", "stop", "bounded"...) gets runtime.sh before it. The two folders
    hold no name twice, so the file found says which kind it is."""
    if (REMOTE_SCRIPTS / f"{name}.sh").is_file():
        files = [REMOTE_SCRIPTS / f"{part}.sh" for part in (*_FRAGMENTS.get(name, ()), name)]
    else:
        files = [RUNTIME_SCRIPTS / "runtime.sh", RUNTIME_SCRIPTS / f"{name}.sh"]
    parts = [REMOTE_SCRIPTS / "common.sh", *files]
    return without_comments("\n".join(p.read_text(encoding="utf-8") for p in parts))


def without_comments(text: str) -> str:
    """The script without its comment-only and blank lines: the text travels with every exec
    (and the login shell and sh parse it each time); the comments are for people reading the
    .sh files. The scripts have no here-documents or multi-line strings with such lines."""
    kept = [
        line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]
    return "\n".join(kept) + "\n"


def script_argv(name: str, *args: str, shell: str = "sh") -> list[str]:
    """argv that runs script ``name`` with ``args`` as $1.. (``$0`` is ``dflash-NAME``)."""
    return [shell, "-c", script_text(name), f"dflash-{name}", *args]


@dataclass
class Reply:
    """A script's answer: its ``key value`` fields (the last of a key), every line, and the
    bytes after ``data`` (None when no ``data`` line arrived)."""

    fields: dict[str, str] = field(default_factory=dict)
    data: bytes | None = None
    lines: list[str] = field(default_factory=list)


def parse_reply(stdout: bytes, name: str) -> Reply:
    """The answer of script ``name``; an empty Reply when the first line is not its own (a
    shell that died, a login banner on stdout)."""
    parsed = Reply()
    rest = stdout
    first = True
    while rest:
        line, sep, tail = rest.partition(b"\n")
        if not sep:  # a partial last line: the output was cut off
            break
        text = line.decode("utf-8", errors="replace")
        rest = tail
        if first:
            first = False
            if text != f"dflash-{name} 1":
                break
            continue
        if text == "data":
            parsed.data = rest
            return parsed
        parsed.lines.append(text)
        key, _, value = text.partition(" ")
        parsed.fields[key] = value
    return parsed


class MalformedReply(ValueError):
    """A script's framed parts that do not add up: the reply was cut off, or is not what the
    script sends. The message says which, in words for a user."""


def reply_parts(reply: Reply, names: tuple[str, ...], *, limit: int) -> dict[str, bytes]:
    """The bytes after ``data`` as the parts its ``part NAME LENGTH`` lines declare (each of
    ``names`` at most once, in that order, at most ``limit`` bytes), exactly: no part split by
    guessing, no byte left over. Raises MalformedReply for anything else."""
    declared: list[tuple[str, int]] = []
    for line in reply.lines:
        if not line.startswith("part "):
            continue
        words = line.split(" ")
        digits = words[2] if len(words) == 3 else ""
        if not (digits.isascii() and digits.isdigit()) or (len(digits) > 1 and digits[0] == "0"):
            raise MalformedReply(f"a part header that does not parse: {line[:80]!r}")
        name, length = words[1], int(words[2])
        if name not in names or any(name == seen for seen, _ in declared):
            raise MalformedReply(f"an unexpected or repeated part {name[:40]!r}")
        if declared and names.index(name) < names.index(declared[-1][0]):
            raise MalformedReply(f"part {name!r} out of order")
        if length > limit:
            raise MalformedReply(f"part {name!r} declares {length} bytes, over the {limit} limit")
        declared.append((name, length))
    if reply.data is None:
        raise MalformedReply("cut off before its bytes")
    total = sum(length for _, length in declared)
    if len(reply.data) < total:
        raise MalformedReply(f"cut off: {len(reply.data)} of the {total} bytes its parts declare")
    if len(reply.data) > total:
        extra = len(reply.data) - total
        raise MalformedReply(f"{extra} byte(s) more than its parts declare ({total})")
    parts: dict[str, bytes] = {}
    offset = 0
    for name, length in declared:
        parts[name] = reply.data[offset : offset + length]
        offset += length
    return parts


def run_script(
    transport: Transport,
    name: str,
    args: list[str],
    *,
    stdin: bytes | None = None,
    timeout: float | None = None,
) -> tuple[CommandResult, Reply]:
    """Run script ``name`` once; the command's result and its parsed answer. ``timeout`` None:
    the transport's command_timeout."""
    result = transport.run(script_argv(name, *args), stdin=stdin, timeout=timeout)
    return result, parse_reply(result.stdout, name)


def stderr_line(result: CommandResult) -> str:
    """The last line the command wrote to stderr, else its exit status: for one-line errors."""
    text = result.stderr.decode("utf-8", errors="replace").strip()
    return text.splitlines()[-1] if text else f"exit status {result.exit_status}"
