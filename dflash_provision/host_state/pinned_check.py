"""``--all-files``: every pinned file of a drafter directory checked where it lies (one exec:
remote/files_read.py), judged by host_state/files_status.py, with the proofs of the history: a file
unchanged since a recorded proof is not hashed again, and new proofs are recorded."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dflash_provision.host_state.files_status import FilesJudgement, FileVerdict, judge_files
from dflash_provision.remote import file_proofs
from dflash_provision.remote.files_read import read_pinned_files

if TYPE_CHECKING:
    from dflash_provision.history.host_key import HostKey
    from dflash_provision.history.store import HistoryStore
    from dflash_provision.source.pinned_files import PinnedFile
    from dflash_provision.transport.base import Transport


def check_pinned_files(
    transport: Transport,
    model_dir: str,
    pinned: list[PinnedFile],
    *,
    host: HostKey,
    history: HistoryStore | None,
    timeout: float | None = None,
    rehash: bool = False,
) -> FilesJudgement:
    """The verdict of ``model_dir``'s files against ``pinned`` on the transport's machine.
    ``rehash``: every file hashed, whatever proofs the history holds (new ones are recorded)."""
    directory = model_dir.rstrip("/") or "/"
    proofs = (
        file_proofs.latest_proofs(history, host, directory, pinned)
        if history is not None and not rehash
        else {}
    )
    read = read_pinned_files(
        transport,
        directory,
        pinned,
        {name: proof.identity for name, proof in proofs.items()},
        timeout=timeout,
    )
    judgement = judge_files(
        pinned, read, {name: proof.recorded_at for name, proof in proofs.items()}
    )
    if history is not None:
        by_name = {p.path: p for p in pinned}
        proved = [
            (by_name[f.name], read.facts[f.name])
            for f in judgement.files
            if f.verdict is FileVerdict.PROVED and f.name in read.facts
        ]
        file_proofs.record_proofs(history, host, directory, proved)
    return judgement
