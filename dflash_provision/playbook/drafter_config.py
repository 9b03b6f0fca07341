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
from typing import Any

from dflash_provision.errors import DflashProvisionError, UsageError
from dflash_provision.transport.callback import CallbackTransport, ShellRunner

#: The module's options, as the CLI names them (``src`` is ``--from``).
OPTIONS = (
    "path", "lock", "repo", "revision", "src", "container", "mkdir", "keep_backups",
    "command_timeout",
)  # fmt: skip


@dataclass(frozen=True)
class DrafterConfigArgs:
    path: str
    lock: str | None = None
    repo: str | None = None
    revision: str | None = None
    src: str | None = None
    container: str | None = None
    mkdir: bool = False
    keep_backups: int | None = None
    command_timeout: float = 60.0  # each remote command, as the CLI's --command-timeout


def parse_args(args: Mapping[str, Any]) -> DrafterConfigArgs:
    """The task's arguments; UsageError (one line) for an unknown or ill-typed option."""
    unknown = sorted(set(args) - set(OPTIONS))
    if unknown:
        raise UsageError(f"unsupported option(s) {', '.join(unknown)}; known: {', '.join(OPTIONS)}")
    path = args.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise UsageError(f"path: the drafter directory's absolute path on the host, got {path!r}")
    texts: dict[str, str | None] = {}
    for name in ("lock", "repo", "revision", "src", "container"):
        value = args.get(name)
        if value is not None and not isinstance(value, str):
            raise UsageError(f"{name}: expected a string, got {value!r}")
        texts[name] = value or None
    if sum(texts[n] is not None for n in ("lock", "repo", "src")) != 1:
        raise UsageError("give exactly one source: lock, repo (with revision) or src")
    keep = args.get("keep_backups")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 0):
        raise UsageError(f"keep_backups: a count >= 0, got {keep!r}")
    mkdir = args.get("mkdir", False)
    if not isinstance(mkdir, bool):
        raise UsageError(f"mkdir: expected a boolean, got {mkdir!r}")
    limit = args.get("command_timeout", 60.0)
    if isinstance(limit, bool) or not isinstance(limit, int | float) or limit <= 0:
        raise UsageError(f"command_timeout: seconds > 0, got {limit!r}")
    return DrafterConfigArgs(
        path, mkdir=mkdir, keep_backups=keep, command_timeout=float(limit), **texts
    )


def apply_drafter_config(
    runner: ShellRunner,
    host: str,
    args: DrafterConfigArgs,
    *,
    check_mode: bool = False,
    diff_mode: bool = False,
) -> dict[str, Any]:
    """Run one task on one host; the Ansible result (``changed``, ``failed``, ``msg``, push's
    ``--json`` fields). A failure of the source or of the host is a failed result, never an
    exception the plugin must know about."""
    try:
        return _apply(runner, host, args, check_mode, diff_mode)
    except DflashProvisionError as exc:
        return {"changed": False, "failed": True, "msg": exc.message, "exit_code": exc.exit_code}


def _apply(
    runner: ShellRunner,
    host: str,
    args: DrafterConfigArgs,
    check_mode: bool,
    diff_mode: bool,
) -> dict[str, Any]:
    from dflash_provision.authority import SourceSpec
    from dflash_provision.history import HostKey, default_store, journal
    from dflash_provision.push import PushStatus, push_config
    from dflash_provision.remote.proof import WriteOptions
    from dflash_provision.target import parse_container_ref, parse_target
    from dflash_provision.transport.base import Transport

    spec = SourceSpec.from_options(args.repo, args.src, args.lock, revision=args.revision)
    authority = spec.load()
    where = host
    transport: Transport = CallbackTransport(
        runner, description=host, command_timeout=args.command_timeout
    )
    if args.container:
        from dflash_provision.transport.container import ContainerTransport

        ref = parse_container_ref(args.container)
        transport = ContainerTransport(transport, ref.kind, ref.name)
        where = f"{host}/{ref.display()}"
    target = parse_target(f"{where}:{args.path}")
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


def _proof(result: Any) -> str | None:
    """What proves the outcome: the separate read-back's sha256 against the meant bytes."""
    readback = result.readback
    if result.status.value == "written" and readback is not None:
        return f"read back sha256 {readback.sha256}: matched"
    return None


def _summary(result: Any) -> str:
    status = result.status.value
    if status == "written":
        return f"written: {result.path} (sha256 {result.new_sha256}, read back and matched)"
    if status == "unchanged":
        return f"unchanged: {result.path} already has sha256 {result.new_sha256}"
    if status == "dry-run":
        return f"check mode: {result.path} would change; nothing written"
    return f"{status}: {result.path}"
