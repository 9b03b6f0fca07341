"""What audit and repair print for a fleet, read as a user reads it (issue 31, item 9): a fleet
drifted one way shows its diff once (and ``--brief`` one line per host), no word (a path, a
sha256) is cut in the middle at 80 columns, and one host is "1 host".

Local targets (``/abs/dir``) go through the same read and write scripts as remote hosts and the
same table code; the real CLI in-process (run_cli_in_process), piped, at the COLUMNS given.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from tests.fixtures.cli import Done, run_cli_in_process

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()
LAST_CHANGE = "use_sliding_window: false → true"  # the incident diff's last line


@pytest.fixture
def short(tmp_path: Path) -> Iterator[Path]:
    """A directory with a short name (pytest's are ~70 characters: a host name that long fills
    an 80-column line by itself)."""
    base = Path(tempfile.mkdtemp(prefix="fo", dir="/tmp"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def fleet(tmp_path: Path, count: int, data: bytes, name: str = "gpu") -> list[str]:
    hosts = []
    for i in range(1, count + 1):
        directory = tmp_path / f"{name}{i:02d}"
        directory.mkdir(parents=True)
        (directory / "config.json").write_bytes(data)
        hosts.append(str(directory))
    return hosts


def run(tmp_path: Path, *args: str, columns: int = 80) -> Done:
    return run_cli_in_process(
        *args, cwd=tmp_path, home=tmp_path / "home", env={"COLUMNS": str(columns)}
    )


def test_a_fleet_drifted_one_way_shows_its_diff_once(short: Path) -> None:
    tmp_path = short
    hosts = fleet(tmp_path, 6, INCIDENT)
    authority = tmp_path / "authority.json"
    authority.write_bytes(REFERENCE)
    done = run(tmp_path, "audit", *hosts, "--from", str(authority))
    assert done.returncode == ExitCode.DRIFT, done.stderr
    assert done.stdout.count(LAST_CHANGE) == 1, done.stdout
    assert done.stdout.count(f"the same 11 change(s) as {hosts[0]}") == len(hosts) - 1
    assert len(done.stdout.splitlines()) < 6 + 11 + 12  # was 6 x 11 diff lines

    brief = run(tmp_path, "audit", *hosts, "--from", str(authority), "--brief")
    assert LAST_CHANGE not in brief.stdout
    assert brief.stdout.count("(+10 more)") == 6

    dry = run(tmp_path, "repair", *hosts, "--from", str(authority), "--dry-run")
    assert dry.stdout.count(LAST_CHANGE) == 1, dry.stdout


def test_no_word_is_cut_at_80_columns(short: Path) -> None:
    """A path or a sha256 longer than the room its column has goes under the row whole, not
    folded mid-word ('qwen3.6-27b-dflash.con' / 'fig.json')."""
    tmp_path = short
    deep = tmp_path / "authoritative-configs"
    deep.mkdir()
    authority = deep / "qwen3.6-27b-dflash.config.json"
    authority.write_bytes(REFERENCE)
    hosts = fleet(tmp_path, 2, REFERENCE, name="inference-host-with-a-long-name-")
    done = run(tmp_path, "audit", *hosts, "--from", str(authority))
    assert done.returncode == ExitCode.OK, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), done.stdout
    words = done.stdout.split()
    assert words.count(str(authority)) == 2, done.stdout  # the whole path, for each host
    assert all(host in words for host in hosts)


def test_one_host_is_one_host(tmp_path: Path) -> None:
    (host,) = fleet(tmp_path, 1, INCIDENT)
    authority = tmp_path / "authority.json"
    authority.write_bytes(REFERENCE)
    done = run(tmp_path, "repair", host, "--from", str(authority))
    assert done.returncode == ExitCode.OK, done.stderr
    assert "1 host: 1 wrote; 1 in sync now" in done.stdout
    assert "1 hosts" not in done.stdout


def test_an_interrupted_run_of_one_host_says_one_host() -> None:
    from dflash_provision.fleet.interrupt import FleetInterrupted

    stopped = FleetInterrupted([], ["h01"], [])
    assert stopped.summary(1, "audited") == "interrupted: 0 of 1 host audited, 1 not contacted"
    assert stopped.summary(2, "audited").startswith("interrupted: 0 of 2 hosts audited")


def test_a_long_report_line_wraps_at_the_terminal_width_without_breaking_a_word() -> None:
    from dflash_provision.cli._render import wrapped

    sha = "06649215322bee7dd3fb2d2dd4ac82d7bc112e5543804b3b44c5585c02a65a6d"
    line = (
        "    warning: dflash_config.target_layer_ids [1, 17, 33, 49, 63] differ from the reference "
        f"default spacing for 64 target layers (sha256 {sha}); fine only if trained so"
    )
    parts = wrapped(line, 80)
    assert len(parts) > 1 and all(len(p) <= 80 for p in parts if sha not in p)
    assert parts[0].startswith("    warning: ") and all(p.startswith("      ") for p in parts[1:])
    assert any(sha in p for p in parts)  # a sha stays one token, on a line of its own if need be
    assert " ".join(p.strip() for p in parts) == line.strip()  # nothing lost
    assert wrapped(line, None) == [line]  # piped: unchanged, for grep
