"""CallbackTransport: another tool's connection carries our commands (argv quoted once, stdin
passed, the timeout contract kept)."""

from __future__ import annotations

import subprocess

import pytest

from dflash_provision.errors import RemoteStepFailed
from dflash_provision.transport.callback import CallbackTransport


def _shell(command: str, stdin: bytes | None) -> tuple[int, bytes, bytes]:
    done = subprocess.run(["sh", "-c", command], input=stdin or b"", capture_output=True)
    return done.returncode, done.stdout, done.stderr


def test_argv_reaches_the_shell_as_separate_words_with_stdin() -> None:
    transport = CallbackTransport(_shell, description="test")
    result = transport.run(
        ["sh", "-c", 'printf "%s|" "$@"; cat', "x", "a b", "$(id)", "'"], stdin=b"\xffbytes"
    )
    assert result.exit_status == 0
    assert result.stdout == b"a b|$(id)|'|\xffbytes"


def test_non_zero_status_is_a_result_not_an_exception() -> None:
    result = CallbackTransport(_shell, description="test").run(["sh", "-c", "echo no >&2; exit 3"])
    assert (result.exit_status, result.stderr) == (3, b"no\n")


def test_a_command_past_its_limit_is_a_timeout_and_the_transport_takes_no_more() -> None:
    transport = CallbackTransport(_shell, description="h1", command_timeout=0.3)
    with pytest.raises(RemoteStepFailed) as raised:
        transport.run(["sleep", "5"])
    assert raised.value.step == "timeout"
    assert "within 0.3 s" in str(raised.value)
    with pytest.raises(RemoteStepFailed):
        transport.run(["true"])
