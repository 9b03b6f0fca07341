"""Check every pinned file of a drafter directory where it lies, in one exec (scripts/files.sh):
what the host holds under each pinned name (its identity, and its hash computed there with
``sha256sum`` / ``sha1sum``), and which names vLLM could read that the lock does not pin.

Only these facts travel, never a file's bytes. What they mean against the lock is judged by
host_state/files_status.py. The reply is untrusted: every line is checked before it is used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dflash_provision.remote.ops import remote_deadline
from dflash_provision.remote.protocol import RemoteProtocolError, script_argv, stderr_line
from dflash_provision.source.pinned_files import ALGORITHMS, PinnedFile
from dflash_provision.transport.base import Transport

MAX_PRESENT = 1000  # top-level names reported; a drafter directory has a handful
MAX_REPLY_BYTES = 1 << 20
_IDENT = re.compile(r"^\d+:\d+:\d+:\d+:\d+$")
_STATES = frozenset(
    {
        "missing",
        "symlink-outside",
        "not-regular",
        "unreadable",
        "size",
        "same",
        "hashed",
        "changed",
        "hash-failed",
        "timeout",
    }
)


@dataclass(frozen=True)
class FileFacts:
    """What the host said of one pinned name. ``identity``: DEV:INO:SIZE:MTIME:CTIME; ``clock``:
    the host's clock when the hash began (a proof is kept only for a file older than that)."""

    name: str
    state: str
    size: int | None = None
    identity: str | None = None
    clock: int | None = None
    digest: str | None = None

    @property
    def ctime(self) -> int | None:
        return int(self.identity.rsplit(":", 1)[1]) if self.identity else None

    @property
    def mtime(self) -> int | None:
        return int(self.identity.split(":")[3]) if self.identity else None


@dataclass
class FilesRead:
    """The answer for one directory. ``dir_state``: ok, missing, permission-denied,
    not-a-directory. ``cut_off``: the script did not finish (its deadline), and ``hashing`` the
    file it was hashing then."""

    where: str
    dir_state: str = "ok"
    facts: dict[str, FileFacts] = field(default_factory=dict)
    present: list[str] = field(default_factory=list)
    too_many_present: bool = False
    odd_present: int = 0  # names vLLM could read that hold a line break (cannot be sent)
    cut_off: bool = False
    hashing: str | None = None


def read_pinned_files(
    transport: Transport,
    model_dir: str,
    pinned: list[PinnedFile],
    trusted: dict[str, str] | None = None,
    *,
    timeout: float | None = None,
) -> FilesRead:
    """Check ``pinned`` in ``model_dir`` on the transport's machine. ``trusted``: name -> the
    identity a recorded proof hashed (such a file, unchanged, is not hashed again)."""
    directory = model_dir.rstrip("/") or "/"
    limit = transport.command_timeout if timeout is None else timeout
    trusted = trusted or {}
    stdin = "".join(
        f"{p.size} {p.algorithm} {trusted.get(p.path, '-')} {p.path}\n" for p in pinned
    ).encode("utf-8")
    argv = script_argv("files", directory, str(remote_deadline(limit)), str(MAX_PRESENT))
    result = transport.run(argv, stdin=stdin, timeout=timeout)
    where = f"{transport.description}:{directory}"
    lines = result.stdout[:MAX_REPLY_BYTES].decode("utf-8", errors="replace").split("\n")
    if not lines or lines[0] != "dflash-files 1":
        raise RemoteProtocolError(
            f"{transport.description}: checking the pinned files in {directory} failed: "
            f"{stderr_line(result)}",
            step="read",
        )
    return _parse(where, lines[1:], {p.path for p in pinned})


def _parse(where: str, lines: list[str], names: set[str]) -> FilesRead:
    read = FilesRead(where, cut_off=True)
    for line in lines:
        key, _, rest = line.partition(" ")
        if key == "dir":
            read.dir_state = rest
        elif key == "hashing" and rest in names:
            read.hashing = rest
        elif key == "f":
            facts = _facts(rest, names)
            if facts is None:
                raise RemoteProtocolError(f"{where}: unexpected line {line[:80]!r}", step="read")
            read.facts[facts.name] = facts
            if read.hashing == facts.name:
                read.hashing = None
        elif key == "present" and rest and len(read.present) < MAX_PRESENT:
            read.present.append(rest)
        elif key == "present-odd":
            read.odd_present += 1
        elif key == "too-many-present":
            read.too_many_present = True
        elif key == "done":
            read.cut_off = False
    return read


def _facts(rest: str, names: set[str]) -> FileFacts | None:
    parts = rest.split(" ", 5)
    if len(parts) != 6:
        return None
    state, size, identity, clock, digest, name = parts
    if state not in _STATES or name not in names:
        return None
    if (size != "-" and not size.isdigit()) or (clock != "-" and not clock.isdigit()):
        return None
    if identity != "-" and not _IDENT.match(identity):
        return None
    if digest != "-" and not (
        len(digest) in ALGORITHMS.values() and all(c in "0123456789abcdef" for c in digest)
    ):
        return None
    return FileFacts(
        name=name,
        state=state,
        size=int(size) if size != "-" else None,
        identity=identity if identity != "-" else None,
        clock=int(clock) if clock != "-" else None,
        digest=digest if digest != "-" else None,
    )
