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
               container: pct:101                    # lxc:NAME, pct:VMID, incus:NAME, lxd:NAME
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
   groups win, then host vars). INI host patterns like ``gpu[01:64]`` expand.

3. Plain TARGETs on the command line (``root@h1:/root/models/X``, see dflash_provision.target).

Command-line ``--repo/--revision/--lock/--from`` and ``--path`` override what an inventory says
(like Ansible's extra vars), and are required for plain TARGETs.

Errors in an inventory are UsageErrors that name the file, the line and the field.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dflash_provision.errors import UsageError
from dflash_provision.target import ContainerRef, Target, parse_target

UNGROUPED = "ungrouped"


@dataclass(frozen=True)
class DrafterSpec:
    """Where the authoritative config comes from: one of repo(+revision), lock, from_file."""

    repo: str | None = None
    revision: str | None = None
    lock: str | None = None
    from_file: str | None = None

    @property
    def is_set(self) -> bool:
        return bool(self.repo or self.lock or self.from_file)

    def describe(self) -> str:
        if self.lock:
            return f"lock {self.lock}"
        if self.from_file:
            return f"file {self.from_file}"
        if self.repo:
            return f"{self.repo}@{self.revision}" if self.revision else self.repo
        return "(none)"


@dataclass(frozen=True)
class FleetMember:
    """One host (and path) a fleet command works on."""

    name: str  # inventory name, unique in the fleet: report rows and history use it
    target: Target
    source: DrafterSpec
    group: str = UNGROUPED
    origin: str = ""  # "fleet.yaml:12" or "command line", for messages


@dataclass(frozen=True)
class Overrides:
    """Command-line settings that beat (or complete) the inventory's."""

    source: DrafterSpec = field(default_factory=DrafterSpec)
    path: str | None = None


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
            target = _with_path(target, overrides.path, "command line", "--path")
        if not overrides.source.is_set:
            raise UsageError(
                f"target {spec}: no drafter source; give --repo R --revision SHA, --lock FILE or"
                " --from FILE"
            )
        members.append(FleetMember(spec, target, overrides.source, UNGROUPED, "command line"))
    if not members:
        raise UsageError("no hosts: give -i INVENTORY or one or more TARGETs")
    _check_unique(members)
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
    if path.suffix.lower() in (".ini", ".cfg") or _looks_like_ini(text):
        return _AnsibleIni(path, text, overrides).members()
    root = _compose(path, text)
    if root is None:
        raise UsageError(f"inventory {path}: the file is empty")
    if not isinstance(root, _yaml().MappingNode):
        raise UsageError(f"{_where(path, root)}: an inventory must be a mapping at the top level")
    if _is_ours(root):
        return _OurYaml(path, overrides).members(root)
    return _AnsibleYaml(path, overrides).members(root)


# -- shared helpers ------------------------------------------------------------------------------


def _yaml() -> Any:
    import yaml  # deferred: keeps `--help` fast

    return yaml


def _compose(path: Path, text: str) -> Any:
    yaml = _yaml()
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise UsageError(f"inventory {path}{line}: not valid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"inventory {path}: not valid YAML: {exc}") from None


def _looks_like_ini(text: str) -> bool:
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";")):
            continue
        # "[group]" opens an INI section; YAML flow sequences never end a line like "[x:vars]".
        if re.fullmatch(r"\[[^\[\]]+\]", stripped):
            return True
        # "h1 ansible_host=..." is a plain scalar to YAML, never a mapping.
        return ":" not in stripped.split("=", 1)[0] and not stripped.startswith("-")
    return False


def _is_ours(root: Any) -> bool:
    yaml = _yaml()
    keys = {k.value: v for k, v in root.value if isinstance(k, yaml.ScalarNode)}
    if "groups" in keys or "defaults" in keys:
        return True
    hosts = keys.get("hosts")
    return isinstance(hosts, yaml.SequenceNode)


def _where(path: Path, node: Any) -> str:
    return f"{path}:{node.start_mark.line + 1}"


def _check_unique(members: Sequence[FleetMember]) -> None:
    seen: dict[str, FleetMember] = {}
    for member in members:
        first = seen.get(member.name)
        if first is not None:
            raise UsageError(
                f"{member.origin}: host name {member.name!r} is used twice"
                f" (first at {first.origin}); give one of them a distinct name"
            )
        seen[member.name] = member


def _with_path(target: Target, path: str, where: str, field_name: str) -> Target:
    if not path.startswith("/"):
        raise UsageError(f"{where}: {field_name}: the path must be absolute, got {path!r}")
    return _build_target(target.host, target.user, target.port, target.container, path, where)


def _build_target(
    host: str | None,
    user: str | None,
    port: int | None,
    container: ContainerRef | None,
    path: str,
    where: str,
) -> Target:
    """Assemble a Target and run it through parse_target so every field obeys one grammar."""
    draft = Target("", host, user, port, container, path)
    try:
        parsed = parse_target(draft.display())
    except UsageError as exc:
        raise UsageError(f"{where}: {exc.message}") from None
    return replace(parsed, raw=parsed.display())


def _parse_container(text: str, where: str) -> ContainerRef:
    kind, sep, name = text.partition(":")
    if not sep:
        raise UsageError(
            f"{where}: container: expected KIND:NAME (lxc, pct, incus, lxd), got {text!r}"
        )
    try:
        parsed = parse_target(f"{kind}:{name}:/x")
    except UsageError as exc:
        raise UsageError(f"{where}: container: {exc.message}") from None
    if parsed.container is None:  # "lxc:/x" style would be a host called lxc
        raise UsageError(f"{where}: container: expected KIND:NAME, got {text!r}")
    return parsed.container


def _merge_source(base: DrafterSpec, override: DrafterSpec) -> DrafterSpec:
    return override if override.is_set else base


def _resolve_file(base: Path, value: str | None) -> str | None:
    if value is None:
        return None
    candidate = Path(value).expanduser()
    if not candidate.is_absolute():
        candidate = base.parent / candidate
    return str(candidate)


# -- our YAML format -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Settings:
    user: str | None = None
    port: int | None = None
    path: str | None = None
    container: str | None = None
    source: DrafterSpec = field(default_factory=DrafterSpec)
    where: str = ""  # where the drafter / path was set, for "missing" messages

    def over(self, other: _Settings) -> _Settings:
        """``self`` with every field ``other`` sets replaced by other's value."""
        return _Settings(
            user=other.user or self.user,
            port=other.port or self.port,
            path=other.path or self.path,
            container=other.container or self.container,
            source=_merge_source(self.source, other.source),
            where=other.where or self.where,
        )


class _OurYaml:
    _SETTING_KEYS = frozenset({"user", "port", "path", "drafter", "container"})

    def __init__(self, path: Path, overrides: Overrides) -> None:
        self.path = path
        self.overrides = overrides
        self.yaml = _yaml()

    def members(self, root: Any) -> list[FleetMember]:
        top = self._mapping(
            root, "top level", frozenset({"defaults", "groups", "hosts", "version"})
        )
        defaults = _Settings()
        if "defaults" in top:
            defaults = self._settings(top["defaults"], "defaults", self._SETTING_KEYS)
        members: list[FleetMember] = []
        if "groups" in top:
            groups = self._mapping(top["groups"], "groups", None)
            for group_name, group_node in groups.items():
                allowed = self._SETTING_KEYS | {"hosts"}
                fields = self._mapping(group_node, f"groups.{group_name}", allowed)
                settings = defaults.over(
                    self._settings(group_node, f"groups.{group_name}", allowed)
                )
                if "hosts" not in fields:
                    raise UsageError(
                        f"{_where(self.path, group_node)}: groups.{group_name}: missing 'hosts'"
                    )
                members.extend(
                    self._hosts(fields["hosts"], f"groups.{group_name}.hosts", group_name, settings)
                )
        if "hosts" in top:
            members.extend(self._hosts(top["hosts"], "hosts", UNGROUPED, defaults))
        if not members:
            raise UsageError(f"{_where(self.path, root)}: the inventory lists no hosts")
        return members

    def _hosts(
        self, node: Any, field_name: str, group: str, settings: _Settings
    ) -> list[FleetMember]:
        if not isinstance(node, self.yaml.SequenceNode):
            raise UsageError(f"{_where(self.path, node)}: {field_name}: expected a list of hosts")
        members = []
        for index, item in enumerate(node.value):
            where = _where(self.path, item)
            label = f"{field_name}[{index}]"
            if isinstance(item, self.yaml.ScalarNode):
                address = self._str(item, label)
                name, host_settings = address, _Settings()
            else:
                allowed = self._SETTING_KEYS | {"name", "address"}
                fields = self._mapping(item, label, allowed)
                if "address" not in fields and "name" not in fields:
                    raise UsageError(f"{where}: {label}: a host needs 'address' (or 'name')")
                address = self._str(fields.get("address") or fields["name"], f"{label}.address")
                name = self._str(fields["name"], f"{label}.name") if "name" in fields else address
                host_settings = self._settings(item, label, allowed)
            members.append(self._member(name, address, group, settings.over(host_settings), where))
        return members

    def _member(
        self, name: str, address: str, group: str, settings: _Settings, where: str
    ) -> FleetMember:
        source = _merge_source(settings.source, self.overrides.source)
        path = self.overrides.path or settings.path
        if not source.is_set:
            raise UsageError(
                f"{where}: host {name!r} has no drafter: set 'drafter' on the host, its group or"
                " 'defaults', or pass --repo/--lock/--from"
            )
        if not path:
            raise UsageError(
                f"{where}: host {name!r} has no path: set 'path' on the host, its group or"
                " 'defaults', or pass --path"
            )
        container = _parse_container(settings.container, where) if settings.container else None
        target = _build_target(address, settings.user, settings.port, container, path, where)
        return FleetMember(name, target, source, group, where)

    def _settings(self, node: Any, label: str, allowed: frozenset[str]) -> _Settings:
        fields = self._mapping(node, label, allowed)
        port = None
        if "port" in fields:
            port_text = self._str(fields["port"], f"{label}.port")
            if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
                raise UsageError(
                    f"{_where(self.path, fields['port'])}: {label}.port: expected 1..65535,"
                    f" got {port_text!r}"
                )
            port = int(port_text)
        path = self._str(fields["path"], f"{label}.path") if "path" in fields else None
        if path is not None and not path.startswith("/"):
            raise UsageError(
                f"{_where(self.path, fields['path'])}: {label}.path: must be absolute, got {path!r}"
            )
        return _Settings(
            user=self._str(fields["user"], f"{label}.user") if "user" in fields else None,
            port=port,
            path=path,
            container=(
                self._str(fields["container"], f"{label}.container")
                if "container" in fields
                else None
            ),
            source=self._drafter(fields["drafter"], f"{label}.drafter")
            if "drafter" in fields
            else DrafterSpec(),
            where=_where(self.path, node),
        )

    def _drafter(self, node: Any, label: str) -> DrafterSpec:
        fields = self._mapping(node, label, frozenset({"repo", "revision", "lock", "from"}))
        given = [k for k in ("repo", "lock", "from") if k in fields]
        where = _where(self.path, node)
        if len(given) != 1:
            raise UsageError(
                f"{where}: {label}: give exactly one of repo (+ revision), lock, from;"
                f" got {', '.join(given) or 'none'}"
            )
        values = {k: self._str(v, f"{label}.{k}") for k, v in fields.items()}
        if "repo" in values and "revision" not in values:
            raise UsageError(
                f"{where}: {label}.revision: missing; pin the repo to a commit sha (or a tag) so"
                " every host is compared with the same file"
            )
        if "revision" in values and "repo" not in values:
            raise UsageError(f"{where}: {label}.revision: only meaningful with 'repo'")
        return DrafterSpec(
            repo=values.get("repo"),
            revision=values.get("revision"),
            lock=_resolve_file(self.path, values.get("lock")),
            from_file=_resolve_file(self.path, values.get("from")),
        )

    def _mapping(self, node: Any, label: str, allowed: frozenset[str] | None) -> dict[str, Any]:
        if not isinstance(node, self.yaml.MappingNode):
            raise UsageError(f"{_where(self.path, node)}: {label}: expected a mapping")
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = self._str(key_node, f"{label} key")
            if allowed is not None and key not in allowed:
                raise UsageError(
                    f"{_where(self.path, key_node)}: {label}.{key}: unknown field"
                    f" (expected one of: {', '.join(sorted(allowed))})"
                )
            if key in result:
                raise UsageError(f"{_where(self.path, key_node)}: {label}.{key}: given twice")
            result[key] = value_node
        return result

    def _str(self, node: Any, label: str) -> str:
        if not isinstance(node, self.yaml.ScalarNode) or node.tag == "tag:yaml.org,2002:null":
            raise UsageError(f"{_where(self.path, node)}: {label}: expected a value")
        value = str(node.value).strip()
        if not value:
            raise UsageError(f"{_where(self.path, node)}: {label}: empty value")
        return value


# -- Ansible inventories -------------------------------------------------------------------------


@dataclass
class _AnsibleGroup:
    name: str
    vars: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (value, where)
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)


@dataclass
class _AnsibleHost:
    name: str
    where: str
    vars: dict[str, tuple[str, str]] = field(default_factory=dict)


_SOURCE_VARS = ("dflash_repo", "dflash_lock", "dflash_from")


class _AnsibleModel:
    """Groups, hosts and vars as Ansible defines them; resolves vars through ``children``."""

    def __init__(self, path: Path, overrides: Overrides) -> None:
        self.path = path
        self.overrides = overrides
        self.groups: dict[str, _AnsibleGroup] = {}
        self.hosts: dict[str, _AnsibleHost] = {}

    def group(self, name: str) -> _AnsibleGroup:
        return self.groups.setdefault(name, _AnsibleGroup(name))

    def add_host(
        self, group: str, name: str, where: str, host_vars: dict[str, tuple[str, str]]
    ) -> None:
        host = self.hosts.setdefault(name, _AnsibleHost(name, where))
        host.vars.update(host_vars)
        if name not in self.group(group).hosts:
            self.group(group).hosts.append(name)

    def _ancestry(self) -> dict[str, tuple[int, list[str]]]:
        """group -> (depth below "all", parents)."""
        parents: dict[str, list[str]] = {name: [] for name in self.groups}
        for group in self.groups.values():
            for child in group.children:
                parents.setdefault(child, []).append(group.name)
        depth: dict[str, int] = {}

        def depth_of(name: str, trail: tuple[str, ...]) -> int:
            if name in depth:
                return depth[name]
            if name in trail:
                raise UsageError(f"inventory {self.path}: group {name!r} is its own ancestor")
            ups = [p for p in parents.get(name, []) if p != "all"]
            value = 1 + max((depth_of(p, (*trail, name)) for p in ups), default=0)
            depth[name] = value
            return value

        for name in list(parents):
            if name != "all":
                depth_of(name, ())
        depth["all"] = 0
        return {name: (depth[name], parents.get(name, [])) for name in depth}

    def members(self) -> list[FleetMember]:
        ancestry = self._ancestry()
        members = []
        for host in self.hosts.values():
            direct = [g.name for g in self.groups.values() if host.name in g.hosts]
            every: set[str] = {"all"}
            stack = list(direct)
            while stack:
                name = stack.pop()
                if name in every:
                    continue
                every.add(name)
                stack.extend(ancestry.get(name, (0, []))[1])
            # Ansible's precedence: all < shallower groups < deeper groups (ties by name) < host.
            ordered = sorted(every, key=lambda g: (ancestry.get(g, (0, []))[0], g))
            merged: dict[str, tuple[str, str]] = {}
            for level in [self.groups[g].vars for g in ordered if g in self.groups] + [host.vars]:
                # The drafter source is one setting spread over three vars: a level that names
                # a source replaces the inherited one rather than adding a second.
                if any(k in level for k in _SOURCE_VARS):
                    for key in (*_SOURCE_VARS, "dflash_revision"):
                        merged.pop(key, None)
                merged.update(level)
            named = [g for g in direct if g not in ("all", UNGROUPED)]
            group = (
                max(named, key=lambda g: (ancestry.get(g, (0, []))[0], g)) if named else UNGROUPED
            )
            members.append(self._member(host, merged, group))
        if not members:
            raise UsageError(f"inventory {self.path}: the inventory lists no hosts")
        return members

    def _member(
        self, host: _AnsibleHost, merged: dict[str, tuple[str, str]], group: str
    ) -> FleetMember:
        def get(key: str) -> str | None:
            item = merged.get(key)
            return item[0] if item else None

        def where(key: str) -> str:
            item = merged.get(key)
            return item[1] if item else host.where

        port: int | None = None
        port_text = get("ansible_port") or get("ansible_ssh_port")
        if port_text is not None:
            if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
                raise UsageError(
                    f"{where('ansible_port')}: ansible_port: expected 1..65535, got {port_text!r}"
                )
            port = int(port_text)
        repo, revision = get("dflash_repo"), get("dflash_revision")
        lock, from_file = get("dflash_lock"), get("dflash_from")
        given = [
            k
            for k, v in (("dflash_repo", repo), ("dflash_lock", lock), ("dflash_from", from_file))
            if v
        ]
        if len(given) > 1:
            raise UsageError(
                f"{where(given[1])}: host {host.name!r}: {' and '.join(given)} both set;"
                " give exactly one drafter source"
            )
        if repo and not revision and not self.overrides.source.is_set:
            raise UsageError(
                f"{where('dflash_repo')}: dflash_revision: missing for host {host.name!r};"
                " pin dflash_repo to a commit sha"
            )
        source = DrafterSpec(
            repo=repo,
            revision=revision if repo else None,
            lock=_resolve_file(self.path, lock),
            from_file=_resolve_file(self.path, from_file),
        )
        source = _merge_source(source, self.overrides.source)
        if not source.is_set:
            raise UsageError(
                f"{host.where}: host {host.name!r} has no drafter: set dflash_repo +"
                " dflash_revision, dflash_lock or dflash_from, or pass --repo/--lock/--from"
            )
        path = self.overrides.path or get("dflash_path")
        if not path:
            raise UsageError(
                f"{host.where}: host {host.name!r} has no dflash_path (the model directory on the"
                " host); set it as a host or group var, or pass --path"
            )
        if not path.startswith("/"):
            raise UsageError(f"{where('dflash_path')}: dflash_path: must be absolute, got {path!r}")
        container_text = get("dflash_container")
        container = (
            _parse_container(container_text, where("dflash_container")) if container_text else None
        )
        address = get("ansible_host") or get("ansible_ssh_host") or host.name
        user = get("ansible_user") or get("ansible_ssh_user")
        target = _build_target(address, user, port, container, path, host.where)
        return FleetMember(host.name, target, source, group, host.where)


class _AnsibleYaml:
    def __init__(self, path: Path, overrides: Overrides) -> None:
        self.path = path
        self.model = _AnsibleModel(path, overrides)
        self.yaml = _yaml()

    def members(self, root: Any) -> list[FleetMember]:
        for key_node, value_node in root.value:
            self._group(self._key(key_node), value_node)
        return self.model.members()

    def _group(self, name: str, node: Any) -> None:
        group = self.model.group(name)
        if self._is_null(node):
            return
        if not isinstance(node, self.yaml.MappingNode):
            raise UsageError(f"{_where(self.path, node)}: {name}: expected a group (a mapping)")
        for key_node, value_node in node.value:
            key = self._key(key_node)
            if key == "hosts":
                for host_name, host_vars in self._pairs(value_node, f"{name}.hosts"):
                    self.model.add_host(
                        name, host_name, _where(self.path, host_vars[0]), host_vars[1]
                    )
            elif key == "vars":
                for var, (node_, value) in self._vars(value_node, f"{name}.vars").items():
                    group.vars[var] = (value, _where(self.path, node_))
            elif key == "children":
                for child_name, child_node in self._raw_pairs(value_node, f"{name}.children"):
                    if child_name not in group.children:
                        group.children.append(child_name)
                    self._group(child_name, child_node)
            else:
                raise UsageError(
                    f"{_where(self.path, key_node)}: {name}.{key}: unknown key in an Ansible"
                    " group (expected hosts, vars, children)"
                )

    def _pairs(
        self, node: Any, label: str
    ) -> list[tuple[str, tuple[Any, dict[str, tuple[str, str]]]]]:
        pairs = []
        for host_name, host_node in self._raw_pairs(node, label):
            host_vars: dict[str, tuple[str, str]] = {}
            if not self._is_null(host_node):
                for var, (node_, value) in self._vars(host_node, f"{label}.{host_name}").items():
                    host_vars[var] = (value, _where(self.path, node_))
            pairs.append((host_name, (host_node, host_vars)))
        return pairs

    def _raw_pairs(self, node: Any, label: str) -> list[tuple[str, Any]]:
        if self._is_null(node):
            return []
        if not isinstance(node, self.yaml.MappingNode):
            raise UsageError(f"{_where(self.path, node)}: {label}: expected a mapping")
        return [(self._key(k), v) for k, v in node.value]

    def _vars(self, node: Any, label: str) -> dict[str, tuple[Any, str]]:
        result: dict[str, tuple[Any, str]] = {}
        for key, value_node in self._raw_pairs(node, label):
            if isinstance(value_node, self.yaml.ScalarNode) and not self._is_null(value_node):
                result[key] = (value_node, str(value_node.value))
            elif key.startswith(("ansible_", "dflash_")):
                raise UsageError(
                    f"{_where(self.path, value_node)}: {label}.{key}: expected a value"
                )
            # Other vars (lists, dicts) belong to the playbooks: not ours to judge.
        return result

    def _key(self, node: Any) -> str:
        if not isinstance(node, self.yaml.ScalarNode):
            raise UsageError(f"{_where(self.path, node)}: expected a name")
        return str(node.value)

    def _is_null(self, node: Any) -> bool:
        return isinstance(node, self.yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"


class _AnsibleIni:
    _SECTION = re.compile(r"\[([^\[\]:]+)(?::(vars|children))?\]")
    _RANGE = re.compile(r"\[([0-9]+|[a-z]):([0-9]+|[a-z])\]")

    def __init__(self, path: Path, text: str, overrides: Overrides) -> None:
        self.path = path
        self.text = text
        self.model = _AnsibleModel(path, overrides)

    def members(self) -> list[FleetMember]:
        group, kind = UNGROUPED, "hosts"
        for number, raw in enumerate(self.text.splitlines(), start=1):
            where = f"{self.path}:{number}"
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("["):
                match = self._SECTION.fullmatch(line)
                if match is None:
                    raise UsageError(
                        f"{where}: bad section header {line!r}"
                        " (expected [group], [group:vars] or [group:children])"
                    )
                group, kind = match.group(1).strip(), match.group(2) or "hosts"
                self.model.group(group)
                continue
            try:
                words = shlex.split(line, comments=True)
            except ValueError as exc:
                raise UsageError(f"{where}: cannot split {line!r}: {exc}") from None
            if not words:
                continue
            if kind == "vars":
                key, sep, value = line.partition("=")
                if not sep or not key.strip():
                    raise UsageError(f"{where}: [{group}:vars]: expected key=value, got {line!r}")
                self.model.group(group).vars[key.strip()] = (_unquote(value.strip()), where)
            elif kind == "children":
                if len(words) != 1:
                    raise UsageError(
                        f"{where}: [{group}:children]: expected one group name per line"
                    )
                if words[0] not in self.model.group(group).children:
                    self.model.group(group).children.append(words[0])
                self.model.group(words[0])
            else:
                host_vars: dict[str, tuple[str, str]] = {}
                for word in words[1:]:
                    key, sep, value = word.partition("=")
                    if not sep or not key:
                        raise UsageError(
                            f"{where}: host {words[0]}: expected key=value, got {word!r}"
                        )
                    host_vars[key] = (value, where)
                for name in self._expand(words[0], where):
                    self.model.add_host(group, name, where, host_vars)
        return self.model.members()

    def _expand(self, pattern: str, where: str) -> list[str]:
        match = self._RANGE.search(pattern)
        if match is None:
            return [pattern]
        start, end = match.group(1), match.group(2)
        head, tail = pattern[: match.start()], pattern[match.end() :]
        if start.isdigit() != end.isdigit():
            raise UsageError(f"{where}: host range {pattern!r}: mixes letters and digits")
        if start.isdigit():
            width = len(start) if start.startswith("0") else 0
            values = [str(i).zfill(width) for i in range(int(start), int(end) + 1)]
        else:
            values = [chr(c) for c in range(ord(start), ord(end) + 1)]
        if not values:
            raise UsageError(f"{where}: host range {pattern!r} is empty")
        return [name for v in values for name in self._expand(head + v + tail, where)]


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value
