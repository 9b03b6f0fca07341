"""Which port runs the server launched for a drafter directory.

``launch`` writes a record per port (``<state dir>/vllm/<port>/launch.json``, see records.py);
``status``, ``stop``, ``logs``, ``runtime-check`` and ``doctor`` without ``--port`` read them all
in one exec (``scripts/servers.sh``) and take the port whose record names TARGET's drafter
directory. Records of live servers count first; when none lives, every record for the drafter
does (``status`` and ``logs`` of a stopped server still find it). Several → a usage error that
lists them (``--port`` chooses); none → port 8000, where a server the tool did not start may
listen (vLLM's default).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from dflash_provision.errors import RemoteStepFailed, UsageError
from dflash_provision.server.process import run_bounded_script
from dflash_provision.server.records import LaunchRecord
from dflash_provision.target import Target
from dflash_provision.transport.base import Transport

DEFAULT_PORT = 8000


def same_path(a: str | None, b: str) -> bool:
    """Whether ``a`` names the directory ``b`` names, however either is written."""
    return a is not None and posixpath.normpath(a) == posixpath.normpath(b)


@dataclass(frozen=True)
class Launched:
    """One port's launch record and whether its server still runs."""

    port: int
    alive: bool
    record: LaunchRecord
    # Its pidfile names a server that is gone: it crashed, was killed or the host rebooted
    # (`stop` removes the pidfile, so a server stopped on purpose is not dead).
    dead: bool = False


@dataclass(frozen=True)
class PortChoice:
    port: int
    how: str  # "--port" | "launch record" | "default"


def launched(transport: Transport, *, timeout: float | None = None) -> list[Launched]:
    """Every port with a launch record in the login's state directory (one exec). A record
    that does not parse is left out: it cannot say which drafter it ran."""
    _, lines, _ = run_bounded_script(transport, "servers", [], timeout=timeout)
    found = []
    for line in lines:
        if not line.startswith("server "):
            continue
        parts = line.split(" ", 3)
        if len(parts) != 4 or not parts[1].isdigit():
            continue
        try:
            record = LaunchRecord.from_json(parts[3])
        except RemoteStepFailed:
            continue
        found.append(Launched(int(parts[1]), parts[2] == "1", record, dead=parts[2] == "x"))
    return found


def for_drafter(servers: list[Launched], drafter_dir: str) -> list[Launched]:
    """The records for ``drafter_dir``: the live ones when any lives, else all of them."""
    want = posixpath.normpath(drafter_dir)
    mine = [s for s in servers if posixpath.normpath(s.record.drafter_dir or "/") == want]
    alive = [s for s in mine if s.alive]
    return sorted(alive or mine, key=lambda s: s.port)


def choose_port(
    transport: Transport,
    target: Target,
    port: int | None,
    *,
    timeout: float | None = None,
) -> PortChoice:
    """``port`` when given; else the port launched for TARGET's drafter directory (see the
    module docstring). UsageError when several ports run it."""
    if port is not None:
        return PortChoice(port, "--port")
    mine = for_drafter(launched(transport, timeout=timeout), target.model_dir)
    if not mine:
        return PortChoice(DEFAULT_PORT, "default")
    if len(mine) == 1:
        return PortChoice(mine[0].port, "launch record")
    listed = ", ".join(
        f"{s.port} ({'running' if s.alive else 'stopped'}, launched {s.record.started_at})"
        for s in mine
    )
    raise UsageError(
        f"{transport.description}: {target.model_dir} was launched on several ports: {listed}; "
        "choose one with --port"
    )
