"""Inventory parsing: our YAML, Ansible YAML and INI, plain targets, errors with line numbers."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from dflash_provision.errors import UsageError
from dflash_provision.inventory import (
    UNGROUPED,
    Overrides,
    load_inventory,
    load_members,
)
from dflash_provision.source.authority import RepoRef, SourceSpec

SHA = "5f7c2b9e0d4a1c3b8e6f9a2d7c4b1e0f3a5d8c6b"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def by_name(members):
    return {m.name: m for m in members}


def test_our_yaml_resolves_host_over_group_over_defaults(tmp_path):
    inv = write(
        tmp_path,
        "fleet.yaml",
        f"""
        defaults:
          user: root
          path: /root/models/Qwen3.6-27B-DFlash
          drafter:
            repo: z-lab/Qwen3.6-27B-DFlash
            revision: {SHA}
        groups:
          east:
            hosts:
              - gpu1
              - name: gpu3
                address: 10.0.3.17
                user: ops
                port: 2222
          proxmox:
            drafter:
              lock: locks/q.lock
            hosts:
              - name: pve1-101
                address: pve1
                container: pct:101
                path: /srv/m/config.json
        hosts:
          - lab3
        """,
    )
    members = by_name(load_inventory(inv))
    assert set(members) == {"gpu1", "gpu3", "pve1-101", "lab3"}
    gpu1 = members["gpu1"]
    assert (gpu1.target.host, gpu1.target.user, gpu1.target.port) == ("gpu1", "root", None)
    assert gpu1.target.config_path == "/root/models/Qwen3.6-27B-DFlash/config.json"
    assert gpu1.source == SourceSpec(RepoRef("z-lab/Qwen3.6-27B-DFlash", SHA))
    assert gpu1.group == "east"
    gpu3 = members["gpu3"]
    assert (gpu3.target.host, gpu3.target.user, gpu3.target.port) == ("10.0.3.17", "ops", 2222)
    pve = members["pve1-101"]
    assert pve.target.container is not None and pve.target.container.display() == "pct:101"
    assert pve.target.config_path == "/srv/m/config.json"
    # lock paths are relative to the inventory file
    assert pve.source == SourceSpec(lock=str(tmp_path / "locks/q.lock"))
    assert members["lab3"].group == UNGROUPED
    assert members["gpu1"].origin == f"{inv}:10"


def test_our_yaml_reports_unknown_field_with_line(tmp_path):
    inv = write(
        tmp_path,
        "fleet.yaml",
        """
        defaults:
          path: /root/models/X
          drafter: {from: x.json}
        groups:
          east:
            hosts:
              - name: gpu1
                adress: 10.0.0.1
        """,
    )
    with pytest.raises(UsageError) as info:
        load_inventory(inv)
    assert f"{inv}:8:" in info.value.message
    assert "adress" in info.value.message
    assert "unknown field" in info.value.message


# Inventories that must be refused, each naming the file, the line and the field at fault.
BAD_INVENTORIES = [
    pytest.param(
        "fleet.yaml",
        """
        defaults:
          path: /root/models/X
          drafter:
            lock: a.lock
            from: b.json
        hosts: [gpu1]
        """,
        r"fleet.yaml:4: defaults.drafter: give exactly one of",
        id="our_yaml_rejects_two_drafter_sources",
    ),
    pytest.param(
        "fleet.yaml",
        """
        defaults:
          path: /root/models/X
          drafter: {from: x.json}
        hosts:
          - address: gpu1
            port: 99999
        """,
        r"fleet.yaml:6: hosts\[0\].port: expected 1..65535",
        id="our_yaml_bad_port_names_line_and_field",
    ),
    pytest.param(
        "fleet.yaml",
        """
        defaults:
          path: /root/models/X
        hosts:
          - gpu1
        """,
        r"fleet.yaml:4: host 'gpu1' has no drafter",
        id="host_without_drafter_names_its_line",
    ),
    pytest.param(
        "fleet.yaml",
        """
        defaults: {path: /root/models/X, drafter: {from: x.json}}
        hosts:
          - {address: pve1, container: "pct:abc"}
        """,
        r"fleet.yaml:3: container: .*VMID",
        id="bad_container_kind_is_refused_with_line",
    ),
    pytest.param(
        "hosts.yml",
        """
        all:
          vars: {dflash_path: /m, dflash_from: x.json}
          hosts:
            h1:
              ansible_port: nope
        """,
        r"hosts.yml:5: ansible_port: expected 1..65535",
        id="ansible_yaml_bad_port_names_the_line_of_the_var",
    ),
    pytest.param(
        "hosts.ini",
        """
        [east]
        gpu1

        [east:vars]
        dflash_path=/m
        dflash_lock=a.lock
        dflash_from=x.json
        """,
        r"hosts.ini:7: host 'gpu1': dflash_lock and dflash_from",
        id="ansible_ini_two_sources_at_one_level_is_an_error",
    ),
    pytest.param(
        "fleet.yaml",
        "defaults:\n  path: /x\n hosts: [a\n",
        r"fleet.yaml:\d+: not valid YAML",
        id="invalid_yaml_reports_line",
    ),
    pytest.param(
        "hosts.ini",
        "[east]\ngpu1\n[east:varz]\n",
        r"hosts.ini:3: bad section header",
        id="ansible_ini_bad_section_header_names_the_line",
    ),
    pytest.param(
        "hosts.ini",
        "[east]\ngpu1 ansible_user\n",
        r"hosts.ini:2: host gpu1: expected key=value",
        id="ansible_ini_bad_host_var_names_the_line",
    ),
]


@pytest.mark.parametrize(("name", "text", "message"), BAD_INVENTORIES)
def test_a_bad_inventory_is_refused_naming_its_line(tmp_path, name, text, message):
    inv = write(tmp_path, name, text)
    with pytest.raises(UsageError, match=message):
        load_inventory(inv)


def test_duplicate_host_names_are_refused(tmp_path):
    inv = write(
        tmp_path,
        "fleet.yaml",
        """
        defaults: {path: /root/models/X, drafter: {from: x.json}}
        groups:
          a: {hosts: [gpu1]}
          b: {hosts: [gpu1]}
        """,
    )
    with pytest.raises(UsageError, match=r"'gpu1' is used twice"):
        load_members(inv)


def test_ansible_yaml_inherits_vars_through_children(tmp_path):
    inv = write(
        tmp_path,
        "hosts.yml",
        f"""
        all:
          vars:
            dflash_path: /root/models/Qwen3.6-27B-DFlash
            dflash_repo: z-lab/Qwen3.6-27B-DFlash
            dflash_revision: {SHA}
          hosts:
            solo:
              ansible_host: 10.0.0.9
          children:
            gpus:
              vars:
                ansible_user: root
              children:
                east:
                  vars:
                    dflash_path: /srv/east/model
                  hosts:
                    e1:
                      ansible_host: 127.0.1.1
                      ansible_port: 2200
                    e2:
                      ansible_user: admin
                      dflash_container: lxc:c2
        """,
    )
    members = by_name(load_inventory(inv))
    assert set(members) == {"solo", "e1", "e2"}
    e1 = members["e1"]
    assert (e1.target.host, e1.target.user, e1.target.port) == ("127.0.1.1", "root", 2200)
    assert e1.target.path == "/srv/east/model"  # deeper group beats "all"
    assert e1.group == "east"
    e2 = members["e2"]
    assert (e2.target.host, e2.target.user) == ("e2", "admin")  # host var beats group var
    assert e2.target.container is not None and e2.target.container.display() == "lxc:c2"
    solo = members["solo"]
    assert solo.group == UNGROUPED
    assert solo.target.path == "/root/models/Qwen3.6-27B-DFlash"
    assert solo.source == SourceSpec(RepoRef("z-lab/Qwen3.6-27B-DFlash", SHA))


def test_ansible_ini_groups_vars_children_and_ranges(tmp_path):
    inv = write(
        tmp_path,
        "hosts",
        """
        # a classic Ansible inventory
        bastion ansible_host=10.0.0.1

        [east]
        gpu[01:03] ansible_user=root
        odd ansible_host=127.0.1.9 ansible_port=2222 dflash_path="/srv/odd model"

        [east:vars]
        dflash_lock=locks/fleet.lock

        [gpus:children]
        east

        [gpus:vars]
        dflash_path=/root/models/Qwen3.6-27B-DFlash

        [all:vars]
        dflash_from=/etc/dflash/config.json
        dflash_path=/root/models/default
        """,
    )
    members = by_name(load_inventory(inv))
    assert set(members) == {"bastion", "gpu01", "gpu02", "gpu03", "odd"}
    gpu02 = members["gpu02"]
    assert (gpu02.target.host, gpu02.target.user) == ("gpu02", "root")
    assert gpu02.target.path == "/root/models/Qwen3.6-27B-DFlash"
    assert gpu02.group == "east"
    odd = members["odd"]
    assert (odd.target.host, odd.target.port) == ("127.0.1.9", 2222)
    assert odd.target.path == "/srv/odd model"
    assert members["bastion"].target.path == "/root/models/default"


def test_ansible_ini_deeper_group_source_replaces_inherited_one(tmp_path):
    inv = write(
        tmp_path,
        "hosts.ini",
        """
        [east]
        gpu1

        [east:vars]
        dflash_path=/m
        dflash_lock=a.lock

        [all:vars]
        dflash_repo=z/r
        dflash_revision=abc
        """,
    )
    (member,) = load_inventory(inv)
    assert member.source == SourceSpec(lock=str(tmp_path / "a.lock"))


def test_command_line_options_override_the_inventory(tmp_path):
    inv = write(tmp_path, "hosts.ini", "[east]\ngpu1 dflash_path=/m dflash_from=x.json\n")
    overrides = Overrides(source=SourceSpec(RepoRef("z/r", SHA)), path="/other")
    (member,) = load_members(inv, overrides=overrides)
    assert member.source == SourceSpec(RepoRef("z/r", SHA))
    assert member.target.path == "/other"


def test_plain_targets_need_a_drafter_source():
    with pytest.raises(UsageError, match="no drafter source"):
        load_members(None, ["root@h1:/root/models/X"])


def test_plain_targets_become_members():
    overrides = Overrides(source=SourceSpec(from_file="/tmp/x.json"))
    members = load_members(None, ["root@h1:/root/models/X", "pve1/pct:101:/m"], overrides)
    assert [m.name for m in members] == ["root@h1:/root/models/X", "pve1/pct:101:/m"]
    assert members[0].target.user == "root"
    assert members[1].target.container is not None


def test_no_hosts_at_all_is_a_usage_error():
    with pytest.raises(UsageError, match="no hosts"):
        load_members(None, [])


def test_the_documented_example_inventory_parses(tmp_path):
    import dflash_provision.inventory as inventory_module

    doc = inventory_module.__doc__ or ""
    block = doc.split("1. Our YAML inventory (``-i fleet.yaml``)::", 1)[1]
    block = block.split("   Settings resolve", 1)[0]
    inv = tmp_path / "fleet.yaml"
    inv.write_text(textwrap.dedent(block).strip("\n") + "\n")
    members = by_name(load_inventory(inv))
    assert set(members) == {"gpu1", "gpu2", "gpu3", "pve1-101", "lab1", "lab2", "lab3"}
    assert members["gpu3"].target.port == 2222
    assert members["lab1"].target.config_path == "/srv/models/Qwen3.6-27B-DFlash/config.json"
    assert members["lab3"].source.repo.repo_id == "z-lab/Qwen3.6-27B-DFlash"
