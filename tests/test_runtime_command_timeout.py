"""The runtime's remote commands take their limit from the transport (its ``--command-timeout``,
the transport contract), never from a literal default: a CLI command need not pass the option
by hand for it to hold. A unit test with a transport that records the limit each command got."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from dflash_provision.errors import RemoteStepFailed
from dflash_provision.server.locate import launched
from dflash_provision.server.process import find_server, probe_port, read_log, stop_server
from dflash_provision.server.status import server_status
from dflash_provision.transport.base import CommandResult, Transport


class RecordingTransport(Transport):
    """Every command "times out" at once; the limit it was given is recorded."""

    description = "recorder"

    def __init__(self, command_timeout: float) -> None:
        self._command_timeout = command_timeout
        self.limits: list[float | None] = []

    @property
    def command_timeout(self) -> float:
        return self._command_timeout

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        self.limits.append(timeout)
        raise RemoteStepFailed("recorder: timed out", step="timeout")

    def close(self) -> None:
        pass


CALLS: list[tuple[str, Callable[[Transport], Any]]] = [
    ("probe_port", lambda t: probe_port(t, 8000)),
    ("find_server", lambda t: find_server(t, 8000)),
    ("launched", lambda t: launched(t)),
    ("read_log", lambda t: read_log(t, 8000, 10)),
    ("stop_server", lambda t: stop_server(t, 8000)),
    ("server_status", lambda t: server_status(t, 8000)),
]


@pytest.mark.parametrize(("name", "call"), CALLS, ids=[name for name, _ in CALLS])
def test_a_runtime_command_is_limited_by_the_transports_command_timeout(
    name: str, call: Callable[[Transport], Any]
) -> None:
    transport = RecordingTransport(command_timeout=7.5)
    with pytest.raises(RemoteStepFailed):
        call(transport)
    assert transport.limits, f"{name} ran no command"
    assert transport.limits[0] in (None, 7.5), f"{name} gave its own limit {transport.limits[0]}"
