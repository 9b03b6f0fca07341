"""The drafter's pinned files where the server will read them, for the runtime commands:
``launch``'s pre-flight, runtime-check's stage a (and ``doctor``, which runs it) and
``rollout``'s pre-flight.

When the authority is a lock that pins the commit's other files (``fetch --all-files``), each
one is checked on the host as ``verify --all-files`` checks it (host_state/pinned_check.py: one exec
of files.sh, judged by host_state/files_status.py): its size always; its hash computed there unless
the history holds a proof of that file's unchanged identity (device, inode, size, mtime, ctime),
or always with ``rehash``. A lock of the config alone (and ``--from``, ``--repo``) pins no other
file: nothing more is checked, as before. What each command makes of the verdict is its row of
files_status.EXIT_CODE; this module only runs the check and words the refusal."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dflash_provision.errors import (
    DflashProvisionError,
    DriftFound,
    ExitCode,
    RemoteStepFailed,
    RuntimeFailure,
)
from dflash_provision.history.host_key import HostKey
from dflash_provision.history.store import default_store
from dflash_provision.host_state.file_status import Command
from dflash_provision.host_state.files_status import FilesStatus, FileVerdict
from dflash_provision.host_state.pinned_check import check_pinned_files

if TYPE_CHECKING:
    from dflash_provision.host_state.files_status import FilesJudgement
    from dflash_provision.source.authority import Authority
    from dflash_provision.target import Target
    from dflash_provision.transport.base import Transport

#: How many wrong files a one-line message names (the rest are counted; --json has them all).
SHOWN = 6


def check_drafter_files(
    transport: Transport,
    target: Target,
    authority: Authority,
    *,
    rehash: bool = False,
    timeout: float | None = None,
) -> FilesJudgement | None:
    """The verdict of the target's drafter directory against the files ``authority`` pins, or
    None when it pins none beyond config.json. Proofs go to (and come from) the history."""
    if not authority.pinned_files:
        return None
    return check_pinned_files(
        transport,
        target.model_dir,
        list(authority.pinned_files),
        host=HostKey.of_target(target),
        history=default_store(),
        timeout=timeout,
        rehash=rehash,
    )


def wrong_files(files: FilesJudgement) -> str:
    """``NAME verdict (detail); ...`` of the files that are not proved, at most SHOWN of them."""
    bad = files.problems
    shown = "; ".join(f"{f.name} {f.verdict.value} ({f.detail})" for f in bad[:SHOWN])
    return shown + (f"; (+{len(bad) - SHOWN} more)" if len(bad) > SHOWN else "")


def all_files_fix(push_fix: str) -> str:
    """The push that places the pinned files (push's own fix line, with --all-files)."""
    return push_fix if "--all-files" in push_fix else f"{push_fix} --all-files"


def evidence(files: FilesJudgement) -> list[str]:
    """Lines for a report: the directory's status, each file not proved, what was relied on."""
    lines = [f"files {files.status.value}: {files.detail}"]
    lines += [f"file {f.name}: {f.verdict.value}: {f.detail}" for f in files.problems]
    relied = files.relied
    if relied:
        lines.append(
            "relied on recorded proofs (unchanged device, inode, size, mtime, ctime; not hashed "
            f"again; --rehash-files hashes them): {', '.join(f.name for f in relied)}"
        )
    return lines


def refusal(files: FilesJudgement, where: str, fix: str) -> DflashProvisionError | None:
    """launch's refusal for a directory whose pinned files are not the lock's (launch's row of
    files_status.EXIT_CODE: 4 wrong, 7 unreadable, 26 cannot tell), or None when they are."""
    code = files.exit_code(Command.LAUNCH)
    if code is ExitCode.OK:
        return None
    named = wrong_files(files)
    if files.status is FilesStatus.DRIFTED:
        strays = [f.name for f in files.problems if f.verdict is FileVerdict.STRAY]
        tail = f"; fix it with: {all_files_fix(fix)}"
        if strays:
            tail += f" (strays are never removed for you: {', '.join(strays)})"
        return DriftFound(
            f"pre-flight: the drafter's files on {where} are not the pinned commit's: "
            f"{named}{tail}",
            exit_code=code,
        )
    if files.status is FilesStatus.PERMISSION_DENIED:
        return RemoteStepFailed(
            f"pre-flight: the drafter's files on {where} cannot be read by this login: {named}",
            step="read",
            exit_code=code,
        )
    return RuntimeFailure(
        f"pre-flight: cannot tell whether the drafter's files on {where} are the pinned "
        f"commit's: {named}; raise --command-timeout (a second check relies on the proofs "
        "of the first)",
        exit_code=code,
    )
