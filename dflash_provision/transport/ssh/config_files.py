"""Step 1, config: per-process caches of the files every SSH connection reads: ssh_config,
known_hosts, keys.

A fleet of N hosts would otherwise parse them N times (known_hosts parsing is quadratic in its
length in paramiko). Each file is parsed once per version of it: a file that changes (an edit, an
accept-new append) is read again by the next connection.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

import paramiko

from dflash_provision.transport.ssh.config_include import expand_includes, included_files
from dflash_provision.transport.ssh.paramiko_import import enable_match_exec, needs_match_exec

_T = TypeVar("_T")
_Stat = tuple[int, int, int, int, int] | None
_Digest = bytes | None

#: How long after a file's last change its stat is trusted alone (see FileCache). Timestamps
#: come from a coarse clock (a few ms; 2 s on FAT): a change within the same tick as the one we
#: saw would leave them as they were, so a file changed this recently is checked by digest.
_SETTLED_NS = 2_000_000_000


def _stat(path: str) -> _Stat:
    """What changes whenever the file does: device, inode, size, mtime and ctime (None when it
    does not exist). ctime cannot be set back by anyone: a write, a rename over the file or a
    ``touch -d`` all give it the time of the change."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _digest(path: str) -> _Digest:
    """The sha256 of the file's bytes (None when it does not exist): what identifies one
    version of it when its stat cannot (a same-length rewrite within one clock tick)."""
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).digest()
    except FileNotFoundError:
        return None


def _settled(stats: tuple[_Stat, ...], seen_at_ns: int) -> bool:
    """Every file's last change was at least _SETTLED_NS before ``seen_at_ns``: any later change
    gives it another ctime, so an unchanged stat means unchanged bytes."""
    return all(st is None or st[4] < seen_at_ns - _SETTLED_NS for st in stats)


class _Entry(Generic[_T]):
    __slots__ = ("digests", "seen_at_ns", "stats", "value")

    def __init__(
        self, stats: tuple[_Stat, ...], digests: tuple[_Digest, ...], value: _T, seen_at_ns: int
    ) -> None:
        self.stats = stats
        self.digests = digests
        self.value = value
        self.seen_at_ns = seen_at_ns


class FileCache(Generic[_T]):
    """``parse(path)`` once per version of the file(s) it depends on, shared by all threads.

    ``depends(path)`` lists the files whose versions decide the value (default: ``path``).
    Parsing happens under the lock so a fleet's first N connections do not all parse at once.
    A version is told by the files' stat (one ``stat`` each per connection, whatever their
    size: a fleet's known_hosts grows with the fleet, and reading and hashing it for every
    connection cost ~0.1 ms of CPU per host at 254 lines) as long as the files last changed
    well before it was taken (``_settled``, git's answer to "racily clean" entries); otherwise
    by the sha256 of their bytes, so that a same-length rewrite within one clock tick is never
    missed. The stat is taken before reading, so a file that changes meanwhile is read again
    next time.
    """

    def __init__(
        self,
        parse: Callable[[str], _T],
        depends: Callable[[str], tuple[str, ...]] | None = None,
    ) -> None:
        self._parse = parse
        self._depends = depends or (lambda path: (path,))
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry[_T]] = {}

    def get(self, path: str) -> _T:
        files = self._depends(path)
        now = time.time_ns()  # the clock file times come from
        stats = tuple(_stat(p) for p in files)
        with self._lock:
            hit = self._entries.get(path)
            if hit is not None and hit.stats == stats and _settled(stats, hit.seen_at_ns):
                return hit.value
            digests = tuple(_digest(p) for p in files)
            if hit is not None and hit.digests == digests:
                hit.stats, hit.seen_at_ns = stats, now  # the same bytes: a newer stat of them
                return hit.value
            value = self._parse(path)
            self._entries[path] = _Entry(stats, digests, value, now)
            return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


class _RawProxyCommandConfig(paramiko.SSHConfig):
    """paramiko's parser, leaving ProxyCommand's ``%`` tokens alone: paramiko fills ``%p`` and
    ``%r`` from the config file only, while OpenSSH uses the port and user the connection really
    has (a ``user@host:port`` target overrides them). config_route.py expands them instead."""

    def _allowed_tokens(self, key: str) -> list[str]:
        # A private paramiko method the stubs do not list.
        return [] if key == "proxycommand" else super()._allowed_tokens(key)  # type: ignore[misc]


class ParsedSshConfig:
    """One ssh_config file, with each host's lookup remembered (a config with one block per host
    makes every lookup walk the whole file)."""

    def __init__(self, path: str) -> None:
        text, _ = expand_includes(path)  # paramiko itself ignores Include
        if needs_match_exec(text):
            enable_match_exec()
        self._config = _RawProxyCommandConfig.from_text(text)
        self._lock = threading.Lock()
        self._lookups: dict[str, dict[str, object]] = {}

    def lookup(self, host: str) -> dict[str, object]:
        with self._lock:
            entry = self._lookups.get(host)
            if entry is None:
                entry = dict(self._config.lookup(host))
                self._lookups[host] = entry
        # A copy with copied lists: callers may not change what other threads read.
        return {k: list(v) if isinstance(v, list) else v for k, v in entry.items()}


def load_private_key(path: str) -> paramiko.PKey | None:
    """The key (with its ``-cert.pub`` certificate, as paramiko loads it), or None when it cannot
    be loaded without a passphrase or is of an unknown type: paramiko then tries the file itself,
    as before, and reports what is wrong with it."""
    try:
        return paramiko.PKey.from_path(path)
    except (OSError, ValueError, TypeError, paramiko.SSHException):
        return None


# An edit to any included file is a new version of the config.
SSH_CONFIGS: FileCache[ParsedSshConfig] = FileCache(ParsedSshConfig, depends=included_files)
KNOWN_HOSTS: FileCache[paramiko.HostKeys] = FileCache(paramiko.HostKeys)
PRIVATE_KEYS: FileCache[paramiko.PKey | None] = FileCache(
    load_private_key, depends=lambda path: (path, path + "-cert.pub")
)


def cached_key(path: str) -> paramiko.PKey | None:
    try:
        return PRIVATE_KEYS.get(path)
    except OSError:
        return None  # unreadable: paramiko tries the file and reports it as before


def clear_caches() -> None:
    """Forget every parsed ssh_config, known_hosts and key file (tests)."""
    for cache in (SSH_CONFIGS, KNOWN_HOSTS, PRIVATE_KEYS):
        cache.clear()
