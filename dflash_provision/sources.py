"""Turn a SOURCE argument into config bytes: a local file, a directory holding config.json, a
Hub repo id (``owner/name`` or ``owner/name@revision``), or a target such as
``root@gpu1:/root/models/X`` or ``gpu1/lxc:c1:/root/models/X`` (one exec over SSH / in the
container).

Resolution order mirrors what users expect: an existing local path always wins over a repo id.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_provision.authority import Authority, RepoRef, load_repo
from dflash_provision.errors import UsageError

if TYPE_CHECKING:
    from dflash_provision.transport.factory import Connector

CONFIG_FILENAME = "config.json"


#: The largest config file read (= remote.ops.MAX_CONFIG_BYTES; published DFlash configs are
#: about 2 KB). A larger SOURCE is refused, never read whole.
MAX_SOURCE_BYTES = 1024 * 1024


def load_local(path: Path) -> Authority:
    """Read a config file, or ``config.json`` inside a directory: a regular file of at most
    MAX_SOURCE_BYTES. A FIFO, a device (``/dev/zero``) or a socket is refused without being
    opened, so nothing waits on it."""
    file_path = path / CONFIG_FILENAME if path.is_dir() else path
    try:
        return Authority(label=str(file_path), data=_read_bounded(file_path))
    except FileNotFoundError:
        raise UsageError(f"{file_path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{file_path}: is a directory") from None
    except PermissionError:
        raise UsageError(f"{file_path}: permission denied") from None


def _read_bounded(file_path: Path) -> bytes:
    # The type is checked before opening (opening a FIFO waits for a writer); O_NONBLOCK covers
    # a file swapped for a FIFO in between, and fstat then judges what was really opened.
    if not stat.S_ISREG(os.stat(file_path).st_mode):
        raise UsageError(
            f"{file_path}: {_kind(file_path)}, not a regular file: refusing to read it"
        )
    fd = os.open(file_path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{file_path}: not a regular file: refusing to read it")
        data = handle.read(MAX_SOURCE_BYTES + 1)
    if len(data) > MAX_SOURCE_BYTES:
        raise UsageError(
            f"{file_path}: larger than 1 MiB ({MAX_SOURCE_BYTES} bytes), the limit for a config; "
            "is it really a config.json?"
        )
    return data


def _kind(file_path: Path) -> str:
    mode = os.stat(file_path).st_mode
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "a special file"


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
    return Authority(label=target.display(), data=read.data)
