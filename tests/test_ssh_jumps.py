"""Jump-host connections shared across a fleet: the pool's rules, and a real fleet audit through
one bastion that logs in to the bastion once."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from dflash_provision.errors import UnreachableError
from dflash_provision.transport.options import SshOptions
from dflash_provision.transport.ssh import SshTransport
from dflash_provision.transport.ssh.route_pool import JumpPool
from testbed.hosts import Fleet
from testbed.samples import INCIDENT_DRAFTER, REFERENCE_DRAFTER
from tests.fixtures.cli import Cli
from tests.fixtures.ssh import accepted_logins, options_for_fleet


class Conn:
    def __init__(self, n: int) -> None:
        self.n = n
        self.alive = True
        self.closed = False


def pool() -> JumpPool[Conn]:
    def close(conn: Conn) -> None:
        conn.closed = True

    return JumpPool(lambda conn: conn.alive and not conn.closed, close)


def test_many_threads_at_once_share_one_connection_closed_with_the_last_lease() -> None:
    jumps = pool()
    made: list[Conn] = []

    def connect() -> Conn:
        time.sleep(0.05)  # long enough for every thread to be waiting on it
        made.append(Conn(len(made)))
        return made[-1]

    leases = []
    lock = threading.Lock()

    def take() -> None:
        lease = jumps.lease("bastion", connect)
        with lock:
            leases.append(lease)

    threads = [threading.Thread(target=take) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and {lease.value for lease in leases} == {made[0]}
    for lease in leases[:-1]:
        lease.release()
    assert not made[0].closed  # one user left
    leases[-1].release()
    leases[-1].release()  # a second release of the same lease changes nothing
    assert made[0].closed
    assert jumps.lease("bastion", connect).value is made[1]  # a fresh connection next time


def test_a_failure_is_shared_while_leased_and_retried_afterwards() -> None:
    jumps = pool()
    attempts: list[int] = []

    def refused() -> Conn:
        attempts.append(1)
        raise UnreachableError("connection to bastion refused", reason="refused")

    holder = jumps.lease("other-key", lambda: Conn(0))  # unrelated keys do not interfere
    with pytest.raises(UnreachableError):
        jumps.lease("bastion", refused)
    assert len(attempts) == 1 and jumps.connects == 2
    # The failed lease released itself: nothing holds "bastion", so the next one tries again.
    with pytest.raises(UnreachableError):
        jumps.lease("bastion", refused)
    assert len(attempts) == 2
    holder.release()


def test_a_waiting_lease_gets_the_error_of_the_attempt_it_waited_for() -> None:
    jumps = pool()
    attempts: list[int] = []
    everyone_waiting = threading.Event()

    def slow_refusal() -> Conn:
        attempts.append(1)
        assert everyone_waiting.wait(10)
        raise UnreachableError("bastion timed out", reason="timeout")

    errors: list[str] = []

    def take() -> None:
        try:
            jumps.lease("bastion", slow_refusal)
        except UnreachableError as exc:
            errors.append(exc.message)

    threads = [threading.Thread(target=take) for _ in range(6)]
    for t in threads:
        t.start()
    # The connecting thread holds its attempt open until all six hold a lease on "bastion".
    deadline = time.monotonic() + 10
    while jumps._entries.get("bastion") is None or jumps._entries["bastion"].leases < 6:
        assert time.monotonic() < deadline, "the threads never all waited"
        time.sleep(0.001)
    everyone_waiting.set()
    for t in threads:
        t.join()
    assert errors == ["bastion timed out"] * 6
    assert len(attempts) == 1  # the five waiting ones did not each wait out their own timeout


def test_a_dead_connection_is_replaced_for_the_next_lease() -> None:
    jumps = pool()
    made: list[Conn] = []

    def connect() -> Conn:
        made.append(Conn(len(made)))
        return made[-1]

    first = jumps.lease("bastion", connect)
    first.value.alive = False  # the bastion dropped us
    second = jumps.lease("bastion", connect)
    assert second.value is made[1] and made[0].closed
    first.release()
    second.release()


def bastion_config(fleet: Fleet, tmp_path: Path) -> Path:
    """An ssh_config where every host but h01 is ``behind-<name>``, reached through h01."""
    client = fleet.client
    assert client is not None
    config = tmp_path / "ssh_config"
    config.write_text(
        "".join(
            f"Host behind-{h.name}\n    HostName {h.address}\n    Port {h.port}\n"
            for h in fleet.hosts[1:]
        )
        + "Host behind-*\n    ProxyJump h01\n    User root\n"
        f"    IdentityFile {client.identity}\n    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {client.known_hosts}\n\n" + client.ssh_config.read_text()
    )
    return config


@pytest.mark.integration
@pytest.mark.root
def test_a_fleet_behind_one_bastion_logs_in_to_it_once(make_fleet, tmp_path: Path) -> None:
    fleet: Fleet = make_fleet(6)
    bastion, *behind = fleet.hosts
    config = bastion_config(fleet, tmp_path)
    targets = [f"behind-{h.name}:/root/models/behind-bastion" for h in behind]
    before = {h.name: accepted_logins(h) for h in fleet.hosts}
    audited = Cli(tmp_path).run(
        "audit", *targets, "--from", str(REFERENCE_DRAFTER), "--ssh-config", str(config),
        "--no-agent", "--json", "--workers", "8",
    )  # fmt: skip
    assert audited.returncode == 4, audited.stdout + audited.stderr  # drift: files missing
    assert {h["status"] for h in json.loads(audited.stdout)["hosts"]} == {"missing"}
    logins = {h.name: accepted_logins(h) - before[h.name] for h in fleet.hosts}
    assert logins == {bastion.name: 1, **{h.name: 1 for h in behind}}


@pytest.mark.integration
@pytest.mark.root
def test_hosts_closing_at_once_do_not_break_the_shared_bastion(make_fleet, tmp_path: Path) -> None:
    # paramiko could send a tunnel's last data after its close; OpenSSH then dropped the whole
    # bastion connection ("data packet referred to nonexistent channel"): about every other
    # round failed before TunnelSocket serialised them.
    fleet: Fleet = make_fleet(6)
    behind = fleet.hosts[1:]
    config = bastion_config(fleet, tmp_path)
    failures: list[str] = []

    def one(name: str, options: SshOptions) -> None:
        try:
            with SshTransport(f"behind-{name}", options=options) as ssh:
                assert ssh.run(["hostname"]).stdout == f"{name}\n".encode()
        except Exception as exc:  # collected for the assertion below
            failures.append(f"{name}: {type(exc).__name__}: {exc}")

    for round_no in range(15):
        # A new options object each round: a new shared bastion connection each round.
        options = options_for_fleet(ssh_config_path=str(config), command_timeout=30.0 + round_no)
        threads = [threading.Thread(target=one, args=(h.name, options)) for h in behind]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert failures == []


def test_a_released_connection_lingers_then_closes_and_exit_closes_it_too() -> None:
    made: list[Conn] = []

    def connect() -> Conn:
        made.append(Conn(len(made)))
        return made[-1]

    jumps = JumpPool(lambda c: not c.closed, lambda c: setattr(c, "closed", True), linger_s=0.3)
    jumps.lease("bastion", connect).release()
    assert not made[0].closed  # kept for the next host of the same command
    second = jumps.lease("bastion", connect)
    assert second.value is made[0] and jumps.connects == 1
    second.release()
    deadline = time.monotonic() + 10
    while not made[0].closed:
        assert time.monotonic() < deadline, "the lingering connection was never closed"
        time.sleep(0.01)
    jumps.lease("bastion", connect).release()
    assert not made[1].closed
    jumps.close_all()  # what runs at exit
    assert made[1].closed


@pytest.mark.integration
@pytest.mark.root
def test_diff_and_validate_read_a_target_behind_a_bastion_with_the_ssh_options(
    make_fleet, tmp_path: Path
) -> None:
    # The host exists only in the --ssh-config file, behind h01: the remote SOURCE is reached
    # through the same connector (and options) as push and audit (they used to be ignored).
    fleet: Fleet = make_fleet(2)
    behind = fleet.hosts[1]
    model = behind.root_dir / "models" / "behind-bastion"
    model.mkdir(parents=True)
    (model / "config.json").write_bytes(INCIDENT_DRAFTER.read_bytes())
    config = bastion_config(fleet, tmp_path)
    source = f"behind-{behind.name}:/root/models/behind-bastion"
    ssh = ("--ssh-config", str(config), "--no-agent")
    cli = Cli(tmp_path)

    diffed = cli.run("diff", source, str(REFERENCE_DRAFTER), "--json", *ssh)
    assert diffed.returncode == 4, diffed.stdout + diffed.stderr  # the incident's file drifted
    assert json.loads(diffed.stdout)["a"] == source
    validated = cli.run("validate", source, "--no-effective", "--json", *ssh)
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert json.loads(validated.stdout)["source"] == source
    unrouted = cli.run("diff", source, str(REFERENCE_DRAFTER), "--no-agent")
    assert unrouted.returncode != 0 and "behind-" in unrouted.stderr  # no alias without the config
