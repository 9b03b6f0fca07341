"""The write script's reply is framed: a line ``part NAME LENGTH`` per file before ``data``,
the bytes in that order, nothing after them. The controller takes it apart strictly, and a
reply that does not add up is said to be cut off or malformed; it is never split by guessing
(the old parser took the bytes sent as a prefix, else the old file's size from the end).

The replies below are what write.sh sends (see its "Output"), handed back by a transport that
plays the host's answer; the last test runs the real script, with a file that another program
empties between the rename and the read-back.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from dflash_provision.remote.ops import WriteStatus, write_remote_config
from dflash_provision.remote.proof import WriteOptions, write_and_prove
from dflash_provision.remote.protocol import MalformedReply, Reply, parse_reply, reply_parts
from dflash_provision.transport.base import CommandResult, Transport
from tests.fixtures.transports import PrefixTransport

OLD = b'{"mask_token_id": 248064}\n'
NEW = b'{"mask_token_id": 248070}\n'
PATH = "/models/X/config.json"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class HostReply(Transport):
    """Answers every command with ``stdout``: the host's reply, as the transport hands it over."""

    description = "h01"

    def __init__(self, stdout: bytes, exit_status: int = 0) -> None:
        self.stdout = stdout
        self.exit_status = exit_status

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        return CommandResult(self.exit_status, self.stdout, b"", 0.01)


def written(old: bytes, parts: list[tuple[str, int]], body: bytes) -> bytes:
    """write.sh's reply after a rename that backed up ``old``: its lines, the part headers as
    given, then ``body`` as the bytes."""
    lines = [
        "dflash-write 1",
        "old present",
        f"old_size {len(old)}",
        "lock flock",
        f"old_sha256 {sha(old)}",
        "backup config.json.20260101T000000Z",
        f"sha256_after {sha(NEW)}",
        "durability fsync-file+dir",
        "pruned 0",
        "result written",
        *(f"part {name} {length}" for name, length in parts),
        "data",
    ]
    return ("\n".join(lines) + "\n").encode() + body


def test_a_framed_reply_gives_each_part_its_own_bytes() -> None:
    reply = written(OLD, [("readback", len(NEW)), ("old", len(OLD))], NEW + OLD)
    outcome = write_remote_config(HostReply(reply), PATH, NEW)
    assert outcome.status is WriteStatus.WRITTEN
    assert (outcome.readback_data, outcome.old.data, outcome.reply_error) == (NEW, OLD, "")


def test_an_old_file_holding_the_new_bytes_and_a_marker_is_not_split_at_the_marker() -> None:
    # The file read back is empty (another program truncated it after the rename) and the old
    # file begins with the very bytes sent, then a line that looks like the protocol's: a
    # prefix match took the read-back for the bytes sent (a false proof) and the rest for the
    # old file.
    old = NEW + b"part old 3\ndata\nend\n"
    reply = written(old, [("readback", 0), ("old", len(old))], old)
    outcome = write_remote_config(HostReply(reply), PATH, NEW)
    assert outcome.readback_data == b"", "the file read back was empty, not the bytes sent"
    assert outcome.old.data == old


@pytest.mark.parametrize(
    ("parts", "body", "words"),
    [
        # The connection dropped in the middle of the old file.
        ([("readback", len(NEW)), ("old", len(OLD))], NEW + OLD[:10], "cut off: 36 of the 52"),
        # A part whose length is not the length of the bytes sent: the rest does not add up.
        ([("readback", len(NEW) + 4), ("old", len(OLD))], NEW + OLD, "cut off: 52 of the 56"),
        ([("readback", len(NEW) - 4), ("old", len(OLD))], NEW + OLD, "4 byte(s) more"),
        # Something after the parts (a trap's lines after the bytes, a login's echo).
        ([("readback", len(NEW)), ("old", len(OLD))], NEW + OLD + b"failed x\n", "9 byte(s)"),
        ([("readback", 3), ("readback", 3)], b"abcdef", "repeated part 'readback'"),
        ([("old", len(OLD)), ("readback", len(NEW))], OLD + NEW, "out of order"),
        ([("readback", 2_000_000)], b"", "over the"),
    ],
)
def test_a_reply_that_does_not_add_up_is_malformed_and_neither_part_is_taken(
    parts: list[tuple[str, int]], body: bytes, words: str
) -> None:
    outcome = write_remote_config(HostReply(written(OLD, parts, body)), PATH, NEW)
    assert outcome.status is WriteStatus.WRITTEN, "the verdict came before the bytes"
    assert (outcome.readback_data, outcome.old.data) == (None, None)
    assert outcome.reply_error.startswith("the host's reply was cut off or malformed")
    assert words in outcome.reply_error


@pytest.mark.parametrize(
    "header", ["part readback", "part readback -1", "part readback 0x10", "part readback 012"]
)
def test_a_part_header_that_does_not_parse_is_malformed(header: str) -> None:
    reply = parse_reply(f"dflash-write 1\n{header}\ndata\n".encode(), "write")
    with pytest.raises(MalformedReply, match="part header"):
        reply_parts(reply, ("readback", "old"), limit=100)


def test_a_reply_cut_off_before_its_bytes_is_malformed() -> None:
    with pytest.raises(MalformedReply, match="cut off before its bytes"):
        reply_parts(Reply(lines=["part old 3"]), ("readback", "old"), limit=100)


def test_a_push_whose_reply_does_not_add_up_reads_the_file_again_and_says_why(
    tmp_path: Path,
) -> None:
    # The verdict "written" arrived, its bytes did not add up: the push takes none of them,
    # reads the file again (one more exec, as for a read-back that differs) and warns.
    from dflash_provision.place.push import PushStatus, push_config
    from dflash_provision.source.authority import Authority
    from dflash_provision.target import parse_target
    from dflash_provision.transport.local import LocalTransport

    class ThenLocal(HostReply):
        def run(
            self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
        ) -> CommandResult:
            if list(argv[3:4]) == ["dflash-write"]:  # the write: its reply as above
                return super().run(argv, stdin=stdin, timeout=timeout)
            return LocalTransport().run(argv, stdin=stdin, timeout=timeout)

    config = tmp_path / "config.json"
    config.write_bytes(NEW)
    reply = written(OLD, [("readback", len(NEW))], NEW + b"extra")
    result = push_config(
        ThenLocal(reply),
        parse_target(str(config)),
        Authority(label="new.json", data=NEW),
        validate=False,
    )
    assert result.status is PushStatus.WRITTEN, "the file read again holds the bytes sent"
    assert result.readback is not None and result.readback.data == NEW
    assert result.old_data is None, "the old file's bytes did not come back as a part"
    assert any("the host's reply was cut off or malformed" in w for w in result.warnings)
    assert "5 byte(s) more than its parts declare" in result.warnings[0]


def test_the_real_script_frames_an_emptied_file_and_an_old_file_that_begins_with_the_new_bytes(
    tmp_path: Path,
) -> None:
    # A program empties the file right after the rename (the fake `sync`, the step between the
    # rename and the read-back, does it for real). The old file began with the bytes sent.
    fake = tmp_path / "fakebin"
    fake.mkdir()
    model = tmp_path / "model"
    model.mkdir()
    config = model / "config.json"
    (fake / "sync").write_text(f'#!/bin/sh\n/bin/sync "$@"\n: > {config}\n')
    (fake / "sync").chmod(0o755)
    old = NEW + b"data\n"
    config.write_bytes(old)
    shell = PrefixTransport(
        ["/usr/bin/env", f"PATH={fake}:{os.environ.get('PATH', '/usr/bin:/bin')}"], "fake-path"
    )
    proof = write_and_prove(shell, str(config), NEW, WriteOptions())
    assert proof.outcome.status is WriteStatus.WRITTEN, "the script did rename"
    assert proof.outcome.readback_data == b"", "the empty file it read back, not the bytes sent"
    assert proof.old.data == old
    assert proof.readback is not None and proof.readback.data == b"", "described as verify would"
