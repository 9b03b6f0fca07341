"""ProxyCommand and nested jump hosts from ssh_config, against real sshd hosts and a real
OpenSSH ``ssh -W`` proxy."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from dflash_provision.errors import AuthError, UnreachableError, UsageError
from dflash_provision.transport.options import SshOptions
from dflash_provision.transport.ssh import SshTransport
from dflash_provision.transport.ssh.config import resolve_endpoint
from dflash_provision.transport.ssh.config_files import clear_caches
from dflash_provision.transport.ssh.config_route import expand_proxy_command
from testbed.hosts import Fleet, Host, known_hosts_name
from testbed.samples import REFERENCE_DRAFTER
from tests.fixtures.cli import run_cli
from tests.fixtures.ssh import accepted_logins, options_for_fleet


def config_behind(jump: Host, target: Host, tmp_path: Path, proxy: str) -> Path:
    """An ssh_config whose ``behind`` alias is ``target``, reached through ``proxy``."""
    assert jump.client is not None
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host behind\n"
        f"    HostName {target.address}\n"
        f"    Port {target.port}\n"
        "    User root\n"
        f"    IdentityFile {jump.client.identity}\n"
        "    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {jump.client.known_hosts}\n"
        f"    ProxyCommand {proxy}\n\n" + jump.client.ssh_config.read_text()
    )
    return config


def options(config: Path, **changes: object) -> SshOptions:
    """The test fleet's options (see test_transport_ssh) with this test's ssh_config."""
    return options_for_fleet(ssh_config_path=str(config), **changes)


def processes_mentioning(marker: str) -> list[str]:
    """Command lines of live processes that contain ``marker`` (zombies have none)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline and str(os.getpid()) != pid:
            found.append(cmdline)
    return found


@pytest.mark.integration
@pytest.mark.root
def test_ssh_w_proxy_reaches_the_target_and_ends_with_the_connection(
    fleet: Fleet, tmp_path: Path
) -> None:
    h01, h02 = fleet.hosts[0], fleet.hosts[1]
    assert h01.client is not None
    # A real OpenSSH client as the proxy, as most bastion set-ups write it.
    config = config_behind(h01, h02, tmp_path, f"ssh -F {h01.client.ssh_config} -W %h:%p h01")
    jump_before, target_before = accepted_logins(h01), accepted_logins(h02)
    with SshTransport("behind", options=options(config)) as ssh:
        assert ssh.run(["hostname"]).stdout == b"h02\n"
        assert ssh.run(["hostname"]).stdout == b"h02\n"
        assert processes_mentioning(f"-W {h02.address}:{h02.port} h01")
    assert accepted_logins(h01) - jump_before == 1  # the proxy's own login, once
    assert accepted_logins(h02) - target_before == 1  # one connection for both commands
    assert processes_mentioning(f"-W {h02.address}:{h02.port} h01") == []


@pytest.mark.integration
@pytest.mark.root
def test_a_failing_proxy_is_unreachable_with_its_own_message(fleet: Fleet, tmp_path: Path) -> None:
    h01, h02 = fleet.hosts[0], fleet.hosts[1]
    config = config_behind(
        h01, h02, tmp_path, "sh -c 'echo \"bastion: no route to %h\" >&2; exit 3'"
    )
    with pytest.raises(UnreachableError) as caught:
        SshTransport("behind", options=options(config)).run(["true"])
    assert caught.value.reason == "network"
    assert caught.value.message.endswith(
        f"ProxyCommand exited with status 3: bastion: no route to {h02.address}"
    )


@pytest.mark.integration
@pytest.mark.root
def test_a_proxy_that_never_speaks_times_out_and_is_killed(fleet: Fleet, tmp_path: Path) -> None:
    h01, h02 = fleet.hosts[0], fleet.hosts[1]
    config = config_behind(h01, h02, tmp_path, "sleep 4321")
    with pytest.raises(UnreachableError) as caught:
        SshTransport("behind", options=options(config, banner_timeout=1.0)).run(["true"])
    assert caught.value.reason == "timeout"
    assert processes_mentioning("sleep 4321") == []


@pytest.mark.integration
@pytest.mark.root
def test_audit_cli_through_a_proxycommand_alias(fleet: Fleet, tmp_path: Path) -> None:
    h01, h03 = fleet.hosts[0], fleet.hosts[2]
    assert h01.client is not None
    config = config_behind(h01, h03, tmp_path, f"ssh -F {h01.client.ssh_config} -W %h:%p h01")
    audit = [
        "audit", "behind:/root/models/proxied",
        "--from", str(REFERENCE_DRAFTER), "--ssh-config", str(config), "--no-agent", "--json",
    ]  # fmt: skip
    jump_before = accepted_logins(h01)
    proc = run_cli(*audit, home=tmp_path / "home")
    (host,) = json.loads(proc.stdout)["hosts"]
    assert (proc.returncode, host["status"]) == (4, "missing"), proc.stderr
    assert accepted_logins(h01) - jump_before == 1  # it went through the proxy, not straight to h03


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.parametrize(
    "h02_route", ["ProxyJump h01", "ProxyCommand ssh -F {config} -W %h:%p h01"]
)
def test_the_first_jump_hosts_own_route_is_followed(
    fleet: Fleet, tmp_path: Path, h02_route: str
) -> None:
    # behind (h03) -> ProxyJump h02, and h02 itself is only reachable through h01.
    h01, h03 = fleet.hosts[0], fleet.hosts[2]
    assert h01.client is not None
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host h02\n    {h02_route.format(config=h01.client.ssh_config)}\n\n"
        f"Host behind\n    HostName {h03.address}\n    Port {h03.port}\n    ProxyJump h02\n"
        f"    User root\n    IdentityFile {h01.client.identity}\n    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {h01.client.known_hosts}\n\n" + h01.client.ssh_config.read_text()
    )
    before = [accepted_logins(h) for h in fleet.hosts]
    with SshTransport("behind", options=options(config)) as ssh:
        assert ssh.run(["hostname"]).stdout == b"h03\n"
    assert [accepted_logins(h) - b for h, b in zip(fleet.hosts, before, strict=True)] == [1, 1, 1]


def test_a_jump_host_that_leads_back_to_itself_is_a_usage_error(tmp_path: Path) -> None:
    opts = write_config(tmp_path, "Host loop\n    HostName 127.0.0.1\n    ProxyJump loop\n")
    with pytest.raises(UsageError, match="more than 8 proxy hops before loop"):
        SshTransport("loop", user="root", options=opts).run(["true"])


def write_config(tmp_path: Path, text: str) -> SshOptions:
    clear_caches()
    path = tmp_path / "ssh_config"
    path.write_text(text)
    return SshOptions(ssh_config_path=str(path), use_agent=False)


def test_tokens_take_the_port_and_user_the_connection_really_uses(tmp_path: Path) -> None:
    opts = write_config(
        tmp_path, "Host gpu*\n    HostName %h.lab\n    Port 22\n    ProxyCommand ssh -W %h:%p b\n"
    )
    endpoint = resolve_endpoint("gpu1", user="ops", port=2222, options=opts)
    assert endpoint.proxy_command == "ssh -W %h:%p b"  # kept raw by the config parser
    expanded = expand_proxy_command(
        endpoint.proxy_command,
        hostname=endpoint.hostname,
        port=endpoint.port,
        user=endpoint.user,
        alias=endpoint.alias,
    )
    assert expanded == "ssh -W gpu1.lab:2222 b"
    assert (
        expand_proxy_command(
            "nc %h %p # %r %n %%p", hostname="10.0.0.5", port=22, user="root", alias="gpu1"
        )
        == "nc 10.0.0.5 22 # root gpu1 %p"
    )


def test_proxycommand_none_means_a_direct_connection(tmp_path: Path) -> None:
    opts = write_config(tmp_path, "Host gpu1\n    ProxyCommand none\nHost *\n    ProxyCommand nc\n")
    assert resolve_endpoint("gpu1", user=None, port=None, options=opts).proxy_command is None


def test_proxyjump_and_proxycommand_together_are_refused(tmp_path: Path) -> None:
    opts = write_config(tmp_path, "Host gpu1\n    ProxyJump b\n    ProxyCommand nc %h %p\n")
    with pytest.raises(UsageError, match="both ProxyJump and ProxyCommand apply to gpu1"):
        resolve_endpoint("gpu1", user=None, port=None, options=opts)


@pytest.mark.parametrize(
    ("template", "hostname", "words"),
    [
        ("nc %h %x", "gpu1", "unknown token %x"),
        ("nc %h %p", "gpu1;reboot", "refusing to put 'gpu1;reboot' (%h)"),
        ("nc %h %p", "$(id)", "refusing to put '$(id)' (%h)"),
    ],
)
def test_bad_tokens_and_shell_words_in_values_are_refused(
    template: str, hostname: str, words: str
) -> None:
    with pytest.raises(UsageError, match=re.escape(words)):
        expand_proxy_command(template, hostname=hostname, port=22, user="root", alias="gpu1")


@pytest.mark.integration
@pytest.mark.root
def test_host_key_alias_files_and_checks_the_key_under_the_alias(
    fleet: Fleet, tmp_path: Path
) -> None:
    # Typical behind a bastion: the key is filed under a stable name, not the address/port.
    h01, h02 = fleet.hosts[0], fleet.hosts[1]
    assert h01.client is not None
    known = tmp_path / "known_hosts"
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host behind\n    HostName {h02.address}\n    Port {h02.port}\n    User root\n"
        "    HostKeyAlias gpu-02.lab\n"
        f"    IdentityFile {h01.client.identity}\n    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {known}\n"
    )
    key = " ".join(h02.host_public_key.split()[:2])
    known.write_text(
        f"{known_hosts_name(h02.address, h02.port)} {key}\n"
    )  # filed under the address only: not good enough
    with pytest.raises(AuthError, match=re.escape("host key for behind (gpu-02.lab) is unknown")):
        SshTransport("behind", options=options(config)).run(["true"])
    known.write_text("")
    with SshTransport("behind", options=options(config, host_key_policy="accept-new")) as ssh:
        assert ssh.run(["hostname"]).stdout == b"h02\n"
    assert known.read_text() == f"gpu-02.lab {key}\n"  # recorded under the alias, as ssh does
    with SshTransport("behind", options=options(config)) as ssh:  # and checked under it
        assert ssh.run(["hostname"]).stdout == b"h02\n"
