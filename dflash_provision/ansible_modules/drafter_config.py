"""``dflash.provision.drafter_config``: make a drafter directory's config.json the authoritative
one, through the play's connection, with push's own protocol and proof.

The source is resolved and validated here, on the controller, by the library the CLI uses
(``SourceSpec``: a lock file, a Hub repo at a revision, or a local file as ``--from``); the host
side is ``push_config`` over a :class:`CallbackTransport` (wrapped for a container as a target's
``HOST/KIND:NAME`` is), so the lock, temp file, fsync, rename, backup, read-back and the trust
model's refusals are the push's, and so are the status words and the history row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dflash_provision.ansible_modules.common import (
    HOST_OPTIONS,
    SOURCE_OPTIONS,
    HostArgs,
    SourceArgs,
    count,
    failed,
    flag,
    open_host,
    parse_host,
    parse_source,
    refuse_unknown,
)
from dflash_provision.errors import DflashProvisionError
from dflash_provision.history.host_key import HostKey
from dflash_provision.history.store import default_store, journal
from dflash_provision.place.push import PushStatus, push_config
from dflash_provision.remote.proof import WriteOptions
from dflash_provision.transport.callback import ShellRunner

if TYPE_CHECKING:
    from dflash_provision.place.push import PushResult

#: The module's options, as the CLI names them (``src`` is ``--from``).
OPTIONS = (*HOST_OPTIONS, *SOURCE_OPTIONS, "mkdir", "keep_backups")


@dataclass(frozen=True)
class DrafterConfigArgs:
    host: HostArgs
    source: SourceArgs
    mkdir: bool = False
    keep_backups: int | None = None


def parse_args(args: Mapping[str, Any]) -> DrafterConfigArgs:
    """The task's arguments; UsageError (one line) for an unknown or ill-typed option."""
    refuse_unknown(args, OPTIONS)
    host, source = parse_host(args), parse_source(args)
    keep = (
        None
        if args.get("keep_backups") is None
        else count(args, "keep_backups", 0, low=0, high=1_000_000)
    )
    return DrafterConfigArgs(host, source, flag(args, "mkdir"), keep)


def apply_drafter_config(
    runner: ShellRunner,
    host: str,
    args: DrafterConfigArgs,
    *,
    check_mode: bool = False,
    diff_mode: bool = False,
) -> dict[str, Any]:
    """Run one task on one host; the Ansible result (``changed``, ``failed``, ``msg``, push's
    ``--json`` fields). A failure of the source or of the host is a failed result."""
    try:
        return _apply(runner, host, args, check_mode, diff_mode)
    except DflashProvisionError as exc:
        return failed(exc)


def _apply(
    runner: ShellRunner,
    host: str,
    args: DrafterConfigArgs,
    check_mode: bool,
    diff_mode: bool,
) -> dict[str, Any]:
    authority = args.source.spec().load()
    transport, target = open_host(runner, host, args.host)
    write = WriteOptions(mkdir=args.mkdir)
    if args.keep_backups is not None:
        write = WriteOptions(args.keep_backups, args.mkdir)
    store = None if check_mode else default_store()  # check mode changes nothing
    with journal(store, "push", HostKey.of_target(target), target.config_path) as recording:
        result = push_config(transport, target, authority, dry_run=check_mode, write=write)
        result.journal_into(recording)
    document = result.to_dict()
    changed = result.status in (PushStatus.WRITTEN, PushStatus.DRY_RUN)
    out: dict[str, Any] = {
        **document,
        "changed": changed,
        "failed": not result.ok,
        "proof": _proof(result),
        "msg": result.message or _summary(result),
    }
    if diff_mode and result.diff is not None and changed:
        lines = "\n".join(result.diff.lines)
        out["diff"] = {"prepared": f"--- {target.config_path}\n+++ {authority.label}\n{lines}\n"}
    return out


def _proof(result: PushResult) -> str | None:
    """What proves the outcome: the read-back's sha256 against the meant bytes."""
    readback = result.readback
    if result.status.value == "written" and readback is not None:
        return f"read back sha256 {readback.sha256}: matched"
    return None


def _summary(result: PushResult) -> str:
    status = result.status.value
    if status == "written":
        return f"written: {result.path} (sha256 {result.new_sha256}, read back and matched)"
    if status == "unchanged":
        return f"unchanged: {result.path} already has sha256 {result.new_sha256}"
    if status == "dry-run":
        return f"check mode: {result.path} would change; nothing written"
    return f"{status}: {result.path}"
