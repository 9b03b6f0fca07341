"""A 20-host play of ``dflash.provision.drafter_config`` in ``serial`` batches (real
ansible-playbook over ssh against 20 real sshd hosts of the test bed): the batches run in order
and every host ends on the proved authoritative bytes; a host that fails in the second batch
(a planted symlink, refused) with ``max_fail_percentage: 0`` stops the play there, so the third
batch keeps its old file and nothing is half-written anywhere."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest

from dflash_provision.history.store import HistoryStore
from testbed import samples
from testbed.hosts import Fleet, Host
from tests.fixtures.ansible_play import Play, Played

pytestmark = [pytest.mark.integration, pytest.mark.root]

DRAFTER = "/root/models/Qwen3.6-27B-DFlash"
CONFIG = f"{DRAFTER}/config.json"
REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()
TASK = "the drafter config"
HOSTS = 20


def _put(host: Host, data: bytes) -> None:
    script = f'mkdir -p {DRAFTER} && rm -f {CONFIG} && cat > "$1"'
    host.exec(["sh", "-c", script, "sh", CONFIG], data, check=True)


def _read(host: Host) -> bytes:
    return bytes(host.exec(["cat", CONFIG], check=True, text=False).stdout)


def _playbook(serial: str) -> str:
    return (
        f"- hosts: fleet\n  gather_facts: false\n  serial: {serial}\n"
        "  max_fail_percentage: 0\n  tasks:\n"
        f"    - name: {TASK}\n      dflash.provision.drafter_config:\n"
        f"        path: {DRAFTER}\n        src: authoritative.json\n"
    )


def _batches(done: Played) -> list[str]:
    """The hosts in the order their results came."""
    return [r["host"] for r in done.results if r["task"] == TASK]


@pytest.fixture(scope="module")
def bed(make_fleet: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, Play]]:
    fleet = make_fleet(HOSTS)
    tmp = tmp_path_factory.mktemp("ansible-serial")
    (tmp / "authoritative.json").write_bytes(REFERENCE)
    yield fleet, Play(fleet, tmp)


def test_twenty_hosts_in_serial_batches_all_end_proved(bed: tuple[Fleet, Play]) -> None:
    fleet, play = bed
    for host in fleet.hosts:
        _put(host, INCIDENT)
    done = play.run(_playbook("[1, 5, '100%']"), "-f", "20")
    assert done.returncode == 0, done.output[-3000:]
    names = [h.alias for h in fleet.hosts]
    order = _batches(done)
    assert len(order) == HOSTS
    assert order[:1] == names[:1]  # the canary alone
    assert sorted(order[1:6]) == names[1:6]  # then five
    assert sorted(order[6:]) == names[6:]  # then the rest
    for host in fleet.hosts:
        result = done.of(host.alias, TASK)["result"]
        assert result["status"] == "written" and "matched" in result["proof"], result
        assert _read(host) == REFERENCE
    rows = HistoryStore(play.tmp / "state" / "history.sqlite3").query(op="push", limit=None)
    sha = hashlib.sha256(REFERENCE).hexdigest()
    assert sorted(r.host for r in rows) == sorted(names)  # one row per write
    assert {(r.status, r.sha256_after) for r in rows} == {("written", sha)}


def test_a_failure_in_the_second_batch_stops_the_play_before_the_third(
    bed: tuple[Fleet, Play],
) -> None:
    fleet, play = bed
    for host in fleet.hosts:
        _put(host, INCIDENT)
    planted = fleet.hosts[3]  # in batch 2
    planted.exec(["sh", "-c", f"rm -f {CONFIG} && ln -s /etc/hostname {CONFIG}"], check=True)
    hostname = planted.exec(["cat", "/etc/hostname"], check=True).stdout
    try:
        done = play.run(_playbook("[1, 5, '100%']"), "-f", "20")
        assert done.returncode != 0
        assert done.of(planted.alias, TASK)["outcome"] == "failed"
        assert "symlink" in done.of(planted.alias, TASK)["result"]["msg"].lower()
        assert planted.exec(["cat", "/etc/hostname"], check=True).stdout == hostname
        seen = set(_batches(done))
        assert seen == {h.alias for h in fleet.hosts[:6]}  # batch 3 never started
        for index, host in enumerate(fleet.hosts):
            if host is planted:
                continue
            assert _read(host) == (REFERENCE if index < 6 else INCIDENT), host.alias
    finally:
        planted.exec(["rm", "-f", CONFIG], check=True)
