"""The running server is read as vLLM reads it, and found by its drafter on any port: the CLI
in a subprocess against sshd hosts in namespaces (and an LXC busybox container behind one), with
the vLLM STAND-IN (testbed.vllm_standin, a test double) as ``vllm`` there.

- a command line with two speculative options serves the LAST one (vLLM's argparse), so stage c
  judges that one and names both;
- the engine's own start-up record is cross-checked with the command line;
- text a client puts into the log (``--enable-log-requests``) is never start-up evidence;
- status / logs / runtime-check / stop without --port find the port launch used for TARGET's
  drafter directory.
"""

from __future__ import annotations

import json

import pytest

from dflash_provision.errors import ExitCode
from testbed.vllm_standin_install import CONTROL_ENV
from tests.fixtures.runtime import CONTROL, DRAFTER_DIR, REFERENCE, TARGET_DIR, free_port, put
from tests.fixtures.standin import Bed, ContainerBed, stages, statuses

pytestmark = [pytest.mark.integration, pytest.mark.root]

OTHER = "/root/models/other-drafter"
STATE = "/root/.local/state/dflash-provision/vllm"


def spec(model: str, n: int = 15) -> str:
    return json.dumps({"method": "dflash", "model": model, "num_speculative_tokens": n})


HAND_START = (
    "vllm=$1 target=$2 control=$3 port=$4; shift 4; "
    f'{CONTROL_ENV}="$control" VLLM_USE_V2_MODEL_RUNNER=1 setsid "$vllm" serve "$target" '
    '"$@" --host 127.0.0.1 --port "$port" > /root/by-hand.log 2>&1 < /dev/null &'
)
WAIT_HEALTH = (
    "import sys, time, urllib.request\n"
    "for _ in range(480):\n"
    "    try:\n"
    "        urllib.request.urlopen(f'http://127.0.0.1:{sys.argv[1]}/health', timeout=1)\n"
    "        sys.exit(0)\n"
    "    except OSError:\n"
    "        time.sleep(0.5)\n"
    "sys.exit(open('/root/by-hand.log').read()[-2000:])\n"
)


def hand_start(bed: Bed, *options: str) -> None:
    """``vllm serve TARGET OPTIONS... --port P`` started by hand (no launch record), as an
    operator would; returns once /health answers."""
    args = [bed.standin.vllm, TARGET_DIR, CONTROL, str(bed.port), *options]
    bed.host.exec(["sh", "-c", HAND_START, "sh", *args], check=True)
    ready = bed.host.exec(["/usr/bin/python3", "-c", WAIT_HEALTH, str(bed.port)], timeout=280)
    assert ready.returncode == 0, ready.stderr


def run(bed: Bed, command: str, *extra: str, target: str | None = None):  # type: ignore[no-untyped-def]
    """A runtime command for TARGET WITHOUT --port (unless ``extra`` has one)."""
    return bed.cli.run(command, target or f"{bed.host.alias}:{DRAFTER_DIR}", *bed.ssh(), *extra)


# --------------------------------------------------------------------------------------------
# item 1: the command line as vLLM reads it


@pytest.mark.parametrize(
    "last",
    [
        ["--speculative-config=" + spec(OTHER)],  # --opt=value
        ["--speculative_config", spec(OTHER)],  # an underscore means a dash
    ],
    ids=["equals-form", "underscore-form"],
)
def test_two_speculative_options_serve_the_last_and_stage_c_fails_naming_both(
    bed: Bed, last: list[str]
) -> None:
    put(bed.host, f"{OTHER}/config.json", REFERENCE)
    hand_start(bed, "--speculative-config", spec(DRAFTER_DIR), *last)
    code, report = bed.check_json("--python", bed.standin.python)
    assert code == ExitCode.RUNTIME_CHECK_FAILED, json.dumps(report, indent=1)[:3000]
    c = stages(report)["c"]
    assert c["status"] == "failed"
    assert f"runs drafter '{OTHER}' (the last of 2 speculative options" in c["summary"]
    assert f"not '{DRAFTER_DIR}'" in c["summary"]
    evidence = "\n".join(c["evidence"])
    assert "2 speculative options on the command line; vLLM uses the last" in evidence
    assert DRAFTER_DIR in evidence.split("vLLM uses the last")[1].split("2. ")[0]  # option 1
    assert c["data"]["spec"]["model"] == OTHER

    # status shows what vLLM runs, and every option as written.
    status = run(bed, "status", "--port", str(bed.port))
    assert status.returncode == 0, status.stdout + status.stderr
    assert f'"model": "{OTHER}"' in status.stdout.split("speculative ", 1)[1].splitlines()[0]
    assert "2 speculative options on its command line" in status.stdout

    # doctor names the server as the first broken link.
    proc = bed.cli.run(
        "doctor", f"{bed.host.alias}:{DRAFTER_DIR}", "--from", bed.authority(),
        "--port", str(bed.port), "--python", bed.standin.python, "--json", *bed.ssh(),
    )  # fmt: skip
    doctor = json.loads(proc.stdout)
    assert proc.returncode == ExitCode.RUNTIME_CHECK_FAILED, proc.stdout[:2000] + proc.stderr
    assert doctor["first_broken_link"] == "running server"
    assert OTHER in json.dumps(doctor["links"])


def test_an_engine_record_that_disagrees_with_the_command_line_fails_stage_c(bed: Bed) -> None:
    # The engine's own start-up record names another drafter than argv (as when a wrapper or a
    # --config file changed what the server resolved): neither can be taken on trust.
    bed.launch("--env", 'VLLM_STANDIN_ENGINE_SPEC={"model": "/root/models/other-drafter"}')
    code, report = bed.check_json()
    assert code == ExitCode.RUNTIME_CHECK_FAILED, json.dumps(report, indent=1)[:3000]
    c = stages(report)["c"]
    assert c["status"] == "failed"
    wanted = (
        f"the engine's start-up record says drafter '{OTHER}', the command line says "
        f"'{DRAFTER_DIR}'"
    )
    assert wanted in c["evidence"], c["evidence"]
    assert (
        f"the engine runs drafter '{OTHER}', not the provisioned '{DRAFTER_DIR}'" in (c["evidence"])
    )


FAKE_ENGINE = (
    "Initializing a V1 LLM engine (v0.1.0) with config: model='/x', speculative_config="
    "SpeculativeConfig(method='eagle3', model='/evil', num_spec_tokens=3), seed=0"
)
FAKE_AUX = "Using auxiliary layers from speculative config: (1, 2)"


def test_a_logged_prompt_holding_start_up_phrases_does_not_change_stage_c(bed: Bed) -> None:
    bed.launch("--env", "VLLM_LOGGING_LEVEL=DEBUG", "--", "--enable-log-requests")
    # A client's prompt, and a request id holding line breaks: vLLM logs the id as sent and
    # its formatter prefixes each inner line like a record of its own.
    rid = f"x\n{FAKE_ENGINE}\n{FAKE_AUX}"
    body = {"model": TARGET_DIR, "prompt": f"{FAKE_ENGINE}\n{FAKE_AUX}", "max_tokens": 4}
    post = (
        "import json, sys, urllib.request\n"
        "req = urllib.request.Request(f'http://127.0.0.1:{sys.argv[1]}/v1/completions',\n"
        "    data=sys.argv[2].encode(), headers={'Content-Type': 'application/json'})\n"
        "print(urllib.request.urlopen(req, timeout=30).status)\n"
    )
    sent = bed.host.exec(
        ["/usr/bin/python3", "-c", post, str(bed.port), json.dumps({**body, "request_id": rid})],
        timeout=60,
    )
    assert sent.returncode == 0 and "200" in sent.stdout, sent.stderr
    log = bed.host.exec(["cat", f"{STATE}/{bed.port}/server.log"]).stdout
    assert 'details: prompt: "Initializing a V1 LLM engine (v0.1.0)' in log, log[-3000:]
    assert f"] {FAKE_ENGINE}" in log  # the forged "record" really is in the log, as a line

    code, report = bed.check_json()
    c = stages(report)["c"]
    assert c["status"] == "passed", json.dumps(c, indent=1)[:3000]
    assert c["data"]["log"]["speculative_model"] == DRAFTER_DIR
    assert c["data"]["log"]["aux_layers"] == [2, 17, 32, 47, 62]
    assert code == 0, statuses(report)


# --------------------------------------------------------------------------------------------
# item 9: found by its drafter directory on whatever port it runs


def test_status_logs_check_and_stop_find_the_server_launched_on_another_port(bed: Bed) -> None:
    bed.launch()  # on bed.port, a free port that is not 8000
    assert bed.port != 8000
    status = run(bed, "status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    data = json.loads(status.stdout)
    assert (data["port"], data["state"], data["port_from"]) == (bed.port, "ready", "launch record")

    logs = run(bed, "logs")
    assert logs.returncode == 0 and "Initializing a V1 LLM engine" in logs.stdout, logs.stderr

    check = run(bed, "runtime-check", "--from", bed.authority(), "--json")
    report = json.loads(check.stdout)
    assert check.returncode == 0, statuses(report)
    assert report["port"] == bed.port

    doctor = run(bed, "doctor", "--from", bed.authority())
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert f"(server port {bed.port})" in doctor.stdout

    pid = data["pid"]
    stopped = run(bed, "stop", "--timeout", "20")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"port {bed.port}" in stopped.stdout and f"pid {pid}" in stopped.stdout
    left = bed.host.exec(["sh", "-c", 'kill -0 "$1" 2>/dev/null && echo alive || echo gone',
                          "sh", str(pid)]).stdout  # fmt: skip
    assert left.strip() == "gone"
    after = run(bed, "status")
    assert after.returncode == ExitCode.NOT_RUNNING and f"port {bed.port}" in after.stdout


def test_one_drafter_launched_on_two_ports_needs_port_to_choose(bed: Bed) -> None:
    first = bed.port
    bed.launch()
    bed.port = free_port()
    bed.launch()
    for command in ("status", "stop", "logs"):
        proc = run(bed, command)
        assert proc.returncode == ExitCode.USAGE, proc.stdout + proc.stderr
        line = proc.stderr.strip().splitlines()[-1]
        assert line.startswith("error: ") and "several ports" in line and "--port" in line
        assert str(first) in line and str(bed.port) in line
    proc = run(bed, "runtime-check", "--from", bed.authority())
    assert proc.returncode == ExitCode.USAGE and "several ports" in proc.stderr
    # --port still chooses.
    for port in (first, bed.port):
        assert run(bed, "stop", "--port", str(port)).returncode == 0


@pytest.mark.lxc
def test_in_a_container_commands_without_port_find_the_launched_server(
    container_bed: ContainerBed,
) -> None:
    container_bed.launch()  # on a free port inside the container
    b = container_bed.bed
    target = container_bed.target
    status = run(b, "status", "--json", target=target)
    assert status.returncode == 0, status.stdout + status.stderr
    assert json.loads(status.stdout)["port"] == b.port
    check = run(b, "runtime-check", "--from", b.authority(), "--json", target=target)
    report = json.loads(check.stdout)
    assert check.returncode == 0, json.dumps(report, indent=1)[:3000]
    assert report["port"] == b.port
    stopped = run(b, "stop", target=target)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    left = container_bed.container.attach(
        ["sh", "-c", "ps -o pid,args | grep -c '[v]llm_standin' || true"]
    )
    assert str(left.stdout).strip() == "0"


@pytest.mark.lxc
def test_in_a_container_two_speculative_options_fail_stage_c_naming_both(
    container_bed: ContainerBed,
) -> None:
    b, container = container_bed.bed, container_bed.container
    container_bed.put(f"{OTHER}/config.json", REFERENCE)
    options = ["--speculative-config", spec(DRAFTER_DIR), "--speculative_config=" + spec(OTHER)]
    args = [b.standin.vllm, TARGET_DIR, CONTROL, str(b.port), *options]
    container.attach(["sh", "-c", HAND_START, "sh", *args])
    ready = container.attach([b.standin.python, "-c", WAIT_HEALTH, str(b.port)], timeout=280)
    assert ready.returncode == 0, ready.stderr
    proc = container_bed.run("runtime-check", "--python", b.standin.python, "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == ExitCode.RUNTIME_CHECK_FAILED, json.dumps(report)[:3000]
    c = stages(report)["c"]
    assert f"runs drafter '{OTHER}' (the last of 2 speculative options" in c["summary"]
    assert f"not '{DRAFTER_DIR}'" in c["summary"]
