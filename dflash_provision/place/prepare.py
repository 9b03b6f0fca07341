"""Prepare a drafter in place before vLLM starts: the init container's job (``dflash-provision
init``). The pinned bytes (a lock file, a Hub repo at a commit, or a mounted file) are judged
against the target model's config beside them on the shared volume, then written on this
machine with push's protocol (lock, temp file, fsync, backup, rename, directory fsync, read-back
in the same script) and proved. Anything wrong is one error, so the pod's vLLM never starts on a
config it cannot serve.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from dflash_provision.errors import ConfigInvalid, RemoteStepFailed, UsageError
from dflash_provision.place.push import push_config
from dflash_provision.target import parse_target
from dflash_provision.transport.local import LocalTransport
from dflash_provision.validation.validate import validate_config

if TYPE_CHECKING:
    from dflash_provision.place.push import PushResult
    from dflash_provision.remote.proof import WriteOptions
    from dflash_provision.source.authority import Authority, SourceSpec

_COMMIT = re.compile(r"[0-9a-f]{40}")


def require_pinned(spec: SourceSpec) -> None:
    """UsageError unless ``spec`` names bytes that cannot move: a lock file, a mounted file, or
    a Hub repo at a full commit sha (a branch or tag is not pinned)."""
    if not spec.is_set:
        raise UsageError(
            "init needs a pinned source: --lock FILE, --repo OWNER/NAME --revision COMMIT, "
            "or --from FILE"
        )
    if spec.repo is not None and not _COMMIT.fullmatch(spec.repo.revision or ""):
        given = repr(spec.repo.revision) if spec.repo.revision else "none"
        raise UsageError(
            f"--repo {spec.repo.repo_id}: init needs the revision pinned to a 40-hex commit sha "
            f"(got {given}; a branch or tag can move between two pod starts): use --revision "
            "COMMIT, or --lock"
        )


def check_fit(authority: Authority, target: Authority, *, effective: bool) -> None:
    """ConfigInvalid, one line naming the first errors, unless the drafter config passes every
    validation layer, the target model's fit included."""
    report = validate_config(
        authority.data, label=authority.label, target=target.data, effective=effective
    )
    if report.ok:
        return
    errors = [f for f in report.findings if f.severity == "error"]
    summary = "; ".join(
        f"{f.layer}: {f.message}"
        if not f.path or f.message.startswith(f.path)
        else f"{f.layer}: {f.path}: {f.message}"
        for f in errors[:3]
    )
    more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
    raise ConfigInvalid(
        f"{authority.label} does not pass validation for target {target.label}, nothing "
        f"written: {summary}{more}"
    )


def prepare_drafter(
    authority: Authority,
    target: Authority,
    drafter_dir: str,
    *,
    write: WriteOptions,
    effective: bool = True,
    command_timeout: float,
) -> PushResult:
    """Judge ``authority`` against ``target`` (the model's config), then make
    ``drafter_dir``'s config hold exactly its bytes on this machine, proved by read-back.
    Raises ConfigInvalid (3), UsageError (2) for a path that is not a local absolute one, and
    RemoteStepFailed with the write's own code (7, 17) when the write is not proved."""
    if not drafter_dir.startswith("/"):
        raise UsageError(f"DRAFTER_DIR {drafter_dir!r}: give the absolute path on the volume")
    place = parse_target(drafter_dir)
    check_fit(authority, target, effective=effective)
    with LocalTransport(command_timeout) as transport:
        result = push_config(transport, place, authority, validate=False, write=write)
    if not result.ok:
        raise RemoteStepFailed(
            f"{result.path}: {result.message}",
            step=result.failed_step or "write",
            exit_code=result.exit_code,
        )
    return result
