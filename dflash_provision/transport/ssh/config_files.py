"""Step 1, config: per-process caches of the files every SSH connection reads: ssh_config,
known_hosts, keys.

A fleet of N hosts would otherwise parse them N times (known_hosts parsing is quadratic in its
length in paramiko). Each file is parsed once per version of it: a file that changes (an edit, an
accept-new append) is read again by the next connection.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import paramiko

from dflash_provision.transport.ssh.config_include import expand_includes, included_files
from dflash_provision.transport.ssh.paramiko_import import enable_match_exec, needs_match_exec

_T = TypeVar("_T")
_Stamp = bytes | None


def _stamp(path: str) -> _Stamp:
    """What identifies one version of a file: the sha256 of its bytes (None when it does not
    exist). Reading and hashing a few kilobytes costs microseconds; parsing is what costs. Unlike
    size + mtime, a digest cannot miss an in-place rewrite of the same length within one clock
    tick (known_hosts lines for one key type all have the same length)."""
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).digest()
    except FileNotFoundError:
        return None


class FileCache(Generic[_T]):
    """``parse(path)`` once per version of the file(s) it depends on, shared by all threads.

    ``depends(path)`` lists the files whose versions decide the value (default: ``path``).
    Parsing happens under the lock so a fleet's first N connections do not all parse at once;
    the stamp is taken before parsing, so a file that changes meanwhile is parsed again next time
    (a file whose bytes change in between is parsed at least as new as its stamp).
    """

    def __init__(
        self,
        parse: Callable[[str], _T],
        depends: Callable[[str], tuple[str, ...]] | None = None,
    ) -> None:
        self._parse = parse
        self._depends = depends or (lambda path: (path,))
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[tuple[_Stamp, ...], _T]] = {}

    def get(self, path: str) -> _T:
        stamps = tuple(_stamp(p) for p in self._depends(path))
        with self._lock:
            hit = self._entries.get(path)
            if hit is not None and hit[0] == stamps:
                return hit[1]
            value = self._parse(path)
            self._entries[path] = (stamps, value)
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
