"""``Include`` in ssh_config (paramiko ignores it): expansion rules, and a real connection to a
host that only an included file defines."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_provision.errors import UsageError
from dflash_provision.transport.options import SshOptions
from dflash_provision.transport.ssh import SshTransport
from dflash_provision.transport.ssh.config import resolve_endpoint
from dflash_provision.transport.ssh.config_files import clear_caches
from testbed.hosts import Fleet
from tests.fixtures.ssh import options_for_fleet


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh" / "config.d").mkdir(parents=True)
    clear_caches()
    return tmp_path


def lookup(config: Path, host: str) -> tuple[str, str, int]:
    endpoint = resolve_endpoint(
        host, user=None, port=None, options=SshOptions(ssh_config_path=str(config))
    )
    return endpoint.hostname, endpoint.user, endpoint.port


def test_relative_globs_are_under_dot_ssh_sorted_and_the_outer_block_resumes(home: Path) -> None:
    ssh = home / ".ssh"
    (ssh / "config.d" / "20-b.conf").write_text("Host gpu-b\n    HostName 10.0.0.2\n")
    (ssh / "config.d" / "10-a.conf").write_text("Host gpu-*\n    User ops\n")
    (ssh / "extra.conf").write_text("Port 2200\n")  # no Host line: belongs to the outer block
    config = ssh / "config"
    config.write_text(
        "Include config.d/*.conf nothing-matches-*.conf\n"
        "Host gpu-a\n"
        "    Include extra.conf\n"
        "    HostName 10.0.0.1\n"
        "Host *\n"
        "    User root\n"
    )
    # gpu-a: its own block holds both the included Port and the HostName after the Include.
    assert lookup(config, "gpu-a") == ("10.0.0.1", "ops", 2200)
    assert lookup(config, "gpu-b") == ("10.0.0.2", "ops", 22)  # 10-a.conf read before 20-b
    assert lookup(config, "other") == ("other", "root", 22)


def test_top_level_lines_after_an_include_stay_global(home: Path) -> None:
    ssh = home / ".ssh"
    (ssh / "config.d" / "only.conf").write_text("Host gpu-b\n    HostName 10.0.0.2\n")
    config = ssh / "config"
    config.write_text("Include config.d/only.conf\nUser everyone\n")
    assert lookup(config, "anything")[1] == "everyone"
    assert lookup(config, "gpu-b") == ("10.0.0.2", "everyone", 22)


def test_an_include_loop_is_a_usage_error(home: Path) -> None:
    config = home / ".ssh" / "config"
    config.write_text("Include config\n")
    with pytest.raises(UsageError, match="Include nested more than 16 deep"):
        lookup(config, "gpu1")


@pytest.mark.integration
@pytest.mark.root
def test_a_host_only_an_included_file_defines_is_reached_and_edits_are_seen(
    fleet: Fleet, tmp_path: Path
) -> None:
    h01, h02 = fleet.hosts[0], fleet.hosts[1]
    assert h01.client is not None
    included = tmp_path / "fleet.conf"
    included.write_text(h01.client.ssh_config.read_text().replace("Host h01", "Host gpu-alias"))
    config = tmp_path / "config"
    config.write_text(f"Include {included}\n")
    options = options_for_fleet(ssh_config_path=str(config))
    with SshTransport("gpu-alias", options=options) as ssh:
        assert ssh.run(["hostname"]).stdout == b"h01\n"
    # The same process, after an edit to the included file only: the new HostName is used.
    included.write_text(included.read_text().replace(h01.address + "\n", h02.address + "\n", 1))
    with SshTransport("gpu-alias", options=options) as ssh:
        assert ssh.run(["hostname"]).stdout == b"h02\n"


def test_blocks_in_a_file_included_inside_a_block_are_refused(home: Path) -> None:
    ssh = home / ".ssh"
    (ssh / "inner.conf").write_text("Host gpu-b\n    Port 2201\n")
    (ssh / "middle.conf").write_text("User only-a\nInclude inner.conf\n")
    config = ssh / "config"
    config.write_text("Host gpu-a\n    Include middle.conf\nHost *\n    User everyone\n")
    # OpenSSH would apply "Host gpu-b" only where "Host gpu-a" applies too (never, here).
    with pytest.raises(UsageError, match=r"inner\.conf: has its own Host block but is included"):
        lookup(config, "gpu-b")
    (ssh / "middle.conf").write_text("User only-a\n")  # options only: fine, and conditional
    assert lookup(config, "gpu-a")[1] == "only-a"
    assert lookup(config, "gpu-b")[1] == "everyone"
