"""Lifecycle safety (issue #17 item 8), for real: sshd hosts in namespaces and an LXC busybox
container behind one, the vLLM stand-in as ``vllm`` (its ``lifecycle`` control modes: a server
that ignores SIGTERM, one that starts a setsid() child and a double-forked daemon).

- ``launch --restart`` refuses before it stops anything (a bad ``--env`` value);
- ``stop`` ends every process of the server, also those that left its process group, and says
  which;
- a pidfile that does not name the launch's server is never signalled;
- the state directory must be the login user's own (no symlink, mode 0700);
- Ctrl-C during the readiness wait leaves the server starting and names the stop command;
- a port held by a process this login cannot see is reported as exactly that.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.hosts import Host
from testbed.lxc import Container
from testbed.vllm_standin_install import (
    CONTROL_ENV,
    install_standin,
    standin_container,
    write_control,
)
from tests.fixtures.cli import Cli, cli_env
from tests.fixtures.lifecycle_bed import READY_TIMEOUT, STATE, Bed, error_line, make_bed
from tests.fixtures.login_users import (
    LoginUser,
    add_private_login_users,
    fleet_for_any_user,
    free_uids,
)
from tests.fixtures.runtime import DRAFTER_DIR, REFERENCE, TARGET_DIR, free_port, put

pytestmark = [pytest.mark.integration, pytest.mark.root]

CONTROL = "/root/standin/control.json"


@pytest.fixture
def bed(ssh_host: Host, tmp_path: Path) -> Iterator[Bed]:
    """One host, the stand-in, the drafter, a CLI (tests/fixtures/lifecycle_bed.py)."""
    yield make_bed(ssh_host, tmp_path)


@pytest.fixture
def container_bed(bed: Bed) -> Iterator[tuple[Bed, Container]]:
    """The same inside an LXC busybox container behind the host."""
    container = standin_container(bed.host)
    try:
        bed.standin = install_standin(container, "/root/standin", verify=False)
        for path, data in (
            (f"{DRAFTER_DIR}/config.json", REFERENCE),
            (f"{TARGET_DIR}/config.json", samples.REFERENCE_TARGET.read_bytes()),
        ):
            container.attach(["sh", "-c", 'mkdir -p "${1%/*}" && cat > "$1"', "sh", path], data)
        yield bed, container
    finally:
        container.destroy()


def alive(bed: Bed, pid: int, container: Container | None = None) -> bool:
    """``pid`` exists (and is not a zombie) in the host or the container: read from /proc."""
    script = 'read -r line < /proc/"$1"/stat 2>/dev/null && set -- ${line##*) } && echo "$1"'
    if container is not None:
        out = str(container.attach(["sh", "-c", script, "sh", str(pid)]).stdout)
    else:
        out = bed.sh(script, str(pid))
    return out.strip() not in ("", "Z", "X")


def pidfile(bed: Bed, container: Container | None = None) -> list[str]:
    path = f"{STATE}/{bed.port}/pid"
    if container is not None:
        out = str(container.attach(["sh", "-c", 'cat "$1" 2>/dev/null || true', "sh", path]).stdout)
    else:
        out = bed.sh('cat "$1" 2>/dev/null || true', path)
    return out.split()


def hostile(bed: Bed, container: Container | None = None, **modes: object) -> dict[str, str]:
    """A control file with the stand-in's lifecycle ``modes``; the env that points at it."""
    place = container if container is not None else bed.host
    write_control(place, CONTROL, {"lifecycle": modes})
    return {CONTROL_ENV: CONTROL}


def read_child(bed: Bed, path: str, container: Container | None = None) -> int:
    """The pid a stand-in child wrote to ``path`` (it writes it before the server is ready)."""
    if container is not None:
        text = str(container.attach(["sh", "-c", 'cat "$1"', "sh", path]).stdout)
    else:
        text = bed.sh('cat "$1"', path)
    return int(text.strip())


# --------------------------------------------------------------------------------------------
# --restart refuses before it stops


def test_restart_with_a_bad_env_value_leaves_the_old_server_running(bed: Bed) -> None:
    assert bed.launch().returncode == 0
    first = bed.pid()
    assert first is not None

    refused = bed.launch("--restart", "--num-speculative-tokens", "4", env={"BAD": "one\ntwo"})
    assert bed.pid() == first and alive(bed, first), "the refused restart stopped the server"
    line = error_line(refused, ExitCode.USAGE)
    assert "--env BAD" in line and "line break" in line
    assert "keeps running" in line and f"pid {first}" in line
    status = bed.run("status")
    assert status.returncode == 0 and "ready" in status.stdout, status.stdout


# --------------------------------------------------------------------------------------------
# stop ends everything the server started


def test_stop_ends_a_setsid_child_and_a_double_forked_daemon_and_says_so(bed: Bed) -> None:
    env = hostile(bed, setsid_child="/root/standin/child.pid", daemon_child="/root/standin/d.pid")
    assert bed.launch(env=env).returncode == 0
    server = bed.pid()
    child = read_child(bed, "/root/standin/child.pid")
    daemon = read_child(bed, "/root/standin/d.pid")
    assert server is not None and alive(bed, child) and alive(bed, daemon)
    # Both left the server's process group and session (the daemon also its parent).
    for pid in (child, daemon):
        pgid, sid = bed.sh('ps -o pgid=,sid= -p "$1"', str(pid)).split()
        assert int(pgid) != server and int(sid) != server

    stopped = bed.run("stop", "--timeout", "20")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert not alive(bed, child) and not alive(bed, daemon) and not alive(bed, server)
    ended = next(line for line in stopped.stdout.splitlines() if "ended" in line)
    for pid in (server, child, daemon):
        assert f" {pid}" in ended, stopped.stdout
    assert "marker" in ended and "process group" in ended
    assert "3 processes" in stopped.stdout and "by SIGTERM" in stopped.stdout, stopped.stdout


def test_a_server_that_ignores_sigterm_is_killed_after_the_timeout(bed: Bed) -> None:
    assert bed.launch(env=hostile(bed, ignore_sigterm=True)).returncode == 0
    server = bed.pid()
    assert server is not None
    stopped = bed.run("stop", "--timeout", "1")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "SIGKILL (SIGTERM was not enough)" in stopped.stdout
    assert f"ended       {server}" in stopped.stdout
    assert not alive(bed, server) and bed.pid() is None


# --------------------------------------------------------------------------------------------
# a pidfile that does not name the server is never signalled


def _sleeper(bed: Bed) -> tuple[int, str]:
    """A process of its own (setsid sleep) on the host: its pid and start time."""
    out = bed.sh(
        "setsid sleep 600 </dev/null >/dev/null 2>&1 & p=$!; sleep 0.3; "
        'read -r l < /proc/$p/stat; set -- ${l##*) }; shift 19; echo "$p $1"'
    )
    pid, stime = out.split()
    return int(pid), stime


@pytest.mark.parametrize("case", ["no-start-time", "pid-0", "pid-1", "start-time", "argv"])
def test_a_pidfile_that_does_not_name_the_server_is_never_signalled(bed: Bed, case: str) -> None:
    assert bed.launch().returncode == 0
    fields = pidfile(bed)
    pid, stime = fields[:2]
    marker = fields[2] if len(fields) > 2 else ""
    named = int(pid)  # the process the tampered pidfile names, which must stay alive
    if case == "no-start-time":
        text, why = f"{pid}\n", "no start time"
    elif case == "pid-0":
        text, why, named = f"0 {stime} {marker}\n", "pid 0", int(pid)
    elif case == "pid-1":
        text, why, named = f"1 {stime} {marker}\n", "pid 1", int(pid)
    elif case == "start-time":
        text, why = f"{pid} 1 {marker}\n", "another process has that pid now"
    else:
        named, other_stime = _sleeper(bed)
        text, why = f"{named} {other_stime} {marker}\n", "not the command line"
    bed.sh('printf "%s" "$1" > "$2"', text, f"{STATE}/{bed.port}/pid")

    stop = bed.run("stop", "--timeout", "1")
    assert alive(bed, named) and alive(bed, int(pid)), "a process was signalled"
    assert stop.returncode == ExitCode.NOT_RUNNING, stop.stdout + stop.stderr
    assert "not stopped" in stop.stdout and why in stop.stdout
    assert "nothing was signalled" in stop.stdout
    status = bed.run("status")
    assert "not trusted, never signalled" in status.stdout and why in status.stdout


# --------------------------------------------------------------------------------------------
# the state directory is the login user's own


@pytest.mark.parametrize("case", ["symlink", "other-owner", "mode-755"])
def test_an_unsafe_state_directory_is_refused(bed: Bed, case: str) -> None:
    sdir = f"{STATE}/{bed.port}"
    if case == "symlink":
        # A link to a perfectly private directory elsewhere: the link itself is the problem.
        bed.sh(
            'umask 077 && mkdir -p /root/elsewhere "${1%/*}" && ln -s /root/elsewhere "$1"', sdir
        )
        why = "is a symlink"
    elif case == "other-owner":
        bed.sh('umask 077 && mkdir -p "$1" && chown 65534:65534 "$1"', sdir)
        why = "owned by uid 65534"
    else:
        bed.sh('umask 077 && mkdir -p "$1" && chmod 755 "$1"', sdir)
        why = "mode 755, not 0700"
    refused = bed.launch()
    line = error_line(refused, ExitCode.REMOTE_FAILED)
    assert "refusing the state directory" in line and why in line
    assert "pid" not in bed.sh('ls "$1"/ 2>/dev/null || true', sdir).split()
    if case == "symlink":
        assert bed.sh("ls -A /root/elsewhere").split() == []  # nothing written through it
    for command in ("status", "stop", "logs"):
        error_line(bed.run(command), ExitCode.REMOTE_FAILED)


# --------------------------------------------------------------------------------------------
# Ctrl-C during the readiness wait


def test_ctrl_c_during_the_readiness_wait_leaves_the_server_starting_and_names_stop(
    bed: Bed,
) -> None:
    write_control(bed.host, CONTROL, {"startup_delay_s": 60})
    args = [
        sys.executable,
        "-m",
        "dflash_provision",
        "launch",
        bed.target,
        "--model",
        TARGET_DIR,
        "--from",
        str(bed.authority),
        "--vllm",
        bed.standin.vllm,
        "--port",
        str(bed.port),
        "--ready-timeout",
        READY_TIMEOUT,
        "--no-check",
        "--env",
        f"{CONTROL_ENV}={CONTROL}",
        *bed.ssh(),
    ]
    env = cli_env(home=bed.cli.workdir / "home")
    proc = subprocess.Popen(
        args,
        cwd=bed.cli.workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stderr is not None
    stderr = proc.stderr

    def read_all() -> None:
        for line in stderr:
            lines.put(line)

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        while not any("waiting for the server" in line for line in seen):
            seen.append(lines.get(timeout=120))  # bounded: a hung launch fails the test
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        assert proc.stdout is not None
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    while not lines.empty():
        seen.append(lines.get())
    err = "".join(seen)
    assert proc.returncode == 130, out + err
    assert "keeps starting" in err
    assert f"dflash-provision stop {bed.target} --port {bed.port}" in err
    server = bed.pid()
    assert server is not None and alive(bed, server), "Ctrl-C must leave the server starting"
    assert f"pid {server}" in err
    stopped = bed.run("stop", "--timeout", "10")
    assert stopped.returncode == 0 and not alive(bed, server)


# --------------------------------------------------------------------------------------------
# a port held by a process this login cannot see


@pytest.fixture(scope="module")
def user_host() -> Iterator[tuple[Host, LoginUser]]:
    with fleet_for_any_user(1) as fleet:
        host = fleet.host("h01")
        user = LoginUser("dfplife", free_uids(1)[0])
        add_private_login_users(host, [user])
        yield host, user


def test_a_port_held_by_a_process_the_login_cannot_see_is_reported_as_such(
    user_host: tuple[Host, LoginUser], tmp_path: Path
) -> None:
    host, user = user_host
    port = free_port()
    # root's own server on the host: the plain login sees the socket, not its process.
    started = host.exec(
        [
            "sh",
            "-c",
            'setsid python3 -m http.server --bind 127.0.0.1 "$1" </dev/null >/dev/null 2>&1 & '
            'echo "$!"',
            "sh",
            str(port),
        ],
        check=True,
    )
    root_server = int(str(started.stdout).strip())
    # A drafter, a target config and the stand-in where the login can read them.
    base = host.dir / "lifecycle"
    drafter, target, standin_dir = base / "drafter", base / "target", str(base / "standin")
    put(host, f"{drafter}/config.json", REFERENCE)
    put(host, f"{target}/config.json", samples.REFERENCE_TARGET.read_bytes())
    standin = install_standin(host, standin_dir, verify=False)
    host.exec(["chmod", "-R", "a+rX", str(base)], check=True)
    authority = tmp_path / "authoritative.json"
    authority.write_bytes(REFERENCE)
    assert host.client is not None
    ssh = ["--ssh-config", str(host.client.ssh_config), "--no-agent"]
    cli = Cli(tmp_path)
    spec = f"{user.name}@{host.alias}:{drafter}"
    try:
        for _ in range(100):  # until root's server listens (bounded; no timing asserted)
            if (
                cli.run("status", f"{host.alias}:{drafter}", "--port", str(port), *ssh).returncode
                == 0
            ):
                break
        status = cli.run("status", spec, "--port", str(port), *ssh)
        assert status.returncode == ExitCode.PORT_TAKEN, status.stdout + status.stderr
        assert "held by a process this login cannot see" in status.stdout
        launch = cli.run(
            "launch",
            spec,
            "--model",
            str(target),
            "--from",
            str(authority),
            "--vllm",
            standin.vllm,
            "--port",
            str(port),
            "--no-check",
            *ssh,
        )
        line = error_line(launch, ExitCode.PORT_TAKEN)
        assert "held by a process this login cannot see" in line
        stop = cli.run("stop", spec, "--port", str(port), *ssh)
        assert stop.returncode == ExitCode.NOT_RUNNING
        assert "a process this login cannot see" in stop.stdout
    finally:
        host.exec(["kill", str(root_server)])


# --------------------------------------------------------------------------------------------
# the same inside an LXC container behind the host


@pytest.mark.lxc
def test_inside_an_lxc_container_restart_refuses_first_and_stop_ends_every_process(
    container_bed: tuple[Bed, Container],
) -> None:
    bed, container = container_bed
    target = f"{bed.host.alias}/lxc:{container.name}:{DRAFTER_DIR}"
    python = ["--python", bed.standin.python]
    env = hostile(
        bed, container, setsid_child="/root/standin/child.pid", daemon_child="/root/standin/d.pid"
    )
    launched = bed.launch(*python, target=target, env=env)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    server = int(pidfile(bed, container)[0])
    child = read_child(bed, "/root/standin/child.pid", container)
    daemon = read_child(bed, "/root/standin/d.pid", container)

    refused = bed.launch(*python, "--restart", target=target, env={**env, "BAD": "a\nb"})
    assert alive(bed, server, container), "the refused restart stopped the server"
    assert int(pidfile(bed, container)[0]) == server
    line = error_line(refused, ExitCode.USAGE)
    assert f"pid {server}" in line and "keeps running" in line

    stopped = bed.run("stop", target=target)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    for pid in (server, child, daemon):
        assert not alive(bed, pid, container), f"pid {pid} survived stop: {stopped.stdout}"
        assert f" {pid}" in stopped.stdout

    # A pidfile naming pid 0 in there is not signalled either; a 0755 state dir is refused.
    sdir = f"{STATE}/{bed.port}"
    container.attach(["sh", "-c", 'printf "0 1\\n" > "$1/pid"', "sh", sdir])
    zero = bed.run("stop", target=target)
    assert zero.returncode == ExitCode.NOT_RUNNING and "pid 0" in zero.stdout
    container.attach(["sh", "-c", 'chmod 755 "$1"', "sh", sdir])
    line = error_line(bed.run("status", target=target), ExitCode.REMOTE_FAILED)
    assert "refusing the state directory" in line and "mode 755" in line
