"""Step 4, channel: one command on an open connection, within its deadline.

One exec channel, no PTY, ``shlex.join(argv)`` in the remote user's shell; stdin is written then
EOF, stdout and stderr are read (one loop) and the exit status returned. A channel that cannot
start or a connection lost on the way is a RemoteStepFailed(step="connection"): the caller's
connection is unusable after it. So is the connection of an ExecRequestTimeout (a
RemoteStepFailed(step="timeout")): the host opened the session, then did not answer the exec
request within the command's deadline.
"""

from __future__ import annotations

import contextlib
import shlex
import threading
import time
from collections.abc import Callable, Sequence

import paramiko

from dflash_provision.errors import RemoteStepFailed
from dflash_provision.transport.base import CommandResult
from dflash_provision.transport.ssh.channel_deadlines import EXEC_DEADLINES
from dflash_provision.transport.ssh.login_errors import reason_text

_POLL_S = 0.2  # how often blocked channel reads/writes look at the deadline
_CHUNK = 64 * 1024
# Input up to this size is sent before the output is read (the channel window is 2 MiB).
_INLINE_STDIN = 512 * 1024
# OpenSSH's ssh exits 255 when the remote command died by a signal; paramiko drops exit-signal.
_NO_EXIT_STATUS = 255


def run_command(
    client: paramiko.SSHClient,
    argv: Sequence[str],
    *,
    stdin: bytes | None,
    timeout: float,
    open_timeout: float,
    description: str,
) -> CommandResult:
    """Run ``argv`` on ``client``'s connection; ``open_timeout`` bounds the channel's opening,
    ``timeout`` the whole command."""
    started = time.monotonic()
    deadline = started + timeout
    transport = client.get_transport()
    assert transport is not None
    try:
        channel = transport.open_session(timeout=open_timeout)
        channel.settimeout(_POLL_S)
        if not _exec_within(channel, shlex.join(argv), deadline - time.monotonic()):
            raise ExecRequestTimeout(
                f"{description}: the host did not start command {argv[0]!r} within "
                f"{timeout:g} s (frozen after the session opened?)"
            )
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise RemoteStepFailed(
            f"{description}: could not start a command: {reason_text(exc)}",
            step="connection",
        ) from None
    try:
        return _exchange(channel, stdin, started, deadline, timeout, argv, description)
    finally:
        channel.close()


class ExecRequestTimeout(RemoteStepFailed):
    """The exec request got no answer within the command's deadline (step "timeout"); unlike a
    command that outlives its deadline, the connection itself is done: close it."""

    def __init__(self, message: str) -> None:
        super().__init__(message, step="timeout")


def _exec_within(channel: paramiko.Channel, command: str, limit: float) -> bool:
    """``channel.exec_command`` with a deadline; False when it expired first. paramiko waits
    for the server's answer to the exec request without one, so a host that freezes after
    opening the session would hold the caller forever; closing the channel wakes that wait
    (paramiko then raises), and only another thread can do it while exec_command blocks: the
    process's deadline thread (channel_deadlines.py), not a thread per request."""

    def expire() -> None:
        # The connection may be gone already (the host froze, then dropped it): closing then
        # raises, in the deadline thread, where nobody would catch it.
        with contextlib.suppress(paramiko.SSHException, OSError, EOFError):
            channel.close()

    deadline = EXEC_DEADLINES.add(limit, expire)
    try:
        channel.exec_command(command)
    except (paramiko.SSHException, OSError, EOFError):
        if deadline.fired:
            return False
        raise
    finally:
        deadline.cancel()
    return not deadline.fired


def _exchange(
    channel: paramiko.Channel,
    stdin: bytes | None,
    started: float,
    deadline: float,
    timeout: float,
    argv: Sequence[str],
    description: str,
) -> CommandResult:
    # One thread reads both streams (stderr whenever some has arrived, so a chatty command
    # can never fill the channel window and stall). Input that fits well inside the window
    # is sent before reading, from this thread; only a bigger one gets a writer thread, so
    # the command's output can flow while it is still being sent. Threads cost more of the
    # controller's CPU per exec than a config-sized command does in total.
    stdout_chunks: list[bytes] = []
    stderr_chunks: list[bytes] = []
    writer_error: list[BaseException] = []
    writer: threading.Thread | None = None
    data = stdin or b""
    if len(data) <= _INLINE_STDIN:
        _write_stdin(channel, data, deadline, writer_error)
    else:
        writer = threading.Thread(
            target=_write_stdin, args=(channel, data, deadline, writer_error), daemon=True
        )
        writer.start()
    stdout_done = stderr_done = False
    while not (stdout_done and stderr_done) and time.monotonic() < deadline:
        if not stderr_done and (stdout_done or channel.recv_stderr_ready()):
            stderr_done = _read_some(channel.recv_stderr, stderr_chunks)
        if not stdout_done:
            stdout_done = _read_some(channel.recv, stdout_chunks)
    finished = channel.status_event.wait(max(0.0, deadline - time.monotonic()))
    if not finished or not (stdout_done and stderr_done):
        channel.close()  # unblocks the writer; the remote command gets SIGHUP-like EOF
        raise RemoteStepFailed(
            f"{description}: command {argv[0]!r} did not finish within {timeout:g} s",
            step="timeout",
        )
    if writer is not None:
        writer.join(1.0)
    stdout, stderr = b"".join(stdout_chunks), b"".join(stderr_chunks)
    if not channel.exit_status_ready() or channel.exit_status < 0:
        live = channel.get_transport()
        if live is None or not live.is_active():
            raise RemoteStepFailed(
                f"connection to {description} was lost during {argv[0]!r}",
                step="connection",
            )
        return CommandResult(
            _NO_EXIT_STATUS,
            stdout,
            stderr + b"\n[remote command ended without an exit status (killed by a signal?)]\n",
            time.monotonic() - started,
        )
    return CommandResult(channel.exit_status, stdout, stderr, time.monotonic() - started)


def _write_stdin(
    channel: paramiko.Channel, data: bytes, deadline: float, errors: list[BaseException]
) -> None:
    view = memoryview(data)
    try:
        while view and time.monotonic() < deadline:
            try:
                sent = channel.send(view[:_CHUNK])  # type: ignore[arg-type]  # any buffer works
            except TimeoutError:
                continue
            if sent <= 0:
                return  # channel closed: the command stopped reading; its exit status says why
            view = view[sent:]
        channel.shutdown_write()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        errors.append(exc)


def _read_some(recv: Callable[[int], bytes], chunks: list[bytes]) -> bool:
    """One read from a channel stream (channel.recv or recv_stderr, which wait at most the
    channel's poll timeout); True at end of stream."""
    try:
        chunk = recv(_CHUNK)
    except TimeoutError:
        return False
    if not chunk:
        return True
    chunks.append(chunk)
    return False
