"""An Ansible host's own SSH key and bastion (ansible_ssh_private_key_file,
ansible_ssh_common_args / ansible_ssh_extra_args): parsed with file and line, and honoured by
real connections through a real jump host."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from dflash_provision.errors import UsageError
from dflash_provision.inventory import load_inventory
from dflash_provision.transport.options import HostRoute, SshOptions
from dflash_provision.transport.ssh.config import resolve_endpoint
from dflash_provision.transport.ssh.config_files import clear_caches
from testbed.hosts import Fleet
from testbed.samples import REFERENCE_DRAFTER
from tests.fixtures.cli import Cli, run_cli
from tests.fixtures.ssh import accepted_logins, ssh_args

COMMON = "dflash_path=/root/models/m dflash_from=/dev/null"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def routes(path: Path) -> dict[str, HostRoute | None]:
    return {m.name: m.route for m in load_inventory(path)}


def test_ini_key_file_and_proxycommand_with_inner_quotes(tmp_path: Path) -> None:
    inv = write(
        tmp_path,
        "hosts.ini",
        f"""
        [gpu]
        gpu1 {COMMON} ansible_ssh_private_key_file=~/.ssh/gpu ansible_ssh_common_args='-o ProxyCommand="ssh -W %h:%p -q bastion" -o ControlMaster=auto -o ControlPersist=60s'
        gpu2 {COMMON}
        """,  # noqa: E501 -- one INI line, as Ansible users write it
    )
    assert routes(inv) == {
        "gpu1": HostRoute(
            identity_files=(os.path.expanduser("~/.ssh/gpu"),),
            proxy_command="ssh -W %h:%p -q bastion",
        ),
        "gpu2": None,
    }


def test_yaml_group_jump_is_inherited_and_a_host_can_turn_it_off(tmp_path: Path) -> None:
    inv = write(
        tmp_path,
        "hosts.yml",
        """
        all:
          vars:
            dflash_path: /root/models/m
            dflash_from: /dev/null
          children:
            east:
              vars:
                ansible_ssh_common_args: "-J ops@bastion:2222 -o StrictHostKeyChecking=no"
              hosts:
                gpu1: {}
                gpu2:
                  ansible_ssh_common_args: "-o ProxyJump=none"
                gpu3:
                  ansible_ssh_extra_args: "-o ProxyJump=other"
        """,
    )
    assert routes(inv) == {
        "gpu1": HostRoute(proxy_jump="ops@bastion:2222"),
        "gpu2": HostRoute(proxy_jump="none"),  # the host's var replaces the group's
        # common args come before extra args, and the first value wins, as on ssh's command line
        "gpu3": HostRoute(proxy_jump="ops@bastion:2222"),
    }


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ("-o Port=2222", "hosts.ini:2: ansible_ssh_common_args: -o Port is not supported here"),
        ("-L 8080:localhost:80", "hosts.ini:2: ansible_ssh_common_args: '-L' is not supported"),
        ("-o", "hosts.ini:2: ansible_ssh_common_args: -o needs a value"),
        (
            '-o ProxyJump=b -o ProxyCommand="nc %h %p"',
            "hosts.ini:2: both ProxyJump and ProxyCommand given",
        ),
    ],
)
def test_unsupported_ssh_arguments_name_the_file_and_line(
    tmp_path: Path, args: str, words: str
) -> None:
    inv = write(tmp_path, "hosts.ini", f"[gpu]\ngpu1 {COMMON} ansible_ssh_common_args='{args}'\n")
    with pytest.raises(UsageError) as caught:
        load_inventory(inv)
    assert str(caught.value.message).startswith(str(tmp_path / words.split(":")[0]))
    assert words.split(":", 1)[1] in caught.value.message


def test_a_routes_proxy_and_key_beat_the_config_file(tmp_path: Path) -> None:
    clear_caches()
    config = tmp_path / "ssh_config"
    config.write_text("Host gpu1\n    ProxyJump old-bastion\n    IdentityFile /k/config\n")
    key = tmp_path / "route-key"
    key.write_text("not really a key")
    opts = SshOptions(ssh_config_path=str(config), use_agent=False, identities_only=True)
    plain = resolve_endpoint("gpu1", user=None, port=None, options=opts)
    assert plain.proxy_jump == ("old-bastion",)
    routed = resolve_endpoint(
        "gpu1",
        user=None,
        port=None,
        options=opts,
        route=HostRoute(identity_files=(str(key),), proxy_command="nc %h %p"),
    )
    assert (routed.proxy_jump, routed.proxy_command) == ((), "nc %h %p")
    assert routed.identity_files[0] == str(key)


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.parametrize(
    "args", ["-o ProxyJump=h01", '-o ProxyCommand="ssh -F {config} -W %h:%p h01"']
)
def test_repair_through_the_inventorys_bastion(fleet: Fleet, tmp_path: Path, args: str) -> None:
    h01, h03 = fleet.hosts[0], fleet.hosts[2]
    client = h01.client
    assert client is not None
    model = f"/root/models/bastion-{len(args)}"
    # h03 by address only: its key and its route come from the inventory, not from ssh_config.
    inv = write(
        tmp_path,
        "hosts.ini",
        f"""
        [behind]
        h03 ansible_host={h03.address} ansible_port={h03.port} ansible_user=root ansible_ssh_private_key_file={client.identity} ansible_ssh_common_args='{args.format(config=client.ssh_config)}'
        [behind:vars]
        dflash_path={model}
        dflash_from={REFERENCE_DRAFTER}
        """,  # noqa: E501 -- one INI line
    )

    def cli(*command: str) -> subprocess.CompletedProcess[str]:
        known_hosts = ["--known-hosts", str(client.known_hosts)]
        return Cli(tmp_path).run(*command, "-i", str(inv), "--json", *ssh_args(fleet), *known_hosts)

    jump_before = accepted_logins(h01)
    repaired = cli("repair", "--mkdir")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    audited = cli("audit")
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert json.loads(audited.stdout)["hosts"][0]["status"] == "in_sync"
    assert (h03.root_dir / model.removeprefix("/root/") / "config.json").read_bytes() == (
        REFERENCE_DRAFTER.read_bytes()
    )
    assert accepted_logins(h01) - jump_before >= 2  # every command went through the bastion


def test_ansible_connection_local_works_on_this_machine_and_unknown_ones_are_refused(
    tmp_path: Path,
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes(REFERENCE_DRAFTER.read_bytes())
    inv = write(
        tmp_path,
        "hosts.ini",
        f"""
        [ctl]
        localhost ansible_connection=local
        [all:vars]
        dflash_path={model}
        dflash_from={REFERENCE_DRAFTER}
        """,
    )
    (member,) = load_inventory(inv)
    assert member.target.host is None  # no SSH to "localhost"
    audited = run_cli("audit", "-i", inv, "--json", home=tmp_path / "home")
    assert audited.returncode == 0, audited.stderr
    assert json.loads(audited.stdout)["hosts"][0]["status"] == "in_sync"
    inv.write_text(inv.read_text().replace("ansible_connection=local", "ansible_connection=docker"))
    with pytest.raises(UsageError, match=r"hosts.ini:2: ansible_connection: 'docker' is not"):
        load_inventory(inv)


@pytest.mark.parametrize(
    ("become_vars", "expected"),
    [
        ("", False),
        ("ansible_become=true", True),
        ("ansible_become=yes ansible_become_method=ansible.builtin.sudo", True),
        ("ansible_become=no", False),
        ("ansible_become=maybe", "ansible_become: expected true or false"),
        ("ansible_become=true ansible_become_method=su", "only sudo is supported, got 'su'"),
        ("ansible_become=true ansible_become_user=postgres", "only root is supported"),
    ],
)
def test_ansible_become_means_sudo_to_root(
    tmp_path: Path, become_vars: str, expected: bool | str
) -> None:
    inv = write(tmp_path, "hosts.ini", f"[gpu]\ngpu1 {COMMON} {become_vars}\n")
    if isinstance(expected, bool):
        (member,) = load_inventory(inv)
        assert member.become is expected
    else:
        with pytest.raises(UsageError, match=f"hosts.ini:2: .*{expected}"):
            load_inventory(inv)
