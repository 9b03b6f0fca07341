"""`push --sudo` for a non-root login, for real: real sudo (1.9, `sudo -n`) on an sshd host in
namespaces, through the real CLI in a subprocess.

The accounts exist only inside the host: private copies of /etc/passwd, /etc/group, /etc/shadow
and /etc/sudoers.d are bind-mounted in the host's own mount namespace (see
tests.fixtures.login_users.add_private_login_users); the controller's /etc is never changed. The
host has no /etc/hosts entry for its hostname, so sudo also prints "unable to resolve host h01"
on every run, as on many real machines: the product must see through that.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.docker import DockerDaemon
from testbed.hosts import Fleet, Host, missing_prerequisites
from testbed.lxc import busybox_container
from tests.fixtures.cli import Cli, the_error_line
from tests.fixtures.docker import ModelsContainer
from tests.fixtures.login_users import (
    LoginUser,
    add_private_login_users,
    fleet_for_any_user,
    free_uids,
)
from tests.fixtures.model_dirs import INCIDENT, REFERENCE, in_root, seed, snapshot

pytestmark = [pytest.mark.integration, pytest.mark.root]

REF = str(samples.REFERENCE_DRAFTER)


@dataclass(frozen=True)
class SudoHost:
    fleet: Fleet
    host: Host
    nopasswd: LoginUser  # may run anything as root without a password
    with_password: LoginUser  # may run anything as root, after typing a password
    not_allowed: LoginUser  # not in sudoers at all
    needs_tty: LoginUser  # NOPASSWD, but "Defaults requiretty" (old RHEL sudoers)

    def args(self) -> list[str]:
        assert self.fleet.client is not None
        return ["--ssh-config", str(self.fleet.client.ssh_config), "--no-agent"]


@pytest.fixture(scope="module")
def sudo_host() -> Iterator[SudoHost]:
    if shutil.which("sudo") is None:
        pytest.skip("sudo is not installed (apt-get install -y sudo; Makefile APT_PACKAGES)")
    with fleet_for_any_user(1) as fleet:
        uids = free_uids(4)
        users = SudoHost(
            fleet=fleet,
            host=fleet.hosts[0],
            nopasswd=LoginUser("dfpnopw", uids[0], "ALL=(ALL) NOPASSWD: ALL"),
            with_password=LoginUser("dfppw", uids[1], "ALL=(ALL) ALL"),
            not_allowed=LoginUser("dfpnone", uids[2]),
            needs_tty=LoginUser("dfptty", uids[3], "ALL=(ALL) NOPASSWD: ALL", "requiretty"),
        )
        add_private_login_users(
            users.host,
            [users.nopasswd, users.with_password, users.not_allowed, users.needs_tty],
        )
        yield users


@pytest.fixture
def model(request: pytest.FixtureRequest) -> str:
    """A model directory under /root/models unique to the test."""
    return f"/root/models/{request.node.name.replace('[', '-').rstrip(']')}"


def test_nopasswd_user_pushes_into_root_directory_with_sudo_and_file_is_roots(
    sudo_host: SudoHost, cli: Cli, model: str
) -> None:
    directory = in_root(sudo_host.host, model)
    seed(directory)
    spec = f"{sudo_host.nopasswd.name}@h01:{model}"

    pushed = cli.run("push", spec, "--from", REF, "--sudo", *sudo_host.args())
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    config = directory / "config.json"
    assert config.read_bytes() == REFERENCE
    assert (config.stat().st_uid, config.stat().st_gid) == (0, 0)
    backups = [p for p in (directory / ".dflash-backups").iterdir() if p.read_bytes() == INCIDENT]
    assert len(backups) == 1
    assert [n for n in snapshot(directory) if "dflash-tmp" in n] == []
    verified = cli.run("verify", spec, "--from", REF, "--sudo", *sudo_host.args())
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_same_user_without_sudo_exits_remote_failed_permission_denied(
    sudo_host: SudoHost, cli: Cli, model: str
) -> None:
    directory = in_root(sudo_host.host, model)
    before = seed(directory)
    proc = cli.run(
        "push", f"{sudo_host.nopasswd.name}@h01:{model}", "--from", REF, *sudo_host.args()
    )
    # /root is 0700: `[ -d DIR ]` is false for this user, which must not read as "missing".
    line = the_error_line(
        proc, ExitCode.REMOTE_FAILED, "h01", "permission denied", "cannot enter /root", "--sudo"
    )
    assert "does not exist" not in line and "--mkdir" not in line
    assert line.count(model) == 1, line  # named once, by the target
    assert "(new file)" not in proc.stdout
    assert snapshot(directory) == before


def test_same_user_without_sudo_cannot_verify_dry_run_or_roll_back_and_is_told_why(
    sudo_host: SudoHost, cli: Cli, model: str
) -> None:
    directory = in_root(sudo_host.host, model)
    seed(directory)
    spec = f"{sudo_host.nopasswd.name}@h01:{model}"
    pushed = cli.run("push", spec, "--from", REF, "--sudo", *sudo_host.args())
    assert pushed.returncode == 0, pushed.stderr  # so there is a file and a backup to find
    before = snapshot(directory)
    for args in (
        ["verify", spec, "--from", REF],  # was "no config file (dir-missing)", exit 4 (drift)
        ["push", spec, "--from", REF, "--dry-run"],
        ["rollback", spec],  # was "no backups", exit 1 (now 2 when there truly are none)
    ):
        proc = cli.run(*args, *sudo_host.args())
        the_error_line(proc, ExitCode.REMOTE_FAILED, "h01", "cannot enter /root", "--sudo")
    assert snapshot(directory) == before


# Logins sudo refuses (exit 6): each line names the login, the host and what to do.
SUDO_REFUSALS = [
    pytest.param("with_password", ["NOPASSWD", "log in as root"], id="needs-a-password"),
    pytest.param("not_allowed", ["sudo"], id="not-in-sudoers"),
    pytest.param("needs_tty", ["requiretty", "log in as root"], id="requires-a-tty"),
]


@pytest.mark.parametrize(("login", "words"), SUDO_REFUSALS)
def test_sudo_that_refuses_the_login_exits_auth_says_what_to_do_and_changes_nothing(
    sudo_host: SudoHost, cli: Cli, model: str, login: str, words: list[str]
) -> None:
    user: LoginUser = getattr(sudo_host, login)
    directory = in_root(sudo_host.host, model)
    before = seed(directory)
    proc = cli.run("push", f"{user.name}@h01:{model}", "--from", REF, "--sudo", *sudo_host.args())
    the_error_line(proc, ExitCode.AUTH, user.name, "h01", *words)
    assert snapshot(directory) == before


@pytest.mark.lxc
def test_lxc_container_as_non_root_login_exits_auth_needs_root_then_works_with_sudo(
    sudo_host: SudoHost, cli: Cli
) -> None:
    reason = missing_prerequisites(need_lxc=True)
    if reason:
        pytest.skip(f"testbed: {reason}")
    with busybox_container(host=sudo_host.host) as container:
        directory = container.rootfs / "root/models/X"
        before = seed(directory)
        spec = f"{sudo_host.nopasswd.name}@h01/lxc:{container.name}:/root/models/X"
        # Without -P lxc-attach looks in the login's own ~/.local/share/lxc ("You lack access
        # to ..."); with -P /var/lib/lxc it says "Insufficent privileges to control NAME".
        for extra in ([], ["--lxc-path", "/var/lib/lxc"]):
            proc = cli.run("push", spec, "--from", REF, *extra, *sudo_host.args())
            the_error_line(
                proc,
                ExitCode.AUTH,
                container.name,
                "h01",
                "needs root on",
                "--sudo",
                "log in as root",
            )
            assert proc.stdout == ""
        assert snapshot(directory) == before

        pushed = cli.run("push", spec, "--from", REF, "--sudo", *sudo_host.args())
        assert pushed.returncode == 0, pushed.stderr
        assert (directory / "config.json").read_bytes() == REFERENCE


@pytest.mark.docker
def test_docker_container_as_non_root_login_exits_auth_needs_root_then_works_with_sudo(
    sudo_host: SudoHost, cli: Cli, docker_daemon: DockerDaemon, docker_models: ModelsContainer
) -> None:
    # The daemon's socket is closed to a login outside the docker group (here: not even its
    # directory can be entered): docker says "permission denied while trying to connect".
    directory = docker_models.models / "X"
    before = seed(directory)
    spec = f"{sudo_host.nopasswd.name}@h01/docker:{docker_models.name}:/models/X"
    daemon = ["--docker-host", docker_daemon.host_url]
    proc = cli.run("push", spec, "--from", REF, *daemon, *sudo_host.args())
    the_error_line(
        proc, ExitCode.AUTH, docker_models.name, "h01", "may not use docker", "--sudo",
        "docker group",
    )  # fmt: skip
    assert proc.stdout == ""
    assert snapshot(directory) == before

    pushed = cli.run("push", spec, "--from", REF, "--sudo", *daemon, *sudo_host.args())
    assert pushed.returncode == 0, pushed.stderr
    assert (directory / "config.json").read_bytes() == REFERENCE


def test_ansible_become_repairs_as_root_for_that_host_only(
    sudo_host: SudoHost, cli: Cli, model: str, tmp_path: Path
) -> None:
    # An Ansible inventory with a non-root ansible_user: ansible_become is what Ansible users set
    # instead of a global --sudo.
    directory = in_root(sudo_host.host, model)
    seed(directory)
    inventory = tmp_path / "hosts.ini"
    line = f"h01 ansible_user={sudo_host.nopasswd.name} dflash_path={model} dflash_from={REF}"
    inventory.write_text(f"[gpu]\n{line} ansible_become=false\n")
    refused = cli.run("repair", "-i", str(inventory), "--json", *sudo_host.args())
    # The login cannot read /root: the same exit code (7) as `verify` gives for that host.
    assert refused.returncode == ExitCode.REMOTE_FAILED, refused.stdout + refused.stderr
    assert (directory / "config.json").read_bytes() == INCIDENT
    inventory.write_text(f"[gpu]\n{line} ansible_become=yes ansible_become_user=root\n")
    repaired = cli.run("repair", "-i", str(inventory), "--json", *sudo_host.args())
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    config = directory / "config.json"
    assert config.read_bytes() == REFERENCE
    assert (config.stat().st_uid, config.stat().st_gid) == (0, 0)
