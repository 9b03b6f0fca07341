"""push / verify / rollback over real SSH (sshd in namespaces) and into real busybox LXC
containers, with every failure produced for real. Each failure test checks that the old bytes
are still there and that no temp file is left in the directory.

How each failure is made:
  connection refused     the host's sshd is stopped (nothing listens)
  hung host              the host's sshd is SIGSTOPped (TCP accepts, no banner) -> timeout
  disk full              a 16k tmpfs over the model dir, filled (Host.fill_disk)
  read-only filesystem   a read-only bind mount of the model dir (Host.make_readonly)
  killed mid-write       the per-connection sshd process is SIGKILLed while 24 MB stream in
  not taking effect      an `mv` that exits 0 and does nothing, bind-mounted over the host's
                         /usr/local/bin (first on sshd's PATH)
  container not running  lxc-stop -k
(Permission denied and immutable files are in test_remote_ops.py: root on these hosts bypasses
modes; an unprivileged user via setpriv and chattr +i are used there.)
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from dflash_provision.errors import ContainerError, ExitCode, UnreachableError
from dflash_provision.place.push import (
    NOT_APPLIED_MESSAGE,
    PushResult,
    PushStatus,
    push_config,
    rollback_config,
)
from dflash_provision.remote.ops import WriteStatus, write_remote_config
from dflash_provision.remote.proof import WriteOptions
from dflash_provision.source.authority import Authority
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import open_transport
from testbed import samples
from testbed.hosts import Host
from tests.fixtures.after_rename import install_tool
from tests.fixtures.cli import Done, run_cli
from tests.fixtures.ssh import client_options, host_args, session_sshd_pids

pytestmark = [pytest.mark.integration, pytest.mark.root]

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()
MODEL = "/root/models/Qwen3.6-27B-DFlash"


def loaded(data: bytes) -> Authority:
    return Authority(label="test", data=data)


def host_path(host: Host, remote: str) -> Path:
    """Controller-side path of a file under the host's private /root."""
    assert remote.startswith("/root/")
    return host.root_dir / remote[len("/root/") :]


def seed(host: Host, data: bytes = INCIDENT) -> Path:
    directory = host_path(host, MODEL)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_bytes(data)
    return directory


def push_reference(host: Host, model: str = MODEL) -> PushResult:
    """Push the reference config to ``host:model`` over a fresh SSH connection."""
    target = parse_target(f"{host.alias}:{model}")
    with open_transport(target, client_options(host)) as transport:
        return push_config(transport, target, loaded(REFERENCE))


def remote_listing(host: Host, directory: str) -> list[str]:
    out = host.exec(["ls", "-A", directory], check=True).stdout
    return sorted(out.split())


def temp_files(directory: Path) -> list[str]:
    """Temp files of the write protocol in a model directory (controller-side path): they are
    made in its .dflash-backups (older versions made them beside the config)."""
    names = os.listdir(directory)
    if ".dflash-backups" in names:
        names += os.listdir(directory / ".dflash-backups")
    return [n for n in names if "dflash-tmp" in n]


def assert_old_kept_no_temp(host: Host, directory: str = MODEL, old: bytes = INCIDENT) -> None:
    seen = host.exec(["cat", f"{directory}/config.json"], text=False, check=True).stdout
    assert seen == old
    listed = host.exec(["ls", "-A", directory, f"{directory}/.dflash-backups"]).stdout
    leftovers = [n for n in listed.split() if "dflash-tmp" in n]
    assert leftovers == []


# ---------------------------------------------------------------------------------------------
# the happy path over SSH


def test_push_over_ssh_then_unchanged_then_rollback(ssh_host):
    seed(ssh_host)
    target = parse_target(f"{ssh_host.alias}:{MODEL}")
    with open_transport(target, client_options(ssh_host)) as transport:
        pushed = push_config(transport, target, loaded(REFERENCE))
        assert pushed.status is PushStatus.WRITTEN
        assert "dflash_config.mask_token_id: 248064 → 248070" in pushed.diff.lines
        assert host_path(ssh_host, MODEL + "/config.json").read_bytes() == REFERENCE
        assert pushed.write.durability is not None

        assert push_config(transport, target, loaded(REFERENCE)).status is PushStatus.UNCHANGED

        rolled = rollback_config(transport, target)
        assert rolled.status is PushStatus.WRITTEN
    assert host_path(ssh_host, MODEL + "/config.json").read_bytes() == INCIDENT


def test_hostile_remote_path_over_ssh_is_literal(ssh_host):
    canary = ssh_host.root_dir / "canary"
    weird = "/root/models/sp ace/'q\"/$(touch /root/canary);touch /root/canary;`touch /root/canary`"
    target = parse_target(f"{ssh_host.alias}:{weird}")
    with open_transport(target, client_options(ssh_host)) as transport:
        result = push_config(transport, target, loaded(REFERENCE), write=WriteOptions(mkdir=True))
    assert result.status is PushStatus.WRITTEN
    assert host_path(ssh_host, weird + "/config.json").read_bytes() == REFERENCE
    assert not canary.exists()


def test_cli_push_and_verify_over_ssh(ssh_host):
    seed(ssh_host)
    assert ssh_host.client is not None
    common = host_args(ssh_host)
    spec = f"{ssh_host.alias}:{MODEL}"
    ref = str(samples.REFERENCE_DRAFTER)

    def run(*args: str) -> Done:
        return run_cli(*args, *common, entry_point=True)

    drift = run("verify", spec, "--from", ref)
    assert drift.returncode == ExitCode.DRIFT, drift.stderr
    pushed = run("push", spec, "--from", ref, "--json")
    assert pushed.returncode == 0, pushed.stderr
    assert json.loads(pushed.stdout)["status"] == "written"
    assert run("verify", spec, "--from", ref).returncode == 0


# ---------------------------------------------------------------------------------------------
# failures


def test_connection_refused_is_unreachable_and_leaves_file_alone(ssh_host):
    seed(ssh_host)
    ssh_host.stop()
    target = parse_target(f"{ssh_host.alias}:{MODEL}")
    started = time.monotonic()
    with (
        pytest.raises(UnreachableError),
        open_transport(target, client_options(ssh_host)) as transport,
    ):
        push_config(transport, target, loaded(REFERENCE))
    assert time.monotonic() - started < 10
    directory = host_path(ssh_host, MODEL)
    assert (directory / "config.json").read_bytes() == INCIDENT
    assert sorted(os.listdir(directory)) == ["config.json"]


def test_hung_host_times_out_and_leaves_file_alone(ssh_host):
    seed(ssh_host)
    ssh_host.hang()
    target = parse_target(f"{ssh_host.alias}:{MODEL}")
    try:
        started = time.monotonic()
        with (
            pytest.raises(UnreachableError),
            open_transport(
                target, client_options(ssh_host, connect_timeout=1.0, banner_timeout=1.0)
            ) as transport,
        ):
            push_config(transport, target, loaded(REFERENCE))
        assert time.monotonic() - started < 10
    finally:
        ssh_host.resume()
    assert_old_kept_no_temp(ssh_host)


def test_disk_full_fails_at_the_write_step_and_keeps_old_file(ssh_host):
    seed(ssh_host)
    ssh_host.fill_disk(MODEL)
    result = push_reference(ssh_host)
    assert result.status is PushStatus.FAILED
    assert result.write is not None and result.write.reason == "no-space"
    assert result.failed_step in ("write", "lock", "tmp")
    assert "disk full" in result.message
    assert_old_kept_no_temp(ssh_host)


def test_read_only_filesystem_fails_and_keeps_old_file(ssh_host):
    seed(ssh_host)
    ssh_host.make_readonly(MODEL)
    result = push_reference(ssh_host)
    assert result.status is PushStatus.FAILED
    assert result.write is not None and result.write.reason == "read-only"
    assert_old_kept_no_temp(ssh_host)
    assert remote_listing(ssh_host, MODEL) == ["config.json"]


def test_missing_directory_fails_and_mkdir_creates_it(ssh_host):
    target = parse_target(f"{ssh_host.alias}:/root/models/new/X")
    with open_transport(target, client_options(ssh_host)) as transport:
        refused = push_config(transport, target, loaded(REFERENCE))
        assert (refused.status, refused.failed_step) == (PushStatus.FAILED, "dir")
        assert not host_path(ssh_host, "/root/models/new").exists()
        created = push_config(transport, target, loaded(REFERENCE), write=WriteOptions(mkdir=True))
    assert created.status is PushStatus.WRITTEN
    assert host_path(ssh_host, "/root/models/new/X/config.json").read_bytes() == REFERENCE


def test_symlinked_destination_is_refused(ssh_host):
    directory = seed(ssh_host)
    (directory / "config.json").rename(directory / "real.json")
    (directory / "config.json").symlink_to("real.json")
    result = push_reference(ssh_host)
    assert (result.status, result.failed_step) == (PushStatus.FAILED, "symlink")
    assert (directory / "real.json").read_bytes() == INCIDENT
    assert (directory / "config.json").is_symlink()


def test_connection_killed_mid_write_keeps_old_file_and_leaves_no_temp(ssh_host):
    seed(ssh_host)
    directory = host_path(ssh_host, MODEL)
    payload = b'{"pad": "' + b"x" * 24_000_000 + b'"}\n'
    target = parse_target(f"{ssh_host.alias}:{MODEL}")
    outcome: dict = {}

    def push() -> None:
        try:
            with open_transport(target, client_options(ssh_host)) as transport:
                outcome["result"] = write_remote_config(transport, target.config_path, payload)
        except Exception as exc:  # the transport may raise when its connection dies
            outcome["error"] = exc

    thread = threading.Thread(target=push)
    thread.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if temp_files(directory):
            break
        time.sleep(0.002)
    else:
        pytest.fail("the temp file never appeared")
    for pid in session_sshd_pids(ssh_host):
        os.kill(pid, signal.SIGKILL)
    thread.join(30)
    if "result" in outcome:  # the transport returned what little output arrived
        assert outcome["result"].status is WriteStatus.FAILED
        assert outcome["result"].failed_step in ("verify", "transport")
    # The remote shell sees EOF (short write) or SIGPIPE and cleans up; give it a moment.
    deadline = time.monotonic() + 10
    while temp_files(directory) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert_old_kept_no_temp(ssh_host)


def test_write_that_does_not_take_effect_exits_remote_failed(ssh_host):
    seed(ssh_host)
    install_tool(ssh_host, "mv", "#!/bin/sh\n# reports success, changes nothing\nexit 0\n")
    assert ssh_host.client is not None
    result = run_cli(
        "push",
        f"{ssh_host.alias}:{MODEL}",
        "--from",
        str(samples.REFERENCE_DRAFTER),
        *host_args(ssh_host),
        entry_point=True,
    )
    assert result.returncode == ExitCode.REMOTE_FAILED
    assert NOT_APPLIED_MESSAGE in result.stderr
    assert_old_kept_no_temp(ssh_host)


def test_concurrent_pushes_of_two_configs_leave_one_complete(ssh_host):
    seed(ssh_host)
    target = parse_target(f"{ssh_host.alias}:{MODEL}")
    first = json.dumps({"who": "first", "pad": "a" * 300_000}).encode()
    second = json.dumps({"who": "second", "pad": "b" * 300_000}).encode()
    results: list = []

    def push(data: bytes) -> None:
        with open_transport(target, client_options(ssh_host)) as transport:
            for _ in range(3):
                results.append(write_remote_config(transport, target.config_path, data))

    threads = [threading.Thread(target=push, args=(d,)) for d in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 6 and all(r.ok for r in results)
    final = host_path(ssh_host, MODEL + "/config.json").read_bytes()
    assert final in (first, second)
    json.loads(final)
    assert not temp_files(host_path(ssh_host, MODEL))


# ---------------------------------------------------------------------------------------------
# LXC containers


@pytest.mark.lxc
def test_push_into_busybox_container_through_ssh_host(lxc_container_on_host):
    container = lxc_container_on_host
    host = container.host
    container.attach(["mkdir", "-p", "/models/X"])
    container.attach(["sh", "-c", "cat > /models/X/config.json"], stdin=INCIDENT)
    target = parse_target(f"{host.alias}/lxc:{container.name}:/models/X")
    with open_transport(target, client_options(host)) as transport:
        result = push_config(transport, target, loaded(REFERENCE))
        assert result.status is PushStatus.WRITTEN, result.message
        assert result.write.lock_method == "mkdir", "busybox has no flock: the mkdir lock"
        assert (container.rootfs / "models/X/config.json").read_bytes() == REFERENCE
        assert push_config(transport, target, loaded(REFERENCE)).status is PushStatus.UNCHANGED

        container.stop()
        with pytest.raises(ContainerError):
            push_config(transport, target, loaded(INCIDENT))
    assert (container.rootfs / "models/X/config.json").read_bytes() == REFERENCE
    assert not temp_files(container.rootfs / "models/X")
    assert hashlib.sha256(REFERENCE).hexdigest() == result.new_sha256
