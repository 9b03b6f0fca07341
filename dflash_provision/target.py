"""Where a config lives: parse target specs like ``root@gpu1:/root/models/X`` into a Target.

Target syntax (one spec names one model directory or one ``*.json`` file)::

    /abs/path                              this machine
    ./rel/path   ../rel/path               this machine, made absolute against the current dir
    [user@]host:/abs/path                  over SSH; host may be an ~/.ssh/config alias
    [user@][v6addr]:/abs/path              IPv6 literal in brackets
    ssh://[user@]host[:port]/abs/path      URL form, the only form that carries a port
    ssh://[user@][v6addr][:port]/abs/path

    KIND:NAME:/abs/path                    inside a container on this machine
    [user@]host/KIND:NAME:/abs/path        inside a container on a host reached over SSH
    ssh://[user@]host[:port]/KIND:NAME:/abs/path

    KIND is one of
      lxc    classic LXC (lxc-attach)     NAME like c1, gpu-ct.2   ([A-Za-z0-9][A-Za-z0-9_.-]*)
      pct    Proxmox VE (pct exec)        NAME is the numeric VMID, 100..999999999
      incus  Incus (incus exec)           NAME is a hostname label ([A-Za-z][A-Za-z0-9-]*, <=63)
      lxd    LXD (lxc exec)               NAME as for incus
      docker Docker (docker exec -i)      NAME or ID ([A-Za-z0-9][A-Za-z0-9_.-]+, Docker's rule)
      podman Podman (podman exec -i)      NAME or ID as for docker

Examples: ``gpu1:/root/models/Qwen3-8B-DFlash``, ``ssh://ops@10.0.0.5:2222/srv/m/config.json``,
``pve1/pct:101:/root/models/X``, ``lxc:c1:/models/X``, ``gpu1/docker:vllm:/models/X``,
``root@[fd00::5]:/models/X``.

How the grammar stays unambiguous: the remote path always starts with ``/``, so the first ``:``
of an scp-like spec ends the host part (or, with ``/``, the host ends at the first ``/`` and a
container follows). A spec starting with a KIND and ``:`` followed by a name (not ``/``) is a
local container; ``lxc:/path`` is a host called "lxc" (and ``docker:/path`` one called
"docker"). In the ``ssh://`` form a path beginning ``/KIND:NAME:/`` selects a container.

The path is absolute. If its last component ends with ``.json`` the target is that file,
otherwise it is the model directory and the file is ``<path>/config.json`` (decided from the
spec alone, without asking the host). Paths may contain spaces, quotes, ``$``, ``;`` and the
like: they only ever travel as one quoted argument. NUL bytes and line breaks are refused.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Literal

from dflash_provision.errors import UsageError

ContainerKind = Literal["lxc", "pct", "incus", "lxd", "docker", "podman"]
CONTAINER_KINDS: tuple[ContainerKind, ...] = ("lxc", "pct", "incus", "lxd", "docker", "podman")
CONFIG_FILENAME = "config.json"

_LXC_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# Incus and LXD instance names must be valid hostname labels.
_INCUS_NAME = re.compile(r"[A-Za-z](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_VMID = re.compile(r"[1-9][0-9]{2,8}")
# Docker's and Podman's own rule for container names (two characters at least); a container ID
# (12 or 64 hex digits) matches it too.
_DOCKER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]+")
# Host names and ~/.ssh/config aliases; a leading "-" could pass for an option somewhere.
_HOSTNAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_IPV6 = re.compile(r"[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\$?")
_LOCAL_CONTAINER = re.compile(r"(lxc|pct|incus|lxd|docker|podman):([^/][^:]*):(.*)", re.DOTALL)
_FORBIDDEN_CHARS = ("\x00", "\n", "\r")


@dataclass(frozen=True)
class ContainerRef:
    """A container on the target machine, reached through the kind's own exec tool."""

    kind: ContainerKind
    name: str

    def display(self) -> str:
        return f"{self.kind}:{self.name}"


@dataclass(frozen=True)
class Target:
    """A parsed target spec. ``host`` None means this machine."""

    raw: str
    host: str | None
    user: str | None
    port: int | None
    container: ContainerRef | None
    path: str

    @property
    def is_file(self) -> bool:
        """True when ``path`` names the JSON file itself rather than the model directory."""
        return os.path.basename(self.path).endswith(".json")

    @property
    def config_path(self) -> str:
        """Absolute path of the config file on the target machine (or in the container)."""
        if self.is_file:
            return self.path
        return self.path.rstrip("/") + "/" + CONFIG_FILENAME

    @property
    def model_dir(self) -> str:
        """The directory that holds the config file."""
        return os.path.dirname(self.config_path) or "/"

    @property
    def machine(self) -> str:
        """Where commands run, e.g. ``root@gpu1:2222`` or ``local`` (no container, no path)."""
        if self.host is None:
            return "local"
        host = f"[{self.host}]" if ":" in self.host else self.host
        text = f"{self.user}@{host}" if self.user else host
        return f"{text}:{self.port}" if self.port is not None else text

    def display(self) -> str:
        """A canonical, re-parseable spec for messages (the ssh:// form only when a port is set)."""
        inner = f"{self.container.display()}:{self.path}" if self.container else self.path
        if self.host is None:
            return inner
        host = f"[{self.host}]" if ":" in self.host else self.host
        userhost = f"{self.user}@{host}" if self.user else host
        if self.port is not None:
            rest = f"/{inner}" if self.container else inner
            return f"ssh://{userhost}:{self.port}{rest}"
        if self.container:
            return f"{userhost}/{inner}"
        return f"{userhost}:{inner}"

    def __str__(self) -> str:
        return self.display()


def parse_target(spec: str) -> Target:
    """Parse a target spec (syntax in this module's docstring); UsageError on anything unclear."""
    if not spec or not spec.strip():
        raise UsageError("empty target")
    if any(ch in spec for ch in _FORBIDDEN_CHARS):
        raise UsageError(f"target {_show(spec)} contains a NUL byte or a line break")
    if spec.startswith("/"):
        return Target(spec, None, None, None, None, _clean_path(spec, spec))
    if spec.startswith(("./", "../")) or spec in (".", ".."):
        return Target(spec, None, None, None, None, _clean_path(os.path.abspath(spec), spec))
    if spec.startswith("ssh://"):
        return _parse_url(spec)
    local = _LOCAL_CONTAINER.fullmatch(spec)
    if local:
        container = _container(local.group(1), local.group(2), spec)
        return Target(spec, None, None, None, container, _remote_path(local.group(3), spec))
    return _parse_scp_like(spec)


def make_target(
    host: str | None,
    user: str | None,
    port: int | None,
    container: ContainerRef | None,
    path: str,
) -> Target:
    """A Target from its fields (an inventory's), each checked by the rule parse_target applies
    to it, so both obey one grammar without rendering the fields to a spec and parsing it back.
    ``path`` must be absolute."""
    spec = Target("", host, user, port, container, path).display()  # names it in messages
    if host is not None:
        if ":" in host:
            _ipv6(host, spec)
        else:
            _hostname(host, spec)
        if user is not None and not _USER.fullmatch(user):
            raise UsageError(f"target {_show(spec)}: {_show(user)} is not a valid user name")
        if port is not None:
            _port(str(port), spec)
    if container is not None:
        _container(container.kind, container.name, spec)
    target = Target("", host, user, port, container, _remote_path(path, spec))
    return replace(target, raw=target.display())


def parse_container_ref(text: str) -> ContainerRef:
    """``KIND:NAME`` (as in a target spec) -> ContainerRef; UsageError when it is not one."""
    kind, sep, name = text.partition(":")
    if kind not in CONTAINER_KINDS or not sep or not name or name.startswith("/") or ":" in name:
        raise UsageError(f"expected KIND:NAME ({', '.join(CONTAINER_KINDS)}), got {_show(text)}")
    return _container(kind, name, f"{kind}:{name}:/x")


def _parse_scp_like(spec: str) -> Target:
    user, rest = _split_user(spec, spec)
    if rest.startswith("["):
        close = rest.find("]")
        if close < 0:
            raise UsageError(f"target {_show(spec)}: missing ']' after the IPv6 address")
        host = _ipv6(rest[1:close], spec)
        after = rest[close + 1 :]
        if after.startswith(":"):
            return Target(spec, host, user, None, None, _remote_path(after[1:], spec))
        if after.startswith("/"):
            container, path = _container_and_path(after[1:], spec)
            return Target(spec, host, user, None, container, path)
        raise UsageError(f"target {_show(spec)}: expected ':/path' or '/KIND:NAME:/path' after ']'")
    colon = rest.find(":")
    slash = rest.find("/")
    if colon < 0:
        raise UsageError(
            f"target {_show(spec)} is neither an absolute path nor host:/path "
            "(prefix ./ for a path relative to the current directory)"
        )
    if 0 <= slash < colon:
        host = _hostname(rest[:slash], spec)
        container, path = _container_and_path(rest[slash + 1 :], spec)
        return Target(spec, host, user, None, container, path)
    host = _hostname(rest[:colon], spec)
    _refuse_port_in_scp_form(user, host, rest[colon + 1 :], spec)
    return Target(spec, host, user, None, None, _remote_path(rest[colon + 1 :], spec))


_PORT_THEN_PATH = re.compile(r"([0-9]{1,5}):?(/.*)", re.DOTALL)


def _refuse_port_in_scp_form(user: str | None, host: str, after: str, spec: str) -> None:
    """``gpu1:2222:/path`` (or ``gpu1:2222/path``): a port typed as scp has none. Say how a port
    is given instead of "the path must be absolute", which sends the user looking at the path."""
    match = _PORT_THEN_PATH.fullmatch(after)
    if match is None:
        return
    userhost = f"{user}@{host}" if user else host
    raise UsageError(
        f"target {_show(spec)}: host:/path carries no port; give it as "
        f"ssh://{userhost}:{match.group(1)}{match.group(2)} (or as Port in ssh_config)"
    )


def _parse_url(spec: str) -> Target:
    body = spec[len("ssh://") :]
    if "[" in body and "]" not in body:
        raise UsageError(f"target {_show(spec)}: missing ']' after the IPv6 address")
    slash = _authority_end(body)
    if slash < 0:
        raise UsageError(f"target {_show(spec)}: ssh:// URL needs an absolute path after the host")
    authority, rest = body[:slash], body[slash:]
    user, hostport = _split_user(authority, spec)
    port: int | None = None
    if hostport.startswith("["):
        close = hostport.find("]")
        if close < 0:
            raise UsageError(f"target {_show(spec)}: missing ']' after the IPv6 address")
        host = _ipv6(hostport[1:close], spec)
        tail = hostport[close + 1 :]
        if tail:
            if not tail.startswith(":"):
                raise UsageError(f"target {_show(spec)}: unexpected {_show(tail)} after ']'")
            port = _port(tail[1:], spec)
    else:
        name, sep, port_text = hostport.partition(":")
        host = _hostname(name, spec)
        if sep:
            port = _port(port_text, spec)
    in_container = _LOCAL_CONTAINER.fullmatch(rest[1:])
    if in_container:
        container = _container(in_container.group(1), in_container.group(2), spec)
        path = _remote_path(in_container.group(3), spec)
        return Target(spec, host, user, port, container, path)
    return Target(spec, host, user, port, None, _remote_path(rest, spec))


def _authority_end(body: str) -> int:
    """Index of the first "/" outside an IPv6 bracket, -1 if none."""
    in_brackets = False
    for index, char in enumerate(body):
        if char == "[":
            in_brackets = True
        elif char == "]":
            in_brackets = False
        elif char == "/" and not in_brackets:
            return index
    return -1


def _split_user(text: str, spec: str) -> tuple[str | None, str]:
    # A user is whatever precedes an "@" that comes before any ":", "/" or "[".
    at = text.find("@")
    if at < 0 or any(sep in text[:at] for sep in ":/["):
        return None, text
    user, rest = text[:at], text[at + 1 :]
    if not _USER.fullmatch(user):
        raise UsageError(f"target {_show(spec)}: {_show(user)} is not a valid user name")
    return user, rest


def _container_and_path(text: str, spec: str) -> tuple[ContainerRef, str]:
    match = _LOCAL_CONTAINER.fullmatch(text)
    if not match:
        raise UsageError(
            f"target {_show(spec)}: after 'host/' expected KIND:NAME:/path with KIND one of "
            + ", ".join(CONTAINER_KINDS)
        )
    return _container(match.group(1), match.group(2), spec), _remote_path(match.group(3), spec)


def _container(kind: str, name: str, spec: str) -> ContainerRef:
    if kind == "pct":
        if not _VMID.fullmatch(name):
            raise UsageError(
                f"target {_show(spec)}: pct needs a numeric VMID (100..999999999), "
                f"got {_show(name)}"
            )
    elif kind == "lxc":
        if not _LXC_NAME.fullmatch(name):
            raise UsageError(
                f"target {_show(spec)}: {_show(name)} is not a valid LXC container name "
                "(letters, digits, '_', '.', '-'; starting with a letter or digit)"
            )
    elif kind in ("docker", "podman"):
        if not _DOCKER_NAME.fullmatch(name):
            raise UsageError(
                f"target {_show(spec)}: {_show(name)} is not a valid {kind} container name or ID "
                "(two or more letters, digits, '_', '.', '-'; starting with a letter or digit)"
            )
    elif not _INCUS_NAME.fullmatch(name):
        raise UsageError(
            f"target {_show(spec)}: {_show(name)} is not a valid {kind} instance name "
            "(letters, digits and '-', starting with a letter, at most 63 characters)"
        )
    return ContainerRef(kind, name)  # type: ignore[arg-type]  # kind checked by the regex


def _hostname(text: str, spec: str) -> str:
    if not text:
        raise UsageError(f"target {_show(spec)}: empty host name")
    if not _HOSTNAME.fullmatch(text):
        raise UsageError(f"target {_show(spec)}: {_show(text)} is not a valid host name or alias")
    return text


def _ipv6(text: str, spec: str) -> str:
    if not text or ":" not in text or not _IPV6.fullmatch(text):
        raise UsageError(f"target {_show(spec)}: {_show(text)} is not an IPv6 address")
    return text


def _port(text: str, spec: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise UsageError(f"target {_show(spec)}: port must be 1..65535, got {_show(text)}")
    return int(text)


def _remote_path(path: str, spec: str) -> str:
    if not path:
        raise UsageError(f"target {_show(spec)}: empty path")
    if not path.startswith("/"):
        raise UsageError(
            f"target {_show(spec)}: the path must be absolute (start with '/'), got {_show(path)}"
        )
    return _clean_path(path, spec)


def _clean_path(path: str, spec: str) -> str:
    # Only trailing slashes go; ".." and symlinks are the host's business, not ours.
    cleaned = path.rstrip("/") or "/"
    if cleaned != "/" and os.path.basename(cleaned) in ("", ".", ".."):
        raise UsageError(f"target {_show(spec)}: the path must name a directory or a .json file")
    return cleaned


def _show(text: str) -> str:
    """Quote user text for a one-line message (repr escapes control characters)."""
    return repr(text)
