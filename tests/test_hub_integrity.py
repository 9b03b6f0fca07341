"""The Hub's bytes are checked: the real CLI and the real huggingface_hub client against the
stand-in serving faults (``hub_standin.Fault``). A body that does not match the ETag /
X-Linked-Etag / X-Linked-Size the Hub declared is refused, never written and never locked; a
redirect loop and a body that drips are one-line errors within ``--timeout``; credentials in
HF_ENDPOINT never appear in what the CLI prints or records."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from dflash_provision.source.hub_integrity import declared_mismatch
from testbed import samples
from testbed.hub_standin import Fault, HubStandin, git_blob_sha
from tests.fixtures.cli import Done, run_cli, the_error_line

pytestmark = pytest.mark.integration

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
# Same length as the reference, one value changed: only a hash can tell.
SAME_SIZE_TAMPERED = REFERENCE.replace(b"248070", b"248064")
assert len(SAME_SIZE_TAMPERED) == len(REFERENCE) and SAME_SIZE_TAMPERED != REFERENCE
REPO = "test/served-wrong"


def fetch(env: dict[str, str], cwd: Path, *args: str, repo: str = REPO) -> Done:
    return run_cli("fetch", repo, *args, cwd=cwd, base_env=env)


def cached_blobs(hf_home: Path) -> list[Path]:
    return [p for p in hf_home.rglob("blobs/*") if p.is_file()]


# ---------------------------------------------------------------------------------------------
# the check itself


def test_a_git_blob_etag_or_a_sha256_etag_matches_only_its_own_bytes() -> None:
    blob, sha256 = git_blob_sha(REFERENCE), hashlib.sha256(REFERENCE).hexdigest()
    assert declared_mismatch(REFERENCE, blob, len(REFERENCE)) is None
    assert declared_mismatch(REFERENCE, sha256, None) is None
    assert "git blob id" in (declared_mismatch(SAME_SIZE_TAMPERED, blob, None) or "")
    assert "sha256" in (declared_mismatch(SAME_SIZE_TAMPERED, sha256, None) or "")
    assert f"declared {len(REFERENCE) + 1} bytes" in (
        declared_mismatch(REFERENCE, sha256, len(REFERENCE) + 1) or ""
    )
    assert "cannot check" in (declared_mismatch(REFERENCE, "W/abc", None) or "")


# ---------------------------------------------------------------------------------------------
# bodies that are not what the Hub declared


@pytest.mark.parametrize("lfs", [False, True], ids=["direct", "lfs"])
@pytest.mark.parametrize(
    "body", [SAME_SIZE_TAMPERED, REFERENCE[:-10], REFERENCE + b" "], ids=["same", "short", "long"]
)
def test_a_body_that_does_not_match_the_declared_hash_or_size_is_refused_and_never_locked(
    hub_standin: HubStandin,
    hub_env: dict[str, str],
    hf_home: Path,
    tmp_path: Path,
    lfs: bool,
    body: bytes,
) -> None:
    hub_standin.add_repo(REPO, {"config.json": REFERENCE}, fault=Fault(body=body, lfs=lfs))
    out = tmp_path / "config.json"
    done = fetch(hub_env, tmp_path, "-o", str(out))
    the_error_line(done, ExitCode.HUB_INTEGRITY, REPO, "refused")
    assert not (tmp_path / "dflash.lock").exists()
    assert not out.exists()
    assert cached_blobs(hf_home) == []  # the bad bytes do not stay in the cache either

    # Once the Hub serves the right bytes, the same command works: nothing bad was kept.
    hub_standin.repos[REPO].fault = Fault(lfs=lfs)
    again = fetch(hub_env, tmp_path, "-o", str(out))
    assert again.returncode == 0, again.stderr
    assert out.read_bytes() == REFERENCE
    (entry,) = json.loads((tmp_path / "dflash.lock").read_text())["entries"]
    assert entry["sha256"] == hashlib.sha256(REFERENCE).hexdigest()


def test_an_lfs_file_served_right_is_checked_against_x_linked_etag_and_fetched(
    hub_standin: HubStandin, hub_env: dict[str, str], tmp_path: Path
) -> None:
    hub_standin.add_repo(REPO, {"config.json": REFERENCE}, fault=Fault(lfs=True))
    done = fetch(hub_env, tmp_path, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["sha256"] == hashlib.sha256(REFERENCE).hexdigest()
    assert hub_standin.count("/lfs-cdn/") == 1  # the body really came from the "CDN"


def test_a_cached_file_changed_on_disk_is_refused_when_the_hub_names_it_again(
    hub_standin: HubStandin, hub_env: dict[str, str], hf_home: Path, tmp_path: Path
) -> None:
    hub_standin.add_repo(REPO, {"config.json": REFERENCE})
    assert fetch(hub_env, tmp_path, "--no-lock").returncode == 0
    (blob,) = cached_blobs(hf_home)
    blob.chmod(0o644)
    blob.write_bytes(SAME_SIZE_TAMPERED)
    # The Hub still declares the same ETag, so the client takes the cached blob as it is.
    done = fetch(hub_env, tmp_path)
    the_error_line(done, ExitCode.HUB_INTEGRITY, "git blob id", "refused")
    assert not (tmp_path / "dflash.lock").exists()
    assert cached_blobs(hf_home) == []
    again = fetch(hub_env, tmp_path, "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["sha256"] == hashlib.sha256(REFERENCE).hexdigest()


@pytest.mark.parametrize("cache_only", ["pinned commit", "HF_HUB_OFFLINE"])
def test_a_cached_file_changed_on_disk_is_refused_also_when_the_hub_is_not_asked(
    cache_only: str,
    hub_standin: HubStandin,
    hub_env: dict[str, str],
    hf_home: Path,
    tmp_path: Path,
) -> None:
    # A fetch pinned to a commit that is cached, or an offline fetch, reads the cache without a
    # HEAD: the blob's own name (the ETag it was stored under) is then the declaration.
    hub_standin.add_repo(REPO, {"config.json": REFERENCE})
    first = fetch(hub_env, tmp_path, "--no-lock", "--json")
    assert first.returncode == 0, first.stderr
    commit = json.loads(first.stdout)["commit_sha"]
    (blob,) = cached_blobs(hf_home)
    blob.chmod(0o644)
    blob.write_bytes(SAME_SIZE_TAMPERED)
    if cache_only == "pinned commit":
        done = fetch(hub_env, tmp_path, "--revision", commit)
    else:
        done = fetch({**hub_env, "HF_HUB_OFFLINE": "1"}, tmp_path)
    the_error_line(done, ExitCode.HUB_INTEGRITY, "git blob id", "refused")
    assert not (tmp_path / "dflash.lock").exists()
    assert cached_blobs(hf_home) == []


# ---------------------------------------------------------------------------------------------
# a Hub that never finishes


def test_a_redirect_loop_is_one_line_and_exit_14(
    hub_standin: HubStandin, hub_env: dict[str, str], tmp_path: Path
) -> None:
    hub_standin.add_repo(REPO, {"config.json": REFERENCE}, fault=Fault(redirect_loop=True))
    done = fetch(hub_env, tmp_path)
    the_error_line(done, ExitCode.HUB_UNREACHABLE, "redirect", REPO)
    assert not (tmp_path / "dflash.lock").exists()


@pytest.mark.parametrize("lfs", [False, True], ids=["direct", "lfs"])
def test_a_body_sent_a_byte_every_half_second_is_cut_off_at_the_timeout(
    hub_standin: HubStandin, hub_env: dict[str, str], hf_home: Path, tmp_path: Path, lfs: bool
) -> None:
    hub_standin.add_repo(
        REPO, {"config.json": REFERENCE}, fault=Fault(lfs=lfs, drip_interval=0.5, drip_limit=60)
    )
    done = fetch(hub_env, tmp_path, "--timeout", "1.2")
    the_error_line(done, ExitCode.HUB_UNREACHABLE, "within 1.2 s (--timeout)")
    assert not (tmp_path / "dflash.lock").exists()
    # The client hung up after a few bytes of the ~2 KB a drip would take an hour over (each
    # read alone would never have timed out), and left no partial download in the cache.
    hub_standin.stop()  # ends the drip so its count is recorded
    (taken,) = hub_standin.dripped
    assert taken < 10
    assert list(hf_home.rglob("*.incomplete")) == []


def test_headers_sent_a_byte_every_half_second_are_cut_off_at_the_timeout(
    hub_standin: HubStandin, hub_env: dict[str, str], hf_home: Path, tmp_path: Path
) -> None:
    # Every byte of the status line and headers restarts the client's read timeout, and its
    # header parser has no clock: without a deadline of its own this held fetch for hours.
    hub_standin.add_repo(
        REPO,
        {"config.json": REFERENCE},
        fault=Fault(drip_interval=0.5, drip_limit=60, drip_headers=True),
    )
    done = fetch(hub_env, tmp_path, "--timeout", "1.2")
    the_error_line(done, ExitCode.HUB_UNREACHABLE, "within 1.2 s (--timeout)")
    assert not (tmp_path / "dflash.lock").exists()
    hub_standin.stop()  # ends the drip so its count is recorded
    assert hub_standin.dripped and max(hub_standin.dripped) < 10
    assert list(hf_home.rglob("*.incomplete")) == []


# ---------------------------------------------------------------------------------------------
# credentials in HF_ENDPOINT


SECRET = "hf_s3cretpassw0rd"


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("ok", ExitCode.OK),
        ("missing-repo", ExitCode.HUB_REPO_NOT_FOUND),
        ("missing-revision", ExitCode.HUB_REVISION_NOT_FOUND),
        ("tampered", ExitCode.HUB_INTEGRITY),
        ("redirect-loop", ExitCode.HUB_UNREACHABLE),
        ("drip", ExitCode.HUB_UNREACHABLE),
        ("closed-port", ExitCode.HUB_UNREACHABLE),
    ],
)
def test_credentials_in_hf_endpoint_are_never_printed_or_recorded(
    hub_standin: HubStandin, hub_env: dict[str, str], tmp_path: Path, case: str, code: int
) -> None:
    faults = {
        "tampered": Fault(body=SAME_SIZE_TAMPERED),
        "redirect-loop": Fault(redirect_loop=True),
        "drip": Fault(drip_interval=0.5, drip_limit=30),
    }
    hub_standin.add_repo(REPO, {"config.json": REFERENCE}, fault=faults.get(case))
    host_port = hub_standin.url.removeprefix("http://")
    if case == "closed-port":
        host_port = "127.0.0.1:9"  # discard: nothing listens
    env = {**hub_env, "HF_ENDPOINT": f"http://ops:{SECRET}@{host_port}"}
    repo = "test/absent" if case == "missing-repo" else REPO
    args = ["--revision", "no-such-branch"] if case == "missing-revision" else []
    # 1.2 s: more than the drip's 0.5 s between bytes, so only the whole deadline ends it.
    done = fetch(env, tmp_path, *args, "--timeout", "1.2", "--json", repo=repo)
    assert done.returncode == code, done.stderr
    everything = done.stdout + done.stderr
    lock = tmp_path / "dflash.lock"
    everything += lock.read_text() if lock.exists() else ""
    assert SECRET not in everything
    if code != ExitCode.OK:
        line = the_error_line(done, code)
        assert f"ops:{SECRET}" not in line
