"""rollout's pure parts: the batches ``--batches`` makes, the gate's verdict on a runtime-check
report, and the hold an open rollout has on its hosts (a real SQLite history database)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dflash_provision.errors import ExitCode, UsageError
from dflash_provision.rollout.batches import parse_batches, split
from dflash_provision.rollout.host_ops import judge
from dflash_provision.rollout.record import Figures, Gate, HostState, Rollout, State
from dflash_provision.rollout.store import RolloutHeld, RolloutStore
from dflash_provision.verify.acceptance_gate import AcceptanceRules
from dflash_provision.verify.acceptance_gate import judge as judge_acceptance
from dflash_provision.verify.runtime_check import CheckReport
from dflash_provision.verify.stages import StageResult, StageStatus
from dflash_provision.vllm.metrics import Acceptance, SpecCounters


@pytest.mark.parametrize(
    ("spec", "hosts", "sizes"),
    [
        ("1,25%,100%", 6, [1, 1, 4]),
        ("1,25%,100%", 1, [1]),
        ("1,25%,100%", 40, [1, 9, 30]),
        ("2", 5, [2, 3]),  # beyond the last end: one more batch
        ("50%,50%,100%", 4, [2, 2]),  # an end that does not move makes no empty batch
    ],
)
def test_batches_are_cumulative_ends_like_ansible_serial(
    spec: str, hosts: int, sizes: list[int]
) -> None:
    assert [len(b) for b in split(list(range(hosts)), parse_batches(spec))] == sizes


@pytest.mark.parametrize("spec", ["", "0", "1,,2", "150%", "x"])
def test_bad_batches_are_a_usage_error(spec: str) -> None:
    with pytest.raises(UsageError):
        parse_batches(spec)


def _report(*statuses: str, rate: float = 0.6, mean: float = 5.0) -> CheckReport:
    """A report whose stage e carries the acceptance gate's verdict on these figures (as stage e
    makes it), the other stages as given."""
    report = CheckReport("t", 8000, "x")
    counted = SpecCounters(drafts=100, draft_tokens=1500, accepted=rate * 1500, present=True)
    verdict = judge_acceptance(
        Acceptance(counted, rate, mean, ()), AcceptanceRules(0.10, min_draft_tokens=32)
    )
    for key, status in zip("abcde", statuses, strict=True):
        if key == "e" and status != "inconclusive":
            result = StageResult(
                key, key, StageStatus(verdict.outcome.value), "e", acceptance=verdict
            )
        else:
            result = StageResult(key, key, StageStatus(status), f"{key} {status}")
        report.stages.append(result)
    return report


def test_the_gate_passes_fails_or_leaves_undecided() -> None:
    gate = Gate(0.0, 0.10, 0.10)
    base = Figures(0.6, 5.0, "measured")
    ok = ["passed"] * 5
    assert judge(_report(*ok), gate, base).outcome == "passed"
    assert judge(_report(*ok, rate=0.01), gate, base).outcome == "failed"
    low = judge(_report(*ok, mean=4.0), gate, base)  # 20 % below the baseline's 5.0
    assert low.outcome == "failed" and "20% below baseline 5.00" in low.detail
    assert judge(_report(*ok, mean=4.6), gate, base).outcome == "passed"  # 8 %: within 10 %
    broken = judge(_report("passed", "passed", "failed", "skipped", "skipped"), gate, base)
    assert broken.outcome == "failed" and broken.detail.startswith("c:")
    undecided = ["passed"] * 4 + ["inconclusive"]
    assert judge(_report(*undecided), gate, base).outcome == "inconclusive"


def _rollout(rollout_id: str, state: State, *names: str) -> Rollout:
    hosts = [HostState(n, f"{n}:/m", "/m/config.json") for n in names]
    return Rollout(rollout_id, "2026-01-01T00:00:00Z", "x", "{}", "0" * 64, ["1"], Gate(), hosts,
                   state=state)  # fmt: skip


def test_an_open_rollout_holds_its_hosts_until_it_ends(tmp_path: Path) -> None:
    store = RolloutStore(tmp_path / "history.sqlite")
    store.save(_rollout("r1", State.PAUSED, "h01", "h02"))
    with pytest.raises(RolloutHeld) as refused:
        store.refuse_held(_rollout("r2", State.PLANNED, "h02", "h03"))
    assert refused.value.exit_code == ExitCode.ROLLOUT_REFUSED
    assert "rollout r1 (paused) still holds h02" in refused.value.message
    store.refuse_held(_rollout("r3", State.PLANNED, "h03"))  # another host: free
    store.save(_rollout("r1", State.ABORTED, "h01", "h02"))
    store.refuse_held(_rollout("r2", State.PLANNED, "h02"))  # ended: the hold is gone
    assert store.load("r1").state is State.ABORTED


def test_the_printed_commands_repeat_only_the_connection_flags() -> None:
    from dflash_provision.rollout.plan import connection_args

    argv = ["rollout", "-i", "fleet.yaml", "--from", "new.json", "--ssh-config", "my config"]
    argv += ["--env", "TOKEN=secret", "--connect-timeout=5", "--no-agent", "--batches", "1"]
    assert connection_args(argv) == ["--ssh-config", "my config", "--connect-timeout=5",
                                     "--no-agent"]  # fmt: skip


def _member(name: str, spec: str) -> Any:
    from dflash_provision.inventory import FleetMember
    from dflash_provision.source.authority import SourceSpec
    from dflash_provision.target import parse_target

    return FleetMember(name, parse_target(spec), SourceSpec())


def test_resume_finds_the_hosts_the_record_saved_or_refuses_naming_each_change() -> None:
    """The record keeps where each name led (after ssh_config); today's inventory must lead to
    the same places: a host re-pointed or dropped is refused, never followed."""
    from dflash_provision.rollout.identity import HostMismatch
    from dflash_provision.rollout.plan import Settings, members_again, new_rollout
    from dflash_provision.source.authority import Authority
    from dflash_provision.transport.options import SshOptions

    ssh = SshOptions(ssh_config_path=None)
    began = [_member("h01", "/srv/a"), _member("h02", "/srv/b"), _member("h03", "/srv/c")]
    settings = Settings("r1", "2026-01-01T00:00:00Z", ["1"], Gate(), False, {})
    rollout = new_rollout(began, Authority("new", b"{}"), settings, ssh)
    assert [m.name for m in members_again(rollout, began, ssh)] == ["h01", "h02", "h03"]
    today = [_member("h01", "/srv/x"), _member("h03", "/srv/c")]
    with pytest.raises(HostMismatch) as refused:
        members_again(rollout, today, ssh)
    message = refused.value.message
    assert refused.value.exit_code == ExitCode.ROLLOUT_REFUSED
    assert "h01 leads elsewhere now (path /srv/a/config.json → /srv/x/config.json)" in message
    assert "h02 is no longer in the inventory (the rollout began with it as " in message
    assert "\n" not in message


def test_one_host_under_two_names_is_refused_when_the_rollout_is_made() -> None:
    from dflash_provision.rollout.identity import HostMismatch
    from dflash_provision.rollout.plan import Settings, new_rollout
    from dflash_provision.source.authority import Authority
    from dflash_provision.transport.options import SshOptions

    twice = [_member("a", "/srv/m"), _member("b", "/srv/n"), _member("c", "/srv/m/config.json")]
    settings = Settings("r1", "2026-01-01T00:00:00Z", ["1"], Gate(), False, {})
    with pytest.raises(HostMismatch, match=r"^a and c are the same host and drafter file \("):
        new_rollout(twice, Authority("new", b"{}"), settings, SshOptions(ssh_config_path=None))


def test_holds_see_the_saved_places_not_the_names(tmp_path: Path) -> None:
    """Two records naming one machine differently (an alias and its address) share a host."""
    from dflash_provision.rollout.identity import Identity

    store = RolloutStore(tmp_path / "history.sqlite")
    first = _rollout("r1", State.PAUSED, "gpu1")
    second = _rollout("r2", State.PLANNED, "10.0.0.1")
    for rollout in (first, second):
        rollout.hosts[0].identity = Identity(
            "10.0.0.1", 22, "root", None, "/m/config.json"
        ).to_dict()
    store.hold(first)
    with pytest.raises(RolloutHeld, match=r"rollout r1 \(paused\) still holds gpu1"):
        store.hold(second)
    assert [r[0] for r in store.all()] == ["r1"]  # the refused one was not recorded


def test_the_store_keeps_config_bytes_by_sha256_and_trusts_only_matching_bytes(
    tmp_path: Path,
) -> None:
    import hashlib
    import sqlite3

    from dflash_provision.rollout.store import RolloutStore

    store = RolloutStore(tmp_path / "history.sqlite")
    data = b'{"mask_token_id": 248070}\n'
    sha = store.keep_config(data)
    assert sha == hashlib.sha256(data).hexdigest()
    assert store.config_with_sha(sha) == data
    assert store.config_with_sha("0" * 64) is None
    # A row whose bytes were changed behind the store's back is not what that sha256 names.
    with sqlite3.connect(store.path) as conn:
        conn.execute("UPDATE rollout_configs SET data = ? WHERE sha256 = ?", (b"{}", sha))
    assert store.config_with_sha(sha) is None


def test_what_ran_is_the_launch_records_file_sha256_else_its_drafter_sha256() -> None:
    from dflash_provision.rollout.what_ran import ran_sha

    assert ran_sha(None) is None
    assert ran_sha({"drafter_sha256": "a" * 64}) == "a" * 64  # records from before file_sha256
    assert ran_sha({"drafter_sha256": "a" * 64, "file_sha256": "b" * 64}) == "b" * 64
    assert ran_sha({"drafter_sha256": "a" * 64, "file_sha256": ""}) == "a" * 64
