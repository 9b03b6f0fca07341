"""push --all-files: the pinned files of a drafter directory made right on one target.

Checked where they lie first (host_state/pinned_check.py); each file missing, of another size or
other bytes, or a link out of the directory, is placed from the controller's Hub cache
(remote/place_files.py); then every file is checked again, and that check is the proof. Strays
(files vLLM would load that the commit does not have) are named, never deleted: removing a
file from another user's directory is the user's call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import ExitCode
from dflash_provision.history.store import journal
from dflash_provision.host_state.files_status import FilesJudgement, FilesStatus, FileVerdict
from dflash_provision.host_state.pinned_check import check_pinned_files
from dflash_provision.remote.place_files import place_file
from dflash_provision.source.pinned_files import SHA256

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from dflash_provision.history.host_key import HostKey
    from dflash_provision.history.store import HistoryStore, Recording
    from dflash_provision.host_state.files_status import FileJudgement
    from dflash_provision.remote.place_files import Placed, Progress
    from dflash_provision.source.pinned_files import PinnedFile
    from dflash_provision.transport.base import Transport

#: What placing a file fixes. A directory or FIFO under the name is not replaced (not ours to
#: remove), config.json is push's own (its write protocol, backups and read-back).
PLACEABLE = frozenset(
    {
        FileVerdict.MISSING,
        FileVerdict.WRONG_SIZE,
        FileVerdict.WRONG_BYTES,
        FileVerdict.SYMLINK_OUTSIDE,
    }
)


@dataclass
class FilesPush:
    before: FilesJudgement
    after: FilesJudgement
    placed: list[Placed] = field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        """0 when the directory is the commit's; 4 when only strays are left (named, not
        removed); 7 when a placed file is not proved or another file is still wrong."""
        if self.after.status is FilesStatus.IN_SYNC:
            return ExitCode.OK
        left = {f.verdict for f in self.after.problems}
        return ExitCode.DRIFT if left == {FileVerdict.STRAY} else ExitCode.REMOTE_FAILED

    def to_dict(self) -> dict[str, Any]:
        return {
            "before": self.before.to_dict(),
            "placed": [
                {
                    "path": p.name,
                    "size": p.size,
                    "resumed_at": p.resumed_at,
                    "sent": p.sent,
                    "mode": p.mode,
                    "mode_from": p.mode_from,
                }
                for p in self.placed
            ],
            "after": self.after.to_dict(),
            "exit_code": int(self.exit_code),
        }


def push_files(
    transport: Transport,
    model_dir: str,
    pinned: list[PinnedFile],
    *,
    host: HostKey,
    history: HistoryStore | None,
    source_for: Callable[[PinnedFile], Path],
    progress: Progress | None = None,
    dry_run: bool = False,
) -> FilesPush:
    """Check, place what is wrong, check again (the proof). ``source_for``: the controller's
    copy of a pinned file (remote.place_files.cached_copy; a fleet shares one per file).
    ``dry_run``: check only."""
    before = check_pinned_files(transport, model_dir, pinned, host=host, history=history)
    by_name = {p.path: p for p in pinned}
    wanted = [
        by_name[f.name]
        for f in before.files
        if f.verdict in PLACEABLE and f.name in by_name and f.name != "config.json"
    ]
    if dry_run:
        return FilesPush(before, before, [])
    placed = []
    before_of = {f.name: f for f in before.files}
    for item in wanted:
        source = source_for(item)
        with _journal(history, host, model_dir, item, before_of[item.path]) as recording:
            done = place_file(transport, model_dir, item, source, progress=progress)
            recording.sha256_after = item.digest if item.algorithm == SHA256 else None
            recording.message = _placed_message(done, item)
        placed.append(done)
    if not placed:
        return FilesPush(before, before, [])
    after = check_pinned_files(transport, model_dir, pinned, host=host, history=history)
    return FilesPush(before, after, placed)


def _journal(
    history: HistoryStore | None,
    host: HostKey,
    model_dir: str,
    item: PinnedFile,
    before: FileJudgement,
) -> AbstractContextManager[Recording]:
    """One ``place`` row per placed file in the history, "started" before its first byte is
    sent (an interrupted placement stays visible, as an interrupted push does): the sha256
    found there before when the host computed one, the pinned one after (a git blob id is
    named in the message instead: the row's columns are sha256s)."""
    found = (
        before.digest if item.algorithm == SHA256 and before.verdict.value != "missing" else None
    )
    path = f"{model_dir.rstrip('/')}/{item.path}"
    return journal(history, "place", host, path, sha256_before=found)


def _placed_message(done: Placed, item: PinnedFile) -> str:
    resumed = f", resumed at {done.resumed_at} bytes" if done.resumed_at else ""
    mode = (
        f", mode {done.mode} ({_MODE_FROM.get(done.mode_from, done.mode_from)})"
        if done.mode
        else ""
    )
    pin = "" if item.algorithm == SHA256 else f", git blob id {item.digest}"
    return (
        f"placed {item.path} of {item.repo_id}@{item.commit_sha[:12]}: {done.size} bytes, "
        f"{done.sent} sent{resumed}{mode}{pin}; hash proved on the host"
    )


_MODE_FROM = {
    "replaced": "the replaced file's",
    "config.json": "config.json's",
    "default": "no file to take it from",
}
