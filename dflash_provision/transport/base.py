"""The one interface every transport implements: run an argv with stdin and a timeout."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_COMMAND_TIMEOUT = 60.0


@dataclass(frozen=True)
class CommandResult:
    """What one remote command returned. Transports never raise for a non-zero exit status."""

    exit_status: int
    stdout: bytes
    stderr: bytes
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


class Transport(abc.ABC):
    """Runs commands on one machine.

    ``run`` raises UnreachableError / AuthError (connection-level failures) or
    RemoteStepFailed(step="timeout") when ``timeout`` expires; a command that ran and failed is a
    CommandResult with a non-zero ``exit_status``, never an exception.

    The timeout contract: ``timeout=None`` (no timeout given) means ``command_timeout``, the
    configured ``--command-timeout``, in every transport; callers pass a number only to ask for
    a different limit.
    """

    #: Human name for messages, e.g. "root@gpu1", "local", "lxc:c1 via root@gpu1".
    description: str = "transport"

    @property
    def command_timeout(self) -> float:
        """Seconds a command may run when ``run`` is given no timeout."""
        return DEFAULT_COMMAND_TIMEOUT

    @abc.abstractmethod
    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run ``argv`` (no shell on our side: each element arrives as one argument)."""

    def connect(self) -> None:  # noqa: B027 - optional hook, most transports hold nothing
        """Open the connection now rather than on the first ``run`` (so that an unreachable host
        is reported before any slower work); raises as ``run`` would."""

    def close(self) -> None:  # noqa: B027 - optional hook, most transports hold nothing
        """Release connections. Safe to call twice."""

    def host_key(self) -> str | None:
        """The SSH server's host key as ``TYPE SHA256:...`` (connecting first), None where no
        SSH server is involved (this machine): what identifies the machine a rollout acts on."""
        return None

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WrappingTransport(Transport):
    """Runs each argv through ``inner``, rewritten by :meth:`wrap` (``sudo -n --``,
    ``lxc-attach -n NAME --``...), then lets :meth:`check` turn the wrapper tool's own refusals
    into errors. Composes: a container wrapper over a sudo wrapper over SSH."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner

    @property
    def command_timeout(self) -> float:
        return self.inner.command_timeout

    @abc.abstractmethod
    def wrap(self, argv: Sequence[str]) -> list[str]:
        """The argv the inner transport runs."""

    def check(self, argv: Sequence[str], result: CommandResult) -> None:
        """Raise if ``result`` is the wrapper refusing, not the command failing."""

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        if not argv:
            raise ValueError("empty argv")
        result = self.inner.run(self.wrap(argv), stdin=stdin, timeout=timeout)
        self.check(argv, result)
        return result

    def connect(self) -> None:
        self.inner.connect()

    def close(self) -> None:
        self.inner.close()

    def host_key(self) -> str | None:
        return self.inner.host_key()
