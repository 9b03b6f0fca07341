"""Every wait has one deadline and every read a size bound, on real sshd hosts and an LXC
container with the vLLM STAND-IN (a test double) in its hostile modes: a /metrics or completion
that drips a byte every 2 s, a 6 MiB /metrics, a `vllm --version` that hangs (also under
Ctrl-C), and a fleet with a host that drips. No timed assertions: each CLI runs under a
generous outer timeout (a regression fails instead of hanging) and the outcome is asserted:
it finished, its exit code, what it says."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.hosts import Fleet, Host
from testbed.lxc import Container
from testbed.vllm_standin_install import (
    CONTROL_ENV,
    install_standin,
    standin_container,
    write_control,
)
from tests.fixtures.cli import Cli, cli_env
from tests.fixtures.runtime import CONTROL, DRAFTER_DIR, REFERENCE, TARGET_DIR, free_port
from tests.fixtures.standin import Bed, ContainerBed, stages

pytestmark = [pytest.mark.integration, pytest.mark.root]

DRIP_S = 2.0  # one byte every 2 s, as in the issue
TIMEOUT = "6"  # --command-timeout: every request's one deadline
WRONG_FIX = "drafter does not fit"


def _d(report: dict[str, Any]) -> dict[str, Any]:
    return stages(report)["d"]


# -- HTTP reads: /metrics, completions ----------------------------------------------------------


def test_a_dripping_metrics_fails_stage_d_naming_metrics_instead_of_hanging(bed: Bed) -> None:
    bed.launch()
    bed.control(metrics_drip_s=DRIP_S)
    code, report = bed.check_json("--command-timeout", TIMEOUT, "--skip-loader")
    assert code == ExitCode.RUNTIME_CHECK_FAILED
    d = _d(report)
    assert d["status"] == "failed"
    assert "GET /metrics: the server sent" in d["summary"]
    assert "did not finish: deadline reached" in d["summary"]
    assert "/metrics endpoint misbehaves" in d["fix"] and WRONG_FIX not in d["fix"]
    assert stages(report)["e"]["status"] == "skipped"


def test_an_oversized_metrics_is_refused_and_not_blamed_on_the_drafter(bed: Bed) -> None:
    bed.launch()
    bed.control(metrics_bytes=6 * 1024 * 1024)
    code, report = bed.check_json("--command-timeout", TIMEOUT, "--skip-loader")
    assert code == ExitCode.RUNTIME_CHECK_FAILED
    d = _d(report)
    assert "GET /metrics: answer larger than 4 MiB: refused" in d["summary"]
    assert WRONG_FIX not in d["fix"] and "/metrics endpoint misbehaves" in d["fix"]


def test_a_dripping_completion_fails_stage_d_at_its_deadline(bed: Bed) -> None:
    bed.launch()
    bed.control(completion_drip_s=DRIP_S)
    proc = bed.check("--command-timeout", TIMEOUT, "--skip-loader")
    assert proc.returncode == ExitCode.RUNTIME_CHECK_FAILED, proc.stdout + proc.stderr
    assert "d  a real completion: FAILED" in proc.stdout
    assert "POST /v1/completions: the server sent" in proc.stdout
    assert "deadline reached" in proc.stdout
    assert WRONG_FIX not in proc.stdout


@pytest.mark.lxc
def test_a_dripping_or_oversized_metrics_inside_a_container_fails_by_name(
    container_bed: ContainerBed,
) -> None:
    # The request runs inside the container (its python): that program keeps the deadline too.
    container_bed.launch()
    write_control(container_bed.container, CONTROL, {"metrics_drip_s": DRIP_S})
    proc = container_bed.run(
        "runtime-check", "--json", "--command-timeout", TIMEOUT, "--skip-loader"
    )
    assert proc.returncode == ExitCode.RUNTIME_CHECK_FAILED, proc.stdout + proc.stderr
    d = _d(json.loads(proc.stdout))
    assert "GET /metrics:" in d["summary"] and "deadline reached" in d["summary"]
    assert WRONG_FIX not in d["fix"]
    # The container's program reads at most the bound, and the answer is refused by name.
    write_control(container_bed.container, CONTROL, {"metrics_bytes": 6 * 1024 * 1024})
    proc = container_bed.run(
        "runtime-check", "--json", "--command-timeout", TIMEOUT, "--skip-loader"
    )
    assert proc.returncode == ExitCode.RUNTIME_CHECK_FAILED, proc.stdout + proc.stderr
    d = _d(json.loads(proc.stdout))
    assert "GET /metrics: answer larger than 4 MiB: refused" in d["summary"]
    assert WRONG_FIX not in d["fix"]


def test_a_dripping_health_ends_the_readiness_wait_at_its_timeout(bed: Bed) -> None:
    # Each /health poll has one deadline: the wait ends at --ready-timeout, a slow server is
    # left running (as documented) and stopped here.
    bed.control(health_drip_s=DRIP_S)
    proc = bed.cli.run(
        *_launch_argv(bed, f"{bed.host.alias}:{DRAFTER_DIR}"), "--ready-timeout", "15"
    )
    assert proc.returncode == ExitCode.LAUNCH_FAILED, proc.stdout + proc.stderr
    assert "/health: no answer" in proc.stderr and "Traceback" not in proc.stderr
    stop = bed.cli.run(
        "stop", f"{bed.host.alias}:{DRAFTER_DIR}", "--port", str(bed.port), *bed.ssh()
    )
    assert stop.returncode == 0, stop.stdout + stop.stderr


# -- vllm --version: exit 23 and nothing left on the target --------------------------------------


def _version_processes(run: Any) -> list[str]:
    """Command lines of the stand-in's `--version` processes, read from /proc there."""
    script = (
        'for f in /proc/[0-9]*/cmdline; do tr "\\000" " " <"$f" 2>/dev/null; echo; done '
        "| grep -e 'vllm_standin[.]py --version' || true"
    )
    out = run(["sh", "-c", script])
    return [line for line in out.splitlines() if line.strip()]


def _on_host(host: Host) -> Any:
    return lambda argv: host.exec(argv, check=True).stdout


def _launch_argv(bed: Bed, target: str) -> list[str]:
    return [
        "launch", target, "--model", TARGET_DIR, "--from", bed.authority(),
        "--vllm", bed.standin.vllm, "--python", bed.standin.python, "--port", str(bed.port),
        "--env", f"{CONTROL_ENV}={CONTROL}", "--no-check", "--command-timeout", "8", *bed.ssh(),
    ]  # fmt: skip


def test_a_hung_vllm_version_is_vllm_unusable_and_ended_on_the_target(bed: Bed) -> None:
    bed.control(version_sleep_s=600)  # pre-flight runs `vllm --version` first
    proc = bed.cli.run(*_launch_argv(bed, f"{bed.host.alias}:{DRAFTER_DIR}"))
    assert proc.returncode == ExitCode.VLLM_UNUSABLE, proc.stdout + proc.stderr
    assert "--version` did not answer within" in proc.stderr
    assert "ended there" in proc.stderr
    assert _version_processes(_on_host(bed.host)) == []


@pytest.mark.lxc
def test_a_hung_vllm_version_in_a_container_is_ended_there(container_bed: ContainerBed) -> None:
    bed, container = container_bed.bed, container_bed.container
    write_control(container, CONTROL, {"version_sleep_s": 600})
    proc = bed.cli.run(*_launch_argv(bed, container_bed.target))
    assert proc.returncode == ExitCode.VLLM_UNUSABLE, proc.stdout + proc.stderr
    assert _version_processes(lambda argv: container.attach(argv).stdout) == []


def test_ctrl_c_during_a_hung_vllm_version_ends_it_on_the_target(bed: Bed) -> None:
    bed.control(version_sleep_s=600)
    argv = _launch_argv(bed, f"{bed.host.alias}:{DRAFTER_DIR}")
    argv[argv.index("8")] = "120"  # its own deadline is far away: only Ctrl-C ends it
    home = bed.cli.workdir / "home"
    cli = subprocess.Popen(
        [sys.executable, "-m", "dflash_provision", *argv],
        cwd=bed.cli.workdir,
        env=cli_env(home=home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(600):  # until `vllm --version` runs on the host (or the CLI gave up)
            if _version_processes(_on_host(bed.host)) or cli.poll() is not None:
                break
            time.sleep(0.1)
        assert _version_processes(_on_host(bed.host)), "vllm --version never started"
        cli.send_signal(signal.SIGINT)
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 130, out + err
    assert _version_processes(_on_host(bed.host)) == []


# -- the fleet form ------------------------------------------------------------------------------


def _serve(cli: Cli, place: Host | Container, target: str, port: int, ssh: list[str]) -> None:
    standin = install_standin(place, "/root/standin")
    script = 'mkdir -p "${1%/*}" && cat > "$1"'
    for path, data in (
        (f"{DRAFTER_DIR}/config.json", REFERENCE),
        (f"{TARGET_DIR}/config.json", samples.REFERENCE_TARGET.read_bytes()),
    ):
        argv = ["sh", "-c", script, "sh", path]
        if isinstance(place, Host):
            place.exec(argv, data, check=True)
        else:
            place.attach(argv, data)
    write_control(place, CONTROL, {})
    authority = cli.workdir / "config.json"
    authority.write_bytes(REFERENCE)
    proc = cli.run(
        "launch", target, "--model", TARGET_DIR, "--from", str(authority),
        "--vllm", standin.vllm, "--python", standin.python, "--port", str(port),
        "--env", f"{CONTROL_ENV}={CONTROL}", "--no-check", *ssh,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.lxc
def test_a_fleet_with_a_dripping_host_ends_writes_prometheus_and_marks_it_down(
    make_fleet: Any, tmp_path: Path
) -> None:
    # The hosts share one network namespace: h01 serves on the host (and drips), h02's server
    # runs in an LXC container (its own netns); h03 is down.
    fleet: Fleet = make_fleet(3)
    h01, h02, h03 = fleet.hosts
    assert h01.client is not None
    ssh = ["--ssh-config", str(h01.client.ssh_config), "--no-agent"]
    (tmp_path / "work").mkdir()
    cli = Cli(tmp_path / "work")
    port = free_port()
    container = standin_container(h02)
    try:
        _serve(cli, h01, f"{h01.alias}:{DRAFTER_DIR}", port, ssh)
        _serve(cli, container, f"{h02.alias}/lxc:{container.name}:{DRAFTER_DIR}", port, ssh)
        write_control(h01, CONTROL, {"metrics_drip_s": DRIP_S, "completion_drip_s": DRIP_S})
        h03.stop()
        inventory = tmp_path / "fleet.yaml"
        inventory.write_text(
            f"defaults:\n  path: {DRAFTER_DIR}\n"
            f"  drafter: {{from: {cli.workdir / 'config.json'}}}\n"
            "groups:\n  serving:\n    hosts:\n"
            f"      - {h01.alias}\n"
            f"      - {{name: h02-ct, address: {h02.alias}, container: 'lxc:{container.name}'}}\n"
            f"      - {h03.alias}\n"
        )
        prom = tmp_path / "runtime.prom"
        # Each request could wait 60 s; the host's deadline (20 s) ends the dripping one first.
        proc = cli.run(
            "runtime-check", "-i", str(inventory), "--port", str(port), "--prometheus",
            str(prom), "--skip-loader", "--command-timeout", "60", "--deadline", "20",
            "--connect-timeout", "3", "--python", "/root/standin/python3", *ssh,
        )  # fmt: skip
    finally:
        container.destroy()
    assert proc.returncode == ExitCode.UNREACHABLE, proc.stdout + proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line[:1] == "h"}
    assert "deadline" in rows[h01.alias] and "passed" in rows["h02-ct"]
    text = prom.read_text()
    path = f'path="{DRAFTER_DIR}/config.json"'
    assert f'dflash_runtime_check_up{{host="{h01.alias}",group="serving",{path}}} 0' in text
    assert f'dflash_runtime_check_up{{host="h02-ct",group="serving",{path}}} 1' in text
    assert f'dflash_runtime_check_up{{host="{h03.alias}",group="serving",{path}}} 0' in text
    assert f'dflash_runtime_check_passed{{host="h02-ct",group="serving",{path}}} 1' in text
