"""A real dockerd for tests: its own socket, data root and exec root under a temp dir, stopped at
the end, and busybox images made with ``docker import``.

Facts (measured on this machine, Debian's docker.io 20.10 and runc): with
``--iptables=false --bridge=none --storage-driver=vfs`` dockerd runs containers with
``--network none`` and answers ``docker info`` about 1-2 s after it starts. No registry is
reachable: an image is a root filesystem given to ``docker import``. Debian's busybox is linked
dynamically, so the image holds it, the libraries ``ldd`` names and one link per applet (without
the libraries ``docker run`` says "exec /bin/sh: no such file or directory"). The image has no
Python, no bash and no Env: Docker gives its containers PATH=/usr/local/sbin:...:/bin and HOME=/.
``vfs`` copies each layer for every container: the image is ~3 MB, so that is cheap.

Reaching it: ``DOCKER_HOST=unix://BASE/docker.sock`` (``DockerDaemon.environment``) or
``docker -H unix://BASE/docker.sock`` (``--docker-host`` of the product). The socket is a file
under the base directory, which must not be under /root: the fake SSH hosts of testbed.hosts have
their own /root but share every other path, so a host's ``docker -H unix://BASE/docker.sock``
reaches this daemon. Bind-mount sources (``-v DIR:/models``) are read by dockerd in the machine's
own mount namespace: give paths every host sees (not a host's /root).

Clean-up: ``stop()`` removes every container (``docker rm -f``), then ends dockerd by its pid
(SIGTERM, SIGKILL at the deadline); dockerd ends its containerd. dockerd is started through
testbed.hosts' launcher with SIGTERM as its parent-death signal, so if this Python process dies
first dockerd still kills its containers (``--shutdown-timeout=2``) and ends.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path

from testbed.hosts import _popen
from testbed.tier import refuse_in_fast_tier

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
BUSYBOX = "/bin/busybox"
BUSYBOX_IMAGE = "dflash-testbed/busybox:1"
#: The command of a test container: PID 1 ``sleep`` (``docker stop -t 0`` kills it at once).
IDLE = ("sleep", "2147483647")

_LDD_PATH = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")


class DockerUnavailable(RuntimeError):
    """dockerd cannot run here (not root, not installed, would not start): a skip reason."""


class DockerFailure(RuntimeError):
    """A docker command the test bed ran failed."""


def missing_docker_prerequisites() -> str | None:
    """Why a test dockerd cannot run here (a sentence for pytest.skip), or None when it can."""
    if os.geteuid() != 0:
        return "needs root (dockerd)"
    missing = [tool for tool in ("dockerd", "docker", "runc") if shutil.which(tool) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (apt-get install docker.io)"
    if not os.access(BUSYBOX, os.X_OK):
        return f"{BUSYBOX} not installed (apt-get install busybox)"
    return None


class DockerDaemon:
    """One dockerd with everything of its own under ``base_dir`` (keep the path short: the
    containerd socket under it must fit a unix socket path, 107 bytes)."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.socket = base_dir / "docker.sock"
        self.host_url = f"unix://{self.socket}"
        self.log = base_dir / "dockerd.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._images: dict[str, str] = {}
        #: Seconds from launch to the first answer of ``docker info``, for reporting.
        self.start_s: float | None = None

    @property
    def environment(self) -> dict[str, str]:
        """The variables a docker client needs to use this daemon."""
        return {"DOCKER_HOST": self.host_url}

    def start(self, timeout: float = START_TIMEOUT_S) -> DockerDaemon:
        """Start dockerd and wait until it answers; DockerUnavailable (with its log's tail) when
        it exits or does not answer within ``timeout``."""
        refuse_in_fast_tier("a dockerd")
        reason = missing_docker_prerequisites()
        if reason:
            raise DockerUnavailable(reason)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            "dockerd",
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
            "--storage-driver=vfs",
            "--shutdown-timeout=2",
            "--data-root",
            str(self.base_dir / "data"),
            "--exec-root",
            str(self.base_dir / "exec"),
            "--pidfile",
            str(self.base_dir / "dockerd.pid"),
            "-H",
            self.host_url,
        ]
        began = time.monotonic()
        with self.log.open("ab") as log:
            # SIGTERM if this process dies first: dockerd then kills its containers and ends
            # containerd (SIGKILL would leave the containers' shims and processes running).
            self._process = _popen(
                argv, stdout=log, stderr=subprocess.STDOUT, death_signal=signal.SIGTERM
            )
        deadline = began + timeout
        while True:
            if self._process.poll() is not None:
                raise DockerUnavailable(
                    f"dockerd exited with {self._process.returncode}: {self._tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.stop()
                raise DockerUnavailable(
                    f"dockerd did not answer within {timeout:g} s: {self._tail()}"
                )
            info = self.docker(
                "info", "--format", "{{.ServerVersion}}", check=False, timeout=min(remaining, 10)
            )
            if info.returncode == 0:
                self.start_s = time.monotonic() - began
                return self
            time.sleep(0.2)

    def _tail(self) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-5:])[-1500:]

    def docker(
        self,
        *args: str,
        stdin: bytes | None = None,
        timeout: float = 60,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``docker -H THIS_SOCKET args...`` on the controller (set-up and assertions)."""
        proc = subprocess.run(
            ["docker", "-H", self.host_url, *args],
            input=stdin if stdin is not None else b"",
            capture_output=True,
            timeout=timeout,
            check=False,
            cwd="/",
        )
        done = subprocess.CompletedProcess(
            proc.args,
            proc.returncode,
            proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"),
        )
        if check and done.returncode != 0:
            said = done.stderr.strip()[-800:]
            raise DockerFailure(f"docker {' '.join(args[:3])} exited {done.returncode}: {said}")
        return done

    def busybox_image(self) -> str:
        """The busybox image (made once per daemon with ``docker import``); its reference."""
        if BUSYBOX_IMAGE not in self._images:
            tar = busybox_rootfs_tar()
            self.docker("import", "-", BUSYBOX_IMAGE, stdin=tar, timeout=120)
            self._images[BUSYBOX_IMAGE] = BUSYBOX_IMAGE
        return BUSYBOX_IMAGE

    def container(
        self,
        name: str,
        *,
        image: str | None = None,
        volumes: Sequence[tuple[str | Path, str]] = (),
        command: Sequence[str] = IDLE,
    ) -> DockerContainer:
        """``docker run -d --network none`` a container (default: busybox, idle)."""
        mounts: list[str] = []
        for source, inside in volumes:
            mounts += ["-v", f"{source}:{inside}"]
        self.docker(
            "run",
            "-d",
            "--network",
            "none",
            "--name",
            name,
            *mounts,
            image or self.busybox_image(),
            *command,
        )
        return DockerContainer(self, name)

    def run_once(
        self,
        command: Sequence[str],
        *,
        image: str | None = None,
        volumes: Sequence[tuple[str | Path, str, str]] = (),
        environment: dict[str, str] | None = None,
        network: str = "none",
        timeout: float = 300,
    ) -> subprocess.CompletedProcess[str]:
        """``docker run --rm`` in the foreground (as an init container runs): its exit status and
        output. ``volumes``: (source, path inside, ``ro`` or ``rw``)."""
        args = ["run", "--rm", "--network", network]
        for source, inside, mode in volumes:
            args += ["-v", f"{source}:{inside}:{mode}"]
        for name, value in (environment or {}).items():
            args += ["-e", f"{name}={value}"]
        return self.docker(
            *args, image or self.busybox_image(), *command, timeout=timeout, check=False
        )

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Remove every container, then end dockerd by its pid. Safe to call twice."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            listed = self.docker("ps", "-aq", check=False, timeout=30)
            ids = listed.stdout.split()
            if ids:
                self.docker("rm", "-f", *ids, check=False, timeout=60)
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        _unmount_under(self.base_dir)

    def __enter__(self) -> DockerDaemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class DockerContainer:
    """One container of a test DockerDaemon; ``exec`` is for set-up and assertions (the product
    reaches it through its own transport). A context manager removes it."""

    def __init__(self, daemon: DockerDaemon, name: str) -> None:
        self.daemon = daemon
        self.name = name

    def __repr__(self) -> str:
        return f"<DockerContainer {self.name} on {self.daemon.host_url}>"

    def exec(
        self, argv: Sequence[str], stdin: bytes | str | None = None, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """``docker exec -i NAME argv`` (output as str, not checked)."""
        data = stdin.encode() if isinstance(stdin, str) else stdin
        return self.daemon.docker(
            "exec", "-i", "--", self.name, *argv, stdin=data, timeout=timeout, check=False
        )

    def state(self) -> str:
        """``running``, ``exited``, ... as docker inspect says, or ``missing``."""
        done = self.daemon.docker(
            "container", "inspect", "--format", "{{.State.Status}}", "--", self.name, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else "missing"

    def stop(self) -> None:
        """``docker stop -t 0``: SIGKILL at once (the idle PID 1 ignores SIGTERM)."""
        self.daemon.docker("stop", "-t", "0", self.name)

    def remove(self) -> None:
        """``docker rm -f`` (no-op when it is gone already)."""
        self.daemon.docker("rm", "-f", self.name, check=False)

    def __enter__(self) -> DockerContainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def busybox_rootfs_tar() -> bytes:
    """A root filesystem as a tar: busybox, the libraries ``ldd`` names, a link per applet in
    /bin, /etc/passwd with root, and /tmp, /root, /proc, /sys, /dev."""
    ldd = subprocess.run(["ldd", BUSYBOX], capture_output=True, text=True, timeout=30, check=False)
    libraries = [] if ldd.returncode != 0 else _LDD_PATH.findall(ldd.stdout)  # static: none
    applets = subprocess.run(
        [BUSYBOX, "--list"], capture_output=True, text=True, timeout=30, check=True
    ).stdout.split()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for directory, mode in (
            ("bin", 0o755),
            ("etc", 0o755),
            ("root", 0o700),
            ("tmp", 0o1777),
            ("proc", 0o755),
            ("sys", 0o755),
            ("dev", 0o755),
        ):
            _add_dir(tar, directory, mode)
        _add_file(tar, "bin/busybox", Path(BUSYBOX).read_bytes(), 0o755)
        for library in libraries:
            parts = Path(library).parts[1:]
            for depth in range(1, len(parts)):
                _add_dir(tar, "/".join(parts[:depth]), 0o755)
            _add_file(tar, "/".join(parts), Path(library).resolve().read_bytes(), 0o755)
        _add_file(tar, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", 0o644)
        _add_file(tar, "etc/group", b"root:x:0:\n", 0o644)
        for applet in sorted(set(applets) - {"busybox"}):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            tar.addfile(link)
    return buffer.getvalue()


def _add_dir(tar: tarfile.TarFile, name: str, mode: int) -> None:
    if name in tar.getnames():
        return
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    tar.addfile(info)


def _add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def _unmount_under(base_dir: Path) -> None:
    """Lazy-unmount whatever dockerd left mounted under ``base_dir`` (a daemon that had to be
    killed), deepest first, so the directory can be removed."""
    prefix = str(base_dir.resolve()) + "/"
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    points = [
        line.split()[1].replace("\\040", " ")
        for line in lines
        if len(line.split()) > 1 and line.split()[1].startswith(prefix)
    ]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=30, check=False)
