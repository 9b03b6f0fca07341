"""The trust model of the remote write, proven with planted links on real hosts.

The push and rollback run as root (the usual case) into a model directory that an unprivileged
user (uid 65534, "nobody") owns, as a service account's model directory would be. That user can
create any name there: every test plants what such a user could (a symlink or FIFO at a
temp file name, the lock, a backup name, the backup directory itself) and checks that nothing
outside the model directory is created, truncated, deleted or read, and that the push says why
it refused. Files are planted from the controller side (the host's /root is a directory here),
owned by nobody as the user would have made them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dflash_provision.errors import ConfigInvalid, DflashProvisionError, ExitCode, RemoteStepFailed
from dflash_provision.place.push import NoBackups, PushStatus, push_config, rollback_config
from dflash_provision.remote.ops import (
    WriteStatus,
    list_remote_backups,
    read_backup,
    write_remote_config,
)
from dflash_provision.remote.proof import WriteOptions
from dflash_provision.source.authority import Authority
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import open_transport
from testbed import samples
from testbed.hosts import Host
from tests.fixtures.ssh import client_options as options

pytestmark = [pytest.mark.integration, pytest.mark.root]

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()
MODEL = "/root/models/X"
NOBODY = 65534
SECRET = b"root-only secret\n"


def hostile_model_dir(host: Host) -> Path:
    """/root/models/X owned by nobody (mode 0755) holding nobody's config.json; controller-side
    path returned. /root/secret is a root-only file the user must never reach through us."""
    directory = host.root_dir / "models" / "X"
    directory.mkdir(parents=True)
    (directory / "config.json").write_bytes(INCIDENT)
    os.chown(directory / "config.json", NOBODY, NOBODY)
    os.chown(directory, NOBODY, NOBODY)
    secret = host.root_dir / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    return directory


def planted_backup_dir(directory: Path) -> Path:
    """A .dflash-backups the hostile user made before any push did (so it is theirs)."""
    backups = directory / ".dflash-backups"
    backups.mkdir()
    os.chown(backups, NOBODY, NOBODY)
    return backups


def plant_link(link: Path, target: str) -> None:
    link.symlink_to(target)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)


def plant_fifo(path: Path) -> None:
    os.mkfifo(path)
    os.chown(path, NOBODY, NOBODY)


def push(host: Host, data: bytes = REFERENCE, **kwargs):  # type: ignore[no-untyped-def]
    target = parse_target(f"{host.alias}:{MODEL}")
    with open_transport(target, options(host, command_timeout=15.0)) as transport:
        return push_config(transport, target, Authority(label="test", data=data), **kwargs)


def rollback(host: Host, **kwargs):  # type: ignore[no-untyped-def]
    target = parse_target(f"{host.alias}:{MODEL}")
    with open_transport(target, options(host, command_timeout=15.0)) as transport:
        return rollback_config(transport, target, **kwargs)


def assert_refused_untouched(result, directory: Path) -> None:  # type: ignore[no-untyped-def]
    assert result.status is PushStatus.FAILED, result.status
    assert result.failed_step == "trust", (result.failed_step, result.message)
    assert result.exit_code is ExitCode.REMOTE_FAILED
    assert ".dflash-backups" in result.message
    assert (directory / "config.json").read_bytes() == INCIDENT
    assert not [n for n in os.listdir(directory) if "dflash-tmp" in n]


# ---------------------------------------------------------------------------------------------
# the push


def test_push_into_a_directory_another_user_owns_works_and_keeps_its_files_private(ssh_host):
    directory = hostile_model_dir(ssh_host)
    result = push(ssh_host)
    assert result.status is PushStatus.WRITTEN, result.message
    config = directory / "config.json"
    assert config.read_bytes() == REFERENCE
    assert (config.stat().st_uid, config.stat().st_mode & 0o777) == (NOBODY, 0o644)
    backups = directory / ".dflash-backups"
    st = backups.lstat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700), "the push's own directory, closed"
    assert sorted(os.listdir(directory)) == [".dflash-backups", "config.json"]


@pytest.mark.parametrize(
    ("made_by", "why"),
    [
        ("the user", "owned by uid 65534"),
        # Root's own name and owner, but mode 0777 (another root tool's mkdir under umask 0):
        # a push that finds its directory there must refuse it.
        ("root, mode 0777", "others may write in it (mode 777)"),
    ],
)
def test_planted_temp_file_symlink_never_truncates_a_root_only_file(ssh_host, made_by, why):
    directory = hostile_model_dir(ssh_host)
    if made_by == "the user":
        backups = planted_backup_dir(directory)
    else:
        backups = directory / ".dflash-backups"
        backups.mkdir()
        backups.chmod(0o777)
    plant_link(backups / "config.json.dflash-tmp.1", "/root/secret")
    result = push(ssh_host)
    assert (ssh_host.root_dir / "secret").read_bytes() == SECRET
    assert_refused_untouched(result, directory)
    assert why in result.message


def test_backup_dir_symlink_never_makes_pruning_delete_files_elsewhere(ssh_host):
    directory = hostile_model_dir(ssh_host)
    elsewhere = ssh_host.root_dir / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    names = [f"config.json.2020010{i}T000000Z" for i in range(1, 7)]
    for name in names:
        (elsewhere / name).write_bytes(SECRET)
    plant_link(directory / ".dflash-backups", "/root/elsewhere")
    result = push(ssh_host, write=WriteOptions(keep_backups=1))
    assert sorted(os.listdir(elsewhere)) == names, "nothing deleted, nothing created there"
    assert_refused_untouched(result, directory)


def test_planted_lock_symlink_never_creates_a_file_elsewhere(ssh_host):
    directory = hostile_model_dir(ssh_host)
    backups = planted_backup_dir(directory)
    plant_link(backups / "config.json.lock", "/root/created-by-the-lock")
    plant_link(backups / "config.json.lockdir", "/root/lockdir-elsewhere")
    result = push(ssh_host)
    assert not (ssh_host.root_dir / "created-by-the-lock").exists()
    assert not (ssh_host.root_dir / "lockdir-elsewhere").exists()
    assert_refused_untouched(result, directory)


@pytest.mark.parametrize("name", ["config.json.lock", "config.json.dflash-tmp.1"])
def test_fifo_at_the_lock_or_a_temp_file_name_is_refused_without_blocking(ssh_host, name):
    # A FIFO opened for writing blocks until someone reads it: the push must not wait on it
    # (the push's timeout is 15 s; a blocked push raises instead of returning a result).
    directory = hostile_model_dir(ssh_host)
    plant_fifo(planted_backup_dir(directory) / name)
    result = push(ssh_host)
    assert_refused_untouched(result, directory)


def test_fifo_or_symlink_at_the_old_temp_file_names_is_never_opened(ssh_host):
    # Older versions made the temp file in the model directory; a FIFO there must not matter.
    directory = hostile_model_dir(ssh_host)
    for pid in range(1, 200):
        plant_fifo(directory / f".config.json.dflash-tmp.{pid}")
    plant_link(directory / ".config.json.dflash-tmp.200", "/root/secret")
    result = push(ssh_host)
    assert result.status is PushStatus.WRITTEN, result.message
    assert (ssh_host.root_dir / "secret").read_bytes() == SECRET


def test_config_json_planted_as_a_symlink_is_refused_even_with_follow_symlinks(ssh_host):
    # --follow-symlinks trusts the link only when root or the login user made it.
    directory = hostile_model_dir(ssh_host)
    (directory / "config.json").unlink()
    plant_link(directory / "config.json", "/root/secret")
    result = push(ssh_host, write=WriteOptions(follow_symlinks=True))
    assert result.status is PushStatus.FAILED
    assert result.failed_step == "symlink", result.message
    assert "uid 65534" in result.message
    assert (ssh_host.root_dir / "secret").read_bytes() == SECRET


@pytest.mark.parametrize("mode", [0o000, 0o044, 0o004, 0o400, 0o640])
def test_modes_with_leading_zero_digits_are_kept_like_any_other(ssh_host, mode):
    directory = hostile_model_dir(ssh_host)
    config = directory / "config.json"
    config.chmod(mode)
    result = push(ssh_host)
    assert result.status is PushStatus.WRITTEN, result.message
    st = config.stat()
    assert (oct(st.st_mode & 0o7777), st.st_uid) == (oct(mode), NOBODY)
    assert config.read_bytes() == REFERENCE


# ---------------------------------------------------------------------------------------------
# rollback


def test_rollback_never_restores_a_planted_backup_symlink_to_a_root_only_file(ssh_host):
    directory = hostile_model_dir(ssh_host)
    valid_secret = ssh_host.root_dir / "secret.json"
    valid_secret.write_bytes(REFERENCE)  # a valid config: validation alone would let it pass
    valid_secret.chmod(0o600)
    plant_link(planted_backup_dir(directory) / "config.json.20990101T000000Z", "/root/secret.json")
    with pytest.raises(DflashProvisionError) as caught:
        rollback(ssh_host)
    assert caught.value.exit_code is ExitCode.REMOTE_FAILED
    assert ".dflash-backups" in caught.value.message
    assert (directory / "config.json").read_bytes() == INCIDENT


def test_rollback_refuses_a_backup_that_is_a_symlink_even_in_roots_own_backup_dir(ssh_host):
    # How such a link could arise: the user swapped config.json for a link just before a push
    # took its backup (a hard link of whatever is there at that moment).
    directory = hostile_model_dir(ssh_host)
    assert push(ssh_host).status is PushStatus.WRITTEN  # root's .dflash-backups now exists
    valid_secret = ssh_host.root_dir / "secret.json"
    valid_secret.write_bytes(INCIDENT)
    valid_secret.chmod(0o600)
    backups = directory / ".dflash-backups"
    for name in os.listdir(backups):
        (backups / name).unlink()
    (backups / "config.json.20990101T000000Z").symlink_to("/root/secret.json")
    with pytest.raises(NoBackups):
        rollback(ssh_host)  # a link is not a backup: never listed
    target = parse_target(f"{ssh_host.alias}:{MODEL}")
    with open_transport(target, options(ssh_host)) as transport:
        assert list_remote_backups(transport, target.config_path) == []
        with pytest.raises(RemoteStepFailed) as caught:  # nor read, when asked for by name
            read_backup(transport, target.config_path, "config.json.20990101T000000Z")
    assert "not a regular file (a symlink)" in caught.value.message
    assert (directory / "config.json").read_bytes() == REFERENCE


def test_rollback_refuses_a_backup_owned_by_an_unexpected_user_or_with_other_links(ssh_host):
    directory = hostile_model_dir(ssh_host)
    assert push(ssh_host).status is PushStatus.WRITTEN
    backups = directory / ".dflash-backups"
    [name] = [n for n in os.listdir(backups) if n.startswith("config.json.20")]
    backup = backups / name
    os.chown(backup, 1234, 1234)  # neither root, nor the config's owner
    with pytest.raises(DflashProvisionError) as caught:
        rollback(ssh_host)
    assert "owned by uid 1234" in caught.value.message
    os.chown(backup, NOBODY, NOBODY)
    os.link(backup, ssh_host.root_dir / "another-name")  # e.g. a hard link to /etc/shadow
    with pytest.raises(DflashProvisionError) as caught:
        rollback(ssh_host)
    assert "2 links" in caught.value.message
    (ssh_host.root_dir / "another-name").unlink()
    assert rollback(ssh_host).status is PushStatus.WRITTEN
    assert (directory / "config.json").read_bytes() == INCIDENT


def test_rollback_validates_what_it_restores(ssh_host):
    directory = hostile_model_dir(ssh_host)
    (directory / "config.json").write_bytes(b'{"not": "a drafter config"}\n')
    assert push(ssh_host).status is PushStatus.WRITTEN
    with pytest.raises(ConfigInvalid):
        rollback(ssh_host)
    assert (directory / "config.json").read_bytes() == REFERENCE
    assert rollback(ssh_host, force=True).status is PushStatus.WRITTEN


# ---------------------------------------------------------------------------------------------
# the same in a busybox LXC container (no flock: the mkdir lock; busybox applets)


@pytest.mark.lxc
def test_busybox_container_push_refuses_planted_links_and_works_in_a_clean_dir(
    lxc_container_on_host,
):
    container = lxc_container_on_host
    host = container.host
    rootfs = container.rootfs
    directory = rootfs / "models" / "X"
    directory.mkdir(parents=True)
    (directory / "config.json").write_bytes(INCIDENT)
    os.chown(directory, NOBODY, NOBODY)
    secret = rootfs / "secret"
    secret.write_bytes(SECRET)
    backups = planted_backup_dir(directory)
    plant_link(backups / "config.json.dflash-tmp.1", "/secret")
    plant_link(backups / "config.json.lockdir", "/lockdir-elsewhere")
    target = parse_target(f"{host.alias}/lxc:{container.name}:/models/X")
    with open_transport(target, options(host, command_timeout=20.0)) as transport:
        result = push_config(transport, target, Authority(label="t", data=REFERENCE))
        assert secret.read_bytes() == SECRET
        assert not (rootfs / "lockdir-elsewhere").exists()
        assert_refused_untouched(result, directory)

        for name in os.listdir(backups):
            (backups / name).unlink()
        backups.rmdir()
        result = push_config(transport, target, Authority(label="t", data=REFERENCE))
        assert result.status is PushStatus.WRITTEN, result.message
        assert result.write is not None and result.write.lock_method == "mkdir"
        rolled = rollback_config(transport, target)
        assert rolled.status is PushStatus.WRITTEN, rolled.message
    assert (directory / "config.json").read_bytes() == INCIDENT
    assert (backups.stat().st_uid, backups.stat().st_mode & 0o777) == (0, 0o700)


def test_write_outcome_names_the_trust_step_for_an_untrusted_backup_dir(ssh_host):
    directory = hostile_model_dir(ssh_host)
    planted_backup_dir(directory)
    target = parse_target(f"{ssh_host.alias}:{MODEL}")
    with open_transport(target, options(ssh_host)) as transport:
        outcome = write_remote_config(transport, f"{MODEL}/config.json", REFERENCE)
    assert outcome.status is WriteStatus.FAILED
    assert (outcome.failed_step, outcome.reason) == ("trust", "unsafe-dir")
    assert "remove it" in outcome.message


def test_a_backup_dir_swapped_for_roots_own_directory_elsewhere_is_refused(ssh_host):
    # The user renames the push's own directory away and puts a link to a root-owned, closed
    # directory elsewhere in its place: every check on it passes but one, its parent.
    directory = hostile_model_dir(ssh_host)
    assert push(ssh_host).status is PushStatus.WRITTEN
    (directory / ".dflash-backups").rename(directory / "moved")
    elsewhere = ssh_host.root_dir / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (ssh_host.root_dir / "config.json").write_bytes(SECRET)  # what ../config.json would be there
    plant_link(directory / ".dflash-backups", "/root/elsewhere")
    (directory / "config.json").write_bytes(INCIDENT)
    result = push(ssh_host)
    assert_refused_untouched(result, directory)
    assert "not a directory inside" in result.message
    assert (ssh_host.root_dir / "config.json").read_bytes() == SECRET
    assert os.listdir(elsewhere) == []
