"""Docker and Podman containers: the ``exec`` argv, and what the tools say when the container is
missing, not running, or its daemon cannot be reached.

    docker [-H DOCKER_HOST] exec -i -- NAME argv...
    podman exec -i -- NAME argv...

``-i`` passes stdin through (without it the command reads nothing); no ``-t``, so stdout and
stderr are the command's bytes, apart and unchanged. ``--`` ends the tool's options, so a NAME is
never read as one (cobra, which both tools use, stops parsing at the NAME: what follows it is the
command, ``-`` or not). The command runs with the container's own environment (its image's and
``docker run -e``'s, never the caller's: an SSH session's variables do not leak in) and as the
container's user; Docker gives PATH=/usr/local/sbin:...:/bin to a container whose image sets
none (one made with ``docker import``).

Texts measured with the docker 20.10 and 28.2 clients against dockerd 20.10 (Debian's docker.io);
the 20.10 client says ``Error: No such container: NAME``, 28.2 ``Error response from daemon: No
such container: NAME``. Podman's texts are as its v4 sources print them (``podman exec`` could
not be run on the machine these were measured on): untested.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

DOCKER_KINDS = ("docker", "podman")

# Whole lines only (the tool's, not a path or a word the command itself printed).
_ERROR = r"^(?:Error: |Error response from daemon: )"
_DOCKER_MISSING = re.compile(_ERROR + r"No such container: \S+\s*$", re.MULTILINE)
_DOCKER_NOT_RUNNING = re.compile(_ERROR + r"Container \S+ is not running\s*$", re.MULTILINE)
_DOCKER_PAUSED = re.compile(
    _ERROR + r"Container \S+ is paused, unpause the container before exec\s*$", re.MULTILINE
)
_DOCKER_RESTARTING = re.compile(
    _ERROR + r"Container \S+ is restarting, wait until the container is running\s*$",
    re.MULTILINE,
)
_DOCKER_NO_DAEMON = re.compile(
    r"^Cannot connect to the Docker daemon at (\S+?)\.? Is the docker daemon running\?",
    re.MULTILINE,
)
# 20.10: "Got permission denied while trying to connect to the Docker daemon socket at ...";
# 28.2: "permission denied while trying to connect to the Docker daemon socket at ...".
_DOCKER_SOCKET_DENIED = re.compile(
    r"^(?:Got )?permission denied while trying to connect to the Docker daemon socket",
    re.MULTILINE | re.IGNORECASE,
)
_PODMAN_MISSING = re.compile(
    r'^Error: no container with name or ID "[^"]*" found: no such container\s*$', re.MULTILINE
)
_PODMAN_NOT_RUNNING = re.compile(
    r"^Error: can only create exec sessions on running containers: container state improper",
    re.MULTILINE,
)
# ``docker exec`` exits 126 for a command the container does not have (dockerd 20.10, both
# clients), where sh, lxc-attach and ``docker run`` say 127: "OCI runtime exec failed: exec
# failed: unable to start container process: exec: "X": executable file not found in $PATH" or,
# for a path, "... stat /bin/X: no such file or directory". With -i the client prints that line
# on stdout, ending in CR LF (measured, both clients): both streams are searched.
_EXEC_NOT_FOUND = re.compile(
    r'^OCI runtime exec failed: .*exec: "[^"\n]*": (?:executable file not found in \$PATH|'
    r"stat [^\n]*: no such file or directory)",
    re.MULTILINE,
)


def tool_argv(tool: str, *args: str, docker_host: str | None = None) -> list[str]:
    """``tool [-H DOCKER_HOST] args...``: the one place ``-H`` is added, for docker only (podman
    has no ``-H``: its socket is chosen by its own configuration)."""
    daemon = ["-H", docker_host] if docker_host and tool == "docker" else []
    return [tool, *daemon, *args]


def exec_argv(
    tool: str, name: str, argv: Sequence[str], *, docker_host: str | None = None
) -> list[str]:
    """The argv that runs ``argv`` inside container ``name`` (``docker_host``: docker only)."""
    return tool_argv(tool, "exec", "-i", "--", name, *argv, docker_host=docker_host)


def inspect_state_argv(tool: str, name: str, *, docker_host: str | None = None) -> list[str]:
    """The argv that prints the container's state (``exited``, ``created``...) on one line."""
    fmt = ["--format", "{{.State.Status}}"]
    return tool_argv(tool, "container", "inspect", *fmt, "--", name, docker_host=docker_host)


def socket_denied(stderr: str) -> bool:
    """The daemon's socket refused this login (not root, not in the ``docker`` group)."""
    return _DOCKER_SOCKET_DENIED.search(stderr) is not None


def daemon_unreachable(stderr: str) -> str | None:
    """The daemon address the client could not reach (its own words), else None."""
    match = _DOCKER_NO_DAEMON.search(stderr)
    return match.group(1) if match else None


def container_state(kind: str, stderr: str) -> str | None:
    """``missing``, ``not-running``, ``paused`` or ``restarting`` when the tool refused the exec
    for the container's state, else None (the command ran and this is its own output)."""
    if kind == "podman":
        if _PODMAN_MISSING.search(stderr):
            return "missing"
        if _PODMAN_NOT_RUNNING.search(stderr):
            return "not-running"
        return None
    if _DOCKER_MISSING.search(stderr):
        return "missing"
    if _DOCKER_NOT_RUNNING.search(stderr):
        return "not-running"
    if _DOCKER_PAUSED.search(stderr):
        return "paused"
    if _DOCKER_RESTARTING.search(stderr):
        return "restarting"
    return None


def command_not_found(exit_status: int, output: str) -> bool:
    """The container has no such command (docker exec's 126 for what sh calls 127); ``output``
    is stdout and stderr together."""
    return exit_status == 126 and _EXEC_NOT_FOUND.search(output) is not None
