"""Our YAML inventory format (see the package docstring for an example)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_provision.errors import UsageError
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
from dflash_provision.source.authority import (
    SOURCE_KINDS,
    SourceConflict,
    SourceSpec,
    check_one_source,
)


@dataclass(frozen=True)
class _Settings:
    user: str | None = None
    port: int | None = None
    path: str | None = None
    container: str | None = None
    source: SourceSpec = field(default_factory=SourceSpec)
    where: str = ""  # where the drafter / path was set, for "missing" messages

    def over(self, other: _Settings) -> _Settings:
        """``self`` with every field ``other`` sets replaced by other's value."""
        return _Settings(
            user=other.user or self.user,
            port=other.port or self.port,
            path=other.path or self.path,
            container=other.container or self.container,
            source=merge_source(self.source, other.source),
            where=other.where or self.where,
        )


class OurYaml:
    _SETTING_KEYS = frozenset({"user", "port", "path", "drafter", "container"})

    def __init__(self, path: Path, overrides: Overrides) -> None:
        self.path = path
        self.overrides = overrides
        self.yaml = yaml_module()

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
                        f"{where_in(self.path, group_node)}: groups.{group_name}: missing 'hosts'"
                    )
                members.extend(
                    self._hosts(fields["hosts"], f"groups.{group_name}.hosts", group_name, settings)
                )
        if "hosts" in top:
            members.extend(self._hosts(top["hosts"], "hosts", UNGROUPED, defaults))
        if not members:
            raise UsageError(f"{where_in(self.path, root)}: the inventory lists no hosts")
        return members

    def _hosts(
        self, node: Any, field_name: str, group: str, settings: _Settings
    ) -> list[FleetMember]:
        if not isinstance(node, self.yaml.SequenceNode):
            raise UsageError(f"{where_in(self.path, node)}: {field_name}: expected a list of hosts")
        members = []
        for index, item in enumerate(node.value):
            where = where_in(self.path, item)
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
        source = merge_source(settings.source, self.overrides.source)
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
        container = parse_container(settings.container, where) if settings.container else None
        target = build_target(address, settings.user, settings.port, container, path, where)
        return FleetMember(name, target, source, group, where)

    def _settings(self, node: Any, label: str, allowed: frozenset[str]) -> _Settings:
        fields = self._mapping(node, label, allowed)
        port = None
        if "port" in fields:
            port_text = self._str(fields["port"], f"{label}.port")
            if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
                raise UsageError(
                    f"{where_in(self.path, fields['port'])}: {label}.port: expected 1..65535,"
                    f" got {port_text!r}"
                )
            port = int(port_text)
        path = self._str(fields["path"], f"{label}.path") if "path" in fields else None
        if path is not None and not path.startswith("/"):
            raise UsageError(
                f"{where_in(self.path, fields['path'])}: {label}.path: must be absolute,"
                f" got {path!r}"
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
            else SourceSpec(),
            where=where_in(self.path, node),
        )

    def _drafter(self, node: Any, label: str) -> SourceSpec:
        fields = self._mapping(node, label, frozenset({"repo", "revision", "lock", "from"}))
        where = where_in(self.path, node)
        try:
            check_one_source(fields.get("repo"), fields.get("lock"), fields.get("from"))
            given = [kind for kind in SOURCE_KINDS if kind in fields]
        except SourceConflict as exc:
            given = list(exc.given)
        if len(given) != 1:  # none is an error here too: a 'drafter' mapping must name one
            raise UsageError(
                f"{where}: {label}: give exactly one of repo (+ revision), lock, from;"
                f" got {', '.join(given) or 'none'}"
            )
        values = {k: self._str(v, f"{label}.{k}") for k, v in fields.items()}
        if "revision" in values and "repo" not in values:
            raise UsageError(f"{where}: {label}.revision: only meaningful with 'repo'")
        return inventory_source(
            values.get("repo"),
            values.get("revision"),
            resolve_file(self.path, values.get("lock")),
            resolve_file(self.path, values.get("from")),
            where=where,
            repo_field=f"{label}.repo",
        )

    def _mapping(self, node: Any, label: str, allowed: frozenset[str] | None) -> dict[str, Any]:
        if not isinstance(node, self.yaml.MappingNode):
            raise UsageError(f"{where_in(self.path, node)}: {label}: expected a mapping")
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = self._str(key_node, f"{label} key")
            if allowed is not None and key not in allowed:
                raise UsageError(
                    f"{where_in(self.path, key_node)}: {label}.{key}: unknown field"
                    f" (expected one of: {', '.join(sorted(allowed))})"
                )
            if key in result:
                raise UsageError(f"{where_in(self.path, key_node)}: {label}.{key}: given twice")
            result[key] = value_node
        return result

    def _str(self, node: Any, label: str) -> str:
        if not isinstance(node, self.yaml.ScalarNode) or node.tag == "tag:yaml.org,2002:null":
            raise UsageError(f"{where_in(self.path, node)}: {label}: expected a value")
        value = str(node.value).strip()
        if not value:
            raise UsageError(f"{where_in(self.path, node)}: {label}: empty value")
        return value
