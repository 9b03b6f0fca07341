"""Step 3, login: turn paramiko's connection failures into one-line errors that name the cause."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

import paramiko

from dflash_provision.errors import AuthError, UnreachableError
from dflash_provision.transport.ssh.login_hostkeys import UnknownHostKey

if TYPE_CHECKING:
    from dflash_provision.transport.options import SshOptions
    from dflash_provision.transport.ssh.config import Endpoint


def handshake_budget(opts: SshOptions) -> float:
    """How long start_client() may wait: the banner timeout, then connect_timeout for the key
    exchange (paramiko's only other limit on it is a fixed 15 s, see login._transport_factory)."""
    return opts.banner_timeout + opts.connect_timeout


def handshake_phase(client: paramiko.SSHClient) -> str | None:
    """Where the SSH handshake stopped: "banner", "key exchange", or None (it completed, or
    never started)."""
    transport = client.get_transport()
    if transport is None or transport.initial_kex_done:
        return None
    return "key exchange" if transport.remote_version else "banner"


def _handshake_timeout(exc: BaseException, phase: str | None, opts: SshOptions) -> float | None:
    """Seconds after which the handshake gave up, when ``exc`` means it timed out (else None).

    Two shapes, depending on which timer fires first: paramiko's transport thread raises
    "Error reading SSH protocol banner" caused by a socket timeout; or start_client() stops
    waiting silently and the next call fails with "No existing session".
    """
    if phase is None or not isinstance(exc, paramiko.SSHException):
        return None
    if "No existing session" in str(exc):
        return handshake_budget(opts)  # start_client()'s own wait ran out
    if "protocol banner" in str(exc) and (
        isinstance(exc.__context__, TimeoutError) or "timed out" in str(exc).lower()
    ):
        return opts.banner_timeout
    return None


def _host_key_name(endpoint: Endpoint) -> str:
    """The host as the user typed it plus the name its key is filed under, e.g.
    "h01 (127.0.1.1)"; just the latter when they are the same."""
    filed = endpoint.known_hosts_name
    return filed if endpoint.alias in (filed, endpoint.hostname) else f"{endpoint.alias} ({filed})"


def map_connect_error(
    exc: BaseException, endpoint: Endpoint, opts: SshOptions, phase: str | None = None
) -> BaseException:
    label = endpoint.label
    if isinstance(exc, UnknownHostKey):
        return AuthError(
            f"host key for {_host_key_name(endpoint)} is unknown; add it to "
            f"{endpoint.known_hosts_path} or use --accept-new-host-key",
            reason="host-key-unknown",
        )
    if isinstance(exc, paramiko.BadHostKeyException):
        return AuthError(
            f"host key for {_host_key_name(endpoint)} has CHANGED (known_hosts "
            f"{endpoint.known_hosts_path} has {exc.expected_key.get_name()} "
            f"{exc.expected_key.fingerprint}, the server sent {exc.key.fingerprint}); refusing to "
            "connect. If the change is expected, remove the old key with "
            f"ssh-keygen -R {shlex.quote(endpoint.known_hosts_name)} -f "
            f"{shlex.quote(endpoint.known_hosts_path)}",
            reason="host-key-changed",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        if "timeout" in str(exc).lower():
            return UnreachableError(
                f"ssh to {label} timed out after {opts.auth_timeout:g}s (auth)", reason="timeout"
            )
        tried = ", ".join(endpoint.identity_files) or "no key files"
        agent = " and the ssh agent" if opts.use_agent and not endpoint.identities_only else ""
        return AuthError(
            f"authentication to {label} failed (tried {tried}{agent}); check the key "
            f"(--identity KEY), the user, and authorized_keys on {endpoint.alias}",
            reason="auth",
        )
    if isinstance(exc, paramiko.SSHException) and "No authentication methods available" in str(exc):
        # paramiko's words when it had no key at all to offer (no --identity, no default key, no
        # agent). --identity, not -i: -i is the inventory in the fleet commands.
        return AuthError(
            f"no SSH key to log in to {label} with: give one with --identity KEY or IdentityFile, "
            "put one in ~/.ssh (id_ed25519, id_ecdsa, id_rsa), or load it into ssh-agent",
            reason="auth",
        )
    waited = _handshake_timeout(exc, phase, opts)
    if waited is not None:
        return UnreachableError(
            f"ssh to {label} timed out after {waited:g}s ({phase})", reason="timeout"
        )
    if isinstance(exc, paramiko.SSHException) and "protocol banner" in str(exc):
        return UnreachableError(
            f"ssh to {label}: no SSH banner ({reason_text(exc)})", reason="network"
        )
    if isinstance(exc, (paramiko.SSHException, OSError, EOFError)):
        return UnreachableError(
            f"ssh handshake with {label} failed: {reason_text(exc)}", reason="network"
        )
    return exc


def reason_text(exc: BaseException) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__
