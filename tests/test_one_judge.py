"""One judge (file_status.judge) for a host's file, one exit-code table: a reformatted copy of the
authoritative config (same values, other bytes) is ``same_values`` in every command, and each
command does what its row of file_status.EXIT_CODE says with it.

The integration test runs the CLI in subprocesses against a real sshd host with the vLLM
stand-in (tests/fixtures/lifecycle_bed.py), as the lifecycle tests do.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from dflash_provision.host_state.file_status import (
    EXIT_CODE,
    NEEDS_WRITE,
    PASSES_WITH_WARNING,
    Command,
    HostStatus,
    judge,
)
from dflash_provision.remote.ops import ReadStatus, RemoteRead
from dflash_provision.source.authority import Authority
from testbed.hosts import Host
from tests.fixtures.lifecycle_bed import Bed, make_bed
from tests.fixtures.runtime import DRAFTER_DIR, REFERENCE, put

# The reference drafter, reformatted: other indentation, keys sorted, no final newline.
REFORMATTED = json.dumps(json.loads(REFERENCE), indent=4, sort_keys=True).encode()


def _read(data: bytes) -> RemoteRead:
    import hashlib

    return RemoteRead("/m/config.json", ReadStatus.PRESENT, data, hashlib.sha256(data).hexdigest())


def test_every_command_maps_every_status_to_an_exit_code() -> None:
    for command in Command:
        assert set(EXIT_CODE[command]) == set(HostStatus), command
    # A lock pins bytes: the provisioning commands count other bytes as drift...
    assert EXIT_CODE[Command.VERIFY][HostStatus.SAME_VALUES] is ExitCode.DRIFT
    assert EXIT_CODE[Command.AUDIT][HostStatus.SAME_VALUES] is ExitCode.DRIFT
    assert HostStatus.SAME_VALUES in NEEDS_WRITE  # repair writes the exact bytes
    # ...the runtime ones let it pass, with a warning that names it.
    for command in (Command.LAUNCH, Command.RUNTIME_CHECK):
        assert EXIT_CODE[command][HostStatus.SAME_VALUES] is ExitCode.OK
        assert HostStatus.SAME_VALUES in PASSES_WITH_WARNING[command]
    assert {code for status, code in EXIT_CODE[Command.LAUNCH].items() if status.needs_write} == {
        ExitCode.OK,
        ExitCode.DRIFT,
    }


def test_the_judge_tells_the_exact_bytes_from_the_same_values_in_other_bytes() -> None:
    authority = Authority(label="ref", data=REFERENCE)
    assert judge(_read(REFERENCE), authority).status is HostStatus.IN_SYNC
    same = judge(_read(REFORMATTED), authority)
    assert same.status is HostStatus.SAME_VALUES
    assert same.changes == ()
    assert "same values as ref, other bytes" in same.detail
    assert judge(RemoteRead("/m/config.json", ReadStatus.MISSING), authority).status is (
        HostStatus.MISSING
    )


@pytest.fixture
def bed(ssh_host: Host, tmp_path: Path) -> Iterator[Bed]:
    yield make_bed(ssh_host, tmp_path)


@pytest.mark.integration
@pytest.mark.root
def test_a_reformatted_file_is_same_values_in_every_command(bed: Bed) -> None:
    put(bed.host, f"{DRAFTER_DIR}/config.json", REFORMATTED)
    fleet_args = (bed.target, "--from", str(bed.authority), *bed.ssh())

    verify = bed.cli.run("verify", *fleet_args)
    assert verify.returncode == ExitCode.DRIFT, verify.stdout + verify.stderr
    assert verify.stdout.startswith(f"same_values: {bed.target}: "), verify.stdout
    verified = json.loads(bed.cli.run("verify", *fleet_args, "--json").stdout)
    assert verified["status"] == "same_values" and verified["formatting_only"] is True

    audit = bed.cli.run("audit", *fleet_args, "--json")
    assert audit.returncode == ExitCode.DRIFT, audit.stdout + audit.stderr
    (host,) = json.loads(audit.stdout)["hosts"]
    assert host["status"] == "same_values", host

    dry = bed.cli.run("repair", *fleet_args, "--dry-run", "--json")
    assert dry.returncode == ExitCode.DRIFT, dry.stdout + dry.stderr
    (planned,) = json.loads(dry.stdout)["hosts"]
    assert planned["action"] == "would_write"

    # launch's pre-flight and runtime-check stage a: the server loads the same values; both
    # pass, and both say so by the status's name.
    launched = bed.launch("--python", bed.standin.python, check=True)
    try:
        assert launched.returncode == 0, launched.stdout + launched.stderr
        assert "warning: same_values: " in launched.stderr, launched.stderr
        assert f"drafter {DRAFTER_DIR} same_values" in launched.stdout
        assert "runtime-check passed" in launched.stdout, launched.stdout
        checked = bed.launch("--python", bed.standin.python, "--json", check=True)
        data = json.loads(checked.stdout)
        assert data["launch"]["preflight"]["file_status"] == "same_values"
        (stage_a,) = [s for s in data["runtime_check"]["stages"] if s["stage"] == "a"]
        assert stage_a["status"] == "passed"
        assert stage_a["data"]["file_status"] == "same_values"
        assert any(w.startswith("same_values: ") for w in stage_a["warnings"]), stage_a
    finally:
        bed.run("stop")

    repaired = bed.cli.run("repair", *fleet_args, "--json")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    (done,) = json.loads(repaired.stdout)["hosts"]
    assert done["action"] == "wrote" and done["after"]["status"] == "in_sync", done
    assert bed.sh('cat "$1"', f"{DRAFTER_DIR}/config.json").encode() == REFERENCE
    again = bed.cli.run("verify", *fleet_args)
    assert again.returncode == 0 and again.stdout.startswith("in_sync: "), again.stdout
