"""Which hosts a fleet command works on, and which drafter config each must hold.

Three ways to name a fleet, all producing ``list[FleetMember]``:

1. Our YAML inventory (``-i fleet.yaml``)::

       # fleet.yaml -- every key except "hosts" is optional
       defaults:                         # applies to every group unless the group says otherwise
         user: root
         port: 22
         path: /root/models/Qwen3.6-27B-DFlash       # model directory (or a .json file) on the host
         drafter:                                    # exactly one of repo / lock / from
           repo: z-lab/Qwen3.6-27B-DFlash
           revision: 5f7c2b9e0d4a1c3b8e6f9a2d7c4b1e0f3a5d8c6b   # required with repo: pin it
       groups:
         gpu-east:
           hosts:
             - gpu1                                  # an address or an ~/.ssh/config alias
             - gpu2
             - name: gpu3                            # a host with its own settings
               address: 10.0.3.17
               user: ops
               port: 2222
         proxmox:
           drafter:
             lock: locks/qwen36.lock                 # relative to this file
           hosts:
             - name: pve1-101
               address: pve1
               container: pct:101    # lxc:NAME pct:VMID incus:NAME lxd:NAME docker:NAME podman:NAME
               path: /root/models/Qwen3.6-27B-DFlash
         lab:
           drafter:
             from: configs/qwen36-config.json        # a local file, relative to this file
           path: /srv/models/Qwen3.6-27B-DFlash/config.json
           hosts: [lab1, lab2]
       hosts:                                        # ungrouped hosts (group "ungrouped")
         - lab3

   Settings resolve host > group > defaults. Host names must be unique.

2. An existing Ansible inventory, YAML or INI. ``ansible_host``, ``ansible_user`` and
   ``ansible_port`` give the address; ``dflash_path``, ``dflash_repo`` + ``dflash_revision``,
   ``dflash_lock``, ``dflash_from`` and ``dflash_container`` give the rest, as host vars or group
   vars (``[group:vars]``, ``vars:``), inherited through ``children`` like Ansible does (deeper
   groups win, then host vars). INI host patterns like ``gpu[01:64]`` expand. A host's key file
   and bastion (``ansible_ssh_private_key_file``, ``-J``/``-o ProxyJump``/``-o ProxyCommand`` in
   ``ansible_ssh_common_args``) become its ``route`` (see ansible_ssh.py).

3. Plain TARGETs on the command line (``root@h1:/root/models/X``, see
   dflash_provision.target).

Command-line ``--repo/--revision/--lock/--from`` and ``--path`` override what an inventory says
(like Ansible's extra vars), and are required for plain TARGETs.

Errors in an inventory are UsageErrors that name the file, the line and the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dflash_provision.errors import UsageError
from dflash_provision.inventory.ansible import AnsibleIni, AnsibleYaml
from dflash_provision.inventory.common import (
    check_unique,
    compose,
    is_ours,
    looks_like_ini,
    where_in,
    with_path,
    yaml_module,
)
from dflash_provision.inventory.model import UNGROUPED, FleetMember, Overrides
from dflash_provision.inventory.ours import OurYaml
from dflash_provision.target import parse_target

__all__ = ["UNGROUPED", "FleetMember", "Overrides", "load_inventory", "load_members"]


def load_members(
    inventory: Path | None,
    targets: Sequence[str] = (),
    overrides: Overrides | None = None,
) -> list[FleetMember]:
    """Members from an inventory file and/or plain TARGETs, with command-line overrides applied."""
    overrides = overrides or Overrides()
    members: list[FleetMember] = []
    if inventory is not None:
        members.extend(load_inventory(inventory, overrides))
    for spec in targets:
        target = parse_target(spec)
        if overrides.path:
            target = with_path(target, overrides.path, "command line", "--path")
        if not overrides.source.is_set:
            raise UsageError(
                f"target {spec}: no drafter source; give --repo R --revision SHA, --lock FILE or"
                " --from FILE"
            )
        members.append(FleetMember(spec, target, overrides.source, UNGROUPED, "command line"))
    if not members:
        raise UsageError("no hosts: give -i INVENTORY or one or more TARGETs")
    check_unique(members)
    return members


def load_inventory(path: Path, overrides: Overrides | None = None) -> list[FleetMember]:
    """Parse an inventory file, detecting our YAML, Ansible YAML or Ansible INI."""
    overrides = overrides or Overrides()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"inventory {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"inventory {path}: cannot read: {exc}") from None
    if path.suffix.lower() in (".ini", ".cfg") or looks_like_ini(text):
        return AnsibleIni(path, text, overrides).members()
    root = compose(path, text)
    if root is None:
        raise UsageError(f"inventory {path}: the file is empty")
    if not isinstance(root, yaml_module().MappingNode):
        raise UsageError(f"{where_in(path, root)}: an inventory must be a mapping at the top level")
    if is_ours(root):
        return OurYaml(path, overrides).members(root)
    return AnsibleYaml(path, overrides).members(root)
