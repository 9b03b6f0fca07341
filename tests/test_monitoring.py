"""monitoring/: the shipped Prometheus alerting rules and Grafana dashboard, on series taken from
a REAL ``audit --prometheus`` and a REAL fleet ``runtime-check --prometheus`` run on the test
bed's sshd hosts with the vLLM STAND-IN (a test double). ``promtool check rules`` and
``promtool test rules`` (Debian's prometheus package) judge the rules on those series; one test
has Debian's node_exporter serve the textfiles to a real Prometheus whose rules then fire.

The hosts: h01 serves the drafter (stand-in) and passes a first runtime-check, which records the
acceptance reference; then its drafts are mostly rejected and a second check finds acceptance
below the gate and regressed against the reference. h02's config is loader-normalised, h03's the
incident's drifted one; h03 is then stopped, so the runtime-check cannot check it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.hosts import Fleet, Host
from testbed.vllm_standin_install import (
    CONTROL_ENV,
    install_standin,
    write_control,
)
from tests.fixtures.cli import Cli
from tests.fixtures.runtime import (
    CONTROL,
    DRAFTER_DIR,
    INCIDENT,
    NO_SWA,
    REFERENCE,
    TARGET_DIR,
    free_port,
    put,
)

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "monitoring" / "dflash-alerts.yml"
DASHBOARD = ROOT / "monitoring" / "dflash-dashboard.json"
JOB, INSTANCE = "node", "controller:9100"
PATH_LABEL = f"{DRAFTER_DIR}/config.json"
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool missing (Debian package prometheus; make system-deps)")
    return found


def test_rules_pass_promtool_check() -> None:
    proc = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 10 rules found" in proc.stdout


def test_dashboard_queries_only_the_tools_gauges() -> None:
    """Every panel's query names a gauge the tool writes (no typo'd metric shows an empty panel)."""
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 6
    known = set(re.findall(r'"(dflash_[a-z_]+)"', _sources()))
    for expr in exprs:
        names = set(re.findall(r"\bdflash_[a-z_]+", expr))
        assert names and names <= known, expr


def _sources() -> str:
    files = ("fleet/report.py", "verify/fleet_check.py")
    return "".join((ROOT / "dflash_provision" / f).read_text() for f in files)


# -- the real textfiles ------------------------------------------------------------------------


@dataclass
class Textfiles:
    audit: str
    runtime: str  # the second runtime-check: h01 below the gate and regressed, h03 down
    directory: Path  # what node_exporter serves: audit.prom and runtime.prom
    hosts: tuple[str, str, str]
    first_runtime: str  # the first runtime-check: h01 passed, h03 failed stage a


@pytest.fixture(scope="module")
def textfiles(make_fleet: Any, tmp_path_factory: pytest.TempPathFactory) -> Textfiles:
    fleet: Fleet = make_fleet(3)
    h01, h02, h03 = fleet.hosts
    assert h01.client is not None
    base = tmp_path_factory.mktemp("monitoring")
    ssh = ["--ssh-config", str(h01.client.ssh_config), "--no-agent", "--connect-timeout", "3"]
    authority = base / "config.json"
    authority.write_bytes(REFERENCE)
    (base / "work").mkdir()
    cli = Cli(base / "work")
    directory = base / "textfile"
    directory.mkdir()
    for host, data in ((h01, REFERENCE), (h02, NO_SWA), (h03, INCIDENT)):
        put(host, f"{DRAFTER_DIR}/config.json", data)
    inventory = _inventory(base, authority, (h01.alias, h02.alias, h03.alias))
    audit = cli.run("audit", "-i", str(inventory), "--prometheus", str(directory / "audit.prom"),
                    *ssh)  # fmt: skip
    assert audit.returncode == ExitCode.DRIFT, audit.stdout + audit.stderr
    runtime = _runtime_textfile(cli, base, authority, h01, h03, ssh, directory / "runtime.prom")
    return Textfiles(
        (directory / "audit.prom").read_text(),
        runtime,
        directory,
        (h01.alias, h02.alias, h03.alias),
        (base / "first-runtime.prom").read_text(),
    )


def _inventory(base: Path, authority: Path, hosts: tuple[str, ...], name: str = "all") -> Path:
    path = base / f"{name}.yaml"
    path.write_text(
        f"defaults:\n  path: {DRAFTER_DIR}\n  drafter: {{from: {authority}}}\n"
        f"groups:\n  serving:\n    hosts: [{', '.join(hosts)}]\n"
    )
    return path


def _runtime_textfile(
    cli: Cli, base: Path, authority: Path, h01: Host, h03: Host, ssh: list[str], prom: Path
) -> str:
    standin = install_standin(h01, "/root/standin")
    put(h01, f"{TARGET_DIR}/config.json", samples.REFERENCE_TARGET.read_bytes())
    write_control(h01, CONTROL, {})
    port = free_port()
    launch = cli.run(
        "launch", f"{h01.alias}:{DRAFTER_DIR}", "--model", TARGET_DIR, "--from", str(authority),
        "--vllm", standin.vllm, "--python", standin.python, "--port", str(port),
        "--env", f"{CONTROL_ENV}={CONTROL}", "--no-check", *ssh,
    )  # fmt: skip
    assert launch.returncode == 0, launch.stdout + launch.stderr
    inventory = _inventory(base, authority, (h01.alias, h03.alias), "runtime")
    check = ["runtime-check", "-i", str(inventory), "--port", str(port),
             "--python", standin.python, *ssh]  # fmt: skip
    # h01 passes and records its acceptance reference; h03 has the incident's file (stage a)
    first = cli.run(*check, "--prometheus", str(base / "first-runtime.prom"))
    assert first.returncode == ExitCode.RUNTIME_CHECK_FAILED, first.stdout + first.stderr
    assert re.search(rf"^{h01.alias} +passed ", first.stdout, re.M), first.stdout
    write_control(h01, CONTROL, {"acceptance": 0.011})
    h03.stop()
    second = cli.run(*check, "--prometheus", str(prom))
    assert second.returncode == ExitCode.ACCEPTANCE_LOW, second.stdout + second.stderr
    return prom.read_text()


def _series(text: str, *, rebase: float | None = None) -> list[dict[str, str]]:
    """promtool input_series from a textfile, as node_exporter's scrape labels them; each value
    held for the whole test. ``rebase``: subtract it from the *_timestamp_seconds gauges, so the
    run happened at promtool's time 0 (its clock starts at the Unix epoch)."""
    out = []
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if line.startswith("#") or match is None:
            continue
        name, labels, value = match.groups()
        inner = (labels or "{}")[1:-1]
        extra = f'job="{JOB}",instance="{INSTANCE}"'
        number = float(value)
        if rebase is not None and name.endswith("_timestamp_seconds"):
            number -= rebase
        series = f"{name}{{{inner + ',' if inner else ''}{extra}}}"
        out.append({"series": series, "values": f"{number!r}x200"})
    return out


def _timestamps(files: Textfiles) -> float:
    match = re.search(r"^dflash_config_audit_timestamp_seconds (\S+)$", files.audit, re.M)
    assert match is not None
    return float(match.group(1))


def _labels(alert: str, severity: str, host: str, **extra: str) -> dict[str, str]:
    return {"alertname": alert, "severity": severity, "host": host, "group": "serving",
            "path": PATH_LABEL, "job": JOB, "instance": INSTANCE, **extra}  # fmt: skip


def _expect(alert: str, labels: dict[str, str], value: str = "") -> dict[str, Any]:
    """An expected alert: its labels and the rule's annotations rendered for them (the
    templates' ``$labels.x`` and ``$value | humanize...``, which is ``value``)."""
    rule = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                if r["alert"] == alert)  # fmt: skip

    def render(template: str) -> str:
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], template)
        return re.sub(r"\{\{ \$value \| \w+ \}\}", value, text)

    annotations = {k: render(v) for k, v in rule["annotations"].items()}
    return {"exp_labels": labels, "exp_annotations": annotations}


def _promtool_test(tmp_path: Path, series: list[dict[str, str]], tests: list[Any]) -> str:
    spec = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": tests}],
    }
    path = tmp_path / "dflash-alerts.test.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = subprocess.run(
        [_promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.integration
@pytest.mark.root
def test_promtool_alerts_on_a_real_audit_and_runtime_check(
    textfiles: Textfiles, tmp_path: Path
) -> None:
    h01, h02, h03 = textfiles.hosts
    series = _series(textfiles.audit + textfiles.runtime, rebase=_timestamps(textfiles))
    # The figures the alerts carry come from the real run; the annotations are the rules' own.
    got = _promtool_test(
        tmp_path,
        series,
        [
            {"alertname": name, "eval_time": "10m", "exp_alerts": [_expect(name, labels)]}
            for name, labels in (
                (
                    "DflashConfigDrifted",
                    _labels("DflashConfigDrifted", "warning", h03, status="drifted"),
                ),
                (
                    "DflashConfigLoaderNormalised",
                    _labels(
                        "DflashConfigLoaderNormalised", "critical", h02, status="loader_normalised"
                    ),
                ),
                (
                    "DflashAcceptanceBelowGate",
                    _labels("DflashAcceptanceBelowGate", "critical", h01, stage="e"),
                ),
                ("DflashRuntimeCheckDown", _labels("DflashRuntimeCheckDown", "warning", h03)),
            )
        ]
        + [
            # in sync, checked, not regressed: no alert yet, and not stale after 10 minutes
            {"alertname": "DflashRuntimeCheckFailed", "eval_time": "10m", "exp_alerts": []},
            {"alertname": "DflashConfigAuditStale", "eval_time": "10m", "exp_alerts": []},
            {"alertname": "DflashRuntimeCheckStale", "eval_time": "10m", "exp_alerts": []},
            {
                "alertname": "DflashConfigAuditStale",
                "eval_time": "150m",
                "exp_alerts": [
                    _expect(
                        "DflashConfigAuditStale",
                        {
                            "alertname": "DflashConfigAuditStale",
                            "severity": "warning",
                            "job": JOB,
                            "instance": INSTANCE,
                        },
                        "2h 30m 0s",
                    )
                ],
            },
        ],
    )
    assert "SUCCESS" in got


@pytest.mark.integration
@pytest.mark.root
def test_promtool_regression_alert_on_the_real_runtime_check(
    textfiles: Textfiles, tmp_path: Path
) -> None:
    h01 = textfiles.hosts[0]
    pattern = r"^dflash_runtime_acceptance_regression\{[^}]*\} (\S+)$"
    match = re.search(pattern, textfiles.runtime, re.M)
    assert match is not None, textfiles.runtime  # compared with the first check's reference
    assert float(match.group(1)) > 0.10
    drop = float(match.group(1)) * 100
    _promtool_test(
        tmp_path,
        _series(textfiles.runtime, rebase=_timestamps(textfiles)),
        [
            {
                "alertname": "DflashAcceptanceRegressed",
                "eval_time": "5m",
                "exp_alerts": [
                    _expect(
                        "DflashAcceptanceRegressed",
                        _labels("DflashAcceptanceRegressed", "warning", h01),
                        f"{drop:.4g}%",
                    )
                ],
            }
        ],
    )


@pytest.mark.integration
@pytest.mark.root
def test_promtool_check_failed_alert_on_the_first_real_runtime_check(
    textfiles: Textfiles, tmp_path: Path
) -> None:
    # h03 holds the incident's file: stage a failed, the host was checked (not down); h01
    # passed: no acceptance alert for it.
    h03 = textfiles.hosts[2]
    assert 'stage="a"} 0' in textfiles.first_runtime
    _promtool_test(
        tmp_path,
        _series(textfiles.first_runtime, rebase=_timestamps(textfiles)),
        [
            {
                "alertname": "DflashRuntimeCheckFailed",
                "eval_time": "5m",
                "exp_alerts": [
                    _expect(
                        "DflashRuntimeCheckFailed",
                        _labels("DflashRuntimeCheckFailed", "critical", h03),
                    )
                ],
            },
            {"alertname": "DflashRuntimeCheckDown", "eval_time": "5m", "exp_alerts": []},
            {"alertname": "DflashAcceptanceBelowGate", "eval_time": "5m", "exp_alerts": []},
            {"alertname": "DflashAcceptanceRegressed", "eval_time": "5m", "exp_alerts": []},
        ],
    )


# -- a real Prometheus scraping a real node_exporter -------------------------------------------


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} missing (Debian packages prometheus, prometheus-node-exporter)")
    return found


@pytest.fixture
def prometheus(textfiles: Textfiles, tmp_path: Path) -> Iterator[str]:
    """node_exporter serving the textfile directory and Prometheus (1 s scrape and rule
    evaluation) on free loopback ports, their own data dir; yields Prometheus's base URL."""
    exporter_port, prom_port = free_port(), free_port()
    exporter = [
        _binary("prometheus-node-exporter"), f"--web.listen-address=127.0.0.1:{exporter_port}",
        "--collector.disable-defaults", "--collector.textfile",
        f"--collector.textfile.directory={textfiles.directory}",
    ]  # fmt: skip
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {
                        "job_name": JOB,
                        "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}],
                    }
                ],
            }
        )
    )
    server = [
        _binary("prometheus"), f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{prom_port}",
    ]  # fmt: skip
    logs = tmp_path / "logs"
    logs.mkdir()
    procs = []
    try:
        for argv, name in ((exporter, "exporter"), (server, "prometheus")):
            with (logs / name).open("wb") as log:
                procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        yield f"http://127.0.0.1:{prom_port}"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=20)


def _firing(base: str) -> list[dict[str, Any]]:
    try:
        url = f"{base}/api/v1/alerts"
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (http only)
            document = json.loads(response.read(4 << 20))
    except OSError:
        return []  # not listening yet
    alerts: list[dict[str, Any]] = document["data"]["alerts"]
    return [a for a in alerts if a["state"] == "firing"]


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="the test bed's hosts need root")
def test_node_exporter_serves_the_textfiles_and_prometheus_fires(
    prometheus: str, textfiles: Textfiles
) -> None:
    h01, h02, _ = textfiles.hosts
    deadline = time.monotonic() + 90.0  # the one deadline: start-up, scrapes, evaluations
    wanted = {("DflashConfigLoaderNormalised", h02), ("DflashAcceptanceBelowGate", h01)}
    seen: set[tuple[str, str]] = set()
    while time.monotonic() < deadline and not wanted <= seen:
        seen = {
            (a["labels"]["alertname"], a["labels"].get("host", "")) for a in _firing(prometheus)
        }
        time.sleep(0.5)
    assert wanted <= seen, f"firing: {sorted(seen)}"


def test_promtool_a_same_values_host_raises_the_drift_alert(tmp_path: Path) -> None:
    # The textfile comes from the real renderer; the host's file has the authoritative values
    # in other bytes, which repair rewrites: the same alert as a drifted file.
    from dflash_provision.fleet import HostAudit, HostStatus
    from dflash_provision.fleet.report import prometheus_text

    audit = HostAudit(
        "h09", "serving", f"h09:{DRAFTER_DIR}", PATH_LABEL, HostStatus.SAME_VALUES,
        "same values as ref, other bytes", "ref", "0" * 64,
    )  # fmt: skip
    text = prometheus_text([audit], timestamp=1000.0, run_duration_s=0.1)
    labels = _labels("DflashConfigDrifted", "warning", "h09", status="same_values")
    got = _promtool_test(
        tmp_path,
        _series(text, rebase=1000.0),
        [
            {"alertname": "DflashConfigDrifted", "eval_time": "5m",
             "exp_alerts": [_expect("DflashConfigDrifted", labels)]},
            {"alertname": "DflashConfigAuditHostNotRead", "eval_time": "5m", "exp_alerts": []},
        ],
    )  # fmt: skip
    assert "SUCCESS" in got
