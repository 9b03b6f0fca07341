"""dflash.lock: reading, writing, stability, malformed files, and loading the pinned config."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from dflash_provision.errors import ConfigInvalid, ExitCode, HubError, UsageError
from dflash_provision.source.hub import fetch_config
from dflash_provision.source.lockfile import (
    LockEntry,
    entry_from_fetched,
    find_entry,
    load_locked_config,
    read_lock,
    render_lock,
    upsert_lock,
)
from testbed import samples
from testbed.hub_standin import (
    DFLASH2_REPO,
    REFERENCE_OLD_SHA,
    HubStandin,
    older_reference_layout,
)

DRAFTER = LockEntry(
    repo_id="z-lab/Qwen3.6-27B-DFlash",
    revision="main",
    commit_sha="a" * 40,
    filename="config.json",
    sha256="b" * 64,
    size=838,
    fetched_at="2025-05-01T12:00:00Z",
)
TARGET = replace(DRAFTER, repo_id="Qwen/Qwen3.6-27B", commit_sha="c" * 40, sha256="d" * 64)


def test_upserted_entries_read_back_equal_and_sorted(tmp_path: Path) -> None:
    lock = tmp_path / "dflash.lock"

    upsert_lock(lock, DRAFTER)
    upsert_lock(lock, TARGET)

    assert read_lock(lock) == [TARGET, DRAFTER]  # sorted by repo id: "Qwen/" < "z-lab/"


def test_upsert_replaces_the_entry_for_the_same_repo_and_file_only(tmp_path: Path) -> None:
    lock = tmp_path / "dflash.lock"
    upsert_lock(lock, DRAFTER)
    upsert_lock(lock, TARGET)
    moved = replace(DRAFTER, commit_sha="e" * 40, fetched_at="2025-06-01T00:00:00Z")

    upsert_lock(lock, moved)

    assert read_lock(lock) == [TARGET, moved]


def test_lock_bytes_do_not_depend_on_insertion_order(tmp_path: Path) -> None:
    one, two = tmp_path / "one.lock", tmp_path / "two.lock"
    upsert_lock(one, DRAFTER)
    upsert_lock(one, TARGET)
    upsert_lock(two, TARGET)
    upsert_lock(two, DRAFTER)

    assert one.read_bytes() == two.read_bytes()
    assert one.read_text() == render_lock([DRAFTER, TARGET])
    assert one.read_text().endswith("}\n")
    assert json.loads(one.read_text())["version"] == 1


def test_refetching_the_same_commit_keeps_the_file_byte_identical(tmp_path: Path) -> None:
    lock = tmp_path / "dflash.lock"
    upsert_lock(lock, DRAFTER)
    before = lock.read_bytes()

    upsert_lock(lock, replace(DRAFTER, fetched_at="2030-01-01T00:00:00Z"))

    assert lock.read_bytes() == before


def test_upsert_keeps_the_file_mode_and_leaves_no_temp_files(tmp_path: Path) -> None:
    lock = tmp_path / "dflash.lock"
    upsert_lock(lock, DRAFTER)
    lock.chmod(0o600)

    upsert_lock(lock, TARGET)

    assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dflash.lock"]


def test_a_failed_rename_keeps_the_old_lock_and_removes_the_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "dflash.lock"
    upsert_lock(lock, DRAFTER)
    before = lock.read_bytes()

    def failing_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space"):
        upsert_lock(lock, TARGET)

    assert lock.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dflash.lock"]


def test_entry_from_fetched_records_utc_time_size_and_hashes() -> None:
    from dflash_provision.source.hub import FetchedConfig

    data = b'{"x": 1}\n'
    fetched = FetchedConfig(
        repo_id="o/n",
        requested_revision="main",
        commit_sha="f" * 40,
        filename="config.json",
        path=Path("/nowhere"),
        data=data,
        sha256=hashlib.sha256(data).hexdigest(),
    )
    when = datetime(2025, 5, 1, 14, 30, 5, tzinfo=UTC)

    entry = entry_from_fetched(fetched, fetched_at=when)

    assert entry.fetched_at == "2025-05-01T14:30:05Z"
    assert entry.size == len(data)
    assert (entry.commit_sha, entry.sha256) == (fetched.commit_sha, fetched.sha256)


def _valid_document() -> dict[str, object]:
    return json.loads(render_lock([DRAFTER]))


def _entry_with(**changes: object) -> dict[str, object]:
    document = _valid_document()
    entries = document["entries"]
    assert isinstance(entries, list)
    entries[0].update(changes)
    return document


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{not json", "not JSON"),
        (json.dumps([]), "entries"),
        (json.dumps({**_valid_document(), "version": 2}), "version"),
        (json.dumps(_entry_with(commit_sha="main")), "commit_sha"),
        (json.dumps(_entry_with(sha256="abc")), "sha256"),
        (json.dumps(_entry_with(size="838")), "size"),
        (json.dumps({"version": 1, "entries": [{"repo_id": "o/n"}]}), "lacks"),
        (render_lock([DRAFTER]).replace('"entries": [', '"entries": [1, '), "not an object"),
    ],
    ids=["not-json", "not-object", "version", "bad-sha", "bad-sha256", "size", "missing", "item"],
)
def test_malformed_lock_is_a_usage_error_naming_the_file(
    tmp_path: Path, content: str, words: str
) -> None:
    lock = tmp_path / "dflash.lock"
    lock.write_text(content)

    with pytest.raises(UsageError) as raised:
        read_lock(lock)

    assert str(lock) in raised.value.message
    assert "malformed" in raised.value.message
    assert words in raised.value.message


def test_a_lock_recording_one_file_twice_is_malformed(tmp_path: Path) -> None:
    lock = tmp_path / "dflash.lock"
    document = _valid_document()
    entries = document["entries"]
    assert isinstance(entries, list)
    lock.write_text(json.dumps({**document, "entries": entries * 2}))

    with pytest.raises(UsageError, match="twice"):
        read_lock(lock)


def test_missing_lock_is_a_usage_error_that_says_to_fetch(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as raised:
        read_lock(tmp_path / "dflash.lock")

    assert "dflash.lock" in raised.value.message
    assert "fetch" in raised.value.message


def test_find_entry_picks_by_repo_and_refuses_none_or_ambiguous() -> None:
    entries = [TARGET, DRAFTER]

    assert find_entry(entries, DRAFTER.repo_id) == DRAFTER
    assert find_entry([DRAFTER]) == DRAFTER
    with pytest.raises(UsageError, match="several"):
        find_entry(entries)
    with pytest.raises(UsageError, match="no entry for other/repo"):
        find_entry(entries, "other/repo")
    with pytest.raises(UsageError, match=r"no entry for tokenizer\.json"):
        find_entry(entries, filename="tokenizer.json")


# The lock as later commands (push, audit) use it: real huggingface_hub against the stand-in.


@pytest.mark.integration
def test_locked_config_loads_the_pinned_commit_from_cache_with_zero_requests(
    hub_standin: HubStandin, tmp_path: Path
) -> None:
    cache, lock = str(tmp_path / "cache"), tmp_path / "dflash.lock"
    upsert_lock(
        lock,
        entry_from_fetched(
            fetch_config(samples.REFERENCE_REPO, "v1", endpoint=hub_standin.url, cache_dir=cache)
        ),
    )
    upsert_lock(
        lock,
        entry_from_fetched(fetch_config(DFLASH2_REPO, endpoint=hub_standin.url, cache_dir=cache)),
    )
    hub_standin.reset_counts()

    loaded = load_locked_config(
        lock, samples.REFERENCE_REPO, cache_dir=cache, endpoint=hub_standin.url
    )

    assert loaded.data == older_reference_layout()
    assert loaded.commit_sha == REFERENCE_OLD_SHA
    assert loaded.requested_revision == "v1"
    assert hub_standin.count() == 0


@pytest.mark.integration
def test_locked_config_whose_cached_bytes_changed_is_refused_and_evicted(
    hub_standin: HubStandin, tmp_path: Path
) -> None:
    cache, lock = str(tmp_path / "cache"), tmp_path / "dflash.lock"
    fetched = fetch_config(samples.REFERENCE_REPO, endpoint=hub_standin.url, cache_dir=cache)
    upsert_lock(lock, entry_from_fetched(fetched))
    blob = fetched.path.resolve()  # the snapshot file links to this blob, named by its ETag
    blob.write_bytes(b'{"tampered": true}\n')

    # The cached bytes no longer match the ETag their blob is named after: a Hub integrity
    # error (exit 16), and the bytes leave the cache so the next read downloads them again.
    with pytest.raises(HubError) as raised:
        load_locked_config(lock, cache_dir=cache, endpoint=hub_standin.url)

    assert raised.value.exit_code == ExitCode.HUB_INTEGRITY
    assert blob.name in raised.value.message
    assert not blob.exists()
    again = load_locked_config(lock, cache_dir=cache, endpoint=hub_standin.url)
    assert again.sha256 == fetched.sha256


def test_locked_config_whose_sha256_differs_from_the_lock_is_invalid_naming_both_hashes(
    hub_standin: HubStandin, tmp_path: Path
) -> None:
    cache, lock = str(tmp_path / "cache"), tmp_path / "dflash.lock"
    fetched = fetch_config(samples.REFERENCE_REPO, endpoint=hub_standin.url, cache_dir=cache)
    recorded = "0" * 64  # a lock edited by hand, or written for other bytes
    upsert_lock(lock, replace(entry_from_fetched(fetched), sha256=recorded))

    with pytest.raises(ConfigInvalid) as raised:
        load_locked_config(lock, cache_dir=cache, endpoint=hub_standin.url)

    assert fetched.sha256 in raised.value.message
    assert recorded in raised.value.message
    assert str(lock) in raised.value.message
