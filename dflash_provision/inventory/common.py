"""Helpers shared by the inventory formats: YAML nodes, line numbers, targets, files."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dflash_provision.errors import UsageError
from dflash_provision.inventory.model import FleetMember
from dflash_provision.source.authority import RepoRef, SourceSpec
from dflash_provision.target import ContainerRef, Target, make_target, parse_container_ref


def yaml_module() -> Any:
    import yaml  # deferred: keeps `--help` fast

    return yaml


def compose(path: Path, text: str) -> Any:
    yaml = yaml_module()
    try:
        # libyaml when present: the pure-Python composer costs ~1.5 ms per host of inventory.
        return yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise UsageError(f"inventory {path}{line}: not valid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"inventory {path}: not valid YAML: {exc}") from None


def looks_like_ini(text: str) -> bool:
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


def is_ours(root: Any) -> bool:
    yaml = yaml_module()
    keys = {k.value: v for k, v in root.value if isinstance(k, yaml.ScalarNode)}
    if "groups" in keys or "defaults" in keys:
        return True
    hosts = keys.get("hosts")
    return isinstance(hosts, yaml.SequenceNode)


def where_in(path: Path, node: Any) -> str:
    return f"{path}:{node.start_mark.line + 1}"


def check_unique(members: Sequence[FleetMember]) -> None:
    seen: dict[str, FleetMember] = {}
    for member in members:
        first = seen.get(member.name)
        if first is not None:
            raise UsageError(
                f"{member.origin}: host name {member.name!r} is used twice"
                f" (first at {first.origin}); give one of them a distinct name"
            )
        seen[member.name] = member


def with_path(target: Target, path: str, where: str, field_name: str) -> Target:
    if not path.startswith("/"):
        raise UsageError(f"{where}: {field_name}: the path must be absolute, got {path!r}")
    return build_target(target.host, target.user, target.port, target.container, path, where)


def build_target(
    host: str | None,
    user: str | None,
    port: int | None,
    container: ContainerRef | None,
    path: str,
    where: str,
) -> Target:
    """A Target from an inventory's fields, checked field by field as a target spec would be."""
    try:
        return make_target(host, user, port, container, path)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc.message}") from None


def parse_container(text: str, where: str) -> ContainerRef:
    try:
        return parse_container_ref(text)
    except UsageError as exc:
        raise UsageError(f"{where}: container: {exc.message}") from None


def merge_source(base: SourceSpec, override: SourceSpec) -> SourceSpec:
    return override if override.is_set else base


def inventory_source(
    repo: str | None,
    revision: str | None,
    lock: str | None,
    from_file: str | None,
    *,
    where: str,
    repo_field: str,
) -> SourceSpec:
    """The drafter source an inventory names (``lock`` / ``from`` already resolved against the
    inventory's directory); ``revision`` pins ``repo`` and beats an ``@rev`` in the id."""
    ref = None
    if repo is not None:
        ref = RepoRef.parse(repo)
        if ref is None:
            raise UsageError(f"{where}: {repo_field}: expected OWNER/NAME, got {repo!r}")
    return SourceSpec(repo=ref.at(revision) if ref else None, lock=lock, from_file=from_file)


def resolve_file(base: Path, value: str | None) -> str | None:
    if value is None:
        return None
    candidate = Path(value).expanduser()
    if not candidate.is_absolute():
        candidate = base.parent / candidate
    return str(candidate)
