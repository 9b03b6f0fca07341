"""runtime-check's fleet form on three real sshd hosts with the vLLM STAND-IN (a test double)
started by ``launch``: one healthy, one whose drafts are rejected (in an LXC container), one
down. An inventory, ``--limit``, a table, ``--json`` and a Prometheus textfile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.hosts import Fleet, Host
from testbed.lxc import Container
from testbed.vllm_standin_install import (
    CONTROL_ENV,
    StandinInstall,
    install_standin,
    standin_container,
    write_control,
)
from tests.fixtures.cli import Cli
from tests.fixtures.runtime import (
    CONTROL,
    DRAFTER_DIR,
    REFERENCE,
    TARGET_DIR,
    free_port,
)

pytestmark = [pytest.mark.integration, pytest.mark.root]


def _prepare(place: Host | Container) -> StandinInstall:
    standin = install_standin(place, "/root/standin")
    for path, data in (
        (f"{DRAFTER_DIR}/config.json", REFERENCE),
        (f"{TARGET_DIR}/config.json", samples.REFERENCE_TARGET.read_bytes()),
    ):
        script = 'mkdir -p "${1%/*}" && cat > "$1"'
        argv = ["sh", "-c", script, "sh", path]
        if isinstance(place, Host):
            place.exec(argv, data, check=True)
        else:
            place.attach(argv, data)
    write_control(place, CONTROL, {})
    return standin


@pytest.mark.lxc
def test_fleet_runtime_check_table_json_and_prometheus_gauges(
    make_fleet: object, tmp_path: Path
) -> None:
    # The fake hosts share one network namespace, so two servers on one port need two network
    # namespaces: h01 serves on the host itself, h02 inside an LXC container (its own netns,
    # reached through the container's python); h03 is down.
    fleet: Fleet = make_fleet(3)  # type: ignore[operator]
    h01, h02, h03 = fleet.hosts
    assert h01.client is not None
    ssh = ["--ssh-config", str(h01.client.ssh_config), "--no-agent"]
    authority = tmp_path / "config.json"
    authority.write_bytes(REFERENCE)
    (tmp_path / "work").mkdir()
    cli = Cli(tmp_path / "work")
    port = free_port()
    container = standin_container(h02)
    try:
        targets = {
            h01.alias: (h01, f"{h01.alias}:{DRAFTER_DIR}"),
            "h02-ct": (container, f"{h02.alias}/lxc:{container.name}:{DRAFTER_DIR}"),
        }
        for place, target in targets.values():
            standin = _prepare(place)
            proc = cli.run(
                "launch", target, "--model", TARGET_DIR, "--from", str(authority),
                "--vllm", standin.vllm, "--python", standin.python, "--port", str(port),
                "--env", f"{CONTROL_ENV}={CONTROL}", "--no-check", *ssh,
            )  # fmt: skip
            assert proc.returncode == 0, proc.stdout + proc.stderr
        write_control(container, CONTROL, {"acceptance": 0.011})
        h03.stop()
        _check_fleet(tmp_path, cli, ssh, port, authority, h01.alias, h02.alias, container.name,
                     h03.alias)  # fmt: skip
    finally:
        container.destroy()


def _check_fleet(
    tmp_path: Path,
    cli: Cli,
    ssh: list[str],
    port: int,
    authority: Path,
    h01: str,
    h02: str,
    container: str,
    h03: str,
) -> None:
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text(
        "defaults:\n"
        f"  path: {DRAFTER_DIR}\n"
        f"  drafter: {{from: {authority}}}\n"
        "groups:\n"
        "  serving:\n"
        "    hosts:\n"
        f"      - {h01}\n"
        f"      - {{name: h02-ct, address: {h02}, container: 'lxc:{container}'}}\n"
        f"  spare: {{hosts: [{h03}]}}\n"
    )
    prom = tmp_path / "textfile" / "runtime.prom"
    prom.parent.mkdir()
    python = ["--python", "/root/standin/python3"]

    table = cli.run(
        "runtime-check", "-i", str(inventory), "--port", str(port), "--prometheus", str(prom),
        "--connect-timeout", "3", *python, *ssh,
    )  # fmt: skip
    assert table.returncode == ExitCode.ACCEPTANCE_LOW, table.stdout + table.stderr
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines() if line[:1] == "h"}
    assert rows[h01][1:8] == ["passed", "ok", "ok", "ok", "ok", "ok", "60.0%"]
    assert rows["h02-ct"][1:8] == ["acceptance_low", "ok", "ok", "ok", "ok", "FAIL", "1.1%"]
    assert rows[h03][1] == "unreachable_refused"
    assert "3 hosts: 1 passed, 1 acceptance low, 1 not checked" in table.stdout

    text = prom.read_text()
    path = f'path="{DRAFTER_DIR}/config.json"'
    assert f'dflash_runtime_acceptance_rate{{host="{h01}",group="serving",{path}}} 0.6' in text
    assert f'dflash_runtime_acceptance_rate{{host="h02-ct",group="serving",{path}}} 0.01' in text
    assert f'dflash_runtime_check_passed{{host="h02-ct",group="serving",{path}}} 0' in text
    assert f'dflash_runtime_acceptance_rate{{host="{h03}"' not in text  # nothing measured
    assert f'dflash_runtime_stage_passed{{host="{h03}",group="spare",{path},stage="a"}} 0' in text
    assert list(prom.parent.iterdir()) == [prom]  # atomic write: no temp file left

    limited = cli.run(
        "runtime-check", "-i", str(inventory), "--limit", "serving", "--port", str(port),
        "--json", *python, *ssh,
    )  # fmt: skip
    assert limited.returncode == ExitCode.ACCEPTANCE_LOW, limited.stdout + limited.stderr
    document = json.loads(limited.stdout)
    assert [h["name"] for h in document["hosts"]] == [h01, "h02-ct"]
    assert document["summary"]["by_verdict"] == {"passed": 1, "acceptance_low": 1}
    h02_e = document["hosts"][1]["check"]["stages"][4]
    assert h02_e["stage"] == "e" and h02_e["causes"]
