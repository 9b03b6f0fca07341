"""Real LXC 5 busybox containers for tests, on the controller or inside a fleet host.

``busybox_container(host=h)`` runs ``lxc-create -t busybox`` inside fleet host ``h`` (via
``Host.exec``), so the container lives in that host's ``/var/lib/lxc`` and a client reaches it
over SSH with plain ``ssh h01 lxc-attach -n NAME -- cmd``. ``busybox_container(lxcpath=p)``
does the same on the controller under ``p``.

Facts (measured on this machine, LXC 5.0.2): create + start of a busybox container takes about
0.3 s (the template copies busybox and writes a rootfs; ``lxc-start`` daemonizes at once);
``lxc-stop -k`` and ``lxc-destroy`` take ~30 ms and ~10 ms. There is no bridge here, so the
config says ``lxc.net.0.type = empty`` (the container has only a loopback). ``-t download``
needs internet and fails. Busybox containers have no python and no bash, only busybox sh.
``lxc-attach`` passes stdin through and exits with the command's status; ``/root`` exists and is
writable.

All fake hosts share one kernel, network namespace and ``/run``: LXC's command socket
(abstract, keyed by lxcpath + name), its lock files and cgroups (``lxc.payload.NAME``) would
collide between two hosts that both have a container called ``c1`` in ``/var/lib/lxc``. So
names must be unique machine-wide: ``unique_name()``, or ``Host.container_name(x)`` for the
pct/incus emulators.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dflash_provision.testbed.hosts import Host

BASE_CONFIG = "lxc.net.0.type = empty\n"
DEFAULT_LXCPATH = "/var/lib/lxc"
CGROUP_ROOT = Path("/sys/fs/cgroup")


class ContainerFailure(RuntimeError):
    """An lxc-* command failed while setting up or tearing down a test container."""


def unique_name(prefix: str = "c") -> str:
    """A container name unique on this machine, e.g. ``c-5f3a9e``."""
    return f"{prefix}-{secrets.token_hex(3)}"


class Container:
    """One LXC container, driven by ``lxc-*`` commands on the controller or inside ``host``.

    ``attach`` is for test set-up and assertions; the product reaches containers through its own
    transports. Use as a context manager to destroy on exit.
    """

    def __init__(
        self, name: str, *, host: Host | None = None, lxcpath: str | Path | None = None
    ) -> None:
        self.name = name
        self.host = host
        self.lxcpath = str(lxcpath) if lxcpath is not None else DEFAULT_LXCPATH
        #: Seconds create()+start() took, for reporting.
        self.setup_s: float | None = None

    def __repr__(self) -> str:
        where = self.host.name if self.host is not None else "controller"
        return f"<Container {self.name} on {where} in {self.lxcpath}>"

    @property
    def rootfs(self) -> Path:
        """Controller-side path of the container's root filesystem."""
        base = Path(self.lxcpath)
        if self.host is not None and self.lxcpath == DEFAULT_LXCPATH:
            base = self.host.lxc_dir
        return base / self.name / "rootfs"

    def _run(
        self, argv: Sequence[str], stdin: bytes | str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[Any]:
        if self.host is not None:
            return self.host.exec(argv, stdin, timeout)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        proc = subprocess.run(argv, input=data, capture_output=True, timeout=timeout, cwd="/")
        return subprocess.CompletedProcess(
            proc.args,
            proc.returncode,
            proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"),
        )

    def _lxc(self, tool: str, *args: str, timeout: float = 60) -> str:
        proc = self._run([tool, "-P", self.lxcpath, "-n", self.name, *args], timeout=timeout)
        if proc.returncode != 0:
            raise ContainerFailure(
                f"{tool} {self.name} exited {proc.returncode}: {proc.stderr.strip()[-800:]}"
            )
        return str(proc.stdout)

    def create(self) -> Container:
        """``lxc-create -t busybox`` with a network-less config."""
        config = self._base_config_path()
        self._lxc("lxc-create", "-t", "busybox", "-f", config)
        return self

    def _base_config_path(self) -> str:
        # The config must be readable where lxc-create runs; a fleet host sees the controller's
        # files except /root, /var/lib/lxc and /usr/local/sbin, so the host's own dir works.
        directory = self.host.dir if self.host is not None else Path(tempfile.gettempdir())
        path = directory / "lxc-base.conf"
        if not path.exists():
            path.write_text(BASE_CONFIG)
        return str(path)

    def start(self, timeout: float = 10) -> Container:
        """``lxc-start`` (daemonizes) then wait until RUNNING."""
        self._lxc("lxc-start")
        self._lxc("lxc-wait", "-s", "RUNNING", "-t", str(int(timeout)), timeout=timeout + 5)
        return self

    def stop(self) -> None:
        """Kill the container at once (``lxc-stop -k``); no-op when already stopped."""
        if self.state() == "RUNNING":
            self._lxc("lxc-stop", "-k")

    def destroy(self) -> None:
        """Stop if needed and delete the container and its rootfs (``lxc-destroy -f``)."""
        if self.state() == "MISSING":
            return
        self._lxc("lxc-destroy", "-f")

    def state(self) -> str:
        """ "RUNNING", "STOPPED", ... as lxc-info says, or "MISSING"."""
        proc = self._run(["lxc-info", "-P", self.lxcpath, "-n", self.name, "-s"], timeout=30)
        if proc.returncode != 0:
            return "MISSING"
        return str(proc.stdout).split(":", 1)[1].strip()

    def attach(
        self, argv: Sequence[str], stdin: bytes | str | None = None, timeout: float = 30
    ) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` in the container with ``lxc-attach``; output is str."""
        return self._run(
            ["lxc-attach", "-P", self.lxcpath, "-n", self.name, "--", *argv], stdin, timeout
        )

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def busybox_container(
    name: str | None = None,
    *,
    host: Host | None = None,
    lxcpath: str | Path | None = None,
    start: bool = True,
) -> Container:
    """Create (and by default start) a busybox container; ``setup_s`` records how long it took.

    ``host``: inside that fleet host (default lxcpath /var/lib/lxc there). Without ``host``:
    on the controller under ``lxcpath`` (required, so tests never touch the real
    /var/lib/lxc).
    """
    if host is None and lxcpath is None:
        raise ValueError("on the controller, pass lxcpath (a test directory)")
    if host is None and lxcpath is not None:
        Path(lxcpath).mkdir(parents=True, exist_ok=True)
    container = Container(name or unique_name(), host=host, lxcpath=lxcpath)
    began = time.monotonic()
    container.create()
    try:
        if start:
            container.start()
    except BaseException:
        container.destroy()
        raise
    container.setup_s = time.monotonic() - began
    return container


def remove_leftover_cgroups(names: Iterable[str]) -> None:
    """Remove empty cgroups LXC left for ``names`` when their host was killed, not stopped.

    A killed host takes its containers' processes with it (PID namespace), but the cgroup
    directories ``lxc.payload.NAME`` / ``lxc.monitor.NAME`` stay behind; empty ones are removed
    bottom-up. Busy ones (a container still running) are left alone.
    """
    wanted = set()
    for name in names:
        wanted |= {f"lxc.payload.{name}", f"lxc.monitor.{name}"}
    if not wanted or not CGROUP_ROOT.is_dir():
        return
    # LXC nests them under the caller's cgroup, which differs per controller (e.g. memory:
    # /process_api/<id>), so look a few levels deep in every hierarchy.
    for top in _find_dirs(CGROUP_ROOT, wanted, max_depth=5):
        for dirpath, _dirs, _files in os.walk(top, topdown=False):
            try:
                os.rmdir(dirpath)
            except OSError:
                break  # still has processes: not a leftover


def _find_dirs(root: Path, names: set[str], max_depth: int) -> list[Path]:
    found: list[Path] = []
    level = [root]
    for _ in range(max_depth):
        next_level = []
        for d in level:
            try:
                entries = [e for e in os.scandir(d) if e.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for e in entries:
                if e.name in names:
                    found.append(Path(e.path))
                elif not e.name.startswith("lxc."):
                    next_level.append(Path(e.path))
        level = next_level
    return found


# --------------------------------------------------------------------------------------------
# pct / incus / lxc (LXD) emulators


_PCT = r"""#!/bin/sh
# pct: EMULATION of Proxmox VE's container CLI for the dflash-provision testbed (Proxmox can't
# run here). VMID N is the LXC container "${prefix}N" in /var/lib/lxc; commands go to lxc-*.
# Supported: exec VMID [--] CMD..., status VMID, push VMID SRC DEST, pull VMID SRC DEST,
# start VMID, stop VMID. Errors mimic pct: unknown VMID -> "Configuration file
# 'nodes/<node>/lxc/N.conf' does not exist" (exit 2); exec/push/pull on a stopped container ->
# "container 'N' not running!" (exit 255, what Perl's die gives). exec passes stdin through and
# exits with the command's status.
prefix='@PREFIX@'
die() { echo "$1" >&2; exit "$2"; }
running() { lxc-info -n "$prefix$1" -s 2>/dev/null | grep -q RUNNING; }
need() {
    [ -n "$1" ] || die "400 not enough arguments" 255
    [ -f "/var/lib/lxc/$prefix$1/config" ] ||
        die "Configuration file 'nodes/$(hostname)/lxc/$1.conf' does not exist" 2
}
need_running() { need "$1"; running "$1" || die "container '$1' not running!" 255; }
cmd=$1
[ $# -gt 0 ] && shift
case "$cmd" in
exec)
    vmid=$1; shift; [ "$1" = "--" ] && shift
    need_running "$vmid"
    exec lxc-attach -n "$prefix$vmid" -- "$@" ;;
status)
    need "$1"
    if running "$1"; then echo "status: running"; else echo "status: stopped"; fi ;;
push)
    need_running "$1"
    exec lxc-attach -n "$prefix$1" -- sh -c 'cat > "$1"' sh "$3" < "$2" ;;
pull)
    need_running "$1"
    lxc-attach -n "$prefix$1" -- cat "$2" > "$3" ;;
start)
    need "$1"; lxc-start -n "$prefix$1" && lxc-wait -n "$prefix$1" -s RUNNING -t 10 ;;
stop)
    need "$1"; lxc-stop -k -n "$prefix$1" ;;
*)
    die "pct (testbed emulation): unknown command '$cmd'" 255 ;;
esac
"""

_INCUS = r"""#!/bin/sh
# @PROG@: EMULATION of the @WHAT@ CLI for the dflash-provision testbed (it can't run here).
# Instance NAME is the LXC container "${prefix}NAME" in /var/lib/lxc; commands go to lxc-*.
# Supported: exec NAME [flags] -- CMD..., info NAME ("Status: RUNNING|STOPPED"), start NAME,
# stop NAME, file push SRC NAME/PATH, file pull NAME/PATH DEST. Errors mimic @PROG@:
# unknown instance -> "Error: Instance not found" (exit 1); exec on a stopped instance ->
# "Error: Instance is not running" (exit 1). exec passes stdin and the command's exit status.
prefix='@PREFIX@'
die() { echo "$1" >&2; exit "$2"; }
running() { lxc-info -n "$prefix$1" -s 2>/dev/null | grep -q RUNNING; }
need() { [ -f "/var/lib/lxc/$prefix$1/config" ] || die "Error: Instance not found" 1; }
need_running() { need "$1"; running "$1" || die "Error: Instance is not running" 1; }
cmd=$1
[ $# -gt 0 ] && shift
case "$cmd" in
exec)
    name=$1; shift
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do shift; done  # flags like --env are ignored
    [ "$1" = "--" ] && shift
    need_running "$name"
    exec lxc-attach -n "$prefix$name" -- "$@" ;;
info)
    need "$1"
    echo "Name: $1"
    if running "$1"; then echo "Status: RUNNING"; else echo "Status: STOPPED"; fi ;;
start)
    need "$1"; lxc-start -n "$prefix$1" && lxc-wait -n "$prefix$1" -s RUNNING -t 10 ;;
stop)
    need "$1"; lxc-stop -k -n "$prefix$1" ;;
file)
    sub=$1; shift
    case "$sub" in
    push) name=${2%%/*}; path=/${2#*/}; need_running "$name"
        exec lxc-attach -n "$prefix$name" -- sh -c 'cat > "$1"' sh "$path" < "$1" ;;
    pull) name=${1%%/*}; path=/${1#*/}; need_running "$name"
        lxc-attach -n "$prefix$name" -- cat "$path" > "$2" ;;
    *) die "Error: unknown command 'file $sub' (testbed emulation)" 1 ;;
    esac ;;
*)
    die "Error: unknown command '$cmd' (testbed emulation)" 1 ;;
esac
"""


def emulator_scripts(prefix: str) -> dict[str, str]:
    """The emulated CLIs by program name: ``pct`` (Proxmox VE), ``incus``, ``lxc`` (LXD client).

    Each is a POSIX sh script over lxc-*; container/instance NAME maps to LXC name
    ``prefix + NAME``. The scripts' headers document commands, error texts and exit codes.
    """
    return {
        "pct": _PCT.replace("@PREFIX@", prefix),
        "incus": _INCUS.replace("@PREFIX@", prefix)
        .replace("@PROG@", "incus")
        .replace("@WHAT@", "Incus"),
        "lxc": _INCUS.replace("@PREFIX@", prefix)
        .replace("@PROG@", "lxc")
        .replace("@WHAT@", "LXD (lxc client)"),
    }
