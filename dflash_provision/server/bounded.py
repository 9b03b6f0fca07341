"""Run one command on the target so that it cannot outlive its deadline THERE.

``run_bounded`` wraps the argv in ``server/scripts/bounded.sh``: the remote scripts' own
watchdog (``remote/scripts/common.sh`` start_watchdog, the one that ends a read stuck on a FIFO)
ends the command, and what it started, at ``remote_deadline(timeout)``, a little before this side
stops waiting at ``timeout``. The transport's timeout alone would only close the channel: a
process that does not write (a hung ``vllm --version``) would keep running on the target.

On Ctrl-C (KeyboardInterrupt while waiting) or when this side's own timeout fires first, the
command is found by the random mark on its shell's command line and ended the same way
(``reap.sh``, through ``end_script``), on the same connection, before the error goes on.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Sequence

from dflash_provision.errors import DflashProvisionError, RemoteStepFailed
from dflash_provision.remote.ops import remote_deadline
from dflash_provision.remote.protocol import script_argv
from dflash_provision.transport.base import CommandResult, Transport

#: How long the clean-up after a Ctrl-C may take (one exec; end_script waits a second).
REAP_TIMEOUT_S = 15.0
# Exit statuses of a command ended by a signal: 143 from bounded.sh's trap, 128 + KILL, 255
# over SSH when the exit status was dropped, negative from a local subprocess.
_ENDED = {143, 137, 255, -15, -9}


class EndedAtDeadline(RemoteStepFailed):
    """The command did not finish by its deadline and was ended on the target (step "timeout")."""

    def __init__(self, message: str, *, deadline: int) -> None:
        super().__init__(message, step="timeout")
        self.deadline = deadline


def run_bounded(
    transport: Transport,
    argv: Sequence[str],
    *,
    stdin: bytes | None = None,
    timeout: float | None = None,
) -> CommandResult:
    """``transport.run(argv)``, ended on the target at its deadline (module docstring).

    EndedAtDeadline when the deadline was reached (the command no longer runs there)."""
    if not argv:
        raise ValueError("empty argv")
    limit = transport.command_timeout if timeout is None else timeout
    deadline = remote_deadline(limit)
    mark = f"dflash-bounded-{secrets.token_hex(8)}"
    wrapped = script_argv("bounded", str(deadline), mark, *argv)
    try:
        result = transport.run(wrapped, stdin=stdin, timeout=limit)
    except KeyboardInterrupt:
        reap(transport, mark)
        raise
    except RemoteStepFailed as exc:
        if exc.step != "timeout":
            raise
        # A host that froze before starting the command (ExecRequestTimeout: its connection is
        # closed) has nothing to reap, and asking again would cost a whole new connection.
        if type(exc).__name__ == "ExecRequestTimeout":
            raise
        reap(transport, mark)
        raise _ended(transport, argv, deadline) from None
    if result.exit_status in _ENDED and result.duration_s >= deadline:
        raise _ended(transport, argv, deadline)
    return result


def _ended(transport: Transport, argv: Sequence[str], deadline: int) -> EndedAtDeadline:
    return EndedAtDeadline(
        f"{transport.description}: `{argv[0]}` did not finish within its {deadline} s deadline "
        "and was ended there",
        deadline=deadline,
    )


def reap(transport: Transport, mark: str) -> None:
    """End the bounded command marked ``mark`` on the target; best effort (the connection may
    be gone too, and a second Ctrl-C gives up)."""
    with contextlib.suppress(DflashProvisionError, KeyboardInterrupt, OSError, EOFError):
        transport.run(script_argv("reap", mark), timeout=REAP_TIMEOUT_S)
