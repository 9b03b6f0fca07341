"""``dflash.provision.drafter_config`` with ``become: true`` (real sudo, ``sudo -n``, on an
sshd host in namespaces): a non-root login writes the drafter config in a root-owned directory
through Ansible's own privilege escalation, with push's proof; without become the same play
fails naming the permission and changes nothing. The accounts exist only inside the host
(tests/fixtures/login_users.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.hosts import Fleet
from tests.fixtures.ansible_play import Play
from tests.fixtures.login_users import (
    LoginUser,
    add_private_login_users,
    fleet_for_any_user,
    free_uids,
)
from tests.fixtures.model_dirs import INCIDENT, REFERENCE, assert_no_temp_left, in_root, seed

pytestmark = [pytest.mark.integration, pytest.mark.root]

MODEL = "/root/models/ansible-become"
TASK = "the drafter config"


def _playbook(become: bool) -> str:
    return (
        f"- hosts: fleet\n  gather_facts: false\n  become: {str(become).lower()}\n  tasks:\n"
        f"    - name: {TASK}\n      dflash.provision.drafter_config:\n"
        f"        path: {MODEL}\n        src: authoritative.json\n"
    )


@pytest.fixture(scope="module")
def sudo_play(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, Play]]:
    if shutil.which("sudo") is None:
        pytest.skip("sudo is not installed (apt-get install -y sudo; Makefile APT_PACKAGES)")
    with fleet_for_any_user(1) as fleet:
        user = LoginUser("dfpans", free_uids(1)[0], "ALL=(ALL) NOPASSWD: ALL")
        add_private_login_users(fleet.hosts[0], [user])
        tmp = tmp_path_factory.mktemp("ansible-become")
        (tmp / "authoritative.json").write_bytes(REFERENCE)
        host = fleet.hosts[0].alias
        yield fleet, Play(fleet, tmp, host_vars={host: f"ansible_user={user.name}"})


def test_without_become_the_login_is_refused_and_nothing_changes(
    sudo_play: tuple[Fleet, Play],
) -> None:
    fleet, play = sudo_play
    directory = in_root(fleet.hosts[0], MODEL)
    seed(directory)
    done = play.run(_playbook(become=False))
    assert done.returncode != 0
    result = done.of(fleet.hosts[0].alias, TASK)
    assert result["outcome"] == "failed"
    assert "permission denied" in result["result"]["msg"].lower(), result["result"]["msg"]
    assert (directory / "config.json").read_bytes() == INCIDENT


def test_become_writes_the_root_owned_file_with_proof(sudo_play: tuple[Fleet, Play]) -> None:
    fleet, play = sudo_play
    directory = in_root(fleet.hosts[0], MODEL)
    seed(directory)
    done = play.run(_playbook(become=True))
    assert done.returncode == 0, done.output[-3000:]
    result = done.of(fleet.hosts[0].alias, TASK)["result"]
    assert result["status"] == "written" and "matched" in result["proof"], result
    config: Path = directory / "config.json"
    assert config.read_bytes() == REFERENCE
    assert (config.stat().st_uid, config.stat().st_gid) == (0, 0)
    backups = [p for p in (directory / ".dflash-backups").iterdir() if p.read_bytes() == INCIDENT]
    assert len(backups) == 1
    assert_no_temp_left(directory)
    again = play.run(_playbook(become=True))
    assert again.of(fleet.hosts[0].alias, TASK)["result"]["status"] == "unchanged"
