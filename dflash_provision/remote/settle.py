"""What became of a write whose answer never arrived (scripts/settle.sh).

A write cut off after its data was sent (connection lost, host frozen past the timeout, Ctrl-C)
may or may not have renamed its file into place. ``settle_write`` asks the host on a FRESH
connection, under the push's lock, from the mark write.sh leaves for each write that goes for
its rename. When the rename did not happen and the write never went for it, settle.sh leaves a
"cancelled" mark so that a write still on its way never renames afterwards: "not landed" is
final.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

from dflash_provision.errors import DflashProvisionError
from dflash_provision.remote.ops import check_remote_path
from dflash_provision.remote.protocol import parse_reply, script_argv
from dflash_provision.transport.base import Transport

#: Seconds between attempts to reach a host again (its connection was just lost).
_RETRY_PAUSE_S = 0.5


class Verdict(enum.StrEnum):
    LANDED = "landed"  # the write's rename happened (the file may have been replaced since)
    NOT_LANDED = "not-landed"  # it did not happen, and it never will
    UNKNOWN = "unknown"  # the host could not be asked, or could not tell


@dataclass(frozen=True)
class Settled:
    verdict: Verdict
    sha256: str | None = None  # what the file holds now (None: no regular file, or unknown)
    message: str = ""  # why UNKNOWN


def settle_write(
    transport: Transport,
    path: str,
    *,
    nonce: str,
    sha256: str,
    follow_symlinks: bool,
    lock_timeout: int,
    window: float,
) -> Settled:
    """Ask the host what became of write ``nonce`` (sending bytes with ``sha256``): on a fresh
    connection, retried for ``window`` seconds while the host cannot be reached. Never raises
    for the host's state or a failed connection: UNKNOWN then, with the reason."""
    check_remote_path(path)
    args = [path, nonce, sha256, str(lock_timeout), "1" if follow_symlinks else "0"]
    deadline = time.monotonic() + window
    problem = "not tried"
    while True:
        transport.close()  # a fresh connection: the old one is lost, frozen or abandoned
        try:
            result = transport.run(
                script_argv("settle", *args), stdin=None, timeout=lock_timeout + window
            )
        except DflashProvisionError as exc:
            problem = exc.message
        else:
            fields = parse_reply(result.stdout, "settle").fields
            verdict = fields.get("verdict")
            if verdict in (Verdict.LANDED, Verdict.NOT_LANDED):
                return Settled(Verdict(verdict), sha256=fields.get("sha256") or None)
            return Settled(
                Verdict.UNKNOWN,
                message=fields.get("error") or f"no verdict (exit status {result.exit_status})",
            )
        if time.monotonic() + _RETRY_PAUSE_S >= deadline:
            return Settled(Verdict.UNKNOWN, message=problem)
        time.sleep(_RETRY_PAUSE_S)
