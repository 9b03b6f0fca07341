"""What the collection's modules share: their options' checks (one-line UsageErrors, the CLI's
names), the authoritative source they name, and the host they reach through the play's
connection (a :class:`CallbackTransport`, wrapped for ``container:`` as a target's
``HOST/KIND:NAME`` is)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import DflashProvisionError, UsageError
from dflash_provision.source.authority import SourceSpec
from dflash_provision.target import parse_container_ref, parse_target
from dflash_provision.transport.callback import CallbackTransport, ShellRunner
from dflash_provision.transport.container import ContainerTransport

if TYPE_CHECKING:
    from dflash_provision.source.authority import SourceSpec
    from dflash_provision.target import Target
    from dflash_provision.transport.base import Transport

#: The options every module has: the drafter directory and how the host is reached.
HOST_OPTIONS = ("path", "container", "docker_host", "command_timeout")
#: The authoritative source, as the CLI's --lock, --repo/--revision, --from.
SOURCE_OPTIONS = ("lock", "repo", "revision", "src")
DEFAULT_COMMAND_TIMEOUT = 60.0


@dataclass(frozen=True)
class HostArgs:
    """Where the drafter is: ``path`` on the play's host (inside ``container``)."""

    path: str
    container: str | None = None
    command_timeout: float = DEFAULT_COMMAND_TIMEOUT  # each remote command (--command-timeout)
    docker_host: str | None = None  # a docker:NAME container's daemon (--docker-host)


@dataclass(frozen=True)
class SourceArgs:
    """One of a lock file, a Hub repo at a revision, or a local file (``src``, as ``--from``)."""

    lock: str | None = None
    repo: str | None = None
    revision: str | None = None
    src: str | None = None

    def spec(self) -> SourceSpec:
        return SourceSpec.from_options(self.repo, self.src, self.lock, revision=self.revision)


def refuse_unknown(args: Mapping[str, Any], known: Sequence[str]) -> None:
    unknown = sorted(set(args) - set(known))
    if unknown:
        raise UsageError(f"unsupported option(s) {', '.join(unknown)}; known: {', '.join(known)}")


def text(args: Mapping[str, Any], name: str) -> str | None:
    value = args.get(name)
    if value is not None and not isinstance(value, str):
        raise UsageError(f"{name}: expected a string, got {value!r}")
    return value or None


def flag(args: Mapping[str, Any], name: str, default: bool = False) -> bool:
    value = args.get(name, default)
    if not isinstance(value, bool):
        raise UsageError(f"{name}: expected a boolean, got {value!r}")
    return value


def number(
    args: Mapping[str, Any],
    name: str,
    default: float,
    *,
    check: Callable[[float], bool],
    meaning: str,
) -> float:
    """A number option (YAML gives int or float; a bool is no number) that passes ``check``."""
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not check(value):
        raise UsageError(f"{name}: {meaning}, got {value!r}")
    return float(value)


def count(args: Mapping[str, Any], name: str, default: int, *, low: int, high: int) -> int:
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UsageError(f"{name}: a whole number from {low} to {high}, got {value!r}")
    return value


def parse_host(args: Mapping[str, Any]) -> HostArgs:
    path = args.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise UsageError(f"path: the drafter directory's absolute path on the host, got {path!r}")
    limit = number(
        args,
        "command_timeout",
        DEFAULT_COMMAND_TIMEOUT,
        check=lambda v: v > 0,
        meaning="seconds > 0",
    )
    return HostArgs(path, text(args, "container"), limit, text(args, "docker_host"))


def parse_source(args: Mapping[str, Any]) -> SourceArgs:
    texts = {name: text(args, name) for name in SOURCE_OPTIONS}
    if sum(texts[n] is not None for n in ("lock", "repo", "src")) != 1:
        raise UsageError("give exactly one source: lock, repo (with revision) or src")
    return SourceArgs(**texts)


def open_host(runner: ShellRunner, host: str, where: HostArgs) -> tuple[Transport, Target]:
    """The transport over the play's connection and the drafter's target on it."""
    transport: Transport = CallbackTransport(
        runner, description=host, command_timeout=where.command_timeout
    )
    name = host
    if where.container:
        ref = parse_container_ref(where.container)
        transport = ContainerTransport(transport, ref.kind, ref.name, docker_host=where.docker_host)
        name = f"{host}/{ref.display()}"
    return transport, parse_target(f"{name}:{where.path}")


def failed(exc: DflashProvisionError) -> dict[str, Any]:
    """A failure of the source or of the host as a failed task result (never an exception the
    plugin must know about); ``exit_code`` is the CLI's for the same failure."""
    return {"changed": False, "failed": True, "msg": exc.message, "exit_code": int(exc.exit_code)}
