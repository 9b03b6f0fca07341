"""Run commands as root through ``sudo -n`` (never prompts: a password prompt would hang)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from dflash_provision.errors import AuthError
from dflash_provision.transport.base import CommandResult, Transport, WrappingTransport

# sudo's own refusals (sudo 1.9 texts). They start with "sudo: " and sudo exits 1.
_NEEDS_PASSWORD = re.compile(r"^sudo: (?:a )?password is required", re.MULTILINE)
_NOT_ALLOWED = re.compile(
    r"^(?:\S+ is not in the sudoers file|Sorry, user \S+ is not allowed to execute|"
    r"Sorry, user \S+ may not run sudo)",
    re.MULTILINE,
)
_SUDO_MISSING = re.compile(r"(?:^|\s)sudo: (?:command )?not found")
# "Defaults requiretty" (old RHEL/CentOS sudoers): sudo refuses any session without a terminal,
# and we never request a PTY (it would mangle the bytes on stdin).
_NEEDS_TTY = re.compile(r"^sudo: sorry, you must have a tty to run sudo", re.MULTILINE)


class SudoTransport(WrappingTransport):
    """Wraps every argv as ``sudo -n -- argv...`` on the machine ``inner`` reaches."""

    def __init__(self, inner: Transport) -> None:
        super().__init__(inner)
        self.description = inner.description

    def wrap(self, argv: Sequence[str]) -> list[str]:
        return ["sudo", "-n", "--", *argv]

    def check(self, argv: Sequence[str], result: CommandResult) -> None:
        if result.exit_status in (1, 127):
            stderr = result.stderr.decode("utf-8", "replace")
            where = self.inner.description
            if result.exit_status == 1 and _NEEDS_PASSWORD.search(stderr):
                # sudo asks for the password before it looks at the rules, so with -n a user
                # who may not run the command at all gets this same answer.
                raise AuthError(
                    f"sudo -n on {where} refused: it needs a password or this user may not run "
                    "the command; allow NOPASSWD for it, or log in as root",
                    reason="sudo",
                )
            if result.exit_status == 1 and _NEEDS_TTY.search(stderr):
                raise AuthError(
                    f"sudo on {where} requires a terminal (sudoers has 'Defaults requiretty'); "
                    "exempt this login with 'Defaults:USER !requiretty' or log in as root",
                    reason="sudo",
                )
            if result.exit_status == 1 and _NOT_ALLOWED.search(stderr):
                raise AuthError(
                    f"sudo -n on {where} refused: this user may not run {argv[0]!r} as root; "
                    "allow it (NOPASSWD) in sudoers, or log in as root",
                    reason="sudo",
                )
            if result.exit_status == 127 and _SUDO_MISSING.search(stderr):
                raise AuthError(
                    f"sudo is not installed on {where}; log in as root instead", reason="sudo"
                )
