"""``repair --all-files``: after the configs' repair, every host's pinned files made right, at
most ``--workers`` hosts streaming at once; each file is fetched into the controller's Hub cache
and checked against the pin once per run, whatever the number of hosts that need it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import DflashProvisionError, ExitCode
from dflash_provision.fleet.auditing import for_each_host, internal_error
from dflash_provision.fleet.run import FleetRun, Memo
from dflash_provision.history.host_key import HostKey
from dflash_provision.inventory import FleetMember
from dflash_provision.place.push_files import push_files
from dflash_provision.remote.place_files import cached_copy
from dflash_provision.source.pinned_source import pinned_for

if TYPE_CHECKING:
    from dflash_provision.history.store import HistoryStore
    from dflash_provision.place.push_files import FilesPush
    from dflash_provision.source.pinned_files import PinnedFile


@dataclass
class HostFilesRepair:
    name: str
    files: FilesPush | None
    error: str | None = None  # why the files could not be checked or placed
    error_code: ExitCode = ExitCode.OK
    seconds: float = 0.0

    @property
    def exit_code(self) -> ExitCode:
        return self.files.exit_code if self.files is not None else self.error_code

    @property
    def bytes_sent(self) -> int:
        return sum(p.sent for p in self.files.placed) if self.files else 0

    def to_dict(self) -> dict[str, Any]:
        document = self.files.to_dict() if self.files is not None else {}
        return {**document, "error": self.error, "exit_code": int(self.exit_code)}


def repair_all_files(
    members: Sequence[FleetMember],
    run: FleetRun,
    *,
    workers: int,
    dry_run: bool,
    hub_timeout: float,
    progress: Callable[[HostFilesRepair], None] | None = None,
    history: HistoryStore | None = None,
) -> list[HostFilesRepair]:
    """Check and place every member's pinned files, in the members' order."""
    by_source: dict[object, list[PinnedFile]] = {}
    pinned: dict[str, list[PinnedFile]] = {}
    for m in members:
        key = (m.source, run.authority(m).commit_sha)
        if key not in by_source:
            by_source[key] = pinned_for(m.source, run.authority(m))
        pinned[m.name] = by_source[key]
    copies = Memo()

    def source_for(item: PinnedFile) -> Path:
        def fetch() -> Path:
            return cached_copy(item, timeout=hub_timeout)

        copy: Path = copies.get((*item.key, item.commit_sha), fetch)
        return copy

    def one(member: FleetMember) -> HostFilesRepair:
        return _repair_host(run, member, pinned[member.name], source_for, dry_run, history)

    return for_each_host(members, one, workers, "repair-files", progress, run.stopping)


def fleet_exit_code(results: Sequence[HostFilesRepair]) -> ExitCode:
    """7 when a host's files could not be made right, else 4 when strays are left, else the
    first other code (a host not reached), else 0."""
    codes = [r.exit_code for r in results]
    for wanted in (ExitCode.REMOTE_FAILED, ExitCode.DRIFT):
        if wanted in codes:
            return wanted
    return next((code for code in codes if code is not ExitCode.OK), ExitCode.OK)


def _repair_host(
    run: FleetRun,
    member: FleetMember,
    pinned: list[PinnedFile],
    source_for: Callable[[PinnedFile], Path],
    dry_run: bool,
    history: HistoryStore | None,
) -> HostFilesRepair:
    started = time.monotonic()
    transport = run.open(member)
    try:
        files = push_files(
            transport,
            member.target.model_dir,
            pinned,
            host=HostKey.of_name(member.name),
            history=history,
            source_for=source_for,
            dry_run=dry_run,
        )
        return HostFilesRepair(member.name, files, seconds=time.monotonic() - started)
    except DflashProvisionError as exc:
        return HostFilesRepair(
            member.name, None, exc.message, exc.exit_code, time.monotonic() - started
        )
    except Exception as exc:  # a bug must not abort the other hosts
        return HostFilesRepair(
            member.name, None, internal_error(exc), ExitCode.ERROR, time.monotonic() - started
        )
    finally:
        transport.close()
