"""Fleet statuses for faults the 22-host scenario does not cover, and per-host cost rules."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from dflash_provision.errors import AuthError, UnreachableError
from dflash_provision.fleet import FleetRun, HostStatus, audit, authority_loader, classify_exception
from dflash_provision.fleet.run import Memo
from dflash_provision.inventory import FleetMember
from dflash_provision.source.authority import SourceSpec
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import Connector
from dflash_provision.transport.options import SshOptions
from testbed import samples
from testbed.hosts import _ensure_ed25519

MODEL = "/root/models/Qwen3.6-27B-DFlash"
SOURCE = SourceSpec(from_file=str(samples.REFERENCE_DRAFTER))


def member(spec: str, name: str = "m") -> FleetMember:
    return FleetMember(name, parse_target(spec), SOURCE)


@pytest.mark.integration
@pytest.mark.root
def test_wrong_key_is_auth_failed_and_missing_container_is_reported(ssh_host, tmp_path: Path):
    assert ssh_host.client is not None
    other_key = tmp_path / "id_other"
    _ensure_ed25519(other_key, "not-authorized")
    wrong_key = SshOptions(
        connect_timeout=3,
        ssh_config_path=None,
        known_hosts_path=str(ssh_host.client.known_hosts),
        identity_files=(str(other_key),),
        identities_only=True,
        use_agent=False,
    )
    (result,) = audit(
        [member(ssh_host.ssh_target(MODEL))],
        authority_loader(),
        connector=Connector(wrong_key),
    )
    assert result.status is HostStatus.AUTH_FAILED, result.detail

    if shutil.which("lxc-attach") is None:
        pytest.skip("lxc tools not installed")
    options = SshOptions(
        connect_timeout=3,
        ssh_config_path=str(ssh_host.client.ssh_config),
        use_agent=False,
    )
    (container,) = audit(
        [member(f"{ssh_host.alias}/lxc:no-such-ct:{MODEL}")],
        authority_loader(),
        connector=Connector(options),
    )
    assert container.status is HostStatus.CONTAINER_NOT_RUNNING, container.detail
    assert "no-such-ct" in container.detail


def test_connection_failure_reasons_map_to_distinct_statuses():
    cases = [
        (UnreachableError("connection refused", reason="refused"), HostStatus.UNREACHABLE_REFUSED),
        (UnreachableError("timed out (banner)", reason="timeout"), HostStatus.UNREACHABLE_TIMEOUT),
        (UnreachableError("cannot resolve host", reason="network"), HostStatus.UNREACHABLE),
        (AuthError("host key CHANGED", reason="host-key-changed"), HostStatus.HOST_KEY_CHANGED),
        (AuthError("host key unknown", reason="host-key-unknown"), HostStatus.HOST_KEY_UNKNOWN),
        (AuthError("authentication failed", reason="auth"), HostStatus.AUTH_FAILED),
        (AuthError("sudo -n refused", reason="sudo"), HostStatus.AUTH_FAILED),
    ]
    for error, status in cases:
        assert classify_exception(error)[0] is status, error.message
    # A handshake that died only after the whole banner timeout is a timeout, whatever the words.
    late = UnreachableError("ssh handshake with root@h1 failed: EOF", reason="network")
    assert (
        classify_exception(late, waited_s=10.0, timeout_s=10.0)[0] is HostStatus.UNREACHABLE_TIMEOUT
    )
    assert classify_exception(late, waited_s=0.1, timeout_s=10.0)[0] is HostStatus.UNREACHABLE


def test_memo_computes_once_per_key_across_threads():
    memo = Memo()
    calls: list[str] = []
    gate = threading.Event()

    def compute(key: str) -> str:
        gate.wait(5)
        calls.append(key)
        return key.upper()

    results: list[str] = []
    threads = [
        threading.Thread(target=lambda k=k: results.append(memo.get(k, lambda: compute(k))))
        for k in ["a"] * 10 + ["b"] * 10
    ]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join()
    assert sorted(calls) == ["a", "b"]
    assert sorted(results) == ["A"] * 10 + ["B"] * 10


def test_identical_files_are_judged_once(tmp_path: Path):
    run = FleetRun(authority_loader())
    authority = run.authority(member(f"/x{MODEL}"))
    incident = samples.INCIDENT_DRAFTER.read_bytes()
    import hashlib

    from dflash_provision.remote.ops import ReadStatus, RemoteRead

    def read(data: bytes) -> RemoteRead:
        sha = hashlib.sha256(data).hexdigest()
        return RemoteRead(f"{MODEL}/config.json", ReadStatus.PRESENT, data, sha)

    verdicts = [run.verdict(read(incident), authority) for _ in range(5)]
    assert len({id(v) for v in verdicts}) == 1, "one judgement, remembered"
    assert verdicts[0].status is HostStatus.DRIFTED
    assert run.validations == 1
    # The authoritative bytes themselves are never validated again.
    assert run.verdict(read(authority.data), authority).status is HostStatus.IN_SYNC
    assert run.validations == 1
