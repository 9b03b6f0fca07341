"""`dflash-provision push` failing for real, seen the way a user sees it: the real CLI in a
subprocess (``python -m dflash_provision push ...``) against sshd hosts in namespaces and busybox
LXC containers inside them.

Every failure checks the documented exit code (errors.ExitCode), exactly one ``error: ...`` line
on stderr that names the host and says what to do, the target directory byte-identical
afterwards (old config.json kept, no temp file, no backup, no lock left).

How each failure is made:
  auth failed            a fresh ssh-keygen key that is not in authorized_keys, IdentitiesOnly
  host key unknown       an empty known_hosts file
  host key changed       known_hosts files h02's key under h01's address
  connection refused     h02's sshd stopped
  hung host              h02's sshd SIGSTOPped (TCP accepts, no banner)
  container stopped      lxc-stop -k; container missing: a name nobody created
  permission denied      an unprivileged login user that exists only inside h01 (private
                         /etc/passwd, /etc/group, /etc/shadow bind-mounted in h01's namespace)

Proxmox VE (``pct``) and Incus cannot run here: the pct/incus targets go through the testbed's
EMULATED ``pct``/``incus`` (POSIX sh over real lxc-*, mimicking exec syntax, error texts and exit
codes; see testbed.lxc_host_side.emulator_scripts). The busybox containers are
real.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.hosts import Fleet, Host, known_hosts_name, missing_prerequisites
from testbed.lxc import Container, busybox_container, unique_name
from tests.fixtures.cli import Cli, the_error_line
from tests.fixtures.login_users import (
    LoginUser,
    add_private_login_users,
    fleet_for_any_user,
    free_uids,
)
from tests.fixtures.model_dirs import INCIDENT, REFERENCE, in_root, seed, snapshot
from tests.fixtures.ssh import host_key_line, ssh_args

pytestmark = [pytest.mark.integration, pytest.mark.root]


# ---------------------------------------------------------------------------------------------
# one fleet for the module: h01 (general), h02 (stopped / hung), h03 (pct / incus emulators)


@pytest.fixture(scope="module")
def hosts() -> Iterator[Fleet]:
    with fleet_for_any_user(3) as fleet:
        yield fleet


@pytest.fixture
def model(request: pytest.FixtureRequest) -> str:
    """A model directory under /root/models unique to the test."""
    return f"/root/models/{request.node.name.replace('[', '-').rstrip(']')}"


REF = str(samples.REFERENCE_DRAFTER)


# ---------------------------------------------------------------------------------------------
# authentication and host keys (exit 6)


def test_key_the_host_does_not_accept_exits_auth_and_names_host_and_key(
    hosts: Fleet, cli: Cli, model: str, tmp_path: Path
) -> None:
    h01 = hosts.host("h01")
    assert hosts.client is not None
    before = seed(in_root(h01, model))
    wrong = tmp_path / "id_not_authorized"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True, timeout=30
    )
    # Only the wrong key: the fleet's ssh_config would offer the authorized one as well.
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host h01\n    HostName {h01.address}\n    Port {h01.port}\n    User root\n"
        "    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {hosts.client.known_hosts}\n"
    )
    proc = cli.run(
        "push", f"h01:{model}", "--from", REF, "--ssh-config", str(config), "--identity", str(wrong)
    )
    the_error_line(
        proc,
        ExitCode.AUTH,
        "authentication",
        "h01",
        h01.address,
        str(wrong),
        "check the key (--identity KEY), the user, and authorized_keys on h01",
    )
    assert snapshot(in_root(h01, model)) == before


@pytest.mark.parametrize("command", ["verify", "audit", "diff", "status"])
@pytest.mark.parametrize("key", ["wrong", "none"])
def test_following_the_login_errors_key_hint_logs_in(
    hosts: Fleet, cli: Cli, model: str, tmp_path: Path, command: str, key: str
) -> None:
    """A login error names the flag that gives a key; that flag, typed as the hint spells it,
    must log in with every command (-i was advised once: the inventory in audit, a usage
    error)."""
    h01 = hosts.host("h01")
    assert hosts.client is not None
    seed(in_root(h01, model), REFERENCE)
    home = tmp_path / "user-home"  # no ~/.ssh keys: only what the command line gives
    home.mkdir()
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host h01\n    HostName {h01.address}\n    Port {h01.port}\n    User root\n"
        "    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {hosts.client.known_hosts}\n"
    )
    source = {"status": [], "diff": [REF]}.get(command, ["--from", REF])
    args = [command, f"h01:{model}", *source, "--ssh-config", str(config), "--no-agent"]
    given: list[str] = []
    if key == "wrong":
        wrong = tmp_path / "id_not_authorized"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)],
            check=True, timeout=30,
        )  # fmt: skip
        given = ["--identity", str(wrong)]
    env = {"HOME": str(home)}
    refused = cli.run(*args, *given, env=env)
    assert refused.returncode in (ExitCode.AUTH, ExitCode.UNREACHABLE), refused.stderr
    said = refused.stdout + refused.stderr  # audit's table says it on stdout
    hint = re.search(r"(?:check the key \(|give one with )(-\S+) KEY", " ".join(said.split()))
    assert hint, said
    followed = cli.run(*args, hint.group(1), str(hosts.client.identity), env=env)
    logged_in = ExitCode.NOT_RUNNING if command == "status" else ExitCode.OK  # no server there
    assert followed.returncode == logged_in, followed.stdout + followed.stderr
    assert followed.stderr.strip() == "", followed.stderr  # no warning either


def test_unknown_host_key_exits_auth_then_accept_new_records_it_and_pushes(
    hosts: Fleet, cli: Cli, model: str, tmp_path: Path
) -> None:
    h01 = hosts.host("h01")
    before = seed(in_root(h01, model))
    known = tmp_path / "known_hosts"
    known.write_text("")
    args = ["push", f"h01:{model}", "--from", REF, *ssh_args(hosts), "--known-hosts", str(known)]

    refused = cli.run(*args)
    the_error_line(
        refused,
        ExitCode.AUTH,
        f"h01 ({known_hosts_name(h01.address, h01.port)})",
        "unknown",
        "--accept-new-host-key",
    )
    assert snapshot(in_root(h01, model)) == before
    assert known.read_text() == ""

    accepted = cli.run(*args, "--accept-new-host-key")
    assert accepted.returncode == 0, accepted.stderr
    assert (in_root(h01, model) / "config.json").read_bytes() == REFERENCE
    assert known.read_text() == host_key_line(h01, known_hosts_name(h01.address, h01.port))
    # Recorded: the next run needs no flag.
    verify = cli.run("verify", f"h01:{model}", "--from", REF, *args[4:])
    assert verify.returncode == 0, verify.stderr


def test_history_host_finds_a_push_made_as_user_at_host(hosts: Fleet, cli: Cli, model: str) -> None:
    seed(in_root(hosts.host("h01"), model))
    seed(in_root(hosts.host("h02"), model))
    for spec in (f"root@h01:{model}", f"h02:{model}"):
        pushed = cli.run("push", spec, "--from", REF, *ssh_args(hosts))
        assert pushed.returncode == 0, pushed.stderr
    shown = cli.run("history", "--json", "--host", "h01")
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    assert [(r["op"], r["host"], r["status"]) for r in rows] == [("push", "root@h01", "written")]
    assert rows[0]["sha256_after"] == hashlib.sha256(REFERENCE).hexdigest()
    assert rows[0]["sha256_before"] == hashlib.sha256(INCIDENT).hexdigest()


def test_changed_host_key_exits_auth_even_with_accept_new_and_writes_nothing(
    hosts: Fleet, cli: Cli, model: str, tmp_path: Path
) -> None:
    h01, h02 = hosts.host("h01"), hosts.host("h02")
    before = seed(in_root(h01, model))
    known = tmp_path / "known_hosts"
    lie = host_key_line(
        h02, known_hosts_name(h01.address, h01.port)
    )  # h01's address filed with another host's key
    known.write_text(lie)
    proc = cli.run(
        "push",
        f"h01:{model}",
        "--from",
        REF,
        *ssh_args(hosts),
        "--known-hosts",
        str(known),
        "--accept-new-host-key",
    )
    the_error_line(
        proc,
        ExitCode.AUTH,
        f"h01 ({known_hosts_name(h01.address, h01.port)})",
        "CHANGED",
        "ssh-keygen -R",
    )
    assert snapshot(in_root(h01, model)) == before
    assert known.read_text() == lie


# ---------------------------------------------------------------------------------------------
# unreachable (exit 5)


def test_stopped_host_exits_unreachable_at_once(hosts: Fleet, cli: Cli, model: str) -> None:
    h02 = hosts.host("h02")
    before = seed(in_root(h02, model))
    h02.stop()
    try:
        proc = cli.run("push", f"h02:{model}", "--from", REF, *ssh_args(hosts))
    finally:
        h02.start()
    the_error_line(proc, ExitCode.UNREACHABLE, "h02", h02.address, "refused")
    assert snapshot(in_root(h02, model)) == before


def test_hung_host_exits_unreachable_after_connect_timeout(
    hosts: Fleet, cli: Cli, model: str
) -> None:
    h02 = hosts.host("h02")
    before = seed(in_root(h02, model))
    h02.hang()
    started = time.monotonic()
    try:
        proc = cli.run(
            "push", f"h02:{model}", "--from", REF, *ssh_args(hosts), "--connect-timeout", "2"
        )
    finally:
        h02.resume()
    elapsed = time.monotonic() - started
    print(f"hung host: exit {proc.returncode} after {elapsed:.2f}s with --connect-timeout 2")
    # paramiko's start_client() stops waiting silently when its own timeout runs out; the
    # message must say "timed out" whichever timer fires first.
    the_error_line(proc, ExitCode.UNREACHABLE, "h02", h02.address, "timed out after 2s (banner)")
    assert elapsed < 20  # loose on purpose: a 2-core machine under load; the figure is printed
    assert snapshot(in_root(h02, model)) == before


# ---------------------------------------------------------------------------------------------
# containers (exit 8)


@pytest.fixture
def lxc_on_h01(hosts: Fleet) -> Iterator[Container]:
    reason = missing_prerequisites(need_lxc=True)
    if reason:
        pytest.skip(f"testbed: {reason}")
    container = busybox_container(host=hosts.host("h01"))
    yield container
    container.destroy()


@pytest.mark.lxc
def test_push_into_stopped_lxc_container_exits_container_and_keeps_its_file(
    hosts: Fleet, cli: Cli, lxc_on_h01: Container
) -> None:
    directory = lxc_on_h01.rootfs / "root/models/X"
    before = seed(directory)
    lxc_on_h01.stop()
    proc = cli.run(
        "push", f"h01/lxc:{lxc_on_h01.name}:/root/models/X", "--from", REF, *ssh_args(hosts)
    )
    the_error_line(proc, ExitCode.CONTAINER, lxc_on_h01.name, "h01", "not running")
    assert snapshot(directory) == before


@pytest.mark.lxc
def test_push_into_missing_lxc_container_exits_container(hosts: Fleet, cli: Cli) -> None:
    name = unique_name("missing")
    proc = cli.run("push", f"h01/lxc:{name}:/root/models/X", "--from", REF, *ssh_args(hosts))
    the_error_line(proc, ExitCode.CONTAINER, name, "h01", "does not exist")
    assert not (hosts.host("h01").lxc_dir / name).exists()


@pytest.fixture(scope="module")
def emulated_h03(hosts: Fleet) -> Host:
    reason = missing_prerequisites(need_lxc=True)
    if reason:
        pytest.skip(f"testbed: {reason}")
    h03 = hosts.host("h03")
    h03.install_container_cli_emulators()
    return h03


@pytest.mark.lxc
@pytest.mark.parametrize(("kind", "name"), [("pct", "101"), ("incus", "web-1"), ("lxd", "web-2")])
def test_emulated_pct_and_incus_push_verify_then_stopped_exits_container(
    hosts: Fleet, cli: Cli, emulated_h03: Host, kind: str, name: str
) -> None:
    """pct / incus / lxd here are the testbed's EMULATIONS (Proxmox and Incus can't run on this
    machine); the container behind them is a real busybox LXC container."""
    with busybox_container(emulated_h03.container_name(name), host=emulated_h03) as container:
        directory = container.rootfs / "root/models/X"
        seed(directory)
        spec = f"h03/{kind}:{name}:/root/models/X"

        pushed = cli.run("push", spec, "--from", REF, *ssh_args(hosts))
        assert pushed.returncode == 0, pushed.stderr
        assert (directory / "config.json").read_bytes() == REFERENCE
        verified = cli.run("verify", spec, "--from", REF, *ssh_args(hosts))
        assert verified.returncode == 0, verified.stdout + verified.stderr

        container.stop()
        before = snapshot(directory)
        stopped = cli.run(
            "push", spec, "--from", str(samples.INCIDENT_DRAFTER), "--force", *ssh_args(hosts)
        )
        the_error_line(
            stopped, ExitCode.CONTAINER, f"{kind} container {name}", "h03", "not running"
        )
        assert snapshot(directory) == before


@pytest.mark.lxc
@pytest.mark.parametrize(("kind", "name"), [("pct", "999"), ("incus", "nope")])
def test_emulated_missing_container_exits_container(
    hosts: Fleet, cli: Cli, emulated_h03: Host, kind: str, name: str
) -> None:
    """Through the EMULATED pct / incus (see the module docstring)."""
    proc = cli.run("push", f"h03/{kind}:{name}:/root/models/X", "--from", REF, *ssh_args(hosts))
    the_error_line(proc, ExitCode.CONTAINER, f"{kind} container {name}", "h03", "does not exist")


# ---------------------------------------------------------------------------------------------
# remote step failed (exit 7) and hostile paths


@pytest.fixture(scope="module")
def plain_user(hosts: Fleet) -> LoginUser:
    """An unprivileged login on h01 only (private /etc files in h01's mount namespace)."""
    user = LoginUser("dfpplain", free_uids(1)[0])
    add_private_login_users(hosts.host("h01"), [user])
    return user


def test_unprivileged_login_pushing_into_a_root_directory_exits_permission_denied(
    hosts: Fleet, cli: Cli, plain_user: LoginUser
) -> None:
    h01 = hosts.host("h01")
    # Outside /root (which the user can't even enter): a directory it can read, not write.
    directory = h01.dir / "srv" / "models" / "X"
    before = seed(directory)
    proc = cli.run("push", f"{plain_user.name}@h01:{directory}", "--from", REF, *ssh_args(hosts))
    line = the_error_line(
        proc, ExitCode.REMOTE_FAILED, "h01", "permission denied", plain_user.name, "--sudo"
    )
    assert line.count(str(directory)) <= 2, line  # the target, and what could not be created
    assert snapshot(directory) == before


def test_hostile_target_path_is_one_literal_directory_over_ssh(
    hosts: Fleet, cli: Cli, tmp_path: Path
) -> None:
    h01 = hosts.host("h01")
    token = unique_name("canary")
    canaries = [Path(f"/tmp/{token}-{tag}") for tag in ("X", "Y", "Z")]
    relative = f"{token}-R"  # lands in the remote home (/root) or the CLI's cwd if run
    parts = [
        f"$(touch {canaries[0]})",
        f"; touch {canaries[1]}",
        'it\'s "quoted" with spaces',
        f"`touch {canaries[2]}` && touch {relative} | $HOME *",
    ]
    remote = "/root/models/" + "/".join(parts)
    spec = f"h01:{remote}"

    pushed = cli.run("push", spec, "--from", REF, "--mkdir", *ssh_args(hosts))
    assert pushed.returncode == 0, pushed.stderr
    assert (in_root(h01, remote) / "config.json").read_bytes() == REFERENCE
    verified = cli.run("verify", spec, "--from", REF, *ssh_args(hosts))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    # The hosts share /tmp with the controller: one look covers both sides.
    assert [c for c in canaries if c.exists()] == []
    assert not (h01.root_dir / relative).exists()
    assert not (tmp_path / relative).exists()


def test_ssh_config_or_identity_file_that_does_not_exist_is_a_usage_error(
    cli: Cli, tmp_path: Path
) -> None:
    # No fleet needed: the CLI must refuse before connecting anywhere.
    missing = tmp_path / "no-such-file"
    for option in ("--ssh-config", "--identity"):
        proc = cli.run("push", "h01:/root/models/X", "--from", REF, option, str(missing))
        assert proc.returncode == ExitCode.USAGE, proc.stderr
        assert str(missing) in proc.stderr and "does not exist" in proc.stderr
