"""Turn a SOURCE argument into config bytes: a local file, a directory holding config.json, a
Hub repo id (``owner/name`` or ``owner/name@revision``), or a target such as
``root@gpu1:/root/models/X`` or ``gpu1/lxc:c1:/root/models/X`` (one exec over SSH / in the
container).

Resolution order mirrors what users expect: an existing local path always wins over a repo id.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dflash_provision.errors import RemoteStepFailed, UsageError
from dflash_provision.source.authority import Authority, RepoRef, load_local, load_repo
from dflash_provision.source.local_file import MAX_SOURCE_BYTES
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import Connector

if TYPE_CHECKING:
    from dflash_provision.transport.factory import Connector

__all__ = ["MAX_SOURCE_BYTES", "load_local", "load_remote", "load_source"]


def load_source(
    spec: str, *, revision: str | None = None, connector: Connector | None = None
) -> Authority:
    """Load SOURCE as described in the module docstring. ``revision`` overrides ``@rev``;
    ``connector`` reaches a remote target (the command's SSH options)."""
    path = Path(spec).expanduser()
    if path.exists():
        return load_local(path)
    repo = RepoRef.parse(spec)
    if repo is not None and not spec.startswith((".", "/", "~")):
        return load_repo(repo.at(revision))
    if ":" in spec:
        return load_remote(spec, connector)
    raise UsageError(
        f"{spec}: no such file, directory, Hub repo id (owner/name[@rev]) or target (host:/path)"
    )


def load_remote(spec: str, connector: Connector | None = None) -> Authority:
    """Read a target's config.json (default: ~/.ssh/config, known_hosts, no other options)."""
    from dflash_provision.remote.ops import ReadStatus, read_remote_config

    target = parse_target(spec)
    with (connector or Connector()).open(target) as transport:
        read = read_remote_config(transport, target.config_path)
    if read.status in (ReadStatus.MISSING, ReadStatus.DIR_MISSING):
        raise UsageError(f"{target.display()}: {read.describe()}")  # as for a local file
    if not read.present or read.data is None:
        # Reachable, but the file cannot be read: verify and audit exit 7 for this too.
        raise RemoteStepFailed(f"{target.display()}: {read.describe()}", step="read")
    return Authority(label=target.display(), data=read.data)
