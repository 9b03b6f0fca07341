"""``status``: what runs on a port and whether it answers, composed from the process record
(``process``), the way in (``access``) and the health probe (``readiness``).

Kept apart from ``process`` so that readiness, which reads the process's log, and status, which
uses readiness's probe, do not import each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dflash_provision.server.access import open_server
from dflash_provision.server.process import RunningServer, probe_port, server_from_state
from dflash_provision.server.readiness import probe_health
from dflash_provision.server.records import LaunchRecord
from dflash_provision.transport.base import Transport


@dataclass(frozen=True)
class ServerStatus:
    """``status``'s answer for one port."""

    port: int
    target: str
    state: str  # "ready" | "starting" | "unhealthy" | "not-running"
    server: RunningServer | None
    health_status: int | None  # /health's HTTP status; None when nothing answered
    last_record: LaunchRecord | None  # the port's launch record, even when nothing runs
    state_dir: str
    port_from: str = "--port"  # how the port was chosen: "--port", "launch record", "default"
    # lifecycle: the port is held by a process this login cannot see (exit 22), and why the
    # pidfile's process is not taken for the server (never signalled)
    held_by_hidden_process: bool = False
    pidfile_refused: str | None = None

    @property
    def running(self) -> bool:
        return self.server is not None

    def to_dict(self) -> dict[str, Any]:
        server = self.server
        return {
            "target": self.target,
            "port": self.port,
            "state": self.state,
            "running": self.running,
            "started_by_dflash_provision": bool(server and server.started_by_us),
            "pid": server.pid if server else None,
            "argv": server.argv if server else [],
            "speculative_config": server.speculative_config if server else None,
            # each speculative option as written (vLLM uses the last; dotted ones merge last)
            "speculative_options": list(server.argv_spec.given)
            if server and server.argv_spec
            else [],
            "health_status": self.health_status,
            "record": self.last_record.to_dict() if self.last_record else None,
            "state_dir": self.state_dir,
            "port_from": self.port_from,
            "held_by_hidden_process": self.held_by_hidden_process,
            "pidfile_refused": self.pidfile_refused,
        }


def server_status(
    transport: Transport,
    port: int,
    *,
    python: str | None = None,
    timeout: float | None = None,
    health_timeout: float = 5.0,
    port_from: str = "--port",
) -> ServerStatus:
    """What runs on ``port`` and whether /health answers 200 (two round trips at most)."""
    state = probe_port(transport, port, timeout=timeout)
    server = server_from_state(state)
    record = state.record
    health: int | None = None
    if server is None:
        label = "not-running"
    else:
        chosen = python or (record.python if record else None)
        with open_server(transport, port, python=chosen) as access:
            health = probe_health(access, timeout=health_timeout)
        label = "ready" if health == 200 else "starting" if health is None else "unhealthy"
    return ServerStatus(
        port=port,
        target=transport.description,
        state=label,
        server=server,
        health_status=health,
        last_record=record,
        state_dir=state.state_dir,
        port_from=port_from,
        held_by_hidden_process=state.listener_hidden and not state.ours,
        pidfile_refused=state.untrusted_pid,
    )
