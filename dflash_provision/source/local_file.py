"""Read one local config file the way every SOURCE is read: bounded, never waiting on a FIFO."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dflash_provision.errors import UsageError

CONFIG_FILENAME = "config.json"


#: The largest config file read (= remote.ops.MAX_CONFIG_BYTES; published DFlash configs are
#: about 2 KB). A larger SOURCE is refused, never read whole.
MAX_SOURCE_BYTES = 1024 * 1024


def read_config_file(path: Path) -> tuple[Path, bytes]:
    """The file read (``path``, or ``config.json`` inside a directory) and its bytes: a regular
    file of at most MAX_SOURCE_BYTES. A FIFO, a device (``/dev/zero``) or a socket is refused
    without being opened, so nothing waits on it. UsageError for every way it cannot be read."""
    file_path = path / CONFIG_FILENAME if path.is_dir() else path
    try:
        return file_path, _read_bounded(file_path)
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
