"""A fleet of real OpenSSH "hosts" on one machine, plus the faults a fleet meets.

Each host is a real ``/usr/sbin/sshd`` running as PID 1 of its own mount, UTS and PID namespaces
(``unshare --mount --uts --pid --fork --kill-child --mount-proc --propagation private``), so it
has its own hostname (``h01``), its own ``/root`` (a bind mount of ``base_dir/hosts/h01/root``)
and its own ``/var/lib/lxc`` (``base_dir/hosts/h01/lxc``). All hosts share the machine's network
namespace and listen on ``127.0.X.N:2222`` (all of 127/8 is loopback). Not port 22: the machine's
own sshd usually listens on ``0.0.0.0:22``, which every ``127.0.X.N:22`` collides with
(``DFLASH_TESTBED_PORT`` picks another port). Needs root.

Typical use::

    with Fleet(tmp_path / "fleet", 3) as fleet:
        h1 = fleet.hosts[0]
        subprocess.run(fleet.client.ssh_argv(h1.alias, ["hostname"]))     # real OpenSSH: "h01"
        h1.exec(["sh", "-c", "mkdir -p /root/models"])                    # setup, no SSH
        h1.fill_disk("/root/models")                                      # writes now ENOSPC

Client-side files (generated once under ``base_dir/client``): ``id_ed25519`` (no passphrase),
``known_hosts`` (every host key), ``ssh_config`` (``Host h01`` aliases with HostName, Port, User
root, IdentityFile, UserKnownHostsFile, IdentitiesOnly, StrictHostKeyChecking yes).

Clean-up: ``stop()`` ends every namespace (the kernel kills everything in a PID namespace when its
PID 1 exits, and the mount namespace with its mounts goes with it). If the controlling Python
process dies without ``stop()``, the hosts die with it (``PR_SET_PDEATHSIG`` on ``unshare``, whose
``--kill-child`` passes it on to sshd). As a second line, ``Fleet.start()`` kills any process left
from an earlier run with the same ``base_dir`` (see ``kill_stale``), and only when no live process
owns that ``base_dir``: a running fleet holds an ``flock`` on ``base_dir/owner.lock`` from
``start()`` to ``stop()``, and the kernel drops it when its process dies. Nothing else is ever
killed: another run's hosts are not ours, whatever a lock file records.

Fleets in concurrent processes (pytest-xdist workers, other test runs) need different address
blocks: ``Fleet(..., address_prefix=None)`` picks a free ``127.0.X.`` block at ``start()`` and
holds it (an ``flock`` under LOCK_DIR) until ``stop()``. A block whose addresses are busy (a
leftover we may not kill) is skipped.

For users without root, ``single_user_sshd`` runs one sshd as the current user on a high port.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import getpass
import os
import secrets
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from testbed.tier import refuse_in_fast_tier

SSHD = "/usr/sbin/sshd"
#: For tests of the "openssh-server is not installed" path: the sshd the testbed runs (a path that
#: does not exist behaves like a machine without openssh-server). Unset: SSHD.
SSHD_ENV = "DFLASH_TESTBED_SSHD"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
DEFAULT_PREFIX = "127.0.1."
#: The port every fleet host listens on unless DFLASH_TESTBED_PORT says otherwise. Not 22: a
#: machine's own sshd on 0.0.0.0:22 holds port 22 on every loopback address.
DEFAULT_PORT = 2222
PORT_ENV = "DFLASH_TESTBED_PORT"
#: Held (flock) by the process running a fleet or single-user sshd under a base_dir.
OWNER_LOCK_NAME = "owner.lock"
#: Where address-block locks live; one file per block, held with flock while a fleet runs.
LOCK_DIR = Path(tempfile.gettempdir()) / "dflash-testbed-locks"
#: Name of the file ``fill_disk`` writes to eat the remaining space.
FILLER_NAME = ".testbed-filler"
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0

_PR_SET_PDEATHSIG = 1


class FleetError(RuntimeError):
    """The testbed could not do what was asked (sshd did not start, a mount failed, ...)."""


# --------------------------------------------------------------------------------------------
# prerequisites


#: The Debian/Ubuntu package that brings each tool the testbed runs.
_PACKAGE_OF = {
    "ssh": "openssh-client",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "lxc-create": "lxc",
    "lxc-start": "lxc",
    "lxc-attach": "lxc",
    "busybox": "busybox",
}


def sshd_path() -> str:
    """The sshd binary the testbed runs: SSHD, or the path in DFLASH_TESTBED_SSHD (tests)."""
    return os.environ.get(SSHD_ENV) or SSHD


def fleet_port() -> int:
    """The port fleet hosts listen on: DFLASH_TESTBED_PORT, else DEFAULT_PORT (2222)."""
    text = os.environ.get(PORT_ENV, "").strip()
    if not text:
        return DEFAULT_PORT
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise FleetError(f"{PORT_ENV} must be a TCP port number (1-65535), not {text!r}")
    return int(text)


def missing_prerequisites(*, need_root: bool = True, need_lxc: bool = False) -> str | None:
    """Why the testbed cannot run here (a sentence for pytest.skip), or None when it can."""
    if need_root and os.geteuid() != 0:
        return "needs root (namespaces and bind mounts for the fake hosts)"
    sshd = sshd_path()
    if not os.access(sshd, os.X_OK):
        return f"{sshd} not installed (apt-get install openssh-server)"
    tools = ["ssh", "unshare", "nsenter"] if need_root else ["ssh"]
    if need_lxc:
        tools += ["lxc-create", "lxc-start", "lxc-attach", "busybox"]
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        packages = sorted({_PACKAGE_OF.get(t, t) for t in missing})
        return f"not installed: {', '.join(missing)} (apt-get install {' '.join(packages)})"
    if need_lxc and not Path("/usr/share/lxc/templates/lxc-busybox").exists():
        return "LXC busybox template missing (apt-get install lxc)"
    return None


# --------------------------------------------------------------------------------------------
# keys and client files


def _ensure_ed25519(private_path: Path, comment: str) -> str:
    """Create an ed25519 key pair (no passphrase) unless it exists; return the public line."""
    pub_path = private_path.with_name(private_path.name + ".pub")
    if private_path.exists() and pub_path.exists():
        return pub_path.read_text().strip()
    key = Ed25519PrivateKey.generate()
    private_bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public_line = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
        + f" {comment}"
    )
    private_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private_bytes)
    pub_path.write_text(public_line + "\n")
    return public_line


def known_hosts_name(address: str, port: int) -> str:
    """The host field OpenSSH (and paramiko) look up: ``addr`` on port 22, else ``[addr]:port``."""
    return address if port == 22 else f"[{address}]:{port}"


@dataclass(frozen=True)
class ClientFiles:
    """The controller-side SSH client files for one fleet (or one single-user sshd)."""

    dir: Path
    identity: Path  # private key, id_ed25519
    public_key: str  # the line that goes into authorized_keys
    known_hosts: Path
    ssh_config: Path

    def ssh_argv(
        self, alias: str, argv: Sequence[str] | None = None, *, options: Sequence[str] = ()
    ) -> list[str]:
        """An OpenSSH client command line for ``alias``; ``argv`` is quoted for the remote shell.

        ``options`` are extra ``-o`` values, e.g. ``["ConnectTimeout=2"]``.
        """
        cmd = ["ssh", "-F", str(self.ssh_config)]
        for opt in options:
            cmd += ["-o", opt]
        cmd.append(alias)
        if argv:
            cmd += ["--", shlex.join(argv)]
        return cmd


def _write_client_files(client_dir: Path, endpoints: Sequence[SshEndpoint]) -> None:
    """(Re)write known_hosts and ssh_config for ``endpoints``; the identity already exists."""
    identity = client_dir / "id_ed25519"
    known = [f"{known_hosts_name(e.address, e.port)} {e.host_public_key}" for e in endpoints]
    (client_dir / "known_hosts").write_text("\n".join(known) + "\n")
    blocks = []
    for e in endpoints:
        blocks.append(
            f"Host {e.alias}\n"
            f"    HostName {e.address}\n"
            f"    Port {e.port}\n"
            f"    User {e.user}\n"
            f"    IdentityFile {identity}\n"
            f"    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {client_dir / 'known_hosts'}\n"
            f"    GlobalKnownHostsFile /dev/null\n"
            f"    StrictHostKeyChecking yes\n"
            f"    BatchMode yes\n"
            f"    ConnectTimeout 5\n"
        )
    (client_dir / "ssh_config").write_text("\n".join(blocks))


def _client_files(client_dir: Path) -> ClientFiles:
    identity = client_dir / "id_ed25519"
    public_key = _ensure_ed25519(identity, "dflash-testbed-client")
    return ClientFiles(
        dir=client_dir,
        identity=identity,
        public_key=public_key,
        known_hosts=client_dir / "known_hosts",
        ssh_config=client_dir / "ssh_config",
    )


def _sshd_config(
    *,
    address: str,
    port: int,
    host_key: Path,
    authorized_keys: Path,
    pid_file: str = "none",
) -> str:
    # Our own config, not Debian's: no AcceptEnv, no PAM, no motd, nothing slow or surprising.
    lines = [
        f"ListenAddress {address}",
        f"Port {port}",
        f"HostKey {host_key}",
        f"PidFile {pid_file}",
        f"AuthorizedKeysFile {authorized_keys}",
        "PubkeyAuthentication yes",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "AllowTcpForwarding yes",  # the vLLM runtime checks health through a port-forward
        "MaxStartups 100:30:200",
        "MaxSessions 100",
        "LoginGraceTime 30",
        "LogLevel INFO",
        f"Subsystem sftp {SFTP_SERVER}",
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# processes


def _die_with_parent(sig: int = signal.SIGKILL) -> None:
    """preexec_fn: send ``sig`` (default SIGKILL) to this child when the launching thread's
    process goes away."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


# PR_SET_PDEATHSIG fires when the *thread* that forked exits, so every launch goes through one
# long-lived thread: the hosts then live exactly as long as this Python process.
_launcher: ThreadPoolExecutor | None = None
_launcher_lock = threading.Lock()


def _popen(
    argv: list[str], *, stdout: Any, stderr: Any, death_signal: int = signal.SIGKILL
) -> subprocess.Popen[bytes]:
    """Start ``argv`` from the launcher thread; it gets ``death_signal`` when this process dies
    (SIGKILL; a daemon that must clean up after itself, as dockerd, asks for SIGTERM)."""
    global _launcher
    with _launcher_lock:
        if _launcher is None:
            _launcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="testbed-launcher")
    future = _launcher.submit(
        subprocess.Popen,
        argv,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        preexec_fn=functools.partial(_die_with_parent, death_signal),  # see _die_with_parent
        cwd="/",
    )
    return future.result(timeout=30)


def _process_table() -> list[tuple[int, int, list[str]]]:
    """(pid, ppid, argv) of every process; vanished processes are skipped."""
    table = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        # The command name may contain spaces and parentheses: split after the last ")".
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        table.append((int(entry), ppid, argv))
    return table


def _children_of(pid: int) -> list[int]:
    return [p for p, ppid, _ in _process_table() if ppid == pid]


def _listening(addresses: Sequence[tuple[str, int]]) -> set[tuple[str, int]]:
    """Which of ``addresses`` have a TCP socket in LISTEN state (reads /proc/net/tcp once)."""
    wanted = {
        f"{struct.unpack('=I', socket.inet_aton(a))[0]:08X}:{p:04X}": (a, p) for a, p in addresses
    }
    found = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            if fields[3] == "0A" and fields[1] in wanted:
                found.add(wanted[fields[1]])
    return found


def _port_is_free(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR like sshd: TIME_WAIT leftovers don't count, a listener does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] != b"Z"


class _OwnerLock:
    """An flock on ``base_dir/owner.lock``, held by the process whose fleet (or sshd) runs there.

    The kernel drops it when that process dies, so "the lock is free" proves that no live process
    owns the hosts under ``base_dir``; the file's text (the owner's pid) only names it in messages.
    """

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = Path(base_dir).resolve()
        self.path = self.base_dir / OWNER_LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock without waiting, or raise FleetError naming the live owner."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise FleetError(
                f"{self.base_dir} is in use by a running process (pid {owner}): its hosts are "
                "not ours to stop; use another directory or stop that run"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def _kill_under(base_dir: Path) -> list[int]:
    """SIGKILL testbed processes (unshare/sshd) whose command line names a file under base_dir.

    Only for a ``base_dir`` whose owner lock the caller holds.
    """
    marker = str(Path(base_dir).resolve()) + "/"
    killed = []
    for pid, _, argv in _process_table():
        if pid == os.getpid() or not argv:
            continue
        # sshd rewrites its argv ("sshd: /usr/sbin/sshd -D -f CFG [listener] ..."), so match
        # on the joined command line.
        cmdline = " ".join(argv)
        is_ours = cmdline.startswith(("sshd", SSHD, sshd_path(), "unshare"))
        if is_ours and marker in cmdline:
            _signal(pid, signal.SIGKILL)
            killed.append(pid)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while any(_pid_alive(p) for p in killed) and time.monotonic() < deadline:
        time.sleep(0.02)
    return killed


def kill_stale(base_dir: Path) -> list[int]:
    """SIGKILL what a dead run left under ``base_dir``: its unshare/sshd processes.

    A host's sshd is PID 1 of its namespace, so killing it takes everything in that host with it
    (sessions, LXC containers). Returns the pids signalled. Raises FleetError, killing nothing,
    while a live process owns ``base_dir`` (holds its owner lock): those hosts are running.
    """
    lock = _OwnerLock(base_dir)
    lock.acquire()
    try:
        return _kill_under(lock.base_dir)
    finally:
        lock.release()


# --------------------------------------------------------------------------------------------
# address blocks


class _AddressBlockLock:
    """An flock on LOCK_DIR/<prefix>lock, so two fleets never pick the same address block.

    The file records the holder's base_dir for messages only. Nothing is killed on its word: a
    record outlives its writer (a fleet that failed to start, a probe of a busy block), and the
    base_dir it names may by then belong to a live fleet on another block.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.path = LOCK_DIR / f"{prefix}lock"
        self._fd: int | None = None

    def try_acquire(self, base_dir: Path) -> bool:
        """Take the lock without waiting and record ``base_dir``; False when another holds it."""
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(base_dir).encode(), 0)
        self._fd = fd
        return True

    def holder(self) -> str:
        """The base_dir the lock file names (for messages), or '?'."""
        try:
            with open(self.path, "rb") as f:
                return f.read(4096).decode(errors="replace").strip() or "?"
        except OSError:
            return "?"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def _wildcard_listener(port: int) -> str | None:
    """``0.0.0.0:port`` or ``[::]:port`` when a socket listens on every address, else None.

    Such a listener (the machine's own sshd on port 22, typically) makes every 127.0.X.N:port
    busy, so no address block can work on that port.
    """
    wanted = f"{port:04X}"
    for table, any_address, shown in (
        ("/proc/net/tcp", "00000000", f"0.0.0.0:{port}"),
        ("/proc/net/tcp6", "0" * 32, f"[::]:{port}"),
    ):
        try:
            with open(table) as f:
                lines = f.read(4 << 20).splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A" and fields[1] == f"{any_address}:{wanted}":
                return shown
    return None


# --------------------------------------------------------------------------------------------
# endpoints


class SshEndpoint:
    """What a client needs to reach one sshd: alias, address, port, user, its host key."""

    name: str
    alias: str
    address: str
    port: int
    user: str
    host_public_key: str
    client: ClientFiles | None

    def ssh_argv(
        self, argv: Sequence[str] | None = None, *, options: Sequence[str] = ()
    ) -> list[str]:
        """A real OpenSSH command line reaching this host through its ssh_config."""
        if self.client is None:
            raise FleetError(f"{self.name}: no client files yet (start it first)")
        return self.client.ssh_argv(self.alias, argv, options=options)

    def ssh_target(self, path: str) -> str:
        """A target spec naming this host by address and port, without the ssh_config.

        ``user@address:path`` on port 22 (``root@127.0.1.3:/root/models/x``); on any other port
        the URL form, the only one that carries a port: ``ssh://root@127.0.1.3:2222/root/...``.
        """
        if self.port == 22:
            return f"{self.user}@{self.address}:{path}"
        return f"ssh://{self.user}@{self.address}:{self.port}{path}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.alias} {self.user}@{self.address}:{self.port}>"


class Host(SshEndpoint):
    """One fake host: a real sshd as PID 1 of its own mount/UTS/PID namespaces.

    Attributes: ``name`` (= hostname = ``alias`` in ssh_config), ``address``, ``port``, ``user``
    ("root"), ``dir`` (its files on the controller), ``root_dir`` (controller-side path of its
    /root), ``lxc_dir`` (controller-side path of its /var/lib/lxc), ``sshd_pid`` (as seen from
    the controller; None while stopped), ``log_path`` (sshd's -E log).

    Faults: ``stop()`` (refused), ``hang()`` (accepts, no banner), ``fill_disk()`` (ENOSPC),
    ``make_readonly()`` (EROFS). Mounts are per namespace: they vanish when the host stops.
    """

    def __init__(
        self, name: str, address: str, port: int, dir: Path, authorized_key: str, token: str
    ) -> None:
        self.name = name
        self.alias = name
        self.address = address
        self.port = port
        self.user = "root"
        self.dir = dir
        self.root_dir = dir / "root"
        self.lxc_dir = dir / "lxc"
        self.sbin_dir = dir / "sbin"
        self.log_path = dir / "sshd.log"
        self.config_path = dir / "sshd_config"
        #: LXC names made by the pct/incus emulators on this host start with this (see
        #: ``container_name``): containers on all fake hosts share one kernel, so names must be
        #: unique machine-wide.
        self.container_prefix = f"{token}-{name}-"
        self.sshd_pid: int | None = None
        #: The fleet's client files (key, known_hosts, ssh_config); set by Fleet.start().
        self.client: ClientFiles | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._mounts: list[str] = []
        self._emulators = False
        self._prepare(authorized_key)

    # -- files --------------------------------------------------------------------------------

    def _prepare(self, authorized_key: str) -> None:
        for d in (self.root_dir, self.lxc_dir, self.sbin_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.root_dir.chmod(0o700)
        host_key = self.dir / "ssh_host_ed25519_key"
        self.host_public_key = _ensure_ed25519(host_key, f"root@{self.name}")
        authorized = self.dir / "authorized_keys"
        authorized.write_text(authorized_key + "\n")
        # A minimal login environment: no .bashrc (root's real one is slow), a plain profile.
        profile = self.root_dir / ".profile"
        if not profile.exists():
            profile.write_text("# testbed host: minimal environment on purpose\n")
        self.config_path.write_text(
            _sshd_config(
                address=self.address,
                port=self.port,
                host_key=host_key,
                authorized_keys=authorized,
            )
        )

    # -- lifecycle ----------------------------------------------------------------------------

    def _launch(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        refuse_in_fast_tier(f"sshd host {self.name}")
        self.sshd_pid = None
        self._mounts = []
        script = (
            'hostname "$1" && mount --bind "$2" /root && mount --bind "$3" /var/lib/lxc'
            ' && exec "$4" -D -f "$5" -E "$6"'
        )
        argv = [
            "unshare",
            "--mount",
            "--uts",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            "sh",
            self.name,
            str(self.root_dir),
            str(self.lxc_dir),
            sshd_path(),
            str(self.config_path),
            str(self.log_path),
        ]
        with open(self.dir / "unshare.err", "wb") as err:
            self._proc = _popen(argv, stdout=subprocess.DEVNULL, stderr=err)

    def _check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            raise FleetError(
                f"{self.name}: sshd exited with {self._proc.returncode}: " + self._tail()
            )

    def _tail(self) -> str:
        texts = []
        for p in (self.dir / "unshare.err", self.log_path):
            with contextlib.suppress(OSError):
                texts.append(p.read_text(errors="replace")[-800:].strip())
        return " | ".join(t for t in texts if t) or "(no output)"

    def _after_ready(self) -> None:
        assert self._proc is not None
        children = _children_of(self._proc.pid)
        if len(children) != 1:
            raise FleetError(f"{self.name}: cannot find sshd under unshare pid {self._proc.pid}")
        self.sshd_pid = children[0]
        if self._emulators:
            self._mount_emulators()

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start (or restart after ``stop()``) this host and wait until its port listens."""
        self._launch()
        _wait_listening([self], timeout)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM the sshd (PID 1 of the namespace: everything in the host dies) and wait."""
        self._signal_stop()
        self._wait_stopped(timeout)

    def _signal_stop(self) -> None:
        if self.sshd_pid is not None:
            _signal(self.sshd_pid, signal.SIGCONT)  # a hung (stopped) sshd can't act on SIGTERM
            _signal(self.sshd_pid, signal.SIGTERM)
        elif self._proc is not None and self._proc.poll() is None:
            self._proc.kill()  # still starting: unshare's --kill-child takes the child along

    def _wait_stopped(self, timeout: float) -> None:
        if self._proc is not None:
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                if self.sshd_pid is not None:
                    _signal(self.sshd_pid, signal.SIGKILL)
                self._proc.kill()
                self._proc.wait(timeout)
        self._proc = None
        self.sshd_pid = None
        self._mounts = []

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def hang(self) -> None:
        """SIGSTOP the sshd: TCP connects still succeed (kernel backlog) but no banner comes."""
        self._require_running()
        assert self.sshd_pid is not None
        os.kill(self.sshd_pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Undo ``hang()``; connections queued meanwhile are then served."""
        self._require_running()
        assert self.sshd_pid is not None
        os.kill(self.sshd_pid, signal.SIGCONT)

    def _require_running(self) -> None:
        if self.sshd_pid is None or not self.running:
            raise FleetError(f"{self.name} is not running")

    # -- inside the host ----------------------------------------------------------------------

    def exec(
        self,
        argv: Sequence[str],
        stdin: bytes | str | None = None,
        timeout: float = 30,
        *,
        check: bool = False,
        text: bool = True,
    ) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` inside the host (its mounts, hostname and PID namespace), not via SSH.

        For test set-up and assertions. Output is str (``text=True``) or bytes; ``check=True``
        raises FleetError on a non-zero exit, with stderr in the message.
        """
        self._require_running()
        if isinstance(stdin, str):
            stdin = stdin.encode()
        cmd = ["nsenter", "-t", str(self.sshd_pid), "-m", "-u", "-p", "--", *argv]
        proc: subprocess.CompletedProcess[Any] = subprocess.run(
            cmd, input=stdin, capture_output=True, timeout=timeout, cwd="/"
        )
        if text:
            proc = subprocess.CompletedProcess(
                proc.args,
                proc.returncode,
                proc.stdout.decode(errors="replace"),
                proc.stderr.decode(errors="replace"),
            )
        if check and proc.returncode != 0:
            err = proc.stderr if text else proc.stderr.decode(errors="replace")
            raise FleetError(f"{self.name}: {shlex.join(argv)} exited {proc.returncode}: {err}")
        return proc

    def _sh(self, script: str, *args: str) -> None:
        self.exec(["sh", "-c", script, "sh", *args], check=True)

    def fill_disk(self, dir: str, size: str = "16k", *, fill: bool = True) -> None:
        """Mount a ``size`` tmpfs over ``dir`` inside the host, keeping the files already there.

        With ``fill`` (default) the rest of the space is taken by ``dir/.testbed-filler``
        (FILLER_NAME), so creating an empty file still works but writing any data fails with
        ENOSPC, as on a really full disk. ``dir`` is created if missing. Undo: ``undo_mounts()``
        (files written meanwhile vanish with the tmpfs).
        """
        script = r"""
set -e
d=$1
mkdir -p "$d"
keep=$(mktemp -d /tmp/.testbed-keep.XXXXXX)
cp -a "$d/." "$keep/"
mount -t tmpfs -o "size=$2" testbed-full "$d"
cp -a "$keep/." "$d/"
rm -rf "$keep"
if [ "$3" = 1 ]; then dd if=/dev/zero of="$d/$4" bs=1024 2>/dev/null || true; fi
"""
        self._sh(script, dir, size, "1" if fill else "0", FILLER_NAME)
        self._mounts.append(dir)

    def make_readonly(self, dir: str) -> None:
        """Make ``dir`` read-only inside the host (bind it onto itself, remount ro): EROFS."""
        self._sh(
            'set -e; mkdir -p "$1"; mount --bind "$1" "$1"; mount -o remount,bind,ro "$1"', dir
        )
        self._mounts.append(dir)

    def undo_mounts(self, *, lazy: bool = False) -> None:
        """Unmount what ``fill_disk``/``make_readonly`` mounted, newest first. ``lazy``: a
        mount still in use (a process has its working directory there) is detached at once and
        goes when the last user does (``umount -l``), instead of failing."""
        while self._mounts:
            self._sh(
                'umount "$1" || { [ "$2" = 1 ] && umount -l "$1"; }',
                self._mounts.pop(),
                "1" if lazy else "0",
            )

    # -- container CLI emulators ----------------------------------------------------------------

    def container_name(self, name: str | int) -> str:
        """The LXC name the ``pct``/``incus``/``lxc`` emulators on this host use for ``name``."""
        return f"{self.container_prefix}{name}"

    def install_container_cli_emulators(self) -> None:
        """Put emulated ``pct`` (Proxmox VE), ``incus``, ``lxc`` (LXD client) on the host's PATH.

        This is an emulation: Proxmox and Incus cannot run here. Small POSIX sh scripts over real
        LXC (``lxc-attach``/``lxc-info``/...) are bind-mounted over ``/usr/local/sbin`` inside
        the host. ``pct exec 101 -- cmd`` attaches to LXC container ``container_name(101)``.
        Behaviour and error texts: see ``testbed.lxc_host_side.emulator_scripts``.
        Survives ``stop()``/``start()`` (re-applied at start).
        """
        from testbed.lxc_host_side import emulator_scripts

        for existing in Path("/usr/local/sbin").iterdir():  # keep what the machine has there
            target = self.sbin_dir / existing.name
            if not target.exists():
                shutil.copy2(existing, target, follow_symlinks=False)
        for prog, text in emulator_scripts(self.container_prefix).items():
            path = self.sbin_dir / prog
            path.write_text(text)
            path.chmod(0o755)
        self._emulators = True
        if self.running:
            self._mount_emulators()

    def _mount_emulators(self) -> None:
        self._sh('mount --bind "$1" /usr/local/sbin', str(self.sbin_dir))


def _wait_listening(hosts: Sequence[Host], timeout: float) -> None:
    """Poll until every host's address:port is in LISTEN state, or raise FleetError."""
    pending = {(h.address, h.port): h for h in hosts}
    deadline = time.monotonic() + timeout
    while pending:
        for key in _listening(list(pending)):
            pending.pop(key)._after_ready()
        for h in pending.values():
            h._check_alive()
        if not pending:
            break
        if time.monotonic() > deadline:
            names = ", ".join(h.name for h in pending.values())
            raise FleetError(f"not listening after {timeout:.0f}s: {names}")
        time.sleep(0.005)


# --------------------------------------------------------------------------------------------
# the fleet


class Fleet:
    """``count`` hosts ``h01``... on ``<address_prefix><first_index + i>:<port>``. Needs root.

    ``port`` defaults to ``fleet_port()``: 2222, or DFLASH_TESTBED_PORT. Port 22 is possible but
    collides with the machine's own sshd whenever that listens on 0.0.0.0:22.

    Use as a context manager or call ``start()``/``stop()``. Files under ``base_dir``:
    ``client/`` (see ClientFiles), ``hosts/<name>/`` (host key, sshd_config, authorized_keys,
    sshd.log, ``root/``, ``lxc/``). Keys are generated once and reused on later starts.

    In tests pass ``address_prefix=None``: a free ``127.0.X.`` block is picked at ``start()``, so
    concurrent runs don't collide. One fleet per prefix at a time (enforced with a lock file),
    and one live process per ``base_dir`` (``owner.lock``; a second start there is refused).
    """

    def __init__(
        self,
        base_dir: Path,
        count: int,
        *,
        address_prefix: str | None = DEFAULT_PREFIX,
        first_index: int = 1,
        name_prefix: str = "h",
        port: int | None = None,
    ) -> None:
        if address_prefix is not None and not address_prefix.endswith("."):
            raise ValueError(f"address_prefix must end with '.': {address_prefix!r}")
        if first_index < 1 or first_index + count - 1 > 254:
            raise ValueError("host indexes must be within 1..254")
        self.base_dir = Path(base_dir).resolve()
        for hidden in ("/root", "/var/lib/lxc", "/usr/local/sbin"):
            if self.base_dir.is_relative_to(hidden):
                # Inside a host these paths are covered by bind mounts: sshd would not find its
                # config/keys there.
                raise ValueError(f"base_dir must not be under {hidden}: {self.base_dir}")
        self.count = count
        #: None until start() when the prefix is allocated automatically.
        self.address_prefix: str | None = address_prefix
        self._auto_prefix = address_prefix is None
        self.first_index = first_index
        self.name_prefix = name_prefix
        self.port = fleet_port() if port is None else port
        self.hosts: list[Host] = []
        self.client: ClientFiles | None = None
        self._lock: _AddressBlockLock | None = None
        self._owner: _OwnerLock | None = None

    def _token(self) -> str:
        path = self.base_dir / "token"
        if not path.exists():
            path.write_text(secrets.token_hex(2))
        return path.read_text().strip()

    def host(self, name: str) -> Host:
        """The host called ``name`` (e.g. "h02")."""
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def unused_address(self, offset: int = 1) -> str:
        """An address in this fleet's block where nothing listens (connections are refused)."""
        index = self.first_index + self.count - 1 + offset
        if index > 254:
            raise ValueError("no unused address left in this block")
        return f"{self.address_prefix}{index}"

    def _indexes(self) -> range:
        return range(self.first_index, self.first_index + self.count)

    def _acquire_block(self) -> None:
        """Lock the address block (choosing a free one when the prefix is automatic)."""
        if self._auto_prefix:
            for x in range(1, 255):
                lock = _AddressBlockLock(f"127.0.{x}.")
                if not lock.try_acquire(self.base_dir):
                    continue
                if all(_port_is_free(f"127.0.{x}.{i}", self.port) for i in self._indexes()):
                    self.address_prefix, self._lock = lock.prefix, lock
                    return
                lock.release()
                self._refuse_wildcard_port()
            raise FleetError("no free 127.0.X. address block (all locked or busy)")
        assert self.address_prefix is not None
        lock = _AddressBlockLock(self.address_prefix)
        if not lock.try_acquire(self.base_dir):
            holder = lock.holder()
            raise FleetError(
                f"address block {self.address_prefix}x is in use by another fleet ({holder}); "
                "pass address_prefix=None to get a free one"
            )
        self._lock = lock

    def _refuse_wildcard_port(self) -> None:
        """Raise FleetError when a listener on every address holds our port (no block can work)."""
        listener = _wildcard_listener(self.port)
        if listener is not None:
            raise FleetError(
                f"port {self.port} is taken on every address by a listener on {listener} "
                f"(another sshd?): set {PORT_ENV} to a free port"
            )

    def start(self, timeout: float = START_TIMEOUT_S) -> Fleet:
        """Generate files (once), launch every host at once, wait until all listen."""
        refuse_in_fast_tier(f"a fleet of {self.count} sshd hosts")
        reason = missing_prerequisites()
        if reason:
            raise FleetError(f"cannot start a fleet: {reason}")
        owner = _OwnerLock(self.base_dir)
        owner.acquire()  # refused while a live process runs a fleet here
        self._owner = owner
        try:
            _kill_under(self.base_dir)  # what a dead run left here: provably nobody's now
            self._acquire_block()
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
            self.client = _client_files(self.base_dir / "client")
            token = self._token()
            self.hosts = []
            for i in range(self.count):
                index = self.first_index + i
                name = f"{self.name_prefix}{index:02d}"
                address = f"{self.address_prefix}{index}"
                if not _port_is_free(address, self.port):
                    self._refuse_wildcard_port()
                    raise FleetError(f"{address}:{self.port} is already in use")
                self.hosts.append(
                    Host(
                        name,
                        address,
                        self.port,
                        self.base_dir / "hosts" / name,
                        self.client.public_key,
                        token,
                    )
                )
            _write_client_files(self.client.dir, self.hosts)
            for h in self.hosts:
                h.client = self.client
            for h in self.hosts:
                h._launch()
            _wait_listening(self.hosts, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop every host (all signalled first, then waited for), release the address block."""
        try:
            for h in self.hosts:
                h._signal_stop()
            for h in self.hosts:
                h._wait_stopped(timeout)
            from testbed.lxc_host_side import remove_leftover_cgroups

            for h in self.hosts:
                remove_leftover_cgroups(p.name for p in h.lxc_dir.iterdir() if p.is_dir())
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None
            if self._owner is not None:
                self._owner.release()
                self._owner = None

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)


# --------------------------------------------------------------------------------------------
# faults without sshd


class BlackholeHost:
    """A TCP port that accepts connections and never says a word (a hung host without sshd).

    ``with BlackholeHost("127.0.1.200") as bh: ...`` then connect to ``bh.address:bh.port``:
    the TCP handshake completes (kernel backlog), the SSH banner never comes. ``port=0`` picks a
    free port.
    """

    def __init__(self, address: str = "127.0.0.1", port: int = 0, backlog: int = 128) -> None:
        self.address = address
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((address, port))
        self._sock.listen(backlog)  # never accept(): the kernel still completes handshakes
        self.port: int = self._sock.getsockname()[1]

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> BlackholeHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def refused_address(port: int | None = None) -> tuple[str, int]:
    """An (address, port) where nothing listens right now: connecting is refused at once.

    ``port`` defaults to the fleet port (``fleet_port()``).
    """
    port = fleet_port() if port is None else port
    for x in range(200, 255):
        address = f"127.0.254.{x}"
        if _port_is_free(address, port):
            return address, port
    raise FleetError("no free address found in 127.0.254.200-254")


# --------------------------------------------------------------------------------------------
# fallback for users without root


class SingleUserSshd(SshEndpoint):
    """One sshd running as the current user on ``127.0.0.1:<port>``, without namespaces.

    Works without root (and as root, since the port is above 1024). Logs in as the current
    user with their real home directory and shell profile. ``client`` holds the key,
    known_hosts (``[127.0.0.1]:port`` form) and an ssh_config with alias ``alias``.
    ``address="0.0.0.0", port=22`` (root) plays a machine's own sshd listening everywhere.
    """

    def __init__(
        self,
        base_dir: Path,
        port: int = 0,
        *,
        alias: str = "testbed",
        address: str = "127.0.0.1",
    ) -> None:
        self.base_dir = Path(base_dir).resolve()
        self.name = alias
        self.alias = alias
        self.address = address
        self.port = port or _free_port(self.address)
        self.user = getpass.getuser()
        self.log_path = self.base_dir / "sshd.log"
        self.pid_file = self.base_dir / "sshd.pid"
        self.config_path = self.base_dir / "sshd_config"
        self.client: ClientFiles | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner: _OwnerLock | None = None

    def start(self, timeout: float = START_TIMEOUT_S) -> SingleUserSshd:
        """Start sshd and wait until it listens; a no-op when this object's sshd already runs
        (``with single_user_sshd(...)`` starts it, then ``__enter__`` asks again)."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        refuse_in_fast_tier("a single-user sshd")
        reason = missing_prerequisites(need_root=False)
        if reason:
            raise FleetError(f"cannot start sshd: {reason}")
        owner = _OwnerLock(self.base_dir)
        owner.acquire()  # refused while a live process runs an sshd here
        self._owner = owner
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        _kill_under(self.base_dir)  # what a dead run left here: provably nobody's now
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.client = _client_files(self.base_dir / "client")
        host_key = self.base_dir / "ssh_host_ed25519_key"
        self.host_public_key = _ensure_ed25519(host_key, f"{self.user}@testbed")
        authorized = self.base_dir / "authorized_keys"
        authorized.write_text(self.client.public_key + "\n")
        self.config_path.write_text(
            _sshd_config(
                address=self.address,
                port=self.port,
                host_key=host_key,
                authorized_keys=authorized,
                pid_file=str(self.pid_file),
            )
        )
        _write_client_files(self.client.dir, [self])
        argv = [sshd_path(), "-D", "-f", str(self.config_path), "-E", str(self.log_path)]
        with open(self.base_dir / "sshd.err", "wb") as err:
            self._proc = _popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + timeout
        while not _listening([(self.address, self.port)]):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
                raise FleetError(f"sshd on port {self.port} did not start: {log[-800:]}")
            time.sleep(0.005)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        try:
            if self._proc is None:
                return
            self._proc.terminate()
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout)
            self._proc = None
        finally:
            if self._owner is not None:
                self._owner.release()
                self._owner = None

    def __enter__(self) -> SingleUserSshd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def single_user_sshd(base_dir: Path, port: int = 0, *, alias: str = "testbed") -> SingleUserSshd:
    """Start and return a SingleUserSshd (``port=0``: a free high port). Stop it with ``stop()``."""
    return SingleUserSshd(base_dir, port, alias=alias).start()


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])
