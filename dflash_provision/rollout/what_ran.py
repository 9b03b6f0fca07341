"""What a rollback returns a host to: the config its server RAN at baseline, not merely the
bytes on disk before the write (a file pushed without a restart holds other bytes than the
server loaded).

The evidence is the launch record's ``file_sha256`` (the file launch or a proved restart
started the server on; older records: ``drafter_sha256``). The bytes themselves come from the
file on disk when it still holds them, else from a backup the write protocol kept on the host,
else from this controller's store (every rollout's new config and every return config it
found are kept there by sha256). Found bytes are kept in the record (``HostState.return_config``)
so the rollback, ``--resume`` and ``--abort`` need neither the backup nor the store later.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import DflashProvisionError
from dflash_provision.place.push import list_backups
from dflash_provision.remote.ops import read_backup

if TYPE_CHECKING:
    from dflash_provision.target import Target
    from dflash_provision.transport.base import Transport

#: Looks bytes up by sha256 on the controller (RolloutStore.config_with_sha).
Lookup = Callable[[str], "bytes | None"]


@dataclass(frozen=True)
class WhatRan:
    """The state a rollback returns to."""

    sha256: str | None  # None: nothing to tell (no file read)
    data: bytes | None  # its bytes, when recovered
    where: str  # where the bytes were found ("" when they were not)
    differs: bool  # the file on disk is not what the server ran

    @property
    def recovered(self) -> bool:
        return self.data is not None


def ran_sha(launch: dict[str, Any] | None) -> str | None:
    """The sha256 of the config the recorded server loaded, or None (no launch record)."""
    if not launch:
        return None
    for key in ("file_sha256", "drafter_sha256"):
        value = launch.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def decide(
    transport: Transport,
    target: Target,
    launch: dict[str, Any] | None,
    on_disk: bytes,
    lookup: Lookup,
    timeout: float,
) -> WhatRan:
    """What the host's server ran (``launch``: its record, None without a launched server: the
    file is all there is) and where its bytes are."""
    disk_sha = hashlib.sha256(on_disk).hexdigest()
    ran = ran_sha(launch)
    if ran is None or ran == disk_sha:
        return WhatRan(disk_sha, on_disk, "the file on the host", differs=False)
    data, where = _from_backups(transport, target, ran, timeout), "a backup on the host"
    if data is None:
        data, where = lookup(ran), "this controller's rollout store"
    if data is None or hashlib.sha256(data).hexdigest() != ran:
        return WhatRan(ran, None, "", differs=True)
    return WhatRan(ran, data, where, differs=True)


def _from_backups(transport: Transport, target: Target, sha: str, timeout: float) -> bytes | None:
    """The bytes of the newest backup with ``sha256`` (read with the restore checks: never
    through a link), or None."""
    try:
        backups = list_backups(transport, target, timeout=timeout)
        chosen = next((b for b in reversed(backups) if b.sha256 == sha), None)
        if chosen is None:
            return None
        return read_backup(transport, target.config_path, chosen.name, timeout=timeout)
    except DflashProvisionError:
        return None


def note(what: WhatRan, disk_sha: str | None) -> str:
    """The pre-flight line naming a host whose file is not what its server ran."""
    said = (
        f"its file (sha256 {str(disk_sha)[:12]}) is not the config its server loaded (sha256 "
        f"{str(what.sha256)[:12]}, launch record)"
    )
    if what.recovered:
        return f"{said}: a rollback returns to what ran (found in {what.where})"
    return (
        f"{said}: those bytes are in no backup on the host and not in this controller's "
        "rollout store: a rollback cannot return to what ran"
    )
