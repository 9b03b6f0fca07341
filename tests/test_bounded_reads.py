"""Every read of a config is bounded at 1 MiB (a published DFlash config is about 2 KB).

Local SOURCEs: a FIFO, /dev/zero or another device is refused without being opened (nothing
waits on it); a regular file over the limit is refused without being read whole. Remote reads
(read, verify, push's read-back, the fleet audit's bytes-only read): the remote side stops
sending past the limit, so a 2 GB config.json on a host costs the controller about 1 MiB. The
audit test measures the controller's peak RSS (os.wait4 of the CLI process) with and without
big files on every host and prints both figures.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dflash_provision.cli._sources import MAX_SOURCE_BYTES, load_source
from dflash_provision.errors import ExitCode, UsageError
from dflash_provision.host_state.file_status import HostStatus
from dflash_provision.place.push import PushStatus, push_config, verify_config
from dflash_provision.remote.ops import (
    MAX_CONFIG_BYTES,
    ReadStatus,
    read_remote_config,
)
from dflash_provision.remote.protocol import script_text
from dflash_provision.source.authority import Authority
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import open_transport
from testbed import samples
from tests.fixtures.cli import run_cli
from tests.fixtures.inventories import write_fleet_inventory
from tests.fixtures.ssh import client_options, host_args

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
MODEL = "/root/models/X"


def test_the_limit_is_the_same_on_both_sides_of_the_wire():
    assert MAX_CONFIG_BYTES == MAX_SOURCE_BYTES == 1024 * 1024
    assert f"max_bytes={MAX_CONFIG_BYTES}\n" in script_text("read")


# ---------------------------------------------------------------------------------------------
# local SOURCEs


def test_a_fifo_source_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    caught: list[BaseException] = []

    def load() -> None:
        try:
            load_source(str(fifo))
        except BaseException as exc:  # handed to the test thread
            caught.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(30)  # a bound for a broken build only: a FIFO nobody writes never answers
    assert not thread.is_alive(), "load_source waited on the FIFO"
    [error] = caught
    assert isinstance(error, UsageError)
    assert "a FIFO, not a regular file" in error.message


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null", "/dev/urandom"])
def test_a_device_source_is_refused_as_a_one_line_usage_error(device):
    result = run_cli("validate", device)
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert result.stderr.strip() == (
        f"error: {device}: a character device, not a regular file: refusing to read it"
    )


def test_a_source_over_one_mib_is_refused_and_one_at_the_limit_is_read(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as handle:
        handle.truncate(2 * 1024**3)  # 2 GB, sparse: reading it whole would be the bug
    with pytest.raises(UsageError) as caught:
        load_source(str(big))
    assert "larger than 1 MiB" in caught.value.message
    at_limit = tmp_path / "limit.json"
    at_limit.write_bytes(b" " * MAX_SOURCE_BYTES)
    assert len(load_source(str(at_limit)).data) == MAX_SOURCE_BYTES


# ---------------------------------------------------------------------------------------------
# remote reads


def big_config(host, size: int = 2 * 1024**3) -> Path:  # type: ignore[no-untyped-def]
    directory = host.root_dir / "models" / "X"
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "config.json"
    with open(config, "wb") as handle:
        handle.write(b'{"pad": "')
        handle.truncate(size)
    return config


@pytest.mark.integration
@pytest.mark.root
def test_remote_reads_of_a_2gb_config_stop_at_the_limit_and_say_so(ssh_host):
    big_config(ssh_host)
    target = parse_target(f"{ssh_host.alias}:{MODEL}")
    with open_transport(target, client_options(ssh_host)) as transport:
        for metadata, remote_hash in ((True, True), (False, True), (False, False)):
            read = read_remote_config(
                transport, target.config_path, metadata=metadata, remote_hash=remote_hash
            )
            assert read.status is ReadStatus.TOO_LARGE, (metadata, remote_hash, read.status)
            assert read.data is None
            assert "larger than 1 MiB" in read.describe()
        # With metadata the size is known first: nothing is hashed or sent.
        assert "2147483648 bytes" in read_remote_config(transport, target.config_path).message
        verified = verify_config(transport, target, Authority(label="ref", data=REFERENCE))
        assert verified.status is HostStatus.ERROR
        assert "larger than 1 MiB" in verified.message
        # A push replaces it (the old bytes are not brought over: the diff says so).
        pushed = push_config(transport, target, Authority(label="ref", data=REFERENCE))
        assert pushed.status is PushStatus.WRITTEN, pushed.message
        assert pushed.diff is not None and pushed.diff.note
    assert (ssh_host.root_dir / "models/X/config.json").read_bytes() == REFERENCE


@pytest.mark.integration
@pytest.mark.root
def test_cli_diff_and_verify_of_a_big_remote_config_are_one_line_errors(ssh_host, tmp_path):
    big_config(ssh_host, 50 * 1024 * 1024)
    assert ssh_host.client is not None
    conn = host_args(ssh_host)
    spec = f"{ssh_host.alias}:{MODEL}"
    verify = run_cli("verify", spec, "--from", str(samples.REFERENCE_DRAFTER), *conn, home=tmp_path)
    assert "larger than 1 MiB" in verify.stdout + verify.stderr
    assert verify.returncode not in (0, 1), verify.stderr
    assert "Traceback" not in verify.stderr


# ---------------------------------------------------------------------------------------------
# the controller's memory in a fleet audit


def audit_peak_rss_kib(fleet, inventory: Path, home: Path) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    """Run `audit` as its own process; its peak RSS (KiB, from wait4) and its stdout."""
    assert fleet.client is not None
    out = home / "audit.out"
    with open(out, "w") as stdout:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dflash_provision",
                "audit",
                "-i",
                str(inventory),
                "--ssh-config",
                str(fleet.client.ssh_config),
                "--known-hosts",
                str(fleet.client.known_hosts),
                "--no-agent",
            ],
            stdout=stdout,
            stderr=subprocess.STDOUT,
            env={**os.environ, "DFLASH_PROVISION_HOME": str(home), "COLUMNS": "200"},
        )
        _, _, usage = os.wait4(proc.pid, 0)
    return usage.ru_maxrss, out.read_text()


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.slow
def test_audit_of_hosts_holding_200mb_configs_uses_about_the_memory_of_a_normal_audit(
    make_fleet, tmp_path
):
    hosts = 16
    fleet = make_fleet(hosts)
    inventory = tmp_path / "inventory.yaml"
    write_fleet_inventory(inventory, (h.name for h in fleet.hosts), model=MODEL)
    for host in fleet.hosts:
        directory = host.root_dir / "models" / "X"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_bytes(REFERENCE)
    normal, report = audit_peak_rss_kib(fleet, inventory, tmp_path)
    assert report.count("in sync") >= hosts or report.count("in_sync") >= hosts, report
    for host in fleet.hosts:
        big_config(host, 200 * 1024 * 1024)
    big, report = audit_peak_rss_kib(fleet, inventory, tmp_path)
    assert report.count("larger than 1 MiB") >= hosts, report
    print(
        f"\naudit of {hosts} hosts: controller peak RSS {normal / 1024:.0f} MiB with ~2 KB "
        f"configs, {big / 1024:.0f} MiB with a 200 MB config.json on every host "
        f"(the files total {hosts * 200} MB)"
    )
    # Each host costs at most ~1 MiB more (its bounded read), never its file's 200 MB.
    assert big - normal < hosts * 2 * 1024 + 32 * 1024
