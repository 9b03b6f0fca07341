"""``dflash.provision.drafter_config`` run by real ansible-playbook (ansible-core 2.19, from the
registry) over its ssh connection against real sshd hosts of the test bed: check mode, diff mode,
apply with proof and history, idempotence, a planted symlink refused, a source that fails
validation refused on the controller. The module is an action plugin over this project's push
(dflash_provision.ansible_modules.drafter_config), so the host side is push's own protocol."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_provision.history.store import HistoryStore
from testbed import samples
from testbed.hosts import Fleet, Host
from tests.fixtures.ansible_play import Play

pytestmark = [pytest.mark.integration, pytest.mark.root]

DRAFTER = "/root/models/Qwen3.6-27B-DFlash"
CONFIG = f"{DRAFTER}/config.json"
REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()
TASK = "the drafter config"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _put(host: Host, path: str, data: bytes) -> None:
    host.exec(["sh", "-c", 'mkdir -p "${1%/*}" && cat > "$1"', "sh", path], data, check=True)


def _read(host: Host, path: str) -> bytes:
    return bytes(host.exec(["cat", path], check=True, text=False).stdout)


def _playbook(source: str, hosts: str = "fleet") -> str:
    return (
        f"- hosts: {hosts}\n  gather_facts: false\n  tasks:\n"
        f"    - name: {TASK}\n      dflash.provision.drafter_config:\n"
        f"        path: {DRAFTER}\n        {source}\n"
    )


@pytest.fixture(scope="module")
def bed(make_fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, Play]]:  # type: ignore[no-untyped-def]
    fleet = make_fleet(2)
    tmp = tmp_path_factory.mktemp("ansible")
    (tmp / "authoritative.json").write_bytes(REFERENCE)
    broken = json.loads(REFERENCE)
    broken["block_size"] = "sixteen"  # the schema wants an integer
    (tmp / "broken.json").write_text(json.dumps(broken, indent=2) + "\n")
    yield fleet, Play(fleet, tmp, hosts=[fleet.hosts[0].alias])


def test_check_mode_reports_the_change_shows_the_diff_and_writes_nothing(bed) -> None:  # type: ignore[no-untyped-def]
    fleet, play = bed
    h01 = fleet.hosts[0]
    _put(h01, CONFIG, INCIDENT)
    done = play.run(_playbook("src: authoritative.json"), "--check", "--diff")
    assert done.returncode == 0, done.output[-3000:]
    result = done.of(h01.alias, TASK)["result"]
    assert result["changed"] is True and result["status"] == "dry-run", result
    assert "dflash_config.mask_token_id: 248064 → 248070" in done.output  # the diff, as shown
    assert _read(h01, CONFIG) == INCIDENT
    assert not (play.tmp / "state" / "history.sqlite3").exists()  # check mode keeps nothing


def test_apply_writes_proves_by_read_back_and_records_the_write(bed) -> None:  # type: ignore[no-untyped-def]
    fleet, play = bed
    h01 = fleet.hosts[0]
    _put(h01, CONFIG, INCIDENT)
    done = play.run(_playbook("src: authoritative.json"))
    assert done.returncode == 0, done.output[-3000:]
    result = done.of(h01.alias, TASK)["result"]
    assert result["changed"] is True and result["status"] == "written", result
    assert result["old_sha256"] == _sha(INCIDENT)
    assert result["new_sha256"] == result["readback_sha256"] == _sha(REFERENCE)
    assert result["backup"] and "matched" in result["proof"]
    assert _read(h01, CONFIG) == REFERENCE  # on the host itself
    backup = _read(h01, f"{DRAFTER}/.dflash-backups/{result['backup']}")
    assert backup == INCIDENT
    rows = HistoryStore(play.tmp / "state" / "history.sqlite3").query(op="push", limit=None)
    assert [(r.status, r.sha256_after) for r in rows] == [("written", _sha(REFERENCE))]


def test_a_second_run_changes_nothing(bed) -> None:  # type: ignore[no-untyped-def]
    fleet, play = bed
    done = play.run(_playbook("src: authoritative.json"))
    assert done.returncode == 0, done.output[-3000:]
    result = done.of(fleet.hosts[0].alias, TASK)["result"]
    assert result["changed"] is False and result["status"] == "unchanged", result
    assert "changed=0" in done.output


def test_a_planted_symlink_is_refused_and_its_target_untouched(bed) -> None:  # type: ignore[no-untyped-def]
    fleet, play = bed
    h01 = fleet.hosts[0]
    _put(h01, "/root/elsewhere.json", b"not yours\n")
    link = f"mkdir -p {DRAFTER} && rm -f {CONFIG} && ln -s /root/elsewhere.json {CONFIG}"
    h01.exec(["sh", "-c", link], check=True)
    try:
        done = play.run(_playbook("src: authoritative.json"))
        assert done.returncode != 0, done.output[-3000:]
        result = done.of(h01.alias, TASK)
        assert result["outcome"] == "failed", result
        assert "symlink" in result["result"]["msg"].lower(), result["result"]["msg"]
        assert _read(h01, "/root/elsewhere.json") == b"not yours\n"
        link = h01.exec(["readlink", CONFIG], check=True).stdout.strip()
        assert link == "/root/elsewhere.json"
    finally:
        h01.exec(["sh", "-c", f"rm -f {CONFIG}"], check=True)
        _put(h01, CONFIG, REFERENCE)


def test_a_write_that_fails_on_the_host_keeps_the_old_file(bed) -> None:  # type: ignore[no-untyped-def]
    """A full disk (a 16k tmpfs over the directory, filled): the write fails on the host, the
    task fails naming the reason, the old file is intact and no temp file is left."""
    fleet, play = bed
    h02 = fleet.hosts[1]
    _put(h02, CONFIG, INCIDENT)
    h02.fill_disk(DRAFTER)
    try:
        done = Play(fleet, play.tmp, hosts=[h02.alias]).run(_playbook("src: authoritative.json"))
        assert done.returncode != 0, done.output[-3000:]
        result = done.of(h02.alias, TASK)
        assert result["outcome"] == "failed"
        assert result["result"]["status"] == "failed"
        assert "no space" in result["result"]["msg"].lower(), result["result"]["msg"]
        assert "the old file was left untouched" in result["result"]["msg"]
        assert _read(h02, CONFIG) == INCIDENT
        left = h02.exec(["ls", "-A", DRAFTER], check=True).stdout.split()
        assert sorted(n for n in left if n != ".testbed-filler") == [
            ".dflash-backups",
            "config.json",
        ]
    finally:
        h02.undo_mounts()


def test_a_write_interrupted_on_the_host_keeps_the_old_file(bed) -> None:  # type: ignore[no-untyped-def]
    """The write is held inside its ``dd`` (the temp file being written) past the task's
    command_timeout: the script's own watchdog ends it on the host, the task fails saying so,
    the old file is intact and no temp file is left."""
    from tests.fixtures.after_rename import hold_tool, release, wait_renamed
    from tests.fixtures.model_dirs import assert_no_temp_left, in_root

    fleet, play = bed
    h02 = fleet.hosts[1]
    _put(h02, CONFIG, INCIDENT)
    hold_tool(h02, "dd", "/bin/dd")
    try:
        source = "src: authoritative.json\n        command_timeout: 5"
        done = Play(fleet, play.tmp, hosts=[h02.alias]).run(_playbook(source))
        wait_renamed(h02, timeout=1)  # the write did reach its dd: it was interrupted there
        assert done.returncode != 0, done.output[-3000:]
        result = done.of(h02.alias, TASK)
        assert result["outcome"] == "failed", result
        assert "deadline" in result["result"]["msg"], result["result"]["msg"]
        assert _read(h02, CONFIG) == INCIDENT
        assert_no_temp_left(in_root(h02, DRAFTER))
    finally:
        release(h02)
        h02.undo_mounts()
        h02.exec(["rm", "-f", "/root/.renamed", "/root/.release"], check=True)


def test_the_drafter_inside_an_lxc_container_behind_the_host(make_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``container: lxc:NAME``: the same protocol through ``lxc-attach`` on the host (a busybox
    container: no python, no bash), proved by reading the file inside the container."""
    from testbed.lxc import busybox_container, unique_name
    from tests.fixtures.hosts import skip_unless_testbed

    skip_unless_testbed(need_lxc=True)
    fleet = make_fleet(1)
    host = fleet.hosts[0]
    (tmp_path / "authoritative.json").write_bytes(REFERENCE)
    with busybox_container(unique_name("ans"), host=host) as container:
        container.attach(["sh", "-c", f"mkdir -p {DRAFTER} && cat > {CONFIG}"], INCIDENT)
        source = f"src: authoritative.json\n        container: lxc:{container.name}"
        done = Play(fleet, tmp_path, hosts=[host.alias]).run(_playbook(source))
        assert done.returncode == 0, done.output[-3000:]
        result = done.of(host.alias, TASK)["result"]
        assert result["status"] == "written" and result["changed"] is True, result
        assert result["target"].startswith(f"{host.alias}/lxc:{container.name}:")
        assert container.attach(["cat", CONFIG]).stdout.encode() == REFERENCE


@pytest.mark.docker
def test_the_drafter_inside_a_docker_container_behind_the_host(  # type: ignore[no-untyped-def]
    make_fleet, docker_daemon, tmp_path: Path
) -> None:
    """``container: docker:NAME`` with ``docker_host`` (the test bed's own dockerd, whose socket
    the host's docker does not know): the same protocol through ``docker exec -i`` on the host
    (a busybox image: no python, no bash), proved by reading the file inside the container."""
    from tests.fixtures.docker import unique_container_name

    fleet = make_fleet(1)
    host = fleet.hosts[0]
    (tmp_path / "authoritative.json").write_bytes(REFERENCE)
    with docker_daemon.container(unique_container_name("ans")) as container:
        container.exec(["sh", "-c", f"mkdir -p {DRAFTER} && cat > {CONFIG}"], INCIDENT)
        source = (
            f"src: authoritative.json\n        container: docker:{container.name}"
            f"\n        docker_host: {docker_daemon.host_url}"
        )
        done = Play(fleet, tmp_path, hosts=[host.alias]).run(_playbook(source))
        assert done.returncode == 0, done.output[-3000:]
        result = done.of(host.alias, TASK)["result"]
        assert result["status"] == "written" and result["changed"] is True, result
        assert result["target"].startswith(f"{host.alias}/docker:{container.name}:")
        assert container.exec(["cat", CONFIG]).stdout.encode() == REFERENCE


def test_a_source_that_fails_validation_is_refused_on_the_controller(bed) -> None:  # type: ignore[no-untyped-def]
    fleet, play = bed
    h01 = fleet.hosts[0]
    before = _read(h01, CONFIG)
    done = play.run(_playbook("src: broken.json"))
    assert done.returncode != 0
    result = done.of(h01.alias, TASK)
    assert result["outcome"] == "failed"
    assert "fails validation, refusing to push" in result["result"]["msg"]
    assert _read(h01, CONFIG) == before


def test_a_bad_option_is_one_clear_line(bed) -> None:  # type: ignore[no-untyped-def]
    _, play = bed
    done = play.run(_playbook("src: authoritative.json\n        lock: dflash.lock"))
    assert done.returncode != 0
    assert "give exactly one source: lock, repo (with revision) or src" in done.output


def test_the_collection_builds_with_ansible_galaxy(tmp_path: Path) -> None:
    import subprocess
    import sys

    galaxy = Path(sys.executable).with_name("ansible-galaxy")
    root = Path(__file__).resolve().parent.parent / "ansible_collections" / "dflash" / "provision"
    done = subprocess.run(
        [str(galaxy), "collection", "build", str(root), "--output-path", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False,
        env={"ANSIBLE_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert [p.name for p in tmp_path.glob("*.tar.gz")] == ["dflash-provision-0.1.0.tar.gz"]


#: The ansible-test sanity tests that run without containers and without a pip inside
#: ansible-test's own venvs (ansible-doc, runtime-metadata, pylint, validate-modules, pep8 and
#: yamllint need one: this machine's python has no ensurepip there).
SANITY = (
    "action-plugin-docs", "compile", "empty-init", "line-endings", "no-assert",
    "no-get-exception", "no-illegal-filenames", "no-smart-quotes", "replace-urlopen", "shebang",
    "symlinks", "use-argspec-type-path", "use-compat-six",
)  # fmt: skip


def test_ansible_test_sanity_is_clean_for_the_tests_that_run_here() -> None:
    import subprocess
    import sys

    ansible_test = Path(sys.executable).with_name("ansible-test")
    root = Path(__file__).resolve().parent.parent / "ansible_collections" / "dflash" / "provision"
    flags = [f for name in SANITY for f in ("--test", name)]
    done = subprocess.run(
        [str(ansible_test), "sanity", "--python", "3.11", *flags],
        cwd=root, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in SANITY:
        assert f'Running sanity test "{name}"' in done.stdout + done.stderr
