"""Which host status a transport or remote error means."""

from __future__ import annotations

from dflash_provision.errors import AuthError, ContainerError, RemoteStepFailed, UnreachableError
from dflash_provision.host_state.file_status import HostStatus

_UNREACHABLE_BY_REASON = {
    "refused": HostStatus.UNREACHABLE_REFUSED,
    "timeout": HostStatus.UNREACHABLE_TIMEOUT,
}
_AUTH_BY_REASON = {
    "host-key-unknown": HostStatus.HOST_KEY_UNKNOWN,
    "host-key-changed": HostStatus.HOST_KEY_CHANGED,
}


def classify_exception(
    exc: BaseException, *, waited_s: float | None = None, timeout_s: float | None = None
) -> tuple[HostStatus, str]:
    """Map a transport / remote error to a status, by the error's type and ``reason``.

    ``waited_s`` / ``timeout_s``: a handshake that failed only after the whole connect/banner
    timeout had passed is a timeout, whatever paramiko's words (it sometimes reports a banner
    timeout as "No existing session").
    """
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    if isinstance(exc, UnreachableError):
        status = _UNREACHABLE_BY_REASON.get(exc.reason, HostStatus.UNREACHABLE)
        if (
            status is HostStatus.UNREACHABLE
            and waited_s is not None
            and timeout_s is not None
            and waited_s >= timeout_s * 0.95
        ):
            return HostStatus.UNREACHABLE_TIMEOUT, f"{message} (no answer within {timeout_s:g} s)"
        return status, message
    if isinstance(exc, AuthError):
        return _AUTH_BY_REASON.get(exc.reason, HostStatus.AUTH_FAILED), message
    if isinstance(exc, ContainerError):
        return HostStatus.CONTAINER_NOT_RUNNING, message
    if isinstance(exc, RemoteStepFailed) and exc.step == "timeout":
        # The host accepted the connection but the command hung: as good as unreachable.
        return HostStatus.UNREACHABLE_TIMEOUT, message
    return HostStatus.ERROR, message
