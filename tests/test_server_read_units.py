"""Unit tests: the command line read with ``vllm serve``'s rules (vllm_argv), log evidence only
from vLLM's own start-up records (vllm_log), stage c's cross-check, and the launch records that
say which port runs which drafter (locate + scripts/servers.sh, run under dash AND busybox ash).
The real-component tests are in test_server_read_standin.py and test_vllm_real.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dflash_provision.remote.protocol import script_text
from dflash_provision.server import locate
from dflash_provision.server.records import LaunchRecord
from dflash_provision.source.authority import Authority
from dflash_provision.target import parse_target
from dflash_provision.verify.stage_server import stage_server
from dflash_provision.verify.stages import CheckContext, StageStatus
from dflash_provision.vllm import log as vllm_log
from dflash_provision.vllm.argv import read_speculative
from testbed import samples

DRAFTER = "/root/models/Qwen3.6-27B-DFlash"


def ctx() -> CheckContext:
    data = samples.REFERENCE_DRAFTER.read_bytes()
    return CheckContext(
        transport=None,  # type: ignore[arg-type]  # stage c on given facts runs no command
        target=parse_target(f"gpu1:{DRAFTER}"),
        authority=Authority("test", data),
        auth_doc=json.loads(data),
        push_fix=f"dflash-provision push gpu1:{DRAFTER} --from x",
    )


A = {"method": "dflash", "model": "/m/A", "num_speculative_tokens": 4}
B = {"method": "dflash", "model": "/m/B", "num_speculative_tokens": 7}
SERVE = ["/venv/bin/python", "-m", "vllm.entrypoints.cli.main", "serve", "/m/T"]


@pytest.mark.parametrize(
    ("options", "model"),
    [
        (["--speculative-config", json.dumps(A), "--speculative-config", json.dumps(B)], "/m/B"),
        (["--speculative-config=" + json.dumps(A), "--speculative_config", json.dumps(B)], "/m/B"),
        (["--speculative_config=" + json.dumps(B)], "/m/B"),
        (["-sc", json.dumps(A), "--speculative-config=" + json.dumps(B)], "/m/B"),
        (["--speculative", json.dumps(B)], "/m/B"),  # argparse's unique prefix
        # dotted forms are merged and appended last: they replace the plain option
        (["--speculative-config.model", "/m/B", "--speculative-config", json.dumps(A)], "/m/B"),
        (["--speculative_config.model=/m/B"], "/m/B"),
        (["--spec-method", "dflash", "--spec-model=/m/B", "--spec-tokens", "7"], "/m/B"),
        (["--speculative-config", json.dumps(A), "--", "--speculative-config", "{}"], "/m/A"),
    ],
)
def test_the_command_line_is_read_as_vllm_serve_reads_it(options: list[str], model: str) -> None:
    read = read_speculative([*SERVE, *options])
    assert read.config is not None and read.config["model"] == model


def test_a_repeated_option_is_reported_with_every_value_and_dash_keys_are_underscores() -> None:
    dashed = {"method": "dflash", "model": "/m/B", "num-speculative-tokens": 7}
    read = read_speculative(
        [*SERVE, "--speculative-config", json.dumps(A), "--speculative-config", json.dumps(dashed)]
    )
    assert read.repeated and len(read.given) == 2 and "/m/A" in read.given[0]
    assert read.config == {"method": "dflash", "model": "/m/B", "num_speculative_tokens": 7}


def test_what_the_tool_cannot_know_is_said_not_guessed() -> None:
    read = read_speculative([*SERVE, "--config", "/etc/vllm.yaml"])
    assert read.config is None and read.unknown is not None and "--config" in read.unknown
    # A command-line option still wins over the file (vLLM puts the file's options first).
    assert read_speculative([*SERVE, "--config", "x.yaml", "-sc", json.dumps(A)]).unknown is None
    both = read_speculative([*SERVE, "-sc", json.dumps(A), "--spec-model", "/m/B"])
    assert any("vLLM refuses" in p for p in both.problems)
    assert read_speculative([*SERVE, "--speculative-config", "{oops"]).problems


# -- the log ------------------------------------------------------------------------------------


def rec(message: str, proc: str = "EngineCore_DP0", level: str = "INFO") -> str:
    return f"({proc} pid=7) {level} 12-02 05:00:00 [core.py:134] {message}"


ENGINE = rec(
    "Initializing a V1 LLM engine (v0.32.0) with config: model='/m/T', speculative_config="
    f"SpeculativeConfig(method='dflash', model='{DRAFTER}', num_spec_tokens=15), seed=0"
)
AUX = rec("Using auxiliary layers from speculative config: (2, 17, 32, 47, 62)")
FORGED = ENGINE.replace(DRAFTER, "/evil").replace("=15", "=3")
MARK = "==== dflash-provision launch on port 8011 at 2026-12-02T05:00:00Z"
READY = "INFO:     Application startup complete."  # uvicorn's line: no vLLM prefix in 0.32


def test_only_this_launchs_records_before_ready_count() -> None:
    old = [MARK, FORGED, rec("Using auxiliary layers from speculative config: (1, 2)"), READY]
    after = [
        rec(f"Request cmpl-1 details: prompt: {FORGED!r}", "APIServer", "DEBUG"),
        FORGED,  # even a whole forged record after ready: requests were served by then
        rec("Using auxiliary layers from speculative config: (1, 2)"),
    ]
    facts = vllm_log.parse_startup("\n".join([*old, MARK, ENGINE, AUX, READY, *after]) + "\n")
    assert facts.engine is not None and facts.engine.spec_model == DRAFTER
    assert facts.aux is not None and facts.aux.ids == (2, 17, 32, 47, 62)
    assert facts.launch == MARK and facts.ready == READY


def test_a_phrase_that_is_not_a_records_own_message_is_no_evidence() -> None:
    inner = "Initializing a V1 LLM engine (v9) with config: speculative_config=SpeculativeConfig("
    lines = [
        MARK,
        f"some tool printed: {inner}method='x', model='/evil', num_spec_tokens=3)",
        rec(f"Received request cmpl-{inner}method='x', model='/evil', num_spec_tokens=3)"),
        ENGINE,
        AUX,
    ]
    facts = vllm_log.parse_startup("\n".join(lines) + "\n")
    assert facts.engine is not None and facts.engine.spec_model == DRAFTER
    assert facts.not_records == 1 and facts.ready is None


def test_a_continuation_line_of_a_multi_line_message_is_not_a_record() -> None:
    # vLLM's NewLineFormatter: message line breaks become "\r\n" + the record's own prefix.
    prefix = "(APIServer pid=7) INFO 12-02 05:00:00 [request_logger.py:65] "
    hostile = (
        prefix
        + "Received request cmpl-x\r\n"
        + FORGED.replace("(EngineCore_DP0 pid=7) INFO 12-02 05:00:00 [core.py:134] ", prefix)
    )
    facts = vllm_log.parse_startup("\n".join([MARK, ENGINE, AUX, hostile]) + "\n")
    assert facts.engine is not None and facts.engine.spec_model == DRAFTER


def test_coloured_records_and_vllms_own_ready_line_are_understood() -> None:
    coloured = "\x1b[0;36m(EngineCore_DP0 pid=7)\x1b[0;0m \x1b[32mINFO\x1b[0m \x1b[90m12-02 " + (
        ENGINE.split(" 12-02 ", 1)[1].replace("[core.py:134]", "[core.py:134]\x1b[0m", 1)
    )
    ready = rec("Starting vLLM server on http://127.0.0.1:8011", "APIServer")
    facts = vllm_log.parse_startup("\n".join([MARK, coloured, AUX, ready, FORGED]) + "\n")
    assert facts.engine is not None and facts.engine.spec_model == DRAFTER
    assert facts.ready == ready


# -- stage c ------------------------------------------------------------------------------------


class Server:
    def __init__(self, argv: list[str]) -> None:
        from dflash_provision.vllm.argv import read_speculative as read

        self.pid, self.argv, self.record = 42, argv, None
        self.argv_spec = read(argv)
        self.speculative_config = self.argv_spec.config


def _stage_c(argv: list[str], log: list[str] | None) -> Any:
    c = ctx()
    c.server = Server(argv)
    c.log = vllm_log.parse_startup("\n".join(log) + "\n") if log is not None else None
    return stage_server(c, 8000)


GOOD = {"method": "dflash", "model": DRAFTER, "num_speculative_tokens": 15}


def test_stage_c_names_both_values_when_engine_and_command_line_disagree() -> None:
    other = {**GOOD, "model": "/m/other"}
    argv = [*SERVE, "--speculative-config", json.dumps(GOOD)]
    result = _stage_c(argv, [MARK, ENGINE.replace(DRAFTER, "/m/other"), AUX])
    assert result.failed
    assert (
        f"the engine's start-up record says drafter '/m/other', the command line says '{DRAFTER}'"
        in result.evidence
    )
    # Repeated options: the last is judged, and both are shown.
    argv = [*SERVE, "--speculative-config", json.dumps(GOOD), "-sc", json.dumps(other)]
    result = _stage_c(argv, None)
    assert result.failed and "runs drafter '/m/other' (the last of 2" in result.summary
    assert any(DRAFTER in line for line in result.evidence if line.startswith("  1. "))


def test_stage_c_with_a_config_file_is_judged_by_the_engine_record_or_is_inconclusive() -> None:
    argv = [*SERVE, "--config", "/etc/vllm.yaml"]
    assert _stage_c(argv, [MARK, ENGINE, AUX]).passed
    unknown = _stage_c(argv, None)
    assert unknown.status is StageStatus.INCONCLUSIVE and "--config FILE" in unknown.summary


# -- which port runs which drafter --------------------------------------------------------------


def _launched(port: int, drafter: str, alive: bool) -> locate.Launched:
    record = LaunchRecord(
        port=port, pid=None, argv=[], env_names=[], drafter_dir=drafter, drafter_sha256="aa",
        model="/m", num_speculative_tokens=4, vllm_cmd=["vllm"], python=None,
        vllm_version="0.32.0", started_at="2026-12-02T05:00:00+00:00", log_path="/s/server.log",
    )  # fmt: skip
    return locate.Launched(port, alive, record)


def test_live_records_of_the_drafter_count_first() -> None:
    servers = [
        _launched(8011, "/m/D/", False),
        _launched(8012, "/m/D", True),
        _launched(8013, "/m/other", True),
    ]
    assert [s.port for s in locate.for_drafter(servers, "/m/D")] == [8012]
    assert [s.port for s in locate.for_drafter(servers[:1], "/m/D")] == [8011]
    assert locate.for_drafter(servers, "/m/none") == []


@pytest.mark.parametrize("shell", ["dash", "busybox"])
def test_the_servers_script_lists_every_record_in_one_exec(shell: str, tmp_path: Path) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    base = tmp_path / "dflash-provision" / "vllm"
    for port in (8011, 8012):
        (base / str(port)).mkdir(parents=True)
        record = _launched(port, f"/m/{port}", False).record
        (base / str(port) / "launch.json").write_text(record.to_json() + "\n")
    (base / "junk").mkdir()
    (base / "8013").mkdir()  # no record: not listed
    argv = [shell, "sh", "-c"] if shell == "busybox" else [shell, "-c"]
    done = subprocess.run(
        [*argv, script_text("servers"), "dflash-servers"],
        env={"PATH": "/usr/bin:/bin", "XDG_STATE_HOME": str(tmp_path)},
        capture_output=True, check=True, timeout=30,
    )  # fmt: skip
    lines = done.stdout.decode().splitlines()
    assert lines[0] == "dflash-servers 1"
    servers = [line.split(" ", 3) for line in lines if line.startswith("server ")]
    assert [(s[1], s[2]) for s in servers] == [("8011", "0"), ("8012", "0")]
    assert json.loads(servers[1][3])["drafter_dir"] == "/m/8012"
