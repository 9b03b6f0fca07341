"""--limit: Ansible host patterns over an inventory, and a real repair that touches only them."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from dflash_provision.errors import UsageError
from dflash_provision.inventory import load_inventory
from dflash_provision.inventory.limit import select
from testbed.hosts import Fleet
from testbed.samples import INCIDENT_DRAFTER, REFERENCE_DRAFTER
from tests.fixtures.cli import Cli
from tests.fixtures.ssh import ssh_args

INI = """
[east]
gpu[01:04]
[west]
gpu[05:06]
[prod:children]
east
west
[staging]
stg1
[all:vars]
dflash_path=/root/models/m
dflash_from=/dev/null
"""


@pytest.fixture
def members(tmp_path: Path):
    inv = tmp_path / "hosts.ini"
    inv.write_text(textwrap.dedent(INI).lstrip())
    return load_inventory(inv)


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        ("east", "gpu01 gpu02 gpu03 gpu04"),
        ("prod,!gpu02,!west", "gpu01 gpu03 gpu04"),
        ("prod:&west", "gpu05 gpu06"),  # ":" separates terms too, as in Ansible
        ("gpu0[56],stg1", "gpu05 gpu06 stg1"),
        ("~gpu0[12]", "gpu01 gpu02"),
        ("all,!prod", "stg1"),
        ("*", "gpu01 gpu02 gpu03 gpu04 gpu05 gpu06 stg1"),
        ("!staging", "gpu01 gpu02 gpu03 gpu04 gpu05 gpu06"),  # only exclusions: from all
        ("gpu06, gpu01", "gpu01 gpu06"),  # inventory order, blanks ignored
    ],
)
def test_patterns_select_like_ansible(members, pattern: str, names: str) -> None:
    assert [m.name for m in select(members, pattern)] == names.split()


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        ("eats", "'eats' matches no host or group"),
        ("all,!gpu-prod", "'gpu-prod' matches no host or group"),  # a typo must not widen it
        ("&west,&east", "leaves no host"),
        ("~gpu(", "bad regular expression"),
        (",", "no host or group named"),
    ],
)
def test_patterns_that_select_nothing_or_mistype_are_errors(
    members, pattern: str, words: str
) -> None:
    with pytest.raises(UsageError, match=words.replace("(", r"\(")):
        select(members, pattern)


@pytest.mark.integration
@pytest.mark.root
def test_repair_with_limit_writes_only_the_selected_hosts(fleet: Fleet, tmp_path: Path) -> None:
    client = fleet.client
    assert client is not None
    model = "/root/models/limited"
    for host in fleet.hosts:
        directory = host.root_dir / "models" / "limited"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_bytes(INCIDENT_DRAFTER.read_bytes())
    inv = tmp_path / "hosts.ini"
    inv.write_text(
        f"[first]\nh01\n[rest]\nh02\nh03\n[all:vars]\ndflash_path={model}\n"
        f"dflash_from={REFERENCE_DRAFTER}\n"
    )

    def cli(*command: str) -> subprocess.CompletedProcess[str]:
        known_hosts = ["--known-hosts", str(client.known_hosts)]
        return Cli(tmp_path).run(*command, "-i", str(inv), "--json", *ssh_args(fleet), *known_hosts)

    repaired = cli("repair", "--limit", "all,!first")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert [h["name"] for h in json.loads(repaired.stdout)["hosts"]] == ["h02", "h03"]
    on_disk = {
        h.name: (h.root_dir / "models" / "limited" / "config.json").read_bytes()
        for h in fleet.hosts
    }
    assert on_disk == {
        "h01": INCIDENT_DRAFTER.read_bytes(),  # not selected: untouched
        "h02": REFERENCE_DRAFTER.read_bytes(),
        "h03": REFERENCE_DRAFTER.read_bytes(),
    }
    audited = cli("audit", "-l", "h01")
    assert audited.returncode == 4  # drift found, and only h01 was looked at
    assert [h["name"] for h in json.loads(audited.stdout)["hosts"]] == ["h01"]
    typo = cli("audit", "--limit", "all,!frist")
    assert typo.returncode == 2
    assert typo.stderr.strip() == (
        "error: --limit: 'frist' matches no host or group in the inventory"
    )
