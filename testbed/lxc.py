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

import secrets
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.tier import refuse_in_fast_tier

if TYPE_CHECKING:
    from testbed.hosts import Host

BASE_CONFIG = "lxc.net.0.type = empty\n"
DEFAULT_LXCPATH = "/var/lib/lxc"


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
        refuse_in_fast_tier(f"LXC container {self.name}")
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
