"""One exception root for everything the user can cause or meet, each carrying its exit code.

The CLI prints ``error: <message>`` on one line and exits with ``exit_code``; anything that is not
a DflashProvisionError is a bug: one line as well, exit 1, the traceback with ``--debug``.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Documented process exit codes (the docs/exit-codes.md table mirrors this)."""

    OK = 0
    ERROR = 1  # unexpected failure, or some hosts failed in a fleet run
    USAGE = 2  # bad arguments, bad target spec, bad inventory, unreadable input file
    INVALID = 3  # the config fails validation (parse, schema, invariants, loader, --against)
    DRIFT = 4  # a compared file differs from the authoritative config
    UNREACHABLE = 5  # connection refused, timed out, name not resolved
    AUTH = 6  # authentication failed, host key unknown or changed, sudo needs a password
    REMOTE_FAILED = 7  # a remote step failed: permission, disk full, read-only, missing dir, ...
    CONTAINER = 8  # the container does not exist or is not running
    LOCAL_WRITE = 9  # the work was done, but this controller could not record or write its own
    # files: the history database (corrupt, unwritable, disk full), a --prometheus file
    HUB_REPO_NOT_FOUND = 10
    HUB_GATED = 11
    HUB_REVISION_NOT_FOUND = 12
    HUB_FILE_NOT_FOUND = 13
    HUB_UNREACHABLE = 14
    HUB_OFFLINE_NOT_CACHED = 15
    HUB_INTEGRITY = 16  # the Hub's bytes do not match the sha256 / size it declared for them
    OUTCOME_UNKNOWN = 17  # a write was cut off and the host could not be asked again: verify
    # runtime (launch / status / stop / logs)
    LAUNCH_FAILED = 20  # the server exited, logged a fatal error, or was not ready in time
    NOT_RUNNING = 21  # no server of ours on that port (status, stop)
    PORT_TAKEN = 22  # a different launch (without --restart) or a foreign process has the port
    VLLM_UNUSABLE = 23  # vLLM missing on the target, or it cannot run this drafter as asked
    # runtime-check / doctor
    RUNTIME_CHECK_FAILED = 24  # a stage a-d failed: the server does not run what was provisioned
    ACCEPTANCE_LOW = 25  # stages a-d passed, acceptance is below --min-acceptance
    INCONCLUSIVE = 26  # no stage failed, but one could not tell (too few drafts, a counter reset)
    # rollout (a gated change across a fleet)
    ROLLED_BACK = 27  # a batch failed its gate and was rolled back, proved
    PAUSED = 28  # a check was inconclusive: the rollout waits for --resume
    ABORTED = 29  # --abort put every host this rollout changed back, proved
    ROLLBACK_FAILED = 30  # a rollback could not be proved: the hosts named need a hand
    ROLLOUT_REFUSED = 31  # refused, nothing done: pre-flight, a hold, a host changed (--resume)
    INTERRUPTED = 130  # Ctrl-C: the shell's 128 + SIGINT; what was done is printed and recorded


class DflashProvisionError(Exception):
    """Base of all expected errors: a one-line user-facing message plus an exit code."""

    exit_code: ExitCode = ExitCode.ERROR

    def __init__(self, message: str, *, exit_code: ExitCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(DflashProvisionError):
    exit_code = ExitCode.USAGE


class ConfigInvalid(DflashProvisionError):
    exit_code = ExitCode.INVALID


class DriftFound(DflashProvisionError):
    exit_code = ExitCode.DRIFT


class HubError(DflashProvisionError):
    """Fetching from the Hub failed; the exit code says which way (10-15)."""


class ConnectionFailure(DflashProvisionError):
    """Could not get a working session on a host. ``reason`` is a stable machine-readable cause
    (fleet reports classify on it, never on the wording of ``message``)."""

    def __init__(self, message: str, *, reason: str, exit_code: ExitCode | None = None) -> None:
        super().__init__(message, exit_code=exit_code)
        self.reason = reason


class UnreachableError(ConnectionFailure):
    """reason: "refused", "timeout", or "network" (name not resolved, no route, handshake)."""

    exit_code = ExitCode.UNREACHABLE


class AuthError(ConnectionFailure):
    """reason: "auth", "host-key-unknown", "host-key-changed", "sudo" or "needs-root"."""

    exit_code = ExitCode.AUTH


class RemoteStepFailed(DflashProvisionError):
    """A step of a remote operation failed; ``step`` names it (e.g. "write", "rename")."""

    exit_code = ExitCode.REMOTE_FAILED

    def __init__(self, message: str, *, step: str, exit_code: ExitCode | None = None) -> None:
        super().__init__(message, exit_code=exit_code)
        self.step = step


class ContainerError(DflashProvisionError):
    exit_code = ExitCode.CONTAINER


class LocalWriteFailed(DflashProvisionError):
    """This controller could not write its own files (history database, --prometheus file)."""

    exit_code = ExitCode.LOCAL_WRITE


class RuntimeFailure(DflashProvisionError):
    """A vLLM server could not be started, found or stopped as asked (exit codes 20-23)."""

    exit_code = ExitCode.LAUNCH_FAILED
