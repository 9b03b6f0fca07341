"""Run commands inside a container by wrapping them in the container tool's exec command.

Composes with any transport (local, SSH, sudo): the wrapped argv runs on the machine that hosts
the container, and stdin, stdout, stderr and the exit status pass through unchanged.

    lxc    lxc-attach [-P LXCPATH] -n NAME --clear-env --set-var PATH=... -- argv...
    pct    pct exec VMID -- argv...
    incus  incus exec NAME -- argv...
    lxd    lxc exec NAME -- argv...
    docker docker [-H DOCKER_HOST] exec -i -- NAME argv...   (see transport.docker_exec)
    podman podman exec -i -- NAME argv...

``lxc-attach`` keeps the caller's environment by default (measured with LXC 5.0: the SSH
session's PATH, HOME, LANG... leak in), so we clear it and set a plain PATH: busybox containers
then find their applets in /bin and /sbin whatever the host's PATH is.

When the wrapper tool itself says the container is missing or stopped, ``run`` raises
ContainerError with one line; when it says this login may not use it (classic LXC as a non-root
user; the Incus/LXD socket closed to it), AuthError: the fix is a different login or ``--sudo``,
not the container (and a fleet audit must not file it as "container not running"). Any other
result (including the tool's exit 127 for a command that does not exist inside) is returned as
it is; ``docker exec``'s 126 for such a command becomes the 127 every other tool says.

Docker and Podman: a container that is missing, stopped (exited, created), paused or restarting
is a ContainerError, as is a Docker daemon that cannot be reached (the container cannot be
either); a daemon socket closed to this login is an AuthError.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from dflash_provision.errors import AuthError, ContainerError
from dflash_provision.target import ContainerKind
from dflash_provision.transport import docker_exec
from dflash_provision.transport.base import CommandResult, Transport, WrappingTransport

CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TOOLS: dict[str, str] = {
    "lxc": "lxc-attach",
    "pct": "pct",
    "incus": "incus",
    "lxd": "lxc",
    "docker": "docker",
    "podman": "podman",
}
_DIAGNOSE_TIMEOUT_S = 15.0

# What the tools print when the container is not there or not running (measured for LXC 5.0:
# stopped and missing look the same, "Failed to get init pid"; pct/incus/lxd texts as their
# sources print them: pct "container '<vmid>' not running!" (older: "CT <vmid> not running") /
# "Configuration file 'nodes/<node>/lxc/<vmid>.conf' does not exist"; Incus/LXD
# "Error: Instance not found" / "Error: Instance is not running").
_PCT_MISSING = re.compile(r"Configuration file '[^']*\b\d+\.conf' does not exist")
_PCT_STOPPED = re.compile(r"container '\d+' not running!|\bCT \d+ not running\b")
_INCUS_MISSING = re.compile(r"^Error: (?:Instance not found|not found)\s*$", re.MULTILINE)
_INCUS_STOPPED = re.compile(r"^Error: Instance is not running\s*$", re.MULTILINE)
# A non-root login (measured with LXC 5.0): without -P, lxc-attach looks in the user's own
# ~/.local/share/lxc ("You lack access to <home>/.local/share/lxc"); with -P /var/lib/lxc it says
# "Insufficent privileges to control NAME" (sic). Incus/LXD: the daemon's unix socket refuses
# users outside its admin group ('dial unix .../unix.socket: connect: permission denied').
_LXC_NOT_ROOT = re.compile(
    r"You lack access to \S*\.local/share/lxc|Insuffici?ent privileges to control "
)
_INCUS_SOCKET_DENIED = re.compile(r"unix\.socket: connect: permission denied")


class ContainerTransport(WrappingTransport):
    """Runs argv inside container ``name`` of ``kind`` on the machine ``inner`` reaches."""

    def __init__(
        self,
        inner: Transport,
        kind: ContainerKind,
        name: str,
        *,
        lxc_path: str | None = None,
        docker_host: str | None = None,
    ) -> None:
        if kind not in TOOLS:
            raise ValueError(f"unknown container kind {kind!r}")
        super().__init__(inner)
        self.kind = kind
        self.name = name
        self.lxc_path = lxc_path  # classic LXC only: lxc-attach -P (default /var/lib/lxc)
        # docker only: docker -H (default: docker's own, $DOCKER_HOST or /var/run/docker.sock)
        self.docker_host = docker_host
        self.tool = TOOLS[kind]
        self.description = f"{kind}:{name} on {inner.description}"

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """The argv that runs ``argv`` inside the container, for the host's side."""
        if self.kind == "lxc":
            return [
                "lxc-attach",
                *self._lxc_path_args(),
                "-n",
                self.name,
                "--clear-env",
                "--set-var",
                f"PATH={CONTAINER_PATH}",
                "--",
                *argv,
            ]
        if self.kind in docker_exec.DOCKER_KINDS:
            return docker_exec.exec_argv(self.tool, self.name, argv, docker_host=self.docker_host)
        return [self.tool, "exec", self.name, "--", *argv]

    def _lxc_path_args(self) -> list[str]:
        return ["-P", self.lxc_path] if self.lxc_path else []

    def check(self, argv: Sequence[str], result: CommandResult) -> None:
        if result.exit_status != 0:
            self._raise_if_access_denied(result)
            problem = self._container_problem(result)
            if problem:
                raise ContainerError(problem)

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        result = super().run(argv, stdin=stdin, timeout=timeout)
        if self.kind == "docker" and docker_exec.command_not_found(
            result.exit_status, (result.stdout + result.stderr).decode("utf-8", "replace")
        ):
            return replace(result, exit_status=127)
        return result

    # -- recognising the wrapper's own failures -------------------------------------------------

    def _raise_if_access_denied(self, result: CommandResult) -> None:
        stderr = result.stderr.decode("utf-8", "replace")
        host = self.inner.description
        where = f"{self.kind} container {self.name} on {host}"
        if self.kind == "lxc" and _LXC_NOT_ROOT.search(stderr):
            raise AuthError(
                f"{where}: lxc-attach needs root on {host}: use --sudo or log in as root",
                reason="needs-root",
            )
        if self.kind == "docker" and docker_exec.socket_denied(stderr):
            raise AuthError(
                f"{where}: this login may not use docker on {host} (the Docker daemon's socket "
                "refused it): use --sudo, log in as root, or add the user to the docker group",
                reason="needs-root",
            )
        if self.kind in ("incus", "lxd") and _INCUS_SOCKET_DENIED.search(stderr):
            raise AuthError(
                f"{where}: this login may not use {self.tool} on {host} (the daemon's socket "
                "refused it): use --sudo, log in as root, or add the user to the daemon's "
                "admin group",
                reason="needs-root",
            )

    def _container_problem(self, result: CommandResult) -> str | None:
        stderr = result.stderr.decode("utf-8", "replace")
        where = f"{self.kind} container {self.name} on {self.inner.description}"
        if result.exit_status == 127 and re.search(
            rf"(?:^|\s){re.escape(self.tool)}: (?:command )?not found", stderr
        ):
            return f"{self.tool} is not installed on {self.inner.description} (needed for {where})"
        if self.kind == "lxc":
            if f"lxc-attach: {self.name}: " in stderr and "Failed to get init pid" in stderr:
                return self._diagnose_lxc(where)
            return None
        if self.kind in docker_exec.DOCKER_KINDS:
            return self._docker_problem(where, stderr)
        if self.kind == "pct":
            if _PCT_MISSING.search(stderr):
                return f"{where} does not exist"
            if _PCT_STOPPED.search(stderr):
                return f"{where} is not running"
            return None
        if _INCUS_MISSING.search(stderr):
            return f"{where} does not exist"
        if _INCUS_STOPPED.search(stderr):
            return f"{where} is not running"
        return None

    def _docker_problem(self, where: str, stderr: str) -> str | None:
        daemon = docker_exec.daemon_unreachable(stderr)
        if daemon is not None:
            return (
                f"{where}: cannot reach the Docker daemon at {daemon} (is dockerd running? "
                "--docker-host names another socket)"
            )
        state = docker_exec.container_state(self.kind, stderr)
        if state == "missing":
            return f"{where} does not exist"
        if state == "not-running":
            return self._diagnose_docker(where)
        if state is not None:
            return f"{where} is not running (state {state})"
        return None

    def _diagnose_docker(self, where: str) -> str:
        """The refusal names no state: ``docker inspect`` says which (exited, created, dead)."""
        info = self.inner.run(
            docker_exec.inspect_state_argv(self.tool, self.name, docker_host=self.docker_host),
            timeout=_DIAGNOSE_TIMEOUT_S,
        )
        state = info.stdout.decode("utf-8", "replace").strip()
        if info.exit_status == 0 and re.fullmatch(r"[a-z]{1,20}", state):
            return f"{where} is not running (state {state})"
        return f"{where} is not running"

    def _diagnose_lxc(self, where: str) -> str:
        """lxc-attach says the same for stopped and missing containers; lxc-info tells which."""
        info = self.inner.run(
            ["lxc-info", *self._lxc_path_args(), "-n", self.name, "-s"],
            timeout=_DIAGNOSE_TIMEOUT_S,
        )
        out = info.stdout.decode("utf-8", "replace")
        err = info.stderr.decode("utf-8", "replace")
        if "doesn't exist" in err or "does not exist" in err:
            return f"{where} does not exist"
        state = re.search(r"State:\s*(\S+)", out)
        if state:
            return f"{where} is not running (state {state.group(1)})"
        return f"{where} does not exist or is not running"
