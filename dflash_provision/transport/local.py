"""Run commands on this machine (targets like ``/root/models/X`` or ``lxc:c1:/path``)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence

from dflash_provision.errors import RemoteStepFailed
from dflash_provision.transport.base import DEFAULT_COMMAND_TIMEOUT, CommandResult, Transport


class LocalTransport(Transport):
    description = "local"
    _command_timeout = DEFAULT_COMMAND_TIMEOUT

    def __init__(self, command_timeout: float = DEFAULT_COMMAND_TIMEOUT) -> None:
        self._command_timeout = command_timeout

    @property
    def command_timeout(self) -> float:
        return self._command_timeout

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        timeout = self._command_timeout if timeout is None else timeout
        started = time.monotonic()
        try:
            completed = subprocess.run(
                list(argv),
                input=stdin if stdin is not None else b"",
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise RemoteStepFailed(
                f"local command {argv[0]!r} did not finish within {timeout:g} s", step="timeout"
            ) from None
        except FileNotFoundError:
            return CommandResult(127, b"", f"{argv[0]}: not found\n".encode(), 0.0)
        return CommandResult(
            exit_status=completed.returncode,
            stdout=completed.stdout,
            stderr=completed.stderr,
            duration_s=time.monotonic() - started,
        )
