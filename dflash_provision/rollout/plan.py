"""A rollout before it runs: its record made from the hosts and options (each host's identity
saved, one host under two names refused), the serial dry run, the members found again for
``--resume`` / ``--abort`` (checked against the record), and the connection flags the printed
commands repeat."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import DflashProvisionError
from dflash_provision.rollout import host_ops
from dflash_provision.rollout.batches import split
from dflash_provision.rollout.identity import (
    HostMismatch,
    Identity,
    differences,
    of_member,
    refuse_same_place,
)
from dflash_provision.rollout.record import Gate, HostState, Rollout
from dflash_provision.rollout.store import RolloutStore

if TYPE_CHECKING:
    from dflash_provision.fleet import FleetRun
    from dflash_provision.inventory import FleetMember
    from dflash_provision.server.container_server import ContainerOption
    from dflash_provision.source.authority import Authority
    from dflash_provision.transport.options import SshOptions

# Connection options and whether they take a value: the printed --resume/--abort commands
# repeat them (not the env values: those are never stored).
_CONNECTION_FLAGS = {
    "--connect-timeout": True, "--command-timeout": True, "--ssh-config": True, "-F": True,
    "--known-hosts": True, "--identity": True, "--private-key": True, "--lxc-path": True,
    "--no-agent": False, "--sudo": False, "--accept-new-host-key": False, "--docker-host": True,
}  # fmt: skip


def connection_args(argv: Sequence[str]) -> list[str]:
    """The connection flags of a command line (``sys.argv[1:]``), as given, for the printed
    ``--resume`` / ``--abort`` commands."""
    kept: list[str] = []
    it = iter(argv)
    for arg in it:
        name = arg.split("=", 1)[0]
        if name in _CONNECTION_FLAGS:
            kept.append(arg)
            if _CONNECTION_FLAGS[name] and "=" not in arg:
                kept.append(next(it, ""))
    return kept


def identities(members: Sequence[FleetMember], ssh: SshOptions) -> list[Identity]:
    """Where each member leads (no connection); HostMismatch when two are one host's file."""
    found = [of_member(m, ssh) for m in members]
    refuse_same_place([(m.name, i) for m, i in zip(members, found, strict=True)])
    return found


@dataclass
class Settings:
    """What the options say about a new rollout (besides its hosts and config)."""

    id: str
    created_at: str
    batches: list[str]
    gate: Gate
    rollback_all: bool
    selection: dict[str, Any]  # how --resume finds the hosts again (inventory, --limit...)
    connection_args: list[str] = field(default_factory=list)
    rehash_files: bool = False
    server_container: str | None = None  # --container: every host's server runs in it


def new_rollout(
    members: Sequence[FleetMember], new: Authority, settings: Settings, ssh: SshOptions
) -> Rollout:
    """The record of a new rollout: every host with the place its name leads to now."""
    served = {"container": settings.server_container} if settings.server_container else None
    hosts = [
        HostState(
            m.name,
            m.target.display(),
            m.target.config_path,
            identity=i.to_dict(),
            server_container=dict(served) if served else None,
        )
        for m, i in zip(members, identities(members, ssh), strict=True)
    ]
    return Rollout(
        id=settings.id,
        created_at=settings.created_at,
        source=new.label,
        new_config=new.data.decode("utf-8"),
        new_sha256=new.sha256,
        batches=settings.batches,
        gate=settings.gate,
        hosts=hosts,
        rollback_all=settings.rollback_all,
        check={"min_acceptance": settings.gate.min_acceptance, "selection": settings.selection},
        connection_args=settings.connection_args,
        pinned_files=[p.to_dict() for p in new.pinned_files],
        rehash_files=settings.rehash_files,
    )


def members_again(rollout: Rollout, members: Sequence[FleetMember], ssh: SshOptions) -> list[Any]:
    """The members of ``rollout``'s hosts in today's inventory, each checked against what the
    record saved; HostMismatch (nothing done) naming every host that is missing or leads
    elsewhere now. Hosts left out of the rollout (excluded) are not needed once it wrote."""
    by_name = {m.name: m for m in members}
    wrote = rollout.batch > 0
    problems: list[str] = []
    found: list[FleetMember] = []
    for host in rollout.hosts:
        member = by_name.get(host.name)
        if member is None:
            if not (wrote and host.phase == "excluded"):
                problems.append(f"{host.name} is no longer in the inventory{_was(host)}")
            continue
        changed = _changed(host, member, ssh)
        if changed:
            problems.append(f"{host.name} leads elsewhere now ({changed})")
            continue
        found.append(member)
    if problems:
        raise HostMismatch(
            f"rollout {rollout.id}: refused, nothing was done: {'; '.join(problems)}; the "
            "record keeps the hosts the rollout began with: put those entries back as they were"
        )
    return found


def _was(host: HostState) -> str:
    where = Identity.from_dict(host.identity).show() if host.identity else host.target
    return f" (the rollout began with it as {where})"


def _changed(host: HostState, member: FleetMember, ssh: SshOptions) -> str:
    if host.identity is None:  # a record from before identities: its TARGET and path
        now = (member.target.display(), member.target.config_path)
        return "" if now == (host.target, host.path) else f"{host.target} → {now[0]}"
    try:
        today = of_member(member, ssh)
    except DflashProvisionError as exc:
        return exc.message
    return ", ".join(differences(Identity.from_dict(host.identity), today))


@dataclass
class DryRun:
    """The plan: the hosts whose pre-flight passed, in their batches, and the ones that failed."""

    batches: list[list[HostState]]
    failed: list[tuple[str, str]]  # (name, why)

    @property
    def ok(self) -> bool:
        return not self.failed


def dry_run(
    members: Sequence[FleetMember],
    new: Authority,
    run: FleetRun,
    env: dict[str, str],
    batches: Sequence[str],
    *,
    rehash_files: bool = False,
    container: ContainerOption | None = None,
) -> DryRun:
    """Pre-flight of every host, one after the other (reads only: writes nothing, restarts
    nothing, records nothing), cut into the batches the rollout would run."""
    identities(members, run.connector.ssh)
    lookup = _kept_configs()
    good: list[HostState] = []
    failed: list[tuple[str, str]] = []
    for member in members:
        try:
            with run.open(member) as transport:
                host, _ = host_ops.inspect(
                    transport, member, new, env, transport.command_timeout, lookup,
                    rehash_files=rehash_files, container=container,
                    docker_host=run.connector.docker_host,
                )  # fmt: skip
            good.append(host)
        except DflashProvisionError as exc:
            failed.append((member.name, exc.message))
    return DryRun(split(good, batches), failed)


def _kept_configs() -> Callable[[str], bytes | None]:
    """The rollout store's configs by sha256 for a dry run: read only (no database is made
    where there is none)."""
    store = RolloutStore()
    if not store.path.exists():
        return lambda sha: None

    def lookup(sha: str) -> bytes | None:
        try:
            return store.config_with_sha(sha)
        except DflashProvisionError:
            return None

    return lookup
