"""`launch`, `status`, `stop`, `logs` for real: the CLI in a subprocess against sshd hosts in
namespaces (and an LXC busybox container inside one), with the vLLM STAND-IN installed as the
``vllm`` command there (testbed.vllm_standin_install). The stand-in loads the
drafter with real transformers and applies vLLM's DFlash start-up rules.

Each fake host shares the machine's network namespace, so every test takes a free port here.
A launched server lives in its host's PID namespace: stopping the host ends anything a failed
test left behind.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.hosts import Host
from testbed.lxc import Container
from testbed.vllm_standin_install import (
    CONTROL_ENV,
    StandinInstall,
    install_standin,
    standin_container,
    write_control,
)
from tests.fixtures.lifecycle_bed import READY_TIMEOUT, STATE, Bed, error_line, make_bed
from tests.fixtures.runtime import DRAFTER_DIR, INCIDENT, REFERENCE, TARGET_DIR, put

pytestmark = [pytest.mark.integration, pytest.mark.root]


@pytest.fixture
def bed(ssh_host: Host, tmp_path: Path) -> Iterator[Bed]:
    yield make_bed(ssh_host, tmp_path)


# --------------------------------------------------------------------------------------------
# a good launch


def test_launch_over_ssh_serves_and_keeps_running_after_the_session_ends(bed: Bed) -> None:
    proc = bed.launch(env={"HF_TOKEN": "s3cret-value"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "started: vLLM 0.32.0+dflash-standin ready" in proc.stdout
    # The reference drafter mixes 4 sliding layers with a full one: the V2 runner is asked for.
    assert "env added   VLLM_USE_V2_MODEL_RUNNER" in proc.stdout

    # The CLI process (and its SSH connection) is gone; the server still runs and answers.
    pid = bed.pid()
    assert pid is not None and bed.group(pid), "no server process after the session ended"
    # Its own session, and no SSH session process above it any more: its parent is the host's
    # PID 1 (the orphan was reparented when the launch's shell ended).
    ppid, sid = bed.sh('ps -o ppid=,sid= -p "$1"', str(pid)).split()
    assert (int(ppid), int(sid)) == (1, pid)
    status = bed.run("status", "--json")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert data["state"] == "ready" and data["health_status"] == 200
    assert data["pid"] == pid and data["started_by_dflash_provision"] is True
    assert data["speculative_config"] == {
        "method": "dflash",
        "model": DRAFTER_DIR,
        "num_speculative_tokens": 15,  # block_size 16 - 1
    }

    # The record: env NAMES only, the drafter's sha256, the version; never the secret value.
    record_text = bed.sh('cat "$1"', f"{STATE}/{bed.port}/launch.json")
    record = json.loads(record_text)
    assert "s3cret-value" not in record_text
    assert record["env_names"] == ["HF_TOKEN", "VLLM_USE_V2_MODEL_RUNNER"]
    assert record["drafter_sha256"] == data["record"]["drafter_sha256"]
    assert record["vllm_version"] == "0.32.0+dflash-standin"
    assert record["argv"][:3] == [bed.standin.vllm, "serve", TARGET_DIR]
    # ... while the server did get the value, and the state dir is private and outside the
    # model directory.
    environ = bed.sh('tr "\\000" "\\n" < /proc/"$1"/environ', str(pid))
    assert "HF_TOKEN=s3cret-value" in environ.splitlines()
    assert bed.sh('stat -c %a "$1"', f"{STATE}/{bed.port}").strip() == "700"
    assert bed.sh('ls -A "$1"', DRAFTER_DIR).split() == ["config.json"]


def test_launch_ends_with_runtime_check_on_the_server_it_started(bed: Bed) -> None:
    python = ("--python", bed.standin.python)  # the one that runs the stand-in (stage b)
    proc = bed.launch(*python, check=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.index("ready on") < out.index("runtime-check ")
    assert "runtime-check passed" in out

    as_json = bed.launch(*python, "--json", check=True)  # already running: checked again
    data = json.loads(as_json.stdout)
    assert data["launch"]["status"] == "already-running"
    assert data["runtime_check"]["ok"] is True
    stages = data["runtime_check"]["stages"]
    assert [(s["stage"], s["status"]) for s in stages] == [(k, "passed") for k in "abcde"]


def test_same_launch_again_says_already_running_and_a_different_one_needs_restart(
    bed: Bed,
) -> None:
    assert bed.launch().returncode == 0
    first = bed.pid()

    again = bed.launch()
    assert again.returncode == 0, again.stderr
    assert "already-running" in again.stdout
    assert bed.pid() == first

    different = bed.launch("--num-speculative-tokens", "4")
    line = error_line(different, ExitCode.PORT_TAKEN)
    assert "num_speculative_tokens: 15 → 4" in line and "--restart" in line
    assert bed.pid() == first

    restarted = bed.launch("--num-speculative-tokens", "4", "--restart")
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert "restarted" in restarted.stdout
    second = bed.pid()
    assert second is not None and second != first
    assert first is not None and bed.group(first) == []
    spec = json.loads(bed.run("status", "--json").stdout)["speculative_config"]
    assert spec["num_speculative_tokens"] == 4


def test_stop_leaves_nothing_of_the_server_and_status_says_not_running(bed: Bed) -> None:
    assert bed.launch().returncode == 0
    pid = bed.pid()
    assert pid is not None and bed.group(pid)

    stopped = bed.run("stop", "--timeout", "20")
    assert stopped.returncode == 0, stopped.stderr
    assert f"pid {pid}" in stopped.stdout and "SIGTERM" in stopped.stdout
    assert bed.group(pid) == []
    assert bed.pid() is None  # pidfile removed; log and record stay
    assert bed.sh('ls "$1"', f"{STATE}/{bed.port}").split() == ["launch.json", "server.log"]

    status = bed.run("status")
    assert status.returncode == ExitCode.NOT_RUNNING
    assert "not running" in status.stdout and "last launch" in status.stdout
    assert bed.run("stop").returncode == ExitCode.NOT_RUNNING


def test_a_pidfile_from_before_a_reboot_never_gets_another_process_signalled(bed: Bed) -> None:
    # The pidfile lives in $HOME and outlives a reboot, after which its pid may be another
    # program's: the recorded start time no longer matches, so it is not our server.
    assert bed.launch().returncode == 0
    pid = bed.pid()
    assert pid is not None
    bed.sh('printf "%s 1\\n" "$1" > "$2"', str(pid), f"{STATE}/{bed.port}/pid")

    stop = bed.run("stop", "--timeout", "1")
    assert stop.returncode == ExitCode.NOT_RUNNING, stop.stdout + stop.stderr
    assert f"held by pid {pid}" in stop.stdout and "left alone" in stop.stdout
    assert bed.group(pid), "a process the pidfile does not really name was signalled"
    assert "NOT started by us" in bed.run("status").stdout


def test_stop_kills_a_process_group_that_ignores_sigterm(bed: Bed) -> None:
    # A vllm whose helper child ignores SIGTERM (as a stuck engine process would): TERM alone
    # leaves it, so stop must KILL the group after the timeout.
    shim = "/root/standin/vllm-stubborn"
    put(
        bed.host,
        shim,
        (
            "#!/bin/sh\n"
            'if [ "$1" = serve ]; then\n'
            "  sh -c 'trap \"\" TERM; while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &\n"
            "fi\n"
            f'exec {shlex.quote(bed.standin.vllm)} "$@"\n'
        ).encode(),
    )
    bed.sh('chmod 755 "$1"', shim)
    bed.standin = StandinInstall(shim, bed.standin.python, bed.standin.dest_dir, "host")
    assert bed.launch().returncode == 0
    pid = bed.pid()
    assert pid is not None and len(bed.group(pid)) >= 2

    stopped = bed.run("stop", "--timeout", "1")
    assert stopped.returncode == 0, stopped.stderr
    assert "SIGKILL" in stopped.stdout
    assert bed.group(pid) == []


def test_logs_prints_the_last_lines_of_the_server_log(bed: Bed) -> None:
    assert bed.launch().returncode == 0
    logs = bed.run("logs", "-n", "3")
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.splitlines()
    assert len(lines) == 3
    everything = bed.run("logs", "-n", "1000").stdout
    assert "Initializing a V1 LLM engine (v0.32.0+dflash-standin)" in everything
    assert everything.splitlines()[-3:] == lines
    small = bed.run("logs", "-n", "1000", "--max-bytes", "100")
    assert len(small.stdout.encode()) <= 101  # + the newline echo adds


# --------------------------------------------------------------------------------------------
# start-up failures, reported with the log line that says why


def test_a_server_that_dies_at_start_is_reported_with_its_log_line(bed: Bed) -> None:
    control = "/root/standin/control.json"
    write_control(bed.host, control, {"die_at_start": "CUDA error: out of memory (stand-in)"})
    proc = bed.launch(env={CONTROL_ENV: control})
    assert proc.returncode == ExitCode.LAUNCH_FAILED, proc.stdout + proc.stderr
    headline = next(line for line in proc.stdout.splitlines() if line.startswith("FAILED:"))
    # The cause itself heads the report, not "engine failed, see above" nor a bare timeout.
    assert "during start-up" in headline
    assert "CUDA error: out of memory (stand-in)" in headline
    assert bed.pid() is None or bed.group(bed.pid() or 0) == []


def test_sliding_layers_without_a_window_are_refused_then_fail_with_vllms_own_line(
    bed: Bed,
) -> None:
    config = json.loads(REFERENCE)
    config["use_sliding_window"] = False
    data = json.dumps(config, indent=2).encode()
    put(bed.host, f"{DRAFTER_DIR}/config.json", data)
    bed.authority.write_bytes(data)

    refused = bed.launch()
    line = error_line(refused, ExitCode.INVALID)
    assert "pre-flight" in line and "use_sliding_window" in line and "--force" in line
    assert bed.pid() is None

    forced = bed.launch("--force")
    assert forced.returncode == ExitCode.LAUNCH_FAILED, forced.stdout + forced.stderr
    failure = forced.stdout.split("FAILED:")[1]
    assert (
        "DFlash sliding attention requires a window size configured in "
        "dflash_config.swa_window_size or the top-level sliding_window." in failure
    )


def test_a_server_not_ready_in_time_keeps_starting_and_launch_again_waits_for_it(
    bed: Bed,
) -> None:
    control = "/root/standin/control.json"
    write_control(bed.host, control, {"startup_delay_s": 15})
    env = {CONTROL_ENV: control}
    slow = bed.launch("--ready-timeout", "2", env=env)
    assert slow.returncode == ExitCode.LAUNCH_FAILED, slow.stdout + slow.stderr
    assert "not ready within 2 s" in slow.stdout and "still starting" in slow.stdout
    pid = bed.pid()
    assert pid is not None and bed.group(pid), "a slow server must be left running"

    again = bed.launch(env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already-running" in again.stdout and bed.pid() == pid


# --------------------------------------------------------------------------------------------
# pre-flight refusals: nothing starts


def test_wrong_drafter_file_on_the_target_is_refused_with_the_push_that_fixes_it(
    bed: Bed,
) -> None:
    put(bed.host, f"{DRAFTER_DIR}/config.json", INCIDENT)
    proc = bed.launch()
    line = error_line(proc, ExitCode.DRIFT)
    assert "dflash_config.mask_token_id" in line
    assert f"dflash-provision push {bed.target} --from {bed.authority}" in line
    assert bed.sh('ls -d "$1" 2>/dev/null || true', f"{STATE}/{bed.port}").strip() == ""


def test_too_many_speculative_tokens_are_refused_before_start(bed: Bed) -> None:
    proc = bed.launch("--num-speculative-tokens", "16")
    line = error_line(proc, ExitCode.INVALID)
    assert "num_speculative_tokens 16 exceeds block_size - 1 = 15" in line
    assert bed.pid() is None


def test_a_missing_vllm_is_refused_with_its_own_exit_code(bed: Bed) -> None:
    bed.standin = StandinInstall("/nonexistent/vllm", "", "", "host")
    line = error_line(bed.launch(), ExitCode.VLLM_UNUSABLE)
    assert "/nonexistent/vllm --version" in line and "--vllm" in line


def test_a_port_held_by_a_process_launch_did_not_start_is_refused(bed: Bed) -> None:
    bed.host.exec(
        [
            "sh",
            "-c",
            'setsid python3 -m http.server --bind 127.0.0.1 "$1" </dev/null >/dev/null 2>&1 &',
            "sh",
            str(bed.port),
        ],
        check=True,
    )
    for _ in range(100):  # until it listens (bounded; no timing asserted)
        if bed.run("status").returncode == 0:
            break
    line = error_line(bed.launch("--restart"), ExitCode.PORT_TAKEN)
    assert "did not start" in line and "http.server" in line
    stop = bed.run("stop")
    assert stop.returncode == ExitCode.NOT_RUNNING and "left alone" in stop.stdout


def test_a_large_reply_through_the_ssh_forward_arrives_whole(bed: Bed) -> None:
    # python's http.server answers HTTP/1.0 (the connection closes after the reply, as vLLM's
    # "Connection: close" does): http.client then closes its socket before the body is read,
    # which must not end the SSH channel mid-body. 300 KB spans many channel windows.
    from dflash_provision.server.access import open_server
    from dflash_provision.server.readiness import probe_health
    from dflash_provision.target import parse_target
    from dflash_provision.transport.factory import open_transport
    from dflash_provision.transport.options import SshOptions

    body = bytes(range(256)) * 1200
    put(bed.host, "/root/www/big.bin", body)
    bed.host.exec(
        [
            "sh",
            "-c",
            'cd /root/www && setsid python3 -m http.server --bind 127.0.0.1 "$1" '
            "</dev/null >/dev/null 2>&1 &",
            "sh",
            str(bed.port),
        ],
        check=True,
    )
    assert bed.host.client is not None
    options = SshOptions(ssh_config_path=str(bed.host.client.ssh_config), use_agent=False)
    with (
        open_transport(parse_target(bed.target), options) as transport,
        open_server(transport, bed.port) as access,
    ):
        for _ in range(100):  # until it listens (bounded; no timing asserted)
            if probe_health(access, timeout=5) is not None:
                break
        for _ in range(3):
            reply = access.request("GET", "/big.bin", timeout=30, max_bytes=1 << 20)
            assert reply.status == 200 and reply.body == body
        capped = access.request("GET", "/big.bin", timeout=30, max_bytes=1000)
        assert capped.truncated and capped.body == body[:1000]


# --------------------------------------------------------------------------------------------
# into an LXC container behind the SSH host


@pytest.fixture
def container_bed(bed: Bed) -> Iterator[tuple[Bed, Container]]:
    container = standin_container(bed.host)
    try:
        installed = install_standin(container, "/root/standin", verify=False)
        for path, data in (
            (f"{DRAFTER_DIR}/config.json", REFERENCE),
            (f"{TARGET_DIR}/config.json", samples.REFERENCE_TARGET.read_bytes()),
        ):
            container.attach(["sh", "-c", 'mkdir -p "${1%/*}" && cat > "$1"', "sh", path], data)
        bed.standin = installed
        yield bed, container
    finally:
        container.destroy()


@pytest.mark.lxc
def test_launch_status_stop_inside_an_lxc_container_behind_ssh(
    container_bed: tuple[Bed, Container],
) -> None:
    bed, container = container_bed
    target = f"{bed.host.alias}/lxc:{container.name}:{DRAFTER_DIR}"
    # A busybox container has no python3 of its own: with no way to reach the port, nothing
    # starts (rather than waiting out the ready timeout).
    line = error_line(bed.launch(target=target), ExitCode.REMOTE_FAILED)
    assert "no python3 to reach the server's port" in line and "--python" in line
    listing = container.attach(["sh", "-c", 'ls "$1" 2>&1 || true', "sh", STATE])
    assert "No such file" in str(listing.stdout)

    python = ["--python", bed.standin.python]
    launched = bed.launch(*python, target=target)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "ready" in launched.stdout

    status = bed.run("status", "--json", target=target)  # the record's python is used
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert data["state"] == "ready" and data["health_status"] == 200
    assert data["speculative_config"]["model"] == DRAFTER_DIR
    pid = data["pid"]
    # Inside the container (its own PID namespace) and nowhere on the host itself.
    inside = container.attach(
        ["sh", "-c", 'cat /proc/"$1"/cmdline | tr "\\000" " "', "sh", str(pid)]
    )
    assert "serve" in str(inside.stdout)

    stopped = bed.run("stop", target=target)
    assert stopped.returncode == 0, stopped.stderr
    after = bed.run("status", target=target)
    assert after.returncode == ExitCode.NOT_RUNNING
    left = container.attach(["sh", "-c", "ps -o pid,args | grep -c '[v]llm_standin' || true"])
    assert str(left.stdout).strip() == "0"


def test_launch_shows_its_pre_flight_summary_before_it_waits_for_the_server(bed: Bed) -> None:
    # stdout and stderr into one pipe, in the order they were written: the summary (stdout)
    # must come before the "waiting for the server" lines (stderr) of a slow start.
    from tests.fixtures.cli import run_cli

    control = "/root/standin/control.json"
    write_control(bed.host, control, {"startup_delay_s": 8})
    proc = run_cli(
        "launch", bed.target, "--model", TARGET_DIR, "--from", str(bed.authority),
        "--vllm", bed.standin.vllm, "--port", str(bed.port), "--ready-timeout", READY_TIMEOUT,
        "--env", f"{CONTROL_ENV}={control}", "--no-check", *bed.ssh(),
        cwd=bed.cli.workdir, home=bed.cli.workdir / "home",
        prefix=["sh", "-c", 'exec "$@" 2>&1', "sh"],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout
    lines = proc.stdout.splitlines()
    summary = next(i for i, line in enumerate(lines) if line.startswith("  pre-flight  drafter"))
    waiting = next(i for i, line in enumerate(lines) if line.startswith("waiting for the server"))
    assert lines[summary - 1] == f"launch {bed.target} port {bed.port}"
    assert summary < waiting, proc.stdout
    assert lines[-1].startswith("started: vLLM 0.32.0+dflash-standin ready"), proc.stdout
