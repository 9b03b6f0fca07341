"""runtime-check's stage e takes counters as evidence only when they make sense, and compares a
pass with the acceptance reference of an earlier one: the CLI in a subprocess against a real
sshd host (and an LXC container behind it) running the vLLM STAND-IN (a test double), whose
control file makes its counters impossible, reset mid-check, or mixed with another client's
requests."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from testbed.hosts import Fleet
from testbed.vllm_standin_install import (
    CONTROL_ENV,
    standin_container,
    write_control,
)
from tests.fixtures.cli import Cli
from tests.fixtures.runtime import CONTROL, DRAFTER_DIR, REFERENCE, TARGET_DIR, free_port
from tests.fixtures.standin import Bed, ContainerBed, stages
from tests.test_runtime_check_fleet import _prepare

pytestmark = [pytest.mark.integration, pytest.mark.root]


def _percentages(text: str) -> list[float]:
    return [float(p) for p in re.findall(r"(\d+(?:\.\d+)?)%", text)]


def test_accepted_more_than_drafted_is_inconclusive_naming_the_counters(bed: Bed) -> None:
    bed.launch()
    bed.control(impossible_counters=True)
    proc = bed.check()
    assert proc.returncode == ExitCode.INCONCLUSIVE, proc.stdout + proc.stderr
    out = proc.stdout
    assert "e  acceptance: INCONCLUSIVE  the server's counters are impossible" in out
    assert re.search(r"accepted tokens \d+ > draft tokens \d+", out), out
    assert "runtime-check INCONCLUSIVE at stage e" in out
    assert "runtime-check passed" not in out and "likely causes" not in out
    assert all(p <= 100.0 for p in _percentages(out)), out  # no "acceptance 260.0%"

    code, report = bed.check_json()
    e = stages(report)["e"]
    assert code == ExitCode.INCONCLUSIVE and not report["ok"]
    assert e["status"] == "inconclusive" and e["causes"] == []
    assert e["data"]["acceptance_rate"] is None and report["acceptance_rate"] is None
    assert e["data"]["counters_impossible"]


def test_a_counter_reset_during_the_check_says_the_server_restarted(bed: Bed) -> None:
    bed.launch()
    assert bed.check("--prompts", "4").returncode == 0  # the server has served traffic
    bed.control(reset_counters="restart-1")  # its next completion finds every counter at 0
    proc = bed.check()
    assert proc.returncode == ExitCode.INCONCLUSIVE, proc.stdout + proc.stderr
    out = proc.stdout
    assert "e  acceptance: INCONCLUSIVE  the server restarted during the check" in out
    assert re.search(r"drafts \d+ → \d+", out), out
    assert "no acceptance rate can be computed" in out
    assert "likely causes" not in out and "acceptance 0.0%" not in out  # no drafter blamed
    code, report = bed.check_json()  # the counters count up again from here: a real pass
    assert code == 0, report


def test_a_restart_is_caught_even_when_the_counters_grew_past_the_old_values(bed: Bed) -> None:
    bed.launch()
    assert bed.check("--prompts", "1").returncode == 0  # 4 drafts so far
    bed.control(reset_counters="restart-2")
    code, report = bed.check_json()  # 12 drafts after the restart: more than before
    e = stages(report)["e"]
    assert code == ExitCode.INCONCLUSIVE, report
    assert e["summary"].startswith("the server restarted during the check")
    assert any("vllm:spec_decode_num_drafts_created" in c for c in e["data"]["counters_decreased"])
    assert e["causes"] == [] and e["data"]["acceptance_rate"] is None


def test_too_few_draft_tokens_are_inconclusive_and_the_defaults_make_enough(bed: Bed) -> None:
    bed.launch()
    # One prompt of 8 tokens: one draft of K=15 tokens, fewer than the default 32.
    proc = bed.check("--prompts", "1", "--max-tokens", "8")
    assert proc.returncode == ExitCode.INCONCLUSIVE, proc.stdout + proc.stderr
    assert (
        "e  acceptance: INCONCLUSIVE  only 15 draft tokens during the check, fewer than "
        "--min-draft-tokens 32: too few to judge"
    ) in proc.stdout
    code, report = bed.check_json("--min-draft-tokens", "1000")
    assert code == ExitCode.INCONCLUSIVE
    assert stages(report)["e"]["data"]["draft_tokens"] == 180  # the default 3 prompts x 32
    assert bed.check().returncode == 0  # 180 >= 32: the defaults decide


def test_another_clients_requests_are_counted_from_the_request_counter(bed: Bed) -> None:
    bed.launch()
    bed.control(foreign_requests=5)  # 5 short requests of another client on every /metrics read
    # The short prompts' window (the long prompt past the window cannot tell with such traffic:
    # tests/test_long_context_standin.py).
    code, report = bed.check_json("--no-long-context")
    assert code == 0, report  # documented: a warning, the drafts are still this server's
    e = stages(report)["e"]
    assert e["data"]["foreign_requests"] == 5 and e["data"]["own_requests"] == 3
    assert e["data"]["foreign_drafts"] == 0  # drafts per generated token could not tell
    assert any("finished 5 request(s) from other clients" in w for w in e["warnings"])
    # Such a window is no clean measurement: it does not become an acceptance reference.
    history = bed.cli.run("history", "--op", "runtime-check", "--json")
    assert history.returncode == 0 and json.loads(history.stdout) == [], history.stdout


def test_a_drop_below_the_reference_warns_and_fails_with_max_regression(bed: Bed) -> None:
    bed.launch()
    first = bed.check()
    assert first.returncode == 0, first.stdout + first.stderr
    history = bed.cli.run("history", "--op", "runtime-check", "--json")
    assert history.returncode == 0, history.stderr
    (recorded,) = json.loads(history.stdout)
    assert recorded["status"] == "passed" and recorded["host"] == bed.host.alias
    assert recorded["message"].startswith(
        "acceptance reference: rate 60.0%, mean acceptance length 10.00, 3 prompt(s) x 32 tokens"
    )

    bed.control(acceptance=0.4)
    code, report = bed.check_json()
    assert code == 0  # without a gate, a drop is a warning
    e = stages(report)["e"]
    assert e["data"]["reference"]["mean_acceptance_length"] == pytest.approx(10.0)
    assert e["data"]["reference"]["vllm_version"] == "0.32.0+dflash-standin"
    assert e["data"]["regression"] == pytest.approx(0.3, abs=0.01)  # 10.00 → 7.00
    assert any(w.startswith("acceptance regressed: mean acceptance length 7.00 vs 10.00")
               for w in e["warnings"]), e["warnings"]  # fmt: skip

    gated = bed.check("--max-regression", "10%")
    assert gated.returncode == ExitCode.ACCEPTANCE_LOW, gated.stdout + gated.stderr
    assert "30.0% lower, more than --max-regression 10.0%" in gated.stdout
    assert bed.check("--max-regression", "0.1").returncode == ExitCode.ACCEPTANCE_LOW
    assert bed.check("--max-regression", "0.5").returncode == 0

    assert bed.check("--no-reference", "--max-regression", "10%").returncode == ExitCode.USAGE
    code, ignored = bed.check_json("--no-reference")
    assert code == 0 and stages(ignored)["e"]["data"]["reference"] is None
    # Accepting the new figures: the reference is reset, and 7.00 is no regression any more.
    assert bed.check("--reset-reference").returncode == 0
    assert bed.check("--max-regression", "10%").returncode == 0


def test_doctor_on_impossible_counters_is_inconclusive_not_nothing_broken(bed: Bed) -> None:
    bed.launch()
    bed.control(impossible_counters=True)
    proc = bed.cli.run(
        "doctor", f"{bed.host.alias}:{DRAFTER_DIR}", "--from", bed.authority(),
        "--port", str(bed.port), *bed.ssh(),
    )  # fmt: skip
    assert proc.returncode == ExitCode.INCONCLUSIVE, proc.stdout + proc.stderr
    assert "cannot tell: acceptance: the server's counters are impossible" in proc.stdout
    assert "nothing broken" not in proc.stdout and "Traceback" not in proc.stderr


@pytest.mark.lxc
def test_references_and_impossible_counters_inside_an_lxc_container(
    container_bed: ContainerBed,
) -> None:
    container_bed.launch()
    first = container_bed.run("runtime-check")
    assert first.returncode == 0, first.stdout + first.stderr
    write_control(container_bed.container, CONTROL, {"acceptance": 0.4})
    gated = container_bed.run("runtime-check", "--max-regression", "10%")
    assert gated.returncode == ExitCode.ACCEPTANCE_LOW, gated.stdout + gated.stderr
    assert "30.0% lower, more than --max-regression 10.0%" in gated.stdout
    history = container_bed.bed.cli.run("history", "--op", "runtime-check", "--json")
    hosts = [row["host"] for row in json.loads(history.stdout)]
    assert hosts == [f"{container_bed.bed.host.alias}/lxc:{container_bed.container.name}"]

    write_control(container_bed.container, CONTROL, {"impossible_counters": True})
    proc = container_bed.run("runtime-check")
    assert proc.returncode == ExitCode.INCONCLUSIVE, proc.stdout + proc.stderr
    assert "the server's counters are impossible" in proc.stdout


# --------------------------------------------------------------------------------------------
# the fleet form: an inconclusive host is shown as inconclusive, and references work per host


@pytest.mark.lxc
def test_fleet_form_shows_an_inconclusive_host_and_compares_with_references(
    make_fleet: object, tmp_path: Path
) -> None:
    # Two servers on one port need two network namespaces: h01 serves on the host itself, the
    # other inside an LXC container behind h02 (as in test_runtime_check_fleet).
    fleet: Fleet = make_fleet(2)  # type: ignore[operator]
    h01, h02 = fleet.hosts
    assert h01.client is not None
    ssh = ["--ssh-config", str(h01.client.ssh_config), "--no-agent"]
    authority = tmp_path / "config.json"
    authority.write_bytes(REFERENCE)
    (tmp_path / "work").mkdir()
    cli = Cli(tmp_path / "work")
    port = free_port()
    container = standin_container(h02)
    try:
        for place, target in (
            (h01, f"{h01.alias}:{DRAFTER_DIR}"),
            (container, f"{h02.alias}/lxc:{container.name}:{DRAFTER_DIR}"),
        ):
            standin = _prepare(place)
            proc = cli.run(
                "launch", target, "--model", TARGET_DIR, "--from", str(authority),
                "--vllm", standin.vllm, "--python", standin.python, "--port", str(port),
                "--env", f"{CONTROL_ENV}={CONTROL}", "--no-check", *ssh,
            )  # fmt: skip
            assert proc.returncode == 0, proc.stdout + proc.stderr
        inventory = tmp_path / "fleet.yaml"
        inventory.write_text(
            f"defaults:\n  path: {DRAFTER_DIR}\n  drafter: {{from: {authority}}}\n"
            "groups:\n  serving:\n    hosts:\n"
            f"      - {h01.alias}\n"
            f"      - {{name: h02-ct, address: {h02.alias}, container: 'lxc:{container.name}'}}\n"
        )
        args = ["runtime-check", "-i", str(inventory), "--port", str(port), *ssh,
                "--python", "/root/standin/python3"]  # fmt: skip
        first = cli.run(*args)
        assert first.returncode == 0, first.stdout + first.stderr  # both record a reference

        write_control(container, CONTROL, {"impossible_counters": True})
        prom = tmp_path / "runtime.prom"
        table = cli.run(*args, "--prometheus", str(prom))
        assert table.returncode == ExitCode.INCONCLUSIVE, table.stdout + table.stderr
        rows = {line.split()[0]: line.split() for line in table.stdout.splitlines()
                if line[:1] == "h"}  # fmt: skip
        assert rows[h01.alias][1:8] == ["passed", "ok", "ok", "ok", "ok", "ok", "60.0%"]
        assert rows["h02-ct"][1:8] == ["inconclusive", "ok", "ok", "ok", "ok", "??", "-"]
        assert "2 hosts: 1 passed, 1 inconclusive" in table.stdout
        text = prom.read_text()
        labels = f'host="h02-ct",group="serving",path="{DRAFTER_DIR}/config.json"'
        assert f"dflash_runtime_check_inconclusive{{{labels}}} 1" in text
        assert f"dflash_runtime_check_passed{{{labels}}} 0" in text

        write_control(h01, CONTROL, {"acceptance": 0.4})
        gated = cli.run(*args, "--max-regression", "10%", "--json")
        assert gated.returncode == ExitCode.ACCEPTANCE_LOW, gated.stdout + gated.stderr
        document = json.loads(gated.stdout)
        assert document["summary"]["by_verdict"] == {"acceptance_low": 1, "inconclusive": 1}
        e = document["hosts"][0]["check"]["stages"][4]
        assert e["data"]["regression"] == pytest.approx(0.3, abs=0.01)
        assert "more than --max-regression 10.0%" in e["summary"]
    finally:
        container.destroy()
