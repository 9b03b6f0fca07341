"""The vLLM stand-in (testbed/vllm_standin.py), run for real: as a subprocess on
this machine, on a fake SSH host reached with OpenSSH, and inside an LXC busybox container in a
fake host. Its DFlash rules use real transformers on the bundled sample configs."""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import samples, vllm_standin, vllm_standin_install
from testbed.hosts import Host
from testbed.lxc import Container
from testbed.vllm_standin_install import (
    CONTROL_ENV,
    StandinInstall,
    install_standin,
    write_control,
)
from tests.fixtures.runtime import free_port

READY_DEADLINE_S = 120.0  # start-up imports transformers: seconds on a loaded 2-core machine
STOP_DEADLINE_S = 30.0
NO_WINDOW_LINE = (
    "ValueError: DFlash sliding attention requires a window size configured in "
    "dflash_config.swa_window_size or the top-level sliding_window."
)

# --------------------------------------------------------------------------------------------
# configs


def qwen3_8b() -> dict[str, Any]:
    """All full attention, ids [1, 9, 17, 25, 33], block_size 16."""
    return samples.load_json(samples.QWEN3_8B_DRAFTER)


def reference() -> dict[str, Any]:
    """The real mixed layout: 4 sliding + 1 full, window 2048."""
    return samples.load_json(samples.REFERENCE_DRAFTER)


def all_sliding_without_window() -> dict[str, Any]:
    config = reference()
    config["layer_types"] = ["sliding_attention"] * 5
    config["use_sliding_window"] = False  # transformers then nulls sliding_window
    return config


def write_drafter(directory: Path, config: dict[str, Any]) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return str(directory)


def spec(drafter: str, tokens: int) -> str:
    return json.dumps({"method": "dflash", "model": drafter, "num_speculative_tokens": tokens})


# --------------------------------------------------------------------------------------------
# unit: the rules and the arithmetic


def test_counters_match_what_real_vllm_counted_for_40_tokens_with_4_spec_tokens() -> None:
    agreeing = vllm_standin.Counters(4)
    agreeing.generate(40, 3, 1.0)
    rejected = vllm_standin.Counters(4)
    rejected.generate(40, 3, 0.0)
    good, bad = agreeing.snapshot(), rejected.snapshot()
    assert (good.drafts, good.draft_tokens, good.accepted) == (8, 32, 32)
    assert (bad.drafts, bad.draft_tokens, bad.accepted) == (39, 156, 0)
    assert good.per_pos == [8, 8, 8, 8]


def test_counters_keep_accepted_over_drafted_at_the_asked_fraction() -> None:
    counters = vllm_standin.Counters(15)
    for _ in range(20):
        counters.generate(200, 5, 0.011)
    t = counters.snapshot()
    assert abs(t.accepted / t.draft_tokens - 0.011) < 1 / t.draft_tokens + 1e-9
    assert t.accepted > 0
    line = vllm_standin.spec_decoding_line(t, 1.0)
    assert re.search(r"Avg Draft acceptance rate: 1\.1%$", line)


def test_control_file_rejects_typos_and_out_of_range_values() -> None:
    assert vllm_standin.parse_control({}) == vllm_standin.Control()
    for bad in ({"acceptence": 0.5}, {"acceptance": 1.5}, {"extra_traffic": -1}, [1]):
        with pytest.raises((ValueError, TypeError)):
            vllm_standin.parse_control(bad)


def test_control_file_errors_keep_the_last_good_value_and_warn_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "control.json"
    control = vllm_standin.ControlFile(str(path), vllm_standin.VllmLog())
    assert control.read() == vllm_standin.Control()  # no file yet: defaults
    path.write_text(json.dumps({"acceptance": 0.011, "extra_traffic": 3}))
    good = control.read()
    assert (good.acceptance, good.extra_traffic) == (0.011, 3)
    path.write_text("{half a json")
    assert control.read() == good and control.read() == good
    warnings = [line for line in capsys.readouterr().out.splitlines() if " WARNING " in line]
    assert len(warnings) == 1 and str(path) in warnings[0]


def test_serve_arguments_take_unknown_flags_with_or_without_values() -> None:
    args = vllm_standin.parse_serve_args(
        ["/m/T", "--port", "9001", "--enforce-eager", "--kv-cache-dtype", "auto", "--x=1"]
    )
    assert (args.model, args.port, args.enforce_eager) == ("/m/T", 9001, True)
    assert args.other == {"--kv-cache-dtype": "auto", "--x": "1"}
    switch_first = vllm_standin.parse_serve_args(
        ["--enforce-eager", "/m/T", "--max_model_len", "256", "-tp", "1"]
    )
    assert (switch_first.model, switch_first.max_model_len) == ("/m/T", 256)
    with pytest.raises(vllm_standin.UsageError):
        vllm_standin.parse_serve_args(["/m/T", "--speculative-config", "{not json"])


@pytest.mark.integration
def test_incident_file_loads_with_real_transformers_and_shifts_its_ids(tmp_path: Path) -> None:
    drafter = write_drafter(tmp_path / "d", samples.load_json(samples.INCIDENT_DRAFTER))
    draft = vllm_standin.resolve_draft(json.loads(spec(drafter, 15)), None)
    assert draft.aux_layers == (2, 18, 34, 50, 64) and draft.aux_from_config
    assert vllm_standin._window_per_layer(draft.config, False) == (None,) * 5


@pytest.mark.integration
def test_sliding_layers_with_use_sliding_window_false_have_no_window(tmp_path: Path) -> None:
    config = reference()
    config["use_sliding_window"] = False
    draft = vllm_standin.resolve_draft(json.loads(spec(write_drafter(tmp_path, config), 4)), None)
    with pytest.raises(vllm_standin.StartupFailure) as mixed:
        vllm_standin._window_per_layer(draft.config, False)
    assert mixed.value.kind == "NotImplementedError"
    with pytest.raises(vllm_standin.StartupFailure, match="requires a window size") as v2:
        vllm_standin._window_per_layer(draft.config, True)
    assert v2.value.kind == "ValueError"


def start_in_process(
    tmp_path: Path, drafter: dict[str, Any], model: str, capsys: pytest.CaptureFixture[str]
) -> tuple[vllm_standin.Engine | vllm_standin.StartupFailure, str]:
    """start_engine in this process (no server): the engine or the failure, and the log."""
    args = vllm_standin.parse_serve_args(
        [model, "--speculative-config", spec(write_drafter(tmp_path / "d", drafter), 4)]
    )
    log = vllm_standin.VllmLog()
    control = vllm_standin.ControlFile(None, log)
    try:
        result: Any = vllm_standin.start_engine(args, log, control, threading.Event())
    except vllm_standin.StartupFailure as failure:
        result = failure
    return result, capsys.readouterr().out


@pytest.mark.integration
def test_drafter_without_target_layer_ids_falls_back_to_the_models_layers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = qwen3_8b()
    del config["dflash_config"]["target_layer_ids"]
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(
        json.dumps({**samples.load_json(samples.REFERENCE_TARGET), "vocab_size": 151936})
    )
    engine, log = start_in_process(tmp_path, config, str(target), capsys)
    assert isinstance(engine, vllm_standin.Engine)
    assert "Using auxiliary layers from model: (2, 32, 61)" in log  # the 64-layer target's
    assert "from speculative config" not in log


@pytest.mark.integration
def test_drafter_vocab_that_differs_from_a_local_target_fails_start_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(samples.REFERENCE_TARGET.read_text())
    failure, _ = start_in_process(tmp_path, qwen3_8b(), str(target), capsys)
    assert isinstance(failure, vllm_standin.StartupFailure)
    assert "vocab size (151936) does not match the target model's (248320)" in failure.message


# --------------------------------------------------------------------------------------------
# local subprocess


@pytest.fixture(scope="module")
def local_standin(tmp_path_factory: pytest.TempPathFactory) -> StandinInstall:
    return install_standin(None, str(tmp_path_factory.mktemp("standin-bin")), verify=False)


class Running:
    """A stand-in server started by a test; always stopped (TERM, then KILL) at the end."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, port: int) -> None:
        self.port = port
        self.log_path = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def request(self, path: str, body: dict[str, Any] | bytes | None = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data)
        req.add_header("content-type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as reply:  # noqa: S310 (http only)
                return reply.status, reply.read(1 << 20)
        except urllib.error.HTTPError as err:
            return err.code, err.read(1 << 20)

    def wait_ready(self) -> bool:
        """True once /health answers 200; False when the process exited first."""
        deadline = time.monotonic() + READY_DEADLINE_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if self.request("/health")[0] == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"not ready after {READY_DEADLINE_S}s:\n{self.log()}")

    def exit_status(self) -> int:
        return self.proc.wait(READY_DEADLINE_S)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(STOP_DEADLINE_S)

    def metrics(self) -> dict[str, float]:
        """Spec-decode counters by name (per-position ones as NAME[i])."""
        status, body = self.request("/metrics")
        assert status == 200
        found: dict[str, float] = {}
        for line in body.decode().splitlines():
            m = re.match(r"^(vllm:spec_decode_\w+_total)\{([^}]*)\} (\S+)$", line)
            if m:
                pos = re.search(r'position="(\d+)"', m.group(2))
                found[m.group(1) + (f"[{pos.group(1)}]" if pos else "")] = float(m.group(3))
        return found


@pytest.fixture
def serve(local_standin: StandinInstall, tmp_path: Path) -> Iterator[Any]:
    started: list[Running] = []

    def start(
        drafter: str | None,
        tokens: int = 4,
        control: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        model: str = "/models/Qwen3-8B",
    ) -> Running:
        port = free_port()
        control_path = tmp_path / f"control-{port}.json"
        if control is not None:
            write_control(None, str(control_path), control)
        argv = [local_standin.vllm, "serve", model, "--host", "127.0.0.1", "--port", str(port)]
        if drafter is not None:
            argv += ["--speculative-config", spec(drafter, tokens)]
        full_env = {"PATH": "/usr/bin:/bin", CONTROL_ENV: str(control_path), **(env or {})}
        running = Running(argv, full_env, tmp_path / f"server-{port}.log", port)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


def complete(server: Running, max_tokens: int = 40) -> dict[str, Any]:
    status, body = server.request(
        "/v1/completions",
        {"model": "/models/Qwen3-8B", "prompt": "the quick brown fox", "max_tokens": max_tokens},
    )
    assert status == 200, body
    reply: dict[str, Any] = json.loads(body)
    return reply


@pytest.mark.integration
def test_good_drafter_serves_and_counts_acceptance_the_control_file_asks_for(
    serve: Any, tmp_path: Path
) -> None:
    drafter = write_drafter(tmp_path / "qwen3-8b-dflash", qwen3_8b())
    server = serve(drafter, 4, {"acceptance": 1.0})
    assert server.wait_ready(), server.log()
    models = json.loads(server.request("/v1/models")[1])
    assert models["data"][0]["id"] == "/models/Qwen3-8B"
    reply = complete(server, 40)
    assert reply["usage"]["completion_tokens"] == 40 and reply["choices"][0]["text"]
    after_agreeing = server.metrics()
    assert after_agreeing["vllm:spec_decode_num_drafts_total"] == 8
    assert after_agreeing["vllm:spec_decode_num_draft_tokens_total"] == 32
    assert after_agreeing["vllm:spec_decode_num_accepted_tokens_total"] == 32
    assert after_agreeing["vllm:spec_decode_num_accepted_tokens_per_pos_total[3]"] == 8

    write_control(None, str(tmp_path / f"control-{server.port}.json"), {"acceptance": 0.0})
    complete(server, 40)
    after_rejecting = server.metrics()
    assert after_rejecting["vllm:spec_decode_num_drafts_total"] == 8 + 39
    assert after_rejecting["vllm:spec_decode_num_accepted_tokens_total"] == 32

    log = server.log()
    assert f"Initializing a V1 LLM engine (v{vllm_standin.VERSION}) with config: " in log
    assert (
        f"speculative_config=SpeculativeConfig(method='dflash', model='{drafter}', "
        "num_spec_tokens=4)" in log
    )
    assert "Using auxiliary layers from speculative config: (2, 10, 18, 26, 34)" in log
    assert "STAND-IN" in log
    assert server.stop() == 0


def spec_decoding_totals(log: str) -> tuple[int, int]:
    """Sums of Accepted and Drafted over the SpecDecoding metrics lines of a log."""
    pairs = re.findall(
        r"SpecDecoding metrics: .*Accepted: (\d+) tokens, Drafted: (\d+) tokens", log
    )
    return sum(int(a) for a, _ in pairs), sum(int(d) for _, d in pairs)


@pytest.mark.integration
def test_spec_decoding_log_lines_add_up_to_the_counters(serve: Any, tmp_path: Path) -> None:
    drafter = write_drafter(tmp_path / "d", qwen3_8b())
    server = serve(drafter, 4, {"acceptance": 0.5}, env={"VLLM_LOG_STATS_INTERVAL": "0.2"})
    assert server.wait_ready(), server.log()
    complete(server, 40)
    counters = server.metrics()
    drafted = counters["vllm:spec_decode_num_draft_tokens_total"]
    deadline = time.monotonic() + READY_DEADLINE_S
    while spec_decoding_totals(server.log())[1] < drafted:
        assert time.monotonic() < deadline and server.proc.poll() is None, server.log()
        time.sleep(0.1)
    accepted_logged, drafted_logged = spec_decoding_totals(server.log())
    assert (accepted_logged, drafted_logged) == (
        counters["vllm:spec_decode_num_accepted_tokens_total"],
        drafted,
    )
    assert re.search(
        r"Per-position acceptance rate: [\d.]+, [\d.]+, [\d.]+, [\d.]+, ", server.log()
    )


@pytest.mark.integration
def test_incident_file_serves_and_logs_its_shifted_ids_like_vllm(
    serve: Any, tmp_path: Path
) -> None:
    drafter = write_drafter(tmp_path / "incident", samples.load_json(samples.INCIDENT_DRAFTER))
    server = serve(drafter, 15)
    assert server.wait_ready(), server.log()
    assert "Using auxiliary layers from speculative config: (2, 18, 34, 50, 64)" in server.log()


@pytest.mark.integration
def test_sliding_layers_without_a_window_stop_start_up_with_vllms_error(
    serve: Any, tmp_path: Path
) -> None:
    server = serve(write_drafter(tmp_path / "d", all_sliding_without_window()), 4)
    assert not server.wait_ready()
    assert server.exit_status() == 1
    assert NO_WINDOW_LINE in server.log()
    assert "EngineCore failed to start." in server.log()


@pytest.mark.integration
def test_mixed_layout_needs_the_v2_model_runner(serve: Any, tmp_path: Path) -> None:
    drafter = write_drafter(tmp_path / "reference", reference())
    refused = serve(drafter, 15)
    assert not refused.wait_ready()
    assert refused.exit_status() == 1
    assert re.search(
        r"ERROR .* NotImplementedError: DFlash drafters with mixed sliding/full attention "
        r"require the V2 model runner; relaunch with VLLM_USE_V2_MODEL_RUNNER=1\.",
        refused.log(),
    )
    accepted = serve(drafter, 15, env={"VLLM_USE_V2_MODEL_RUNNER": "1"})
    assert accepted.wait_ready(), accepted.log()
    assert "Using auxiliary layers from speculative config: (2, 17, 32, 47, 62)" in accepted.log()


@pytest.mark.integration
def test_more_spec_tokens_than_block_size_minus_one_are_all_rejected(
    serve: Any, tmp_path: Path
) -> None:
    server = serve(write_drafter(tmp_path / "d", qwen3_8b()), 16, {"acceptance": 1.0})
    assert server.wait_ready(), server.log()
    complete(server, 40)
    counters = server.metrics()
    assert counters["vllm:spec_decode_num_draft_tokens_total"] == 39 * 16
    assert counters["vllm:spec_decode_num_accepted_tokens_total"] == 0


@pytest.mark.integration
def test_failing_completions_leave_health_green(serve: Any, tmp_path: Path) -> None:
    server = serve(write_drafter(tmp_path / "d", qwen3_8b()), 4, {"fail_completions": True})
    assert server.wait_ready(), server.log()
    status, body = server.request(
        "/v1/completions", {"model": "/models/Qwen3-8B", "prompt": "hi", "max_tokens": 8}
    )
    assert status == 500
    assert "expects 256 concatenated aux hidden features" in json.loads(body)["error"]["message"]
    assert server.request("/health")[0] == 200
    assert re.search(r"ERROR .*DFlash drafter expects 256", server.log())


@pytest.mark.integration
def test_die_at_start_logs_the_reason_and_exits_1(serve: Any, tmp_path: Path) -> None:
    reason = "CUDA out of memory while loading the drafter (stand-in control)"
    server = serve(write_drafter(tmp_path / "d", qwen3_8b()), 4, {"die_at_start": reason})
    assert not server.wait_ready()
    assert server.exit_status() == 1
    assert re.search(rf"ERROR .*RuntimeError: {re.escape(reason)}", server.log())


@pytest.mark.integration
def test_extra_traffic_moves_counters_between_two_metrics_reads(serve: Any, tmp_path: Path) -> None:
    server = serve(write_drafter(tmp_path / "d", qwen3_8b()), 4, {"extra_traffic": 5})
    assert server.wait_ready(), server.log()
    first = server.metrics()["vllm:spec_decode_num_drafts_total"]
    second = server.metrics()["vllm:spec_decode_num_drafts_total"]
    assert second == first + 5


@pytest.mark.integration
def test_bounds_and_unknown_paths_get_http_errors(serve: Any, tmp_path: Path) -> None:
    server = serve(write_drafter(tmp_path / "d", qwen3_8b()), 4)
    assert server.wait_ready(), server.log()
    # Only the headers of an oversized body: the server must refuse before reading it.
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.putrequest("POST", "/v1/completions")
    conn.putheader("Content-Length", str(vllm_standin.MAX_BODY_BYTES + 1))
    conn.endheaders()
    assert conn.getresponse().status == 413
    conn.close()
    assert server.request("/nowhere")[0] == 404
    long_ask = {"prompt": "hi", "max_tokens": 10**6}
    assert server.request("/v1/completions", long_ask)[0] == 400
    assert server.request("/v1/completions", {"model": "other", "prompt": "x"})[0] == 404


@pytest.mark.integration
def test_sigterm_during_start_up_delay_ends_the_server_cleanly(serve: Any, tmp_path: Path) -> None:
    server = serve(write_drafter(tmp_path / "d", qwen3_8b()), 4, {"startup_delay_s": 600})
    deadline = time.monotonic() + READY_DEADLINE_S
    while "Initializing a V1 LLM engine" not in server.log():  # now in the delay
        assert server.proc.poll() is None and time.monotonic() < deadline, server.log()
        time.sleep(0.1)
    assert server.stop() == 0
    assert "Application startup complete" not in server.log()


@pytest.mark.integration
def test_version_and_help_say_it_is_a_stand_in(local_standin: StandinInstall) -> None:
    version = subprocess.run([local_standin.vllm, "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.split()[0] == "0.32.0+dflash-standin"
    helped = subprocess.run([local_standin.vllm, "serve", "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "STAND-IN" in helped.stdout


# --------------------------------------------------------------------------------------------
# on a fake SSH host and in a container, reached through OpenSSH

# Runs at the place: starts the stand-in in the background, waits for /health with the place's
# own python, makes one completion, reads /metrics, stops the server. Prints one JSON line.
REMOTE_RUN = r"""
set -u
vllm=$1; py=$2; drafter=$3; port=$4; control=$5; log=$6
spec="{\"method\":\"dflash\",\"model\":\"$drafter\",\"num_speculative_tokens\":4}"
VLLM_STANDIN_CONTROL=$control "$vllm" serve /models/Qwen3-8B --host 127.0.0.1 --port "$port" \
  --speculative-config "$spec" > "$log" 2>&1 &
pid=$!
"$py" -c "$7" "$port" "$pid"
status=$?
kill -TERM "$pid" 2>/dev/null
wait "$pid"
echo "server exit $?"
exit $status
"""

REMOTE_CLIENT = r"""
import json, os, sys, time, urllib.request
port, pid = sys.argv[1], int(sys.argv[2])
base = "http://127.0.0.1:" + port
deadline = time.monotonic() + 120
while True:
    try:
        if urllib.request.urlopen(base + "/health", timeout=5).status == 200:
            break
    except OSError:
        pass
    if time.monotonic() > deadline or not os.path.exists("/proc/%d" % pid):
        print(json.dumps({"ready": False})); sys.exit(0)
    time.sleep(0.1)
body = json.dumps({"prompt": "the quick brown fox", "max_tokens": 40}).encode()
req = urllib.request.Request(base + "/v1/completions", data=body,
                             headers={"content-type": "application/json"})
reply = json.loads(urllib.request.urlopen(req, timeout=30).read(1 << 20))
metrics = urllib.request.urlopen(base + "/metrics", timeout=30).read(1 << 20).decode()
counters = {}
for line in metrics.splitlines():
    if line.startswith("vllm:spec_decode_num_") and "_total{" in line and "position" not in line:
        counters[line.split("{")[0]] = float(line.rsplit(" ", 1)[1])
print(json.dumps({"ready": True, "tokens": reply["usage"]["completion_tokens"],
                  "counters": counters}))
"""


def run_remote(
    host: Host, prefix: list[str], installed: StandinInstall, drafter: str, control: str
) -> tuple[dict[str, Any], str]:
    """REMOTE_RUN over real OpenSSH on ``host``, after ``prefix`` (e.g. lxc-attach ... --)."""
    log = installed.dest_dir + "/server.log"
    remote = [*prefix, "sh", "-c", REMOTE_RUN, "sh", installed.vllm, installed.python]
    remote += [drafter, "8123", control, log, REMOTE_CLIENT]
    proc = subprocess.run(host.ssh_argv(remote), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result_line, server_exit = proc.stdout.strip().splitlines()[-2:]
    return json.loads(result_line), server_exit


@pytest.mark.integration
@pytest.mark.root
def test_stand_in_serves_on_a_fake_ssh_host_through_openssh(ssh_host: Host) -> None:
    installed = install_standin(ssh_host, "/root/standin")
    assert installed.python == "/root/standin/python3"  # not the venv's /root/.pyenv python
    write_drafter(ssh_host.root_dir / "models" / "qwen3-8b-dflash", qwen3_8b())
    write_control(ssh_host, "/root/standin/control.json", {"acceptance": 1.0})
    result, server_exit = run_remote(
        ssh_host,
        [],
        installed,
        "/root/models/qwen3-8b-dflash",
        "/root/standin/control.json",
    )
    assert result["ready"], (ssh_host.root_dir / "standin" / "server.log").read_text()
    assert result["tokens"] == 40
    assert result["counters"]["vllm:spec_decode_num_accepted_tokens_total"] == 32
    assert server_exit == "server exit 0"
    log = (ssh_host.root_dir / "standin" / "server.log").read_text()
    assert "model='/root/models/qwen3-8b-dflash', num_spec_tokens=4" in log


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.lxc
def test_stand_in_serves_inside_a_busybox_container_behind_ssh(
    lxc_container_on_host: Container,
) -> None:
    container, host = lxc_container_on_host, lxc_container_on_host.host
    assert host is not None
    assert container.attach(["sh", "-c", "command -v python3"]).returncode != 0  # busybox
    installed = install_standin(container, "/root/standin")
    write_drafter(container.rootfs / "root" / "models" / "d", qwen3_8b())
    write_control(container, "/root/standin/control.json", {"acceptance": 0.5})
    attach = ["lxc-attach", "-n", container.name, "--"]
    result, server_exit = run_remote(
        host, attach, installed, "/root/models/d", "/root/standin/control.json"
    )
    assert result["ready"], (container.rootfs / "root/standin/server.log").read_text()
    counters = result["counters"]
    assert counters["vllm:spec_decode_num_accepted_tokens_total"] == pytest.approx(
        counters["vllm:spec_decode_num_draft_tokens_total"] * 0.5, abs=1
    )
    assert server_exit == "server exit 0"
    assert container.attach(["sh", "-c", "command -v python3"]).returncode != 0


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.lxc
def test_container_python_also_runs_through_the_mounted_loader(
    lxc_container_on_host: Container,
) -> None:
    installed = install_standin(lxc_container_on_host, "/root/standin", verify=False)
    wrapper = vllm_standin_install._container_python_wrapper(direct=False)
    assert "--library-path" in wrapper
    vllm_standin_install._put(lxc_container_on_host, "/root/loader-python", wrapper.encode(), "755")
    check = "import transformers; print(transformers.AutoConfig.__name__)"
    for python in (installed.python, "/root/loader-python"):
        proc = lxc_container_on_host.attach([python, "-c", check], timeout=120)
        assert (proc.returncode, proc.stdout.strip()) == (0, "AutoConfig"), proc.stderr
