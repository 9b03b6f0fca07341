"""The pinned files (issue 32) below the hosts: which files vLLM reads, the lock's ``files``
(old locks keep working, a moved commit drops them, malformed ones are refused), the judge's
statuses and exit codes for what the host tests cannot stage cheaply (a check cut off by its
deadline, a directory that cannot be entered), the rule for keeping a proof, the tree listing
across pages, and the CLI's refusals."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode, UsageError
from dflash_provision.host_state.file_status import Command
from dflash_provision.host_state.files_status import (
    FilesStatus,
    FileVerdict,
    combined_exit,
    fleet_files_exit,
    judge_files,
)
from dflash_provision.remote.file_proofs import reusable
from dflash_provision.remote.files_read import FileFacts, FilesRead
from dflash_provision.source.lockfile import (
    LockEntry,
    read_lock,
    read_pinned_files,
    upsert_lock,
    upsert_pinned_files,
)
from dflash_provision.source.pinned_files import GIT_BLOB, SHA256, PinnedFile, vllm_reads
from testbed.hub_standin import HubStandin
from tests.fixtures.cli import run_cli
from tests.fixtures.drafter_repo import INDEX, REPO, SHARDS, drafter_files

COMMIT = "a" * 40
ENTRY = LockEntry(REPO, "main", COMMIT, "config.json", "b" * 64, 838, "2026-01-01T00:00:00Z")
SHARD = PinnedFile(REPO, COMMIT, SHARDS[0], 3000, SHA256, "c" * 64)
CONFIG = PinnedFile(REPO, COMMIT, "config.json", 838, GIT_BLOB, "d" * 40)


def test_the_files_vllm_reads() -> None:
    names = ["config.json", "model.safetensors", "mask_embedding.pt", "pytorch_model.bin", "a.pt"]
    assert vllm_reads("model.safetensors", names)
    assert vllm_reads("mask_embedding.pt", names)  # qwen3_dflash loads it whenever present
    assert vllm_reads(INDEX, names) and vllm_reads("generation_config.json", names)
    # .bin / .pt weights are vLLM's fall-back only when there is no safetensors
    assert not vllm_reads("pytorch_model.bin", names)
    assert vllm_reads("pytorch_model.bin", ["pytorch_model.bin"])
    assert not vllm_reads("optimizer.pt", ["optimizer.pt"])  # a trainer file, filtered out
    for never in ("README.md", ".gitattributes", "tokenizer.json", "sub/model.safetensors"):
        assert not vllm_reads(never, [*names, never])


def test_a_config_only_lock_reads_as_before_and_a_lock_with_files_round_trips(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "dflash.lock"
    upsert_lock(lock, ENTRY)
    config_only = lock.read_bytes()
    assert b"files" not in config_only  # byte for byte what a lock has always been
    assert read_pinned_files(lock) == []

    upsert_pinned_files(lock, REPO, [SHARD, CONFIG])
    assert read_lock(lock) == [ENTRY]
    assert read_pinned_files(lock) == [CONFIG, SHARD]  # sorted by path
    document = json.loads(lock.read_text())
    assert document["version"] == 1 and len(document["files"]) == 2

    upsert_lock(lock, ENTRY)  # the same commit again: the files stay
    assert read_pinned_files(lock) == [CONFIG, SHARD]
    # The commit moved: the files no longer say what it holds.
    upsert_lock(lock, replace(ENTRY, commit_sha="e" * 40))
    assert read_pinned_files(lock) == []


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"path": "sub/model.safetensors"}, "is not a file name of the top directory"),
        ({"path": " model.safetensors"}, "is not a file name of the top directory"),
        ({"digest": "c" * 40}, "digest is not 64 hex digits"),
        ({"algorithm": "md5"}, "algorithm must be one of"),
        ({"size": -1}, "size is negative"),
        ({"size": True}, "size must be int"),
    ],
)
def test_a_malformed_pinned_file_is_refused(tmp_path: Path, change: dict, why: str) -> None:
    lock = tmp_path / "dflash.lock"
    upsert_lock(lock, ENTRY)
    document = json.loads(lock.read_text())
    document["files"] = [{**SHARD.to_dict(), **change}]
    lock.write_text(json.dumps(document))
    with pytest.raises(UsageError, match=why):
        read_pinned_files(lock)


def _read(**facts: FileFacts) -> FilesRead:
    return FilesRead("h:/m", facts=dict(facts))


def test_a_check_cut_off_by_its_deadline_cannot_tell_and_exits_26() -> None:
    proved = FileFacts("config.json", "hashed", 838, "1:2:838:10:10", 20, "d" * 40)
    read = FilesRead("h:/m", facts={"config.json": proved}, cut_off=True, hashing=SHARDS[0])
    judgement = judge_files([CONFIG, SHARD], read)
    assert judgement.status is FilesStatus.INCONCLUSIVE
    assert judgement.exit_code(Command.VERIFY) is ExitCode.INCONCLUSIVE
    [shard] = judgement.problems
    assert shard.verdict is FileVerdict.NOT_CHECKED
    assert "the deadline (--command-timeout) passed while it was hashed" in shard.detail


def test_what_cannot_be_read_or_entered_is_7_and_a_missing_directory_is_drift() -> None:
    unreadable = judge_files([SHARD], _read(**{SHARDS[0]: FileFacts(SHARDS[0], "unreadable")}))
    assert unreadable.status is FilesStatus.PERMISSION_DENIED
    assert unreadable.exit_code(Command.AUDIT) is ExitCode.REMOTE_FAILED
    closed = judge_files([SHARD], FilesRead("h:/m", dir_state="permission-denied"))
    assert closed.exit_code(Command.VERIFY) is ExitCode.REMOTE_FAILED
    gone = judge_files([SHARD, CONFIG], FilesRead("h:/m", dir_state="missing"))
    assert gone.exit_code(Command.VERIFY) is ExitCode.DRIFT
    assert {f.verdict for f in gone.files} == {FileVerdict.MISSING}


def test_launch_and_runtime_check_take_their_codes_from_the_one_judge() -> None:
    """What the runtime side cannot stage cheaply on a host (a login that cannot read a shard):
    launch's refusal and stage a's code for each status, by the judge's rows."""
    from dflash_provision.errors import DriftFound, RemoteStepFailed, RuntimeFailure
    from dflash_provision.server.drafter_files import refusal

    fix = "dflash-provision push gpu1:/m --lock dflash.lock"
    unreadable = judge_files([SHARD], _read(**{SHARDS[0]: FileFacts(SHARDS[0], "unreadable")}))
    refused = refusal(unreadable, "gpu1", fix)
    assert isinstance(refused, RemoteStepFailed) and refused.exit_code is ExitCode.REMOTE_FAILED
    assert f"{SHARDS[0]} unreadable" in refused.message
    assert unreadable.exit_code(Command.RUNTIME_CHECK) is ExitCode.RUNTIME_CHECK_FAILED

    cut = FilesRead("h:/m", cut_off=True, hashing=SHARDS[0])
    untold = judge_files([SHARD], cut)
    refused = refusal(untold, "gpu1", fix)
    assert isinstance(refused, RuntimeFailure) and refused.exit_code is ExitCode.INCONCLUSIVE
    assert refused.message.startswith("pre-flight: cannot tell")
    assert untold.exit_code(Command.RUNTIME_CHECK) is ExitCode.INCONCLUSIVE

    stray = FilesRead(
        "h:/m",
        facts={SHARDS[0]: FileFacts(SHARDS[0], "same", 3000, "1:2:3000:1:1")},
        present=[SHARDS[0], "mask_embedding.pt"],
    )
    drifted = judge_files([SHARD], stray)
    refused = refusal(drifted, "gpu1", fix)
    assert isinstance(refused, DriftFound) and refused.exit_code is ExitCode.DRIFT
    assert "mask_embedding.pt stray" in refused.message
    assert f"fix it with: {fix} --all-files" in refused.message
    assert "strays are never removed for you: mask_embedding.pt" in refused.message
    assert drifted.exit_code(Command.RUNTIME_CHECK) is ExitCode.RUNTIME_CHECK_FAILED

    fine = judge_files([SHARD], FilesRead("h:/m", facts=stray.facts, present=[SHARDS[0]]))
    assert fine.status is FilesStatus.IN_SYNC and refusal(fine, "gpu1", fix) is None


def test_one_code_for_the_config_and_the_files_and_for_a_fleet() -> None:
    assert combined_exit(ExitCode.OK, ExitCode.DRIFT) is ExitCode.DRIFT
    assert combined_exit(ExitCode.UNREACHABLE, ExitCode.OK) is ExitCode.UNREACHABLE
    assert combined_exit(ExitCode.OK, ExitCode.INCONCLUSIVE) is ExitCode.INCONCLUSIVE
    assert combined_exit(ExitCode.DRIFT, ExitCode.INCONCLUSIVE) is ExitCode.DRIFT
    codes = [ExitCode.OK, ExitCode.INCONCLUSIVE, ExitCode.REMOTE_FAILED]
    assert fleet_files_exit(codes) is ExitCode.REMOTE_FAILED
    assert fleet_files_exit([ExitCode.OK]) is ExitCode.OK


def test_a_proof_is_kept_only_for_a_file_older_than_the_second_its_hash_began() -> None:
    # DEV:INO:SIZE:MTIME:CTIME; the hash began at clock 100
    assert reusable(FileFacts("f", "hashed", 3, "1:2:3:98:99", 100, "c" * 64))
    assert not reusable(FileFacts("f", "hashed", 3, "1:2:3:98:100", 100, "c" * 64))  # racy
    assert not reusable(FileFacts("f", "hashed", 3, "1:2:3:100:99", 100, "c" * 64))
    assert not reusable(FileFacts("f", "size", 3, "1:2:3:1:1", None, None))


def test_the_tree_listing_is_read_across_pages_as_the_hub_pages_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dflash_provision.source.hub_tree import list_commit_files

    with HubStandin(tree_page_size=2) as hub:
        sha = hub.add_repo(REPO, drafter_files(1))
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        files = list_commit_files(REPO, sha, endpoint=hub.url)
        pages = hub.count(f"/api/models/{REPO}/tree/{sha}")
    assert {f.path for f in files} == {"config.json", "generation_config.json", INDEX, *SHARDS}
    assert pages == 3  # 6 entries (README.md included), 2 a page


@pytest.mark.integration
def test_all_files_needs_a_pinned_commit_and_a_lock_that_pins_files(
    hub_standin: HubStandin, hub_env: dict[str, str], tmp_path: Path
) -> None:
    hub_standin.add_repo(REPO, drafter_files(1))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_bytes(drafter_files(1)["config.json"])
    assert run_cli("fetch", REPO, cwd=tmp_path, base_env=hub_env).returncode == 0

    config_only = run_cli("verify", "./m", "--all-files", cwd=tmp_path, base_env=hub_env)
    assert config_only.returncode == ExitCode.USAGE
    assert "pins no files" in config_only.stderr and "fetch --all-files" in config_only.stderr
    assert run_cli("verify", "./m", cwd=tmp_path, base_env=hub_env).returncode == ExitCode.OK

    from_file = run_cli(
        "verify", "./m", "--all-files", "--from", "m/config.json", cwd=tmp_path, base_env=hub_env
    )
    assert from_file.returncode == ExitCode.USAGE
    assert "--all-files needs a pinned commit" in from_file.stderr

    offline = run_cli(
        "fetch", "--all-files", cwd=tmp_path, base_env={**hub_env, "HF_HUB_OFFLINE": "1"}
    )
    assert offline.returncode == ExitCode.HUB_OFFLINE_NOT_CACHED, offline.stderr


@pytest.mark.integration
def test_with_repo_the_hub_listing_is_the_pin_and_a_stray_is_named(
    hub_standin: HubStandin, hub_env: dict[str, str], tmp_path: Path
) -> None:
    files = drafter_files(1)
    hub_standin.add_repo(REPO, files)
    model = tmp_path / "m"
    model.mkdir()
    for name, data in files.items():
        (model / name).write_bytes(data)
    args = ("verify", "./m", "--repo", REPO, "--all-files", "--json")

    done = run_cli(*args, cwd=tmp_path, base_env=hub_env, home=tmp_path / "home")
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    verdicts = {f["path"]: f["verdict"] for f in json.loads(done.stdout)["files"]["files"]}
    assert set(verdicts) == {"config.json", "generation_config.json", INDEX, *SHARDS}
    assert set(verdicts.values()) <= {"proved", "unchanged"}

    (model / "extra.safetensors").write_bytes(files[SHARDS[0]])
    done = run_cli(*args, cwd=tmp_path, base_env=hub_env, home=tmp_path / "home")
    assert done.returncode == ExitCode.DRIFT, done.stdout + done.stderr
    strays = [f for f in json.loads(done.stdout)["files"]["files"] if f["verdict"] == "stray"]
    assert [f["path"] for f in strays] == ["extra.safetensors"]

    # A name the host cannot send on a line is a stray all the same (vLLM's glob reads it).
    (model / "extra.safetensors").unlink()
    (model / "odd\nname.safetensors").write_bytes(files[SHARDS[0]])
    done = run_cli(*args, cwd=tmp_path, base_env=hub_env, home=tmp_path / "home")
    assert done.returncode == ExitCode.DRIFT, done.stdout + done.stderr
    strays = [f for f in json.loads(done.stdout)["files"]["files"] if f["verdict"] == "stray"]
    assert [f["path"] for f in strays] == ["(a name with a line break)"]
