"""What the stress programs share: configs, the real CLI in a subprocess, host process faults.

Everything here drives real parts: the testbed's sshd hosts (``testbed/hosts.py``), busybox LXC
containers inside them (``testbed/lxc.py``) and ``python -m dflash_provision`` processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dflash_provision.transport.options import SshOptions
from testbed import samples
from testbed.hosts import Fleet, Host, missing_prerequisites

MODEL = "/root/models/Qwen3.6-27B-DFlash"
REPO_ROOT = Path(__file__).resolve().parents[2]


def require_testbed(*, need_lxc: bool = False) -> None:
    """Exit 2 with the reason when the real testbed cannot run here (not root, no sshd...)."""
    reason = missing_prerequisites(need_lxc=need_lxc)
    if reason:
        sys.exit(f"stress: cannot run: {reason}")


def restore_sigint() -> None:
    """Let the CLI processes we start meet Ctrl-C: a shell's background job (``cmd &``, nohup)
    starts with SIGINT ignored, and an ignored signal stays ignored across exec, so a SIGINT
    sent to the CLI would do nothing. A handler here is reset to the default in the child."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def configs(count: int, *, first_indent: int = 1) -> list[bytes]:
    """``count`` distinct valid configs: the reference drafter config, indented differently.

    Different bytes, the same meaning: every one passes validation, and a torn or mixed file is
    seen at once (it is none of them, and usually not JSON).
    """
    obj = json.loads(samples.REFERENCE_DRAFTER.read_bytes())
    return [(json.dumps(obj, indent=first_indent + i) + "\n").encode() for i in range(count)]


def big_config(size: int = 64 * 1024) -> bytes:
    """A valid config of at least ``size`` bytes (a wide indent), so a write can run out of
    space part way through on a small tmpfs (whose space comes in 4 KiB pages)."""
    obj = json.loads(samples.REFERENCE_DRAFTER.read_bytes())
    indent = 1
    while True:
        data = (json.dumps(obj, indent=indent) + "\n").encode()
        if len(data) >= size:
            return data
        indent *= 2


def warm_verdicts(home: Path, datas: Sequence[bytes]) -> None:
    """Validate each config once in this process with ``home`` as the data directory, so the
    CLI processes find the verdict cached (no ~2-5 s transformers import per trial)."""
    from dflash_provision.place.push import check_authority
    from dflash_provision.source.authority import Authority

    os.environ["DFLASH_PROVISION_HOME"] = str(home)
    for data in datas:
        check_authority(Authority(label="stress", data=data), force=False)


def ssh_options(fleet: Fleet, *, connect: float = 5.0, command: float = 30.0) -> SshOptions:
    """Core-API SSH options for a testbed fleet (its key, known_hosts and ssh_config only)."""
    assert fleet.client is not None
    return SshOptions(
        connect_timeout=connect,
        banner_timeout=connect,
        auth_timeout=connect,
        command_timeout=command,
        ssh_config_path=str(fleet.client.ssh_config),
        known_hosts_path=str(fleet.client.known_hosts),
        identity_files=(str(fleet.client.identity),),
        use_agent=False,
        identities_only=True,
    )


def connection_flags(fleet: Fleet) -> list[str]:
    """The CLI flags that reach a testbed fleet."""
    assert fleet.client is not None
    return [
        "-F",
        str(fleet.client.ssh_config),
        "--known-hosts",
        str(fleet.client.known_hosts),
        "--identity",
        str(fleet.client.identity),
        "--no-agent",
    ]


def cli_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DFLASH_PROVISION_DEBUG"}
    env["DFLASH_PROVISION_HOME"] = str(home)
    return env


def cli_popen(args: Sequence[str], home: Path, workdir: Path) -> subprocess.Popen[bytes]:
    """Start ``dflash-provision ARGS`` as a user would (a fresh interpreter), output captured."""
    return subprocess.Popen(
        [sys.executable, "-m", "dflash_provision", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=workdir,  # no stray ./dflash.lock is picked up
        env=cli_env(home),
    )


@dataclass
class Finished:
    """A CLI process that ended: exit code, output, and its own peak memory."""

    pid: int
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    maxrss_kib: int


def wait_cli(proc: subprocess.Popen[bytes], started: float, timeout: float) -> Finished | None:
    """Collect ``proc`` (reading its pipes) within ``timeout``; None if it did not end then
    (it is SIGKILLed and reaped, so nothing is left behind)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None
    return Finished(
        proc.pid,
        proc.returncode,
        out.decode(errors="replace"),
        err.decode(errors="replace"),
        time.monotonic() - started,
        0,
    )


def run_measured(argv: Sequence[str], home: Path, workdir: Path, timeout: float) -> Finished:
    """Run a CLI process to its end and take its peak RSS from wait4 (its own, not siblings')."""
    started = time.monotonic()
    out_path, err_path = workdir / "measured.out", workdir / "measured.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dflash_provision", *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            cwd=workdir,
            env=cli_env(home),
        )
        deadline = started + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)  # already reaped: tell Popen
    return Finished(
        proc.pid,
        proc.returncode,
        out_path.read_text(errors="replace"),
        err_path.read_text(errors="replace"),
        time.monotonic() - started,
        usage.ru_maxrss,  # KiB on Linux
    )


# --------------------------------------------------------------------------------------------
# processes inside a testbed host (seen from the controller)


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (all its threads), from /proc; [] when it is gone."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(p) for p in f.read().split()]
        except OSError:
            continue
    return found


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def sessions(host: Host) -> list[int]:
    """The host's per-connection sshd processes: children of its listening sshd that are sshd
    (an LXC monitor that daemonized is a child too: the listener is the namespace's init)."""
    found = []
    for pid in children(host.sshd_pid) if host.sshd_pid is not None else []:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(b"sshd"):
                    found.append(pid)
        except OSError:
            continue
    return found


def kill_pids(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def freeze(host: Host) -> list[int]:
    """SIGSTOP everything in the host: its sshd, every session, the scripts and containers
    they run. Returns what was stopped (for ``thaw``)."""
    assert host.sshd_pid is not None
    frozen: list[int] = []
    # Twice: a process forked while the first pass ran is caught by the second.
    for _ in range(2):
        pids = [host.sshd_pid, *descendants(host.sshd_pid)]
        kill_pids([p for p in pids if p not in frozen], signal.SIGSTOP)
        frozen += [p for p in pids if p not in frozen]
    return frozen


def thaw(pids: Sequence[int]) -> None:
    kill_pids(pids, signal.SIGCONT)


def scripts(host: Host) -> list[int]:
    """The dflash scripts running on ``host`` (their argv names them ``dflash-NAME``), a
    session's or an orphan's: a session whose client was killed can end before its script."""
    found = []
    for pid in descendants(host.sshd_pid) if host.sshd_pid is not None else []:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"\0dflash-" in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def wait_sessions_gone(host: Host, timeout: float) -> bool:
    """Wait until no session and no remote script runs on ``host``; False at timeout."""
    deadline = time.monotonic() + timeout
    while sessions(host) or scripts(host):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def start_fleet(base: Path, count: int) -> Fleet:
    fleet = Fleet(base, count, address_prefix=None)
    fleet.start(timeout=120)
    return fleet


def seed(host: Host, data: bytes, model: str = MODEL) -> None:
    directory = host.root_dir / model.removeprefix("/root/")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_bytes(data)


def line(label: str, value: object) -> None:
    print(f"{label:<44} {value}", flush=True)
