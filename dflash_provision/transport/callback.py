"""Run commands through a function the caller supplies: the face that lets another tool's
connection (an Ansible action plugin's ``ssh`` / ``become`` / container connection) carry this
project's remote protocol, without this package importing that tool."""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Sequence

from dflash_provision.errors import RemoteStepFailed
from dflash_provision.transport.base import DEFAULT_COMMAND_TIMEOUT, CommandResult, Transport

#: One shell command line and its stdin in, (exit status, stdout, stderr) out. The command line is
#: already quoted (``shlex.join``); the runner hands it to the remote shell as it is.
ShellRunner = Callable[[str, bytes | None], tuple[int, bytes, bytes]]


class CallbackTransport(Transport):
    """A :class:`Transport` over a :data:`ShellRunner`.

    The runner's own connection has no per-command deadline, so each call runs in a worker
    thread and is given up at the limit (``RemoteStepFailed(step="timeout")``, as every
    transport reports it); the abandoned call's result is discarded. After a timeout the
    transport refuses further commands: the runner's connection may still be busy with the
    abandoned one, and a second command over it would interleave.
    """

    def __init__(
        self,
        runner: ShellRunner,
        *,
        description: str,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
    ) -> None:
        self._runner = runner
        self.description = description
        self._command_timeout = command_timeout
        self._abandoned = False

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
        if self._abandoned:
            raise RemoteStepFailed(
                f"{self.description}: an earlier command timed out; not running another",
                step="timeout",
            )
        limit = self._command_timeout if timeout is None else timeout
        outcome: list[tuple[int, bytes, bytes]] = []
        failure: list[BaseException] = []

        def call() -> None:
            try:
                outcome.append(self._runner(shlex.join(argv), stdin))
            except BaseException as exc:  # handed to the caller's thread below
                failure.append(exc)

        started = time.monotonic()
        worker = threading.Thread(target=call, name=f"run {argv[0] if argv else ''}", daemon=True)
        worker.start()
        worker.join(limit)
        if worker.is_alive():
            self._abandoned = True
            raise RemoteStepFailed(
                f"{self.description}: {argv[0] if argv else 'command'!r} did not finish "
                f"within {limit:g} s",
                step="timeout",
            )
        if failure:
            raise failure[0]
        status, stdout, stderr = outcome[0]
        return CommandResult(status, stdout, stderr, time.monotonic() - started)
