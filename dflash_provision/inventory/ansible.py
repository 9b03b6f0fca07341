"""Existing Ansible inventories, YAML and INI, read without Ansible."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_provision.errors import UsageError
from dflash_provision.inventory.ansible_ssh import host_route
from dflash_provision.inventory.common import (
    build_target,
    inventory_source,
    merge_source,
    parse_container,
    resolve_file,
    where_in,
    yaml_module,
)
from dflash_provision.inventory.model import UNGROUPED, FleetMember, Overrides
from dflash_provision.source.authority import SourceConflict, check_one_source


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
# ansible_connection values we can honour: SSH by any of its names, or this machine.
_CONNECTIONS = frozenset({"ssh", "paramiko", "paramiko_ssh", "smart", "local"})
# Ansible's booleans, as YAML and INI inventories spell them.
_TRUE = frozenset({"true", "yes", "on", "1", "y", "t"})
_FALSE = frozenset({"false", "no", "off", "0", "n", "f"})


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
            members.append(self._member(host, merged, group, tuple(sorted(every))))
        if not members:
            raise UsageError(f"inventory {self.path}: the inventory lists no hosts")
        return members

    def _member(
        self,
        host: _AnsibleHost,
        merged: dict[str, tuple[str, str]],
        group: str,
        groups: tuple[str, ...],
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
        # An empty var (``dflash_lock=``) names nothing, as if it were not set.
        repo, revision = get("dflash_repo") or None, get("dflash_revision")
        lock, from_file = get("dflash_lock") or None, get("dflash_from") or None
        try:
            check_one_source(repo, lock, from_file)
        except SourceConflict as exc:
            given = [f"dflash_{kind}" for kind in exc.given]
            raise UsageError(
                f"{where(given[1])}: host {host.name!r}: {' and '.join(given)} both set;"
                " give exactly one drafter source"
            ) from None
        source = inventory_source(
            repo,
            revision if repo else None,
            resolve_file(self.path, lock),
            resolve_file(self.path, from_file),
            where=where("dflash_repo"),
            repo_field="dflash_repo",
        )
        source = merge_source(source, self.overrides.source)
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
            parse_container(container_text, where("dflash_container")) if container_text else None
        )
        connection = (get("ansible_connection") or "ssh").removeprefix("ansible.builtin.")
        if connection not in _CONNECTIONS:
            raise UsageError(
                f"{where('ansible_connection')}: ansible_connection: {connection!r} is not"
                f" supported (one of {', '.join(sorted(_CONNECTIONS))}; containers are"
                " dflash_container)"
            )
        become = _become(get, where)
        if connection == "local":  # this machine, no SSH (often "localhost" in inventories)
            target = build_target(None, None, None, container, path, host.where)
            return FleetMember(host.name, target, source, group, host.where, None, groups, become)
        address = get("ansible_host") or get("ansible_ssh_host") or host.name
        user = get("ansible_user") or get("ansible_ssh_user")
        target = build_target(address, user, port, container, path, host.where)
        route = host_route(get, where)
        return FleetMember(host.name, target, source, group, host.where, route, groups, become)


def _become(get: Callable[[str], str | None], where: Callable[[str], str]) -> bool:
    """``ansible_become``: whether this host's commands go through ``sudo -n`` (to root)."""
    text = get("ansible_become")
    if text is None:
        return False
    value = text.strip().lower()
    if value not in _TRUE | _FALSE:
        raise UsageError(f"{where('ansible_become')}: ansible_become: expected true or false")
    if value in _FALSE:
        return False
    method = (get("ansible_become_method") or "sudo").removeprefix("ansible.builtin.")
    if method != "sudo":
        raise UsageError(
            f"{where('ansible_become_method')}: ansible_become_method: only sudo is supported,"
            f" got {method!r}"
        )
    user = get("ansible_become_user") or "root"
    if user != "root":
        raise UsageError(
            f"{where('ansible_become_user')}: ansible_become_user: only root is supported,"
            f" got {user!r}"
        )
    return True


class AnsibleYaml:
    def __init__(self, path: Path, overrides: Overrides) -> None:
        self.path = path
        self.model = _AnsibleModel(path, overrides)
        self.yaml = yaml_module()

    def members(self, root: Any) -> list[FleetMember]:
        for key_node, value_node in root.value:
            self._group(self._key(key_node), value_node)
        return self.model.members()

    def _group(self, name: str, node: Any) -> None:
        group = self.model.group(name)
        if self._is_null(node):
            return
        if not isinstance(node, self.yaml.MappingNode):
            raise UsageError(f"{where_in(self.path, node)}: {name}: expected a group (a mapping)")
        for key_node, value_node in node.value:
            key = self._key(key_node)
            if key == "hosts":
                for host_name, host_vars in self._pairs(value_node, f"{name}.hosts"):
                    self.model.add_host(
                        name, host_name, where_in(self.path, host_vars[0]), host_vars[1]
                    )
            elif key == "vars":
                for var, (node_, value) in self._vars(value_node, f"{name}.vars").items():
                    group.vars[var] = (value, where_in(self.path, node_))
            elif key == "children":
                for child_name, child_node in self._raw_pairs(value_node, f"{name}.children"):
                    if child_name not in group.children:
                        group.children.append(child_name)
                    self._group(child_name, child_node)
            else:
                raise UsageError(
                    f"{where_in(self.path, key_node)}: {name}.{key}: unknown key in an Ansible"
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
                    host_vars[var] = (value, where_in(self.path, node_))
            pairs.append((host_name, (host_node, host_vars)))
        return pairs

    def _raw_pairs(self, node: Any, label: str) -> list[tuple[str, Any]]:
        if self._is_null(node):
            return []
        if not isinstance(node, self.yaml.MappingNode):
            raise UsageError(f"{where_in(self.path, node)}: {label}: expected a mapping")
        return [(self._key(k), v) for k, v in node.value]

    def _vars(self, node: Any, label: str) -> dict[str, tuple[Any, str]]:
        result: dict[str, tuple[Any, str]] = {}
        for key, value_node in self._raw_pairs(node, label):
            if isinstance(value_node, self.yaml.ScalarNode) and not self._is_null(value_node):
                result[key] = (value_node, str(value_node.value))
            elif key.startswith(("ansible_", "dflash_")):
                raise UsageError(
                    f"{where_in(self.path, value_node)}: {label}.{key}: expected a value"
                )
            # Other vars (lists, dicts) belong to the playbooks: not ours to judge.
        return result

    def _key(self, node: Any) -> str:
        if not isinstance(node, self.yaml.ScalarNode):
            raise UsageError(f"{where_in(self.path, node)}: expected a name")
        return str(node.value)

    def _is_null(self, node: Any) -> bool:
        return isinstance(node, self.yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"


class AnsibleIni:
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
