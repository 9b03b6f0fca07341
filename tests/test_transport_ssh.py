"""SshTransport against real OpenSSH servers (the testbed fleet: sshd in namespaces, real keys).

Every test here talks to a real /usr/sbin/sshd through paramiko; faults are real too (SIGSTOPped
sshd, a socket that never speaks, nothing listening, a host killed mid-command). The sudo tests
at the end are unit tests of the argv wrapping and error mapping (sudo is not installed on this
machine, and a non-root login inside a fake host would need a separate passwd database).
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from dflash_provision.errors import AuthError, RemoteStepFailed, UnreachableError
from dflash_provision.transport.base import CommandResult, Transport
from dflash_provision.transport.options import SshOptions
from dflash_provision.transport.ssh import SshTransport
from dflash_provision.transport.sudo import SudoTransport
from testbed.hosts import (
    BlackholeHost,
    Fleet,
    Host,
    known_hosts_name,
    refused_address,
)
from tests.fixtures.ssh import accepted_logins, options_for


def ssh_keygen(path: Path, kind: str = "ed25519") -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", f"test-{kind}", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


# -- running commands ----------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.root
def test_runs_command_and_returns_exit_status_stdout_and_stderr_apart(fleet: Fleet) -> None:
    h01 = fleet.hosts[0]
    with SshTransport("h01", options=options_for(h01)) as ssh:
        result = ssh.run(["sh", "-c", "hostname; echo oops >&2; exit 3"])
    assert result.exit_status == 3
    assert result.stdout == b"h01\n"
    assert result.stderr == b"oops\n"
    assert 0 < result.duration_s < 5


@pytest.mark.integration
@pytest.mark.root
def test_one_mebibyte_of_stdin_round_trips_byte_exact(fleet: Fleet) -> None:
    payload = os.urandom(1 << 20)
    with SshTransport("h01", options=options_for(fleet.hosts[0])) as ssh:
        result = ssh.run(["cat"], stdin=payload)
        digest = ssh.run(["sha256sum"], stdin=payload)
    assert result.ok and result.stdout == payload
    assert digest.stdout.split()[0].decode() == hashlib.sha256(payload).hexdigest()


@pytest.mark.integration
@pytest.mark.root
def test_large_stdout_and_stderr_while_stdin_is_written_do_not_deadlock(fleet: Fleet) -> None:
    # The command fills both output windows before it reads any stdin: a transport that writes
    # all stdin first, or drains one stream at a time, hangs here.
    script = (
        "head -c 4000000 /dev/zero | tr '\\0' o; head -c 4000000 /dev/zero | tr '\\0' e >&2; wc -c"
    )
    with SshTransport("h01", options=options_for(fleet.hosts[0])) as ssh:
        result = ssh.run(["sh", "-c", script], stdin=b"i" * 3_000_000, timeout=30)
    assert result.ok
    assert result.stdout == b"o" * 4_000_000 + b"3000000\n"
    assert result.stderr == b"e" * 4_000_000


@pytest.mark.integration
@pytest.mark.root
def test_exit_statuses_pass_through(fleet: Fleet) -> None:
    with SshTransport("h02", options=options_for(fleet.hosts[1])) as ssh:
        statuses = [ssh.run(["sh", "-c", f"exit {code}"]).exit_status for code in (0, 1, 2, 42)]
        missing = ssh.run(["no-such-command-xyz"])
    assert statuses == [0, 1, 2, 42]
    assert missing.exit_status == 127


@pytest.mark.integration
@pytest.mark.root
def test_hostile_argv_elements_arrive_literally_and_run_nothing(fleet: Fleet) -> None:
    h03 = fleet.hosts[2]
    canary = h03.root_dir / "canary"
    hostile = [
        "$(touch /root/canary)",
        "`touch /root/canary`",
        "; touch /root/canary",
        "&& touch /root/canary",
        "| touch /root/canary",
        'it\'s "quoted"',
        "two\nlines",
        "*",
        "~",
        "$HOME",
        "",
        "-n",
    ]
    with SshTransport("h03", options=options_for(h03)) as ssh:
        result = ssh.run(["printf", "%s\\0", *hostile])
    assert result.ok
    assert result.stdout.split(b"\0")[:-1] == [arg.encode() for arg in hostile]
    assert not canary.exists()


@pytest.mark.integration
@pytest.mark.root
def test_command_that_outlives_its_timeout_fails_with_step_timeout(fleet: Fleet) -> None:
    with SshTransport("h02", options=options_for(fleet.hosts[1])) as ssh:
        started = time.monotonic()
        with pytest.raises(RemoteStepFailed) as caught:
            ssh.run(["sleep", "30"], timeout=1.0)
        elapsed = time.monotonic() - started
        assert caught.value.step == "timeout"
        assert "1 s" in caught.value.message
        assert elapsed < 10
        # The connection survives a timed-out command.
        assert ssh.run(["true"]).ok


@pytest.mark.integration
@pytest.mark.root
def test_one_connection_is_reused_across_runs(fleet: Fleet) -> None:
    h02 = fleet.hosts[1]
    before = accepted_logins(h02)
    with SshTransport("h02", options=options_for(h02)) as ssh:
        outputs = [ssh.run(["echo", str(i)]).stdout for i in range(5)]
        assert ssh.connections_opened == 1
    assert outputs == [f"{i}\n".encode() for i in range(5)]
    assert accepted_logins(h02) - before == 1


@pytest.mark.integration
@pytest.mark.root
def test_close_then_run_opens_a_new_connection(fleet: Fleet) -> None:
    h02 = fleet.hosts[1]
    before = accepted_logins(h02)
    ssh = SshTransport("h02", options=options_for(h02))
    assert ssh.run(["true"]).ok
    ssh.close()
    ssh.close()  # twice is fine
    assert ssh.run(["true"]).ok
    ssh.close()
    assert accepted_logins(h02) - before == 2


@pytest.mark.integration
@pytest.mark.root
def test_connection_dying_mid_command_fails_with_step_connection(ssh_host: Host) -> None:
    ssh = SshTransport(ssh_host.alias, options=options_for(ssh_host))
    assert ssh.run(["true"]).ok
    killer = threading.Timer(0.5, ssh_host.stop)
    killer.start()
    try:
        with pytest.raises(RemoteStepFailed) as caught:
            ssh.run(["sleep", "20"], timeout=10)
    finally:
        killer.join()
        ssh.close()
    assert caught.value.step == "connection"
    assert "lost" in caught.value.message


# -- ~/.ssh/config -------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.root
def test_config_alias_supplies_hostname_port_user_key_and_known_hosts(tmp_path: Path) -> None:
    # A host on port 2222: the alias is the only thing the caller names.
    with Fleet(tmp_path / "fleet", 1, address_prefix=None, port=2222) as one:
        host = one.hosts[0]
        assert host.client is not None
        config = host.client.ssh_config.read_text()
        assert "Port 2222" in config and f"HostName {host.address}" in config
        options = options_for(host, identities_only=False)
        with SshTransport(host.alias, options=options) as ssh:
            result = ssh.run(["sh", "-c", 'echo "$(id -un)@$(hostname)"'])
    assert result.stdout == f"root@{host.name}\n".encode()


@pytest.mark.integration
@pytest.mark.root
def test_proxyjump_reaches_target_through_jump_host(fleet: Fleet, tmp_path: Path) -> None:
    h01, h02 = fleet.hosts[0], fleet.hosts[1]
    assert h01.client is not None
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host behind\n"
        f"    HostName {h02.address}\n"
        f"    Port {h02.port}\n"
        "    User root\n"
        f"    IdentityFile {h01.client.identity}\n"
        "    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {h01.client.known_hosts}\n"
        "    ProxyJump h01\n\n" + h01.client.ssh_config.read_text()
    )
    jump_before, target_before = accepted_logins(h01), accepted_logins(h02)
    options = options_for(h01, ssh_config_path=str(config))
    with SshTransport("behind", options=options) as ssh:
        assert ssh.run(["hostname"]).stdout == b"h02\n"
        assert ssh.run(["hostname"]).stdout == b"h02\n"
    assert accepted_logins(h01) - jump_before == 1
    assert accepted_logins(h02) - target_before == 1


@pytest.mark.integration
@pytest.mark.root
def test_proxyjump_to_a_dead_target_is_unreachable(fleet: Fleet, tmp_path: Path) -> None:
    h01 = fleet.hosts[0]
    assert h01.client is not None
    config = tmp_path / "ssh_config"
    config.write_text(
        # The fleet's port: on port 22 the machine's own sshd may answer at any address.
        f"Host gone\n    HostName {fleet.unused_address()}\n    Port {h01.port}\n"
        "    ProxyJump h01\n\n" + h01.client.ssh_config.read_text()
    )
    with pytest.raises(UnreachableError) as caught:
        SshTransport(
            "gone", user="root", options=options_for(h01, ssh_config_path=str(config))
        ).run(["true"])
    assert "through jump host" in caught.value.message


def home_that_knows(host: Host, tmp_path: Path) -> Path:
    """A fresh HOME whose ~/.ssh holds only a known_hosts that knows ``host``."""
    assert host.client is not None
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text(host.client.known_hosts.read_text())
    return home


@pytest.mark.integration
@pytest.mark.root
def test_default_key_in_home_ssh_is_used_without_identityfile(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h01 = fleet.hosts[0]
    assert h01.client is not None
    home = home_that_knows(h01, tmp_path)
    (home / ".ssh" / "id_ed25519").write_bytes(h01.client.identity.read_bytes())
    (home / ".ssh" / "id_ed25519").chmod(0o600)
    monkeypatch.setenv("HOME", str(home))
    options = SshOptions(ssh_config_path=None, use_agent=False)
    with SshTransport(h01.address, port=h01.port, user="root", options=options) as ssh:
        assert ssh.run(["hostname"]).stdout == b"h01\n"


@pytest.mark.integration
@pytest.mark.root
def test_key_held_only_by_a_real_ssh_agent_authenticates(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No key file anywhere the transport looks: only the agent (OpenSSH's ssh-agent) has it."""
    h01 = fleet.hosts[0]
    home = home_that_knows(h01, tmp_path)
    socket_path = tmp_path / "agent.sock"
    agent = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(socket_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            if socket_path.exists():
                break
            time.sleep(0.01)
        env = {**os.environ, "SSH_AUTH_SOCK": str(socket_path)}
        subprocess.run(
            ["ssh-add", "-q", str(h01.client.identity)], env=env, check=True, capture_output=True
        )
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("SSH_AUTH_SOCK", str(socket_path))
        with SshTransport(
            h01.address,
            port=h01.port,
            user="root",
            options=SshOptions(ssh_config_path=None, use_agent=True),
        ) as ssh:
            assert ssh.run(["hostname"]).stdout == b"h01\n"
        # And the same login fails when the agent is not to be used: the agent really did it.
        with pytest.raises(AuthError) as caught:
            SshTransport(
                h01.address,
                port=h01.port,
                user="root",
                options=SshOptions(ssh_config_path=None, use_agent=False),
            ).run(["true"])
        assert caught.value.reason == "auth"
    finally:
        agent.terminate()
        agent.wait(timeout=10)


@pytest.mark.integration
@pytest.mark.root
def test_openssh_generated_ecdsa_key_authenticates(ssh_host: Host, tmp_path: Path) -> None:
    key = ssh_keygen(tmp_path / "id_ecdsa", "ecdsa")
    authorized = ssh_host.dir / "authorized_keys"
    authorized.write_text(authorized.read_text() + Path(f"{key}.pub").read_text())
    assert ssh_host.client is not None
    options = SshOptions(
        ssh_config_path=None,
        known_hosts_path=str(ssh_host.client.known_hosts),
        identity_files=(str(key),),
        identities_only=True,
        use_agent=False,
    )
    with SshTransport(ssh_host.address, port=ssh_host.port, user="root", options=options) as ssh:
        assert ssh.run(["true"]).ok


@pytest.mark.integration
@pytest.mark.root
def test_wrong_key_is_an_auth_error(fleet: Fleet, tmp_path: Path) -> None:
    h01 = fleet.hosts[0]
    assert h01.client is not None
    wrong = ssh_keygen(tmp_path / "id_wrong")
    options = SshOptions(
        ssh_config_path=None,
        known_hosts_path=str(h01.client.known_hosts),
        identity_files=(str(wrong),),
        identities_only=True,
        use_agent=False,
    )
    with pytest.raises(AuthError) as caught:
        SshTransport(h01.address, port=h01.port, user="root", options=options).run(["true"])
    assert "authentication to root@" in caught.value.message
    assert caught.value.reason == "auth"
    assert str(wrong) in caught.value.message


# -- host keys -----------------------------------------------------------------------------------


def _options_with_known_hosts(host: Host, known_hosts: Path, policy: str) -> SshOptions:
    assert host.client is not None
    return SshOptions(
        ssh_config_path=None,
        known_hosts_path=str(known_hosts),
        host_key_policy=policy,  # type: ignore[arg-type]
        identity_files=(str(host.client.identity),),
        identities_only=True,
        use_agent=False,
    )


@pytest.mark.integration
@pytest.mark.root
def test_unknown_host_key_is_refused_by_default(fleet: Fleet, tmp_path: Path) -> None:
    h01 = fleet.hosts[0]
    known = tmp_path / "known_hosts"
    with pytest.raises(AuthError) as caught:
        SshTransport(
            h01.address,
            port=h01.port,
            user="root",
            options=_options_with_known_hosts(h01, known, "reject"),
        ).run(["true"])
    assert (
        f"host key for {known_hosts_name(h01.address, h01.port)} is unknown" in caught.value.message
    )
    assert "--accept-new-host-key" in caught.value.message
    assert caught.value.reason == "host-key-unknown"
    assert not known.exists()


@pytest.mark.integration
@pytest.mark.root
def test_accept_new_records_the_key_and_later_connections_verify_it(
    fleet: Fleet, tmp_path: Path
) -> None:
    h01 = fleet.hosts[0]
    known = tmp_path / "ssh" / "known_hosts"
    opts = _options_with_known_hosts(h01, known, "accept-new")
    with SshTransport(h01.address, port=h01.port, user="root", options=opts) as ssh:
        assert ssh.run(["hostname"]).stdout == b"h01\n"
    key_type, key_b64 = h01.host_public_key.split()[:2]
    assert known.read_text() == f"{known_hosts_name(h01.address, h01.port)} {key_type} {key_b64}\n"
    assert known.stat().st_mode & 0o777 == 0o600
    strict = _options_with_known_hosts(h01, known, "reject")
    with SshTransport(h01.address, port=h01.port, user="root", options=strict) as ssh:
        assert ssh.run(["true"]).ok


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.parametrize("policy", ["reject", "accept-new"])
def test_changed_host_key_is_refused_under_every_policy(
    fleet: Fleet, tmp_path: Path, policy: str
) -> None:
    h01, h02 = fleet.hosts[0], fleet.hosts[1]
    known = tmp_path / "known_hosts"
    # known_hosts says h01's address has h02's key: exactly what a changed key looks like.
    lie = f"{known_hosts_name(h01.address, h01.port)} {' '.join(h02.host_public_key.split()[:2])}\n"
    known.write_text(lie)
    with pytest.raises(AuthError) as caught:
        SshTransport(
            h01.address,
            port=h01.port,
            user="root",
            options=_options_with_known_hosts(h01, known, policy),
        ).run(["true"])
    assert "CHANGED" in caught.value.message
    assert caught.value.reason == "host-key-changed"
    assert "ssh-keygen -R" in caught.value.message
    assert known.read_text() == lie


# -- unreachable hosts ---------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.root
def test_refused_connection_is_unreachable_at_once_and_names_host_and_port(
    fleet: Fleet,
) -> None:
    address, port = refused_address()
    started = time.monotonic()
    with pytest.raises(UnreachableError) as caught:
        SshTransport(address, port=port, options=options_for(fleet.hosts[0])).run(["true"])
    assert time.monotonic() - started < 10
    assert "refused" in caught.value.message
    assert caught.value.reason == "refused"
    assert address in caught.value.message and f"port {port}" in caught.value.message


@pytest.mark.integration
@pytest.mark.root
def test_hung_sshd_times_out_within_banner_timeout(ssh_host: Host) -> None:
    ssh_host.hang()
    try:
        started = time.monotonic()
        with pytest.raises(UnreachableError) as caught:
            SshTransport(ssh_host.alias, options=options_for(ssh_host, banner_timeout=1.0)).run(
                ["true"]
            )
        elapsed = time.monotonic() - started
    finally:
        ssh_host.resume()
    assert 0.9 < elapsed < 10
    assert "timed out after 1s (banner)" in caught.value.message
    assert caught.value.reason == "timeout"


@pytest.mark.integration
@pytest.mark.root
def test_port_that_accepts_and_never_speaks_times_out_within_banner_timeout(
    fleet: Fleet,
) -> None:
    with BlackholeHost("127.0.0.1") as hole:
        started = time.monotonic()
        with pytest.raises(UnreachableError) as caught:
            SshTransport(
                hole.address,
                port=hole.port,
                user="root",
                options=options_for(fleet.hosts[0], banner_timeout=1.0),
            ).run(["true"])
        elapsed = time.monotonic() - started
    assert elapsed < 10
    assert f"port {hole.port} timed out after 1s (banner)" in caught.value.message


def _no_host_options(**changes: object) -> SshOptions:
    settings: dict[str, object] = {"ssh_config_path": None, "use_agent": False}
    settings.update(changes)
    return SshOptions(**settings)  # type: ignore[arg-type]


def test_silent_port_is_a_banner_timeout_even_when_the_handshake_wait_runs_out_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # paramiko's start_client() stops waiting WITHOUT an error when its timeout runs out; if that
    # happens before the banner timeout fires (the race the CLI used to lose about 1 run in 3),
    # the next call fails with "No existing session". Force that order here.
    import dflash_provision.transport.ssh.login as ssh_login
    import dflash_provision.transport.ssh.login_errors as ssh_errors

    # The wait the transport gives start_client() and the one the error message names.
    for module in (ssh_login, ssh_errors):
        monkeypatch.setattr(module, "handshake_budget", lambda opts: 0.5)
    with BlackholeHost("127.0.0.1") as hole:
        started = time.monotonic()
        with pytest.raises(UnreachableError) as caught:
            SshTransport(hole.address, port=hole.port, user="root", options=_no_host_options()).run(
                ["true"]
            )
        elapsed = time.monotonic() - started
    assert elapsed < 10
    assert f"port {hole.port} timed out after 0.5s (banner)" in caught.value.message


def test_server_that_sends_a_banner_then_stalls_times_out_in_key_exchange() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    held: list[socket.socket] = []

    def banner_then_silence() -> None:
        conn, _ = listener.accept()
        conn.sendall(b"SSH-2.0-OpenSSH_9.6 stalls\r\n")
        held.append(conn)  # kept open, never another byte

    server = threading.Thread(target=banner_then_silence, daemon=True)
    server.start()
    port = listener.getsockname()[1]
    try:
        started = time.monotonic()
        with pytest.raises(UnreachableError) as caught:
            SshTransport(
                "127.0.0.1",
                port=port,
                user="root",
                options=_no_host_options(connect_timeout=1.0, banner_timeout=1.0),
            ).run(["true"])
        elapsed = time.monotonic() - started
    finally:
        server.join(5)
        for conn in held:
            conn.close()
        listener.close()
    assert elapsed < 10
    # budget: banner timeout + connect timeout for the key exchange
    assert f"port {port} timed out after 2s (key exchange)" in caught.value.message


# -- sudo (unit: argv wrapping and sudo's refusals) ----------------------------------------------


class RecordingTransport(Transport):
    """Answers every command with a fixed result and remembers the argv it was given."""

    description = "root@pve1"

    def __init__(self, result: CommandResult) -> None:
        self.result = result
        self.argvs: list[list[str]] = []

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 60
    ) -> CommandResult:
        self.argvs.append(list(argv))
        return self.result


def test_sudo_wraps_argv_with_non_interactive_sudo() -> None:
    inner = RecordingTransport(CommandResult(0, b"ok", b"", 0.01))
    result = SudoTransport(inner).run(["sh", "-c", "echo $(id)"])
    assert inner.argvs == [["sudo", "-n", "--", "sh", "-c", "echo $(id)"]]
    assert result.stdout == b"ok"


@pytest.mark.parametrize(
    ("stderr", "status", "words"),
    [
        (b"sudo: a password is required\n", 1, "needs a password or this user may not run"),
        (b"alice is not in the sudoers file.\n", 1, "may not run 'cat' as root"),
        (b"sh: 1: sudo: not found\n", 127, "sudo is not installed"),
    ],
)
def test_sudo_refusals_become_auth_errors(stderr: bytes, status: int, words: str) -> None:
    inner = RecordingTransport(CommandResult(status, b"", stderr, 0.01))
    with pytest.raises(AuthError) as caught:
        SudoTransport(inner).run(["cat", "/root/x"])
    assert words in caught.value.message
    assert "root@pve1" in caught.value.message
    assert "log in as root" in caught.value.message


def test_command_failing_under_sudo_is_a_plain_result() -> None:
    inner = RecordingTransport(CommandResult(1, b"", b"cat: /x: No such file\n", 0.01))
    assert SudoTransport(inner).run(["cat", "/x"]).exit_status == 1


@pytest.mark.integration
@pytest.mark.root
def test_command_timeout_option_applies_when_run_gets_no_timeout(fleet: Fleet) -> None:
    options = options_for(fleet.hosts[1], command_timeout=1.0)
    with SshTransport("h02", options=options) as ssh:
        started = time.monotonic()
        with pytest.raises(RemoteStepFailed) as caught:
            ssh.run(["sleep", "30"])
    assert caught.value.step == "timeout"
    assert time.monotonic() - started < 10


# Time bounds above are loose on purpose (a loaded 2-core CI machine): they prove that the
# configured timeout fired, not paramiko's defaults (15 s banner, 30 s auth) or no timeout at all.


# -- per-process caches of ssh_config, known_hosts and keys ---------------------------------------


def test_ssh_config_is_parsed_once_and_read_again_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import paramiko

    from dflash_provision.transport.ssh import resolve_endpoint

    parses: list[str] = []
    real_parse = paramiko.SSHConfig.parse

    def counting(self: paramiko.SSHConfig, file_obj: object) -> None:
        parses.append("parsed")
        real_parse(self, file_obj)

    monkeypatch.setattr(paramiko.SSHConfig, "parse", counting)
    config = tmp_path / "config"
    blocks = "".join(f"Host h{i:02d}\n    HostName 127.0.9.{i}\n    Port 22\n" for i in range(40))
    config.write_text(blocks)
    options = SshOptions(ssh_config_path=str(config), use_agent=False)
    for i in range(40):
        endpoint = resolve_endpoint(f"h{i:02d}", user="root", port=None, options=options)
        assert (endpoint.hostname, endpoint.port) == (f"127.0.9.{i}", 22)
    assert len(parses) == 1
    # Rewritten in place, same length: a new version all the same.
    config.write_text(blocks.replace("Port 22", "Port 23"))
    assert resolve_endpoint("h07", user="root", port=None, options=options).port == 23
    assert len(parses) == 2


def test_a_file_unchanged_for_a_while_is_known_by_its_stat_without_reading_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fleet's known_hosts grows with the fleet: reading and hashing it for every connection
    # made each host's controller CPU grow with the fleet. Its bytes are read again only when
    # its stat changes, or while its last change is too recent for the stat to tell.
    from dflash_provision.transport.ssh import config_files

    digests: list[str] = []
    real_digest = config_files._digest

    def counting(path: str) -> bytes | None:
        digests.append(path)
        return real_digest(path)

    monkeypatch.setattr(config_files, "_digest", counting)
    cache = config_files.FileCache(lambda path: Path(path).read_text())
    known = tmp_path / "known_hosts"
    known.write_text("h01 ssh-ed25519 AAAA\n")
    assert cache.get(str(known)) == "h01 ssh-ed25519 AAAA\n"
    assert cache.get(str(known)) == "h01 ssh-ed25519 AAAA\n"
    assert len(digests) == 2, "changed a moment ago: its bytes tell, not its stat"
    time.sleep(config_files._SETTLED_NS / 1e9 + 0.2)
    for _ in range(5):
        assert cache.get(str(known)) == "h01 ssh-ed25519 AAAA\n"
    assert len(digests) == 3, "settled: one last look at its bytes, then the stat alone"
    # Rewritten in place with the same length: a new ctime, so a new version.
    known.write_text("h02 ssh-ed25519 AAAA\n")
    assert cache.get(str(known)) == "h02 ssh-ed25519 AAAA\n"


@pytest.mark.integration
@pytest.mark.root
def test_known_hosts_changes_are_seen_by_the_next_connection_in_the_same_process(
    fleet: Fleet, tmp_path: Path
) -> None:
    h01, h02 = fleet.hosts[0], fleet.hosts[1]
    known = tmp_path / "known_hosts"
    known.write_text(
        f"{known_hosts_name(h02.address, h02.port)} {' '.join(h02.host_public_key.split()[:2])}\n"
    )
    strict = _options_with_known_hosts(h01, known, "reject")
    with SshTransport(h02.address, port=h02.port, user="root", options=strict) as ssh:
        assert ssh.run(["true"]).ok  # the file is parsed and cached now
    # accept-new appends h01; a strict connection right after must know it.
    accept = _options_with_known_hosts(h01, known, "accept-new")
    with SshTransport(h01.address, port=h01.port, user="root", options=accept) as ssh:
        assert ssh.run(["true"]).ok
    with SshTransport(h01.address, port=h01.port, user="root", options=strict) as ssh:
        assert ssh.run(["true"]).ok
    # Rewritten in place (same inode, same length): h01's line now holds h02's key.
    lines = known.read_text().splitlines()
    lie = f"{known_hosts_name(h01.address, h01.port)} {' '.join(h02.host_public_key.split()[:2])}"
    known.write_text("\n".join([lines[0], lie]) + "\n")
    with pytest.raises(AuthError) as caught:
        SshTransport(h01.address, port=h01.port, user="root", options=strict).run(["true"])
    assert "CHANGED" in caught.value.message


class _ChannelOfADroppedConnection:
    """A session channel whose exec request never gets an answer and whose connection is gone:
    ``close`` raises as paramiko's does when it cannot send the close message."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def exec_command(self, command: str) -> None:
        self.closed.wait(10)
        raise EOFError()

    def close(self) -> None:
        self.closed.set()
        raise EOFError()


def test_exec_request_deadline_on_a_dropped_connection_raises_in_no_thread(monkeypatch) -> None:
    from dflash_provision.transport.ssh.channel import _exec_within

    escaped: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(args.exc_value))
    channel = _ChannelOfADroppedConnection()
    assert _exec_within(channel, "true", 0.05) is False  # type: ignore[arg-type]
    # The deadline thread closed the channel (which raised) before exec_command gave up: by
    # now its expire has returned, and an exception it let out would be in ``escaped``.
    time.sleep(0.2)
    assert escaped == []
