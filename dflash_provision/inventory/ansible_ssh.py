"""An Ansible host's own SSH settings: its key file and the ssh arguments its vars add.

Ansible's ssh connection plugin runs ``ssh`` with ``ansible_ssh_common_args`` and
``ansible_ssh_extra_args`` on the command line and ``-i ansible_ssh_private_key_file``. Bastion
set-ups live there (``-o ProxyJump=bastion``, ``-o ProxyCommand="ssh -W %h:%p bastion"``, ``-J``),
so connecting without them would reach the wrong way or not at all. What is honoured: ``-i``,
``-J``, ``-o IdentityFile``, ``-o ProxyJump``, ``-o ProxyCommand`` (the first of each wins, as
with ssh). Options that do not change where or as whom we connect (connection sharing,
keep-alives, logging, host-key checking: ours is ``--accept-new-host-key`` or nothing) are
accepted and have no effect. Anything else is refused with the file and line, rather than
silently connecting differently from Ansible.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable

from dflash_provision.errors import UsageError
from dflash_provision.transport.options import HostRoute

KEY_VARS = ("ansible_ssh_private_key_file", "ansible_private_key_file")
ARG_VARS = ("ansible_ssh_common_args", "ansible_ssh_extra_args")

# ssh -o keys that change nothing about which host, which port, which user or which route.
_NO_EFFECT = frozenset(
    k.lower()
    for k in (
        "AddKeysToAgent", "BatchMode", "CheckHostIP", "Compression", "ConnectionAttempts",
        "ConnectTimeout", "ControlMaster", "ControlPath", "ControlPersist", "ForwardAgent",
        "ForwardX11", "GlobalKnownHostsFile", "GSSAPIAuthentication", "HashKnownHosts",
        "IdentitiesOnly", "IPQoS", "KbdInteractiveAuthentication", "LogLevel",
        "PasswordAuthentication", "PreferredAuthentications", "PubkeyAuthentication",
        "RequestTTY", "SendEnv", "ServerAliveCountMax", "ServerAliveInterval", "SetEnv",
        "StrictHostKeyChecking", "TCPKeepAlive", "UpdateHostKeys", "UserKnownHostsFile",
    )
)  # fmt: skip
# ssh flags without an argument that change nothing here either.
_NO_EFFECT_FLAGS = frozenset("qvCATxXnNtK46")


def host_route(get: Callable[[str], str | None], where: Callable[[str], str]) -> HostRoute | None:
    """The route an Ansible host's vars ask for; None when they ask for nothing."""
    keys: list[str] = []
    jump: str | None = None
    command: str | None = None
    for var in KEY_VARS:
        if get(var):
            keys.append(os.path.expanduser(str(get(var))))
            break
    for var in ARG_VARS:
        text = get(var)
        if not text:
            continue
        for key, value in _options(text, f"{where(var)}: {var}"):
            if key == "identityfile":
                keys.append(os.path.expanduser(value))
            elif key == "proxyjump":
                jump = jump if jump is not None else value
            elif key == "proxycommand":
                command = command if command is not None else value
    if jump is not None and command is not None and jump.lower() != "none":
        raise UsageError(
            f"{where(ARG_VARS[0])}: both ProxyJump and ProxyCommand given; keep one of them"
        )
    if not keys and jump is None and command is None:
        return None
    return HostRoute(
        identity_files=tuple(keys),
        proxy_jump=jump,
        proxy_command=None if command is None or command.lower() == "none" else command,
    )


def _options(text: str, label: str) -> list[tuple[str, str]]:
    """(lowercased key, value) for each -o/-i/-J in ``text``; the rest checked and dropped."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"{label}: cannot split {text!r}: {exc}") from None
    found: list[tuple[str, str]] = []
    i = 0
    while i < len(words):
        word = words[i]
        flag, rest = word[:2], word[2:]
        if flag in ("-o", "-i", "-J"):
            if not rest:
                if i + 1 >= len(words):
                    raise UsageError(f"{label}: {word} needs a value")
                i += 1
                rest = words[i]
            if flag == "-i":
                found.append(("identityfile", rest))
            elif flag == "-J":
                found.append(("proxyjump", rest))
            else:
                found.append(_option(rest, label))
        elif word.startswith("-") and len(word) > 1 and set(word[1:]) <= _NO_EFFECT_FLAGS:
            pass
        else:
            raise UsageError(
                f"{label}: {word!r} is not supported here (only -i, -J and -o options;"
                " put other settings in ~/.ssh/config for this host)"
            )
        i += 1
    return [(k, v) for k, v in found if k not in _NO_EFFECT]


def _option(text: str, label: str) -> tuple[str, str]:
    """``Key=Value`` or ``Key Value`` (both are ssh -o syntax: the key ends at the first ``=``
    or blank)."""
    match = re.match(r"\s*([^=\s]*)\s*=?\s*(.*)", text, re.DOTALL)
    assert match is not None  # the pattern matches any text
    key, value = match.group(1).lower(), match.group(2).strip()
    if not key or not value:
        raise UsageError(f"{label}: -o {text!r}: expected Key=Value")
    if key not in _NO_EFFECT and key not in ("identityfile", "proxyjump", "proxycommand"):
        raise UsageError(
            f"{label}: -o {match.group(1)} is not supported here (it would change"
            " how the host is reached; put it in ~/.ssh/config for this host)"
        )
    return key, value
