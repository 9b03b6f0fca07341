"""Step 2, route: a ProxyCommand's socket; the SSH session runs over its stdin and stdout.

As OpenSSH does it: the command (its ``%`` tokens expanded by config_route.py) goes to
``/bin/sh -c "exec COMMAND"``.

The command's stderr is kept in a temporary file so a proxy that fails (``ssh -W`` to a bastion
that refuses us, ``nc`` that cannot connect) is reported by its own last words instead of an
SSH banner timeout.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import tempfile
import threading

from dflash_provision.errors import UsageError

_EXIT_WAIT_S = 1.0  # how long a proxy that closed its stdout may take to exit


class ProxyCommandSocket:
    """The socket-like object paramiko.Transport reads and writes: a running ProxyCommand."""

    def __init__(self, command: str) -> None:
        self.command = command
        # Kept open for the proxy's lifetime and closed in close(), so no context manager.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        try:
            self._process = subprocess.Popen(
                ["/bin/sh", "-c", "exec " + command],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                bufsize=0,
                start_new_session=True,  # Ctrl-C reaches us, and we end the proxy ourselves
            )
        except OSError as exc:
            self._stderr.close()
            raise UsageError(f"cannot run ProxyCommand {command!r}: {exc.strerror}") from None
        self._timeout: float | None = None
        self._closed = False
        self._ended = False  # the proxy closed its stdout or its stdin: it is done or dying
        self._failure: str | None = None
        self._lock = threading.Lock()  # close() runs on paramiko's thread, failure() on ours

    # -- what paramiko's Packetizer and Transport call ----------------------------------------

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def send(self, data: bytes) -> int:
        assert self._process.stdin is not None
        try:
            return os.write(self._process.stdin.fileno(), data)
        except BrokenPipeError:
            self._ended = True
            raise  # paramiko reads any send error as EOF

    def recv(self, size: int) -> bytes:
        """Up to ``size`` bytes; ``b""`` when the proxy closed its stdout (paramiko: EOF);
        ``socket.timeout`` when nothing came within the timeout (paramiko retries)."""
        assert self._process.stdout is not None
        fd = self._process.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], self._timeout)
        if not ready:
            raise TimeoutError("timed out")
        data = os.read(fd, size)
        if not data:
            self._ended = True
        return data

    def close(self) -> None:
        """End the proxy (paramiko's transport thread calls this when the session ends)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            # Read why it stopped before stopping it ourselves: the caller asks afterwards.
            self._failure = self._describe_exit()
            for pipe in (self._process.stdin, self._process.stdout):
                if pipe is not None:
                    pipe.close()
            if self._process.poll() is None:
                self._signal(signal.SIGTERM)
                try:
                    self._process.wait(timeout=_EXIT_WAIT_S)
                except subprocess.TimeoutExpired:
                    self._signal(signal.SIGKILL)
                    self._process.wait()
            self._stderr.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def getpeername(self) -> tuple[str, int]:
        return ("proxy", 0)

    # -- for error messages --------------------------------------------------------------------

    def failure(self) -> str | None:
        """Why the proxy stopped, if it did: "ProxyCommand exited with status N: <its last
        stderr line>". None while it still runs (then the failure was on its far side)."""
        with self._lock:
            return self._failure if self._closed else self._describe_exit()

    def _describe_exit(self) -> str | None:
        if not self._ended and self._process.poll() is None:
            return None
        try:
            status = self._process.wait(timeout=_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            return None
        self._stderr.seek(0)
        lines = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
        said = f": {lines[-1].strip()}" if lines else ""
        how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
        return f"ProxyCommand {how}{said}"

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signum)  # the whole group: sh's children too
