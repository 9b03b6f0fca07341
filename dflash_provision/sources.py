"""Turn a SOURCE argument into config bytes: a local file, a directory holding config.json, a
Hub repo id (``owner/name`` or ``owner/name@revision``), or a target such as
``root@gpu1:/root/models/X`` or ``gpu1/lxc:c1:/root/models/X`` (one exec over SSH / in the
container).

Resolution order mirrors what users expect: an existing local path always wins over a repo id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_provision.errors import UsageError

if TYPE_CHECKING:
    from dflash_provision.transport.factory import Connector

CONFIG_FILENAME = "config.json"

# The Hub's repo id grammar (namespace/name), optionally pinned with @revision.
_REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.\-]*/[\w.\-]+)(?:@(?P<rev>[^\s@]+))?$")


@dataclass(frozen=True)
class LoadedConfig:
    """Raw config bytes plus where they came from (for messages and lock records)."""

    label: str  # what the user would recognise: a path, "repo@sha", "host:/path"
    data: bytes
    commit_sha: str | None = None  # set for Hub sources


def parse_repo_spec(spec: str) -> tuple[str, str | None] | None:
    """Return (repo_id, revision) if ``spec`` looks like a Hub repo id, else None."""
    match = _REPO_ID.match(spec)
    if match is None:
        return None
    return match.group("repo"), match.group("rev")


def load_local(path: Path) -> LoadedConfig:
    """Read a config file, or ``config.json`` inside a directory."""
    file_path = path / CONFIG_FILENAME if path.is_dir() else path
    try:
        return LoadedConfig(label=str(file_path), data=file_path.read_bytes())
    except FileNotFoundError:
        raise UsageError(f"{file_path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{file_path}: is a directory") from None
    except PermissionError:
        raise UsageError(f"{file_path}: permission denied") from None


def load_source(
    spec: str, *, revision: str | None = None, connector: Connector | None = None
) -> LoadedConfig:
    """Load SOURCE as described in the module docstring. ``revision`` overrides ``@rev``;
    ``connector`` reaches a remote target (the command's SSH options)."""
    path = Path(spec).expanduser()
    if path.exists():
        return load_local(path)
    repo = parse_repo_spec(spec)
    if repo is not None and not spec.startswith((".", "/", "~")):
        from dflash_provision import hub  # deferred: huggingface_hub is slow to import

        repo_id, spec_revision = repo
        fetched = hub.fetch_config(repo_id, revision=revision or spec_revision)
        return LoadedConfig(
            label=f"{repo_id}@{fetched.commit_sha[:12]}",
            data=fetched.data,
            commit_sha=fetched.commit_sha,
        )
    if ":" in spec:
        return load_remote(spec, connector)
    raise UsageError(
        f"{spec}: no such file, directory, Hub repo id (owner/name[@rev]) or target (host:/path)"
    )


def load_remote(spec: str, connector: Connector | None = None) -> LoadedConfig:
    """Read a target's config.json (default: ~/.ssh/config, known_hosts, no other options)."""
    from dflash_provision.errors import RemoteStepFailed
    from dflash_provision.remote.ops import ReadStatus, read_remote_config
    from dflash_provision.target import parse_target
    from dflash_provision.transport.factory import Connector

    target = parse_target(spec)
    with (connector or Connector()).open(target) as transport:
        read = read_remote_config(transport, target.config_path)
    if read.status in (ReadStatus.MISSING, ReadStatus.DIR_MISSING):
        raise UsageError(f"{target.display()}: {read.describe()}")  # as for a local file
    if not read.present or read.data is None:
        # Reachable, but the file cannot be read: verify and audit exit 7 for this too.
        raise RemoteStepFailed(f"{target.display()}: {read.describe()}", step="read")
    return LoadedConfig(label=target.display(), data=read.data)
