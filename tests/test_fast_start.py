"""Fast start: a config this machine has judged is not judged again, and transformers (~2 s to
import) is loaded only for a config it has not seen (dflash_provision.validation.verdict_cache).

The subprocess tests run the real CLI under ``python -X importtime``, which lists every module a
process imported on stderr: "transformers" absent from that list is what "did not import
transformers" means, without any timing. The same list guards the rest of the fast start: what
a second push, audit, verify or repair does not need (rich, jsonschema, invoke, http.client) is
not imported either. bench/bench_startup.py measures the times.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from dflash_provision.validation import verdict_cache
from dflash_provision.validation.validate import validate_config
from testbed import samples
from testbed.hosts import Host, refused_address
from tests.fixtures.cli import (
    CLI_TIMEOUT_S,
    IMPORTTIME,
    Done,
    cli_env,
    imported_modules,
    loaded,
    run_cli,
    without_importtime,
)

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()
MODEL = "/root/models/Qwen3.6-27B-DFlash"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh data directory (history and verdict cache) for this test only."""
    directory = tmp_path / "home"
    monkeypatch.setenv("DFLASH_PROVISION_HOME", str(directory))
    monkeypatch.delenv(verdict_cache.DISABLE_ENV, raising=False)
    return directory


def entries(home: Path) -> list[Path]:
    return sorted((home / "verdicts").rglob("*.json"))


# ---------------------------------------------------------------------------------------------
# the cache itself (in-process, real transformers on the first validation)


@pytest.mark.integration
def test_second_validation_of_the_same_bytes_reads_the_cached_verdict(home: Path) -> None:
    first = validate_config(INCIDENT, label="first")
    assert len(entries(home)) == 1
    second = validate_config(INCIDENT, label="second")
    assert second.source == "second"
    assert second.layers == first.layers
    assert [f.to_dict() for f in second.findings] == [f.to_dict() for f in first.findings]


@pytest.mark.integration
def test_cached_verdict_keeps_loader_findings_and_comparisons_still_run(home: Path) -> None:
    doc = samples.load_json(samples.REFERENCE_DRAFTER)
    doc["use_sliding_window"] = False
    normalised = json.dumps(doc).encode()
    first = validate_config(normalised, label="x")
    again = validate_config(normalised, label="x", against=REFERENCE)
    assert again.layers["effective"] == first.layers["effective"] == "failed"
    assert any("set use_sliding_window: true" in f.message for f in again.findings)
    # --against is not part of the cached verdict: it is compared every time.
    assert again.layers["against"] == "failed"
    assert any(f.path == "use_sliding_window" for f in again.findings_for("against"))


def test_a_file_that_does_not_parse_is_not_worth_an_entry(home: Path) -> None:
    report = validate_config(b"{", label="x")
    assert report.layers["effective"] == "skipped"
    assert entries(home) == []


@pytest.mark.integration
def test_a_corrupt_or_foreign_entry_is_ignored_and_replaced(home: Path) -> None:
    first = validate_config(INCIDENT, label="x")
    (entry,) = entries(home)
    entry.write_text("{not json")
    again = validate_config(INCIDENT, label="x")
    assert again.layers == first.layers
    assert json.loads(entry.read_text())["format"] == verdict_cache.FORMAT
    foreign = json.loads(entry.read_text())
    foreign["layers"]["effective"] = [{"layer": "schema", "path": "", "message": "planted"}]
    entry.write_text(json.dumps(foreign))
    assert "planted" not in str(validate_config(INCIDENT, label="x").to_dict())


def test_the_key_changes_with_the_transformers_version(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = verdict_cache.entry_path(REFERENCE, None)
    verdict_cache.rules_digest.cache_clear()
    monkeypatch.setattr(verdict_cache, "transformers_version", lambda: "0.0.0-other")
    try:
        after = verdict_cache.entry_path(REFERENCE, None)
    finally:
        verdict_cache.rules_digest.cache_clear()
    assert before.name == after.name  # same bytes
    assert before.parent != after.parent  # other rules: another verdict


@pytest.mark.integration
def test_an_unwritable_data_directory_only_loses_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("DFLASH_PROVISION_HOME", str(blocker))
    report = validate_config(INCIDENT, label="x")  # stores nowhere, says nothing
    assert report.ok


@pytest.mark.integration
def test_the_cache_can_be_turned_off(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(verdict_cache.DISABLE_ENV, "1")
    validate_config(INCIDENT, label="x")
    assert entries(home) == []


# ---------------------------------------------------------------------------------------------
# the real CLI: what a second command imports

# Slow to import and not needed once a config's verdict is cached: transformers (~2 s),
# jsonschema (the schema layer, cached with the verdict), rich (a piped table that fits),
# invoke (paramiko's, for ssh_config ``Match exec`` only), http.client (only the Hub needs it),
# difflib (only a mistyped command), email (importlib.metadata's, for paramiko's __version__).
NOT_NEEDED = ("transformers", "jsonschema", "rich", "http.client", "difflib", "email")


def run(workdir: Path, home: Path, *args: str, base_env: dict[str, str] | None = None) -> Done:
    # A wide "terminal" for the piped tables, whatever runs the tests: without COLUMNS a pipe is
    # 80 wide (as under pytest-xdist), a drifted host's table no longer fits and rich is loaded.
    return run_cli(
        *args,
        cwd=workdir,
        home=home,
        env={"COLUMNS": "200"},
        base_env=base_env,
        python_options=IMPORTTIME,
    )


def needless_imports(done: Done) -> list[str]:
    """What of NOT_NEEDED (and invoke beyond paramiko's failed ``import invoke``) ``done``
    imported."""
    found = [name for name in NOT_NEEDED if loaded(done, name)]
    if any(m.startswith("invoke.") for m in imported_modules(done)):
        found.append("invoke")
    return found


def ssh_args(host: Host) -> list[str]:
    assert host.client is not None
    return ["--ssh-config", str(host.client.ssh_config)]


@pytest.mark.integration
@pytest.mark.root
def test_second_push_and_repair_of_the_same_config_do_not_import_transformers(
    ssh_host: Host, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_bytes(REFERENCE)
    target = f"{ssh_host.alias}:{MODEL}"
    home = tmp_path / "home"
    push = ["push", target, "--from", "config.json", "--mkdir", *ssh_args(ssh_host)]
    first = run(tmp_path, home, *push)
    assert first.returncode == 0, without_importtime(first.stderr)
    assert loaded(first, "transformers"), "a config's first validation loads transformers"
    second = run(tmp_path, home, *push)
    assert second.returncode == 0, without_importtime(second.stderr)
    assert "unchanged" in second.stdout
    assert needless_imports(second) == []

    # The host drifts to a file this machine has judged before (validate did): repair needs
    # neither verdict anew.
    (tmp_path / "incident.json").write_bytes(INCIDENT)
    judged = run(tmp_path, home, "validate", "incident.json")
    assert judged.returncode == 0 and loaded(judged, "transformers")
    again = run(tmp_path, home, "validate", "incident.json")
    assert again.stdout == judged.stdout
    assert needless_imports(again) == [] and not loaded(again, "paramiko")
    assert not loaded(again, "sqlite3")  # the verdict cache's directory, not the history store
    (ssh_host.root_dir / MODEL.removeprefix("/root/") / "config.json").write_bytes(INCIDENT)
    repair = ["repair", target, "--from", "config.json", *ssh_args(ssh_host)]
    fixed = run(tmp_path, home, *repair)
    assert fixed.returncode == 0, fixed.stdout + without_importtime(fixed.stderr)
    assert "wrote" in fixed.stdout
    assert needless_imports(fixed) == []  # its table went to a pipe, and fits: no rich


@pytest.mark.integration
@pytest.mark.root
def test_a_second_push_of_the_locked_config_reads_it_from_the_cache_without_http(
    ssh_host: Host, tmp_path: Path, hub_env: dict[str, str]
) -> None:
    """As a user meets it: ``fetch`` wrote dflash.lock and the HF cache; a push reads both."""
    home = tmp_path / "home"
    fetched = run_cli(
        "fetch",
        samples.REFERENCE_REPO,
        "-o",
        "config.json",
        cwd=tmp_path,
        home=home,
        base_env=hub_env,
    )
    assert fetched.returncode == 0, without_importtime(fetched.stderr)
    push = ["push", f"{ssh_host.alias}:{MODEL}", *ssh_args(ssh_host)]
    first = run(tmp_path, home, *push, "--mkdir", base_env=hub_env)
    assert first.returncode == 0, without_importtime(first.stderr)
    assert "(from dflash.lock)" in first.stdout
    second = run(tmp_path, home, *push, base_env=hub_env)
    assert second.returncode == 0, without_importtime(second.stderr)
    assert "unchanged" in second.stdout
    assert needless_imports(second) == []


@pytest.mark.integration
@pytest.mark.root
def test_second_audit_of_a_drifted_host_does_not_import_transformers(
    ssh_host: Host, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_bytes(REFERENCE)
    model = ssh_host.root_dir / MODEL.removeprefix("/root/")
    model.mkdir(parents=True)
    (model / "config.json").write_bytes(INCIDENT)
    home = tmp_path / "home"
    audit = ["audit", f"{ssh_host.alias}:{MODEL}", "--from", "config.json", *ssh_args(ssh_host)]
    first = run(tmp_path, home, *audit)
    assert first.returncode == ExitCode.DRIFT, first.stdout + without_importtime(first.stderr)
    assert loaded(first, "transformers")  # the host's file was judged the first time
    second = run(tmp_path, home, *audit)
    assert second.returncode == ExitCode.DRIFT
    assert "drifted" in second.stdout
    assert needless_imports(second) == []
    # The table rich would have printed, each changed field on its own line.
    header, row, *fields, summary = second.stdout.splitlines()
    assert header.split() == ["host", "status", "detail"]
    assert row.startswith(f"{ssh_host.alias}:{MODEL}  drifted  ")
    detail_column = " " * (row.index("drifted") + len("drifted  "))
    assert fields and all(line.startswith(detail_column) for line in fields)
    assert summary.startswith("1 host: 1 drifted")
    verify = ["verify", f"{ssh_host.alias}:{MODEL}", "--from", "config.json", *ssh_args(ssh_host)]
    checked = run(tmp_path, home, *verify)
    assert checked.returncode == ExitCode.DRIFT
    assert needless_imports(checked) == []


@pytest.mark.integration
def test_push_to_an_unreachable_host_fails_before_validating(tmp_path: Path) -> None:
    # A config no validation has seen: validating it first would load transformers.
    doc = samples.load_json(samples.REFERENCE_DRAFTER)
    doc["_comment"] = "never validated on this machine"
    (tmp_path / "fresh.json").write_text(json.dumps(doc))
    address, port = refused_address()
    done = run(
        tmp_path,
        tmp_path / "home",
        "push",
        f"ssh://root@{address}:{port}/root/models/x",
        "--from",
        "fresh.json",
        "--connect-timeout",
        "2",
    )
    assert done.returncode == ExitCode.UNREACHABLE, without_importtime(done.stderr)
    assert "refused" in without_importtime(done.stderr)
    assert needless_imports(done) == []


@pytest.mark.integration
@pytest.mark.root
def test_an_ssh_config_match_exec_line_still_runs_its_command(
    ssh_host: Host, tmp_path: Path
) -> None:
    """paramiko is imported without invoke; a config with ``Match exec`` brings it back."""
    assert ssh_host.client is not None
    (tmp_path / "config.json").write_bytes(REFERENCE)
    marker = tmp_path / "on-the-vpn"
    address, _ = refused_address()
    # The host's block points nowhere; only a Match exec that succeeds gives the real address.
    block = ssh_host.client.ssh_config.read_text().replace(ssh_host.address, address)
    config = tmp_path / "ssh_config"
    config.write_text(f'Match exec "test -e {marker}"\n    HostName {ssh_host.address}\n{block}')
    push = ["push", f"{ssh_host.alias}:{MODEL}", "--from", "config.json", "--mkdir"]
    push += ["--ssh-config", str(config), "--connect-timeout", "2"]
    home = tmp_path / "home"
    refused = run(tmp_path, home, *push)
    assert refused.returncode == ExitCode.UNREACHABLE, refused.stdout + without_importtime(
        refused.stderr
    )
    assert address in without_importtime(refused.stderr)
    marker.touch()
    pushed = run(tmp_path, home, *push)
    assert pushed.returncode == 0, pushed.stdout + without_importtime(pushed.stderr)
    assert "written" in pushed.stdout
    assert any(m.startswith("invoke.") for m in imported_modules(pushed))


def test_paramiko_gets_its_true_version_and_importlib_metadata_is_the_real_one_after() -> None:
    """paramiko is imported with a stand-in for importlib.metadata (paramiko_import.py)."""
    probe = (
        "import sys\n"
        "import dflash_provision.transport.ssh\n"
        "import importlib, importlib.metadata as m, paramiko\n"
        "assert sys.modules['importlib.metadata'] is m and importlib.metadata is m\n"
        "assert callable(m.entry_points) and m.__file__\n"
        "assert sys.modules.get('invoke', 'absent') is not None\n"
        "print(paramiko.__version__ == m.version('paramiko') != '')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "True"), done.stderr


def test_the_metadata_stand_in_answers_only_paramikos_version_itself() -> None:
    import importlib.metadata

    from dflash_provision.transport.ssh import paramiko_import

    stand_in = paramiko_import._MetadataStandIn()
    assert stand_in.version("paramiko") == importlib.metadata.version("paramiko")
    assert paramiko_import._dist_info_version("paramiko") == importlib.metadata.version("paramiko")
    # Another name, another function: the real module answers.
    assert stand_in.version("click") == importlib.metadata.version("click")
    assert stand_in.entry_points is importlib.metadata.entry_points
    assert paramiko_import._dist_info_version("no_such_package_here") is None


def test_what_start_up_imported_is_left_out_of_the_last_collection(tmp_path: Path) -> None:
    """The console script freezes the objects start-up made (gc.freeze) before the process
    ends, so the interpreter's last collection does not walk every module it loaded."""
    probe = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count(), file=sys.stderr))\n"
        "sys.argv = ['dflash-provision', 'validate', 'config.json']\n"
        "from dflash_provision.cli.entry import main\n"
        "main()\n"
    )
    (tmp_path / "config.json").write_bytes(REFERENCE)
    env = cli_env(home=tmp_path / "home", env={verdict_cache.DISABLE_ENV: "1"})
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert done.returncode == 0, without_importtime(done.stderr)
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("frozen ")]
    assert int(line.split()[1]) > 10_000  # the modules, classes and functions loaded


# ---------------------------------------------------------------------------------------------
# a lock-pinned config read from the HF cache without huggingface_hub


def test_a_pinned_config_is_read_from_the_hf_cache_only_with_its_exact_sha256(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib

    from dflash_provision.source import hub

    sha = "d1f1a5b0c0ffee00000000000000000000000001"
    snapshot = tmp_path / "hf" / "hub" / "models--z-lab--Q" / "snapshots" / sha
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_bytes(REFERENCE)
    digest = hashlib.sha256(REFERENCE).hexdigest()
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    found = hub.pinned_from_cache("z-lab/Q", sha, "config.json", digest)
    assert found is not None and found.data == REFERENCE and found.commit_sha == sha
    # Other bytes than the lock says, another commit, or a path that climbs: not from here.
    assert hub.pinned_from_cache("z-lab/Q", sha, "config.json", "0" * 64) is None
    assert hub.pinned_from_cache("z-lab/Q", "main", "config.json", digest) is None
    assert hub.pinned_from_cache("z-lab/Q", sha, "../config.json", digest) is None


@pytest.mark.integration
def test_a_verdict_others_could_have_written_is_not_trusted(home: Path) -> None:
    first = validate_config(INCIDENT, label="x")
    (entry,) = entries(home)
    planted = json.loads(entry.read_text())
    planted["layers"]["effective"] = [
        {"layer": "effective", "path": "", "message": "planted", "severity": "error"}
    ]
    entry.write_text(json.dumps(planted))
    entry.chmod(0o666)  # writable by anyone: not ours to believe
    again = validate_config(INCIDENT, label="x")
    assert again.layers == first.layers
    assert "planted" not in str(again.to_dict())
