"""Golden tests: the ``--json`` output of runtime-check, doctor and rollout on the vLLM STAND-IN
(testbed.vllm_standin, a test double), pinned before acceptance was judged by one gate (issue
34 item 1), so that the change alters no verdict, figure or cause they show.

What varies from run to run is normalised first (``normalise``): durations and timings, pids,
ports, host aliases and addresses, temporary paths, times, ids and hashes of run-specific files,
and the stand-in's access lines. Everything else is compared exactly with tests/golden/*.json;
``DFLASH_UPDATE_GOLDEN=1`` rewrites them (review the diff: it is the change in output)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed import samples
from testbed.vllm_standin_install import CONTROL_ENV, install_standin, write_control
from tests.fixtures.cli import Cli
from tests.fixtures.runtime import CONTROL, DRAFTER_DIR, REFERENCE, TARGET_DIR
from tests.fixtures.standin import Bed
from tests.fixtures.standin_places import Place, launch_standin

pytestmark = [pytest.mark.integration, pytest.mark.root]

GOLDEN = Path(__file__).parent / "golden"
_VOLATILE_KEYS = re.compile(
    r"(^|_)(s|duration_s|smoke_s|timings|walls|pid|started_at|recorded_at|created|at|id|"
    r"time|when|log_path|launch_line|ready_line|lines_read|argv|rollout_id|history_id|port|spec_decoding_lines|host_key)$"
)


def normalise(value: Any, subs: list[tuple[str, str]]) -> Any:
    """``value`` with what differs between runs replaced (see the module docstring)."""
    if isinstance(value, dict):
        return {
            k: "<volatile>" if _VOLATILE_KEYS.search(k) else normalise(v, subs)
            for k, v in sorted(value.items())
        }
    if isinstance(value, list):
        return [normalise(v, subs) for v in value]
    if isinstance(value, str):
        for old, new in subs:
            value = value.replace(old, new)
        value = re.sub(r"\d{8}T\d{6}Z", "<stamp>", value)
        value = re.sub(r"pid \d+", "pid <pid>", value)
        value = re.sub(r"pid=\d+", "pid=<pid>", value)
        value = re.sub(r"\d\d-\d\d \d\d:\d\d:\d\d", "<time>", value)
        value = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?", "<time>", value)
        value = re.sub(r"/tmp/pytest-of-\w+/pytest-\d+/[^\s'\"]+", "<tmp>", value)
        value = re.sub(r"127\.0\.\d+\.\d+(:\d+)?", "<address>", value)
        value = re.sub(r"\b[0-9a-f]{12,64}\b", "<hex>", value)
        value = re.sub(r"\b\d+(\.\d+)? ?s\b", "<seconds>", value)
        return value
    return value


def assert_golden(name: str, document: Any, subs: list[tuple[str, str]]) -> None:
    got = normalise(document, subs)
    path = GOLDEN / f"{name}.json"
    if os.environ.get("DFLASH_UPDATE_GOLDEN") == "1" or not path.exists():
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(path.read_text())
    assert got == want, f"{name}: --json output changed (DFLASH_UPDATE_GOLDEN=1 to review)"


def _subs(bed: Bed) -> list[tuple[str, str]]:
    return [(str(bed.port), "<port>"), (bed.host.alias, "<host>"), (str(bed.tmp), "<tmp>")]


def test_runtime_check_and_doctor_json_are_pinned(bed: Bed) -> None:
    bed.launch()
    code, report = bed.check_json("--no-reference")
    assert code == 0
    assert_golden("runtime_check_passed", report, _subs(bed))
    bed.control(acceptance=0.011)
    code, report = bed.check_json("--no-reference")
    assert code == 25
    assert_golden("runtime_check_acceptance_low", report, _subs(bed))
    doctor = bed.cli.run(
        "doctor", f"{bed.host.alias}:{DRAFTER_DIR}", "--from", bed.authority(),
        "--port", str(bed.port), "--json", *bed.ssh(),
    )  # fmt: skip
    assert doctor.returncode == 25, doctor.stdout + doctor.stderr
    assert_golden("doctor_acceptance_low", json.loads(doctor.stdout), _subs(bed))
    bed.control(impossible_counters=True)
    code, report = bed.check_json("--no-reference")
    assert code == 26
    assert_golden("runtime_check_inconclusive", report, _subs(bed))


# -- rollout on two hosts ------------------------------------------------------------------------

BAD_MASK = 248064
RULES = {"by_mask_token": {str(BAD_MASK): {"acceptance": 0.01}}}


def _variant(**changes: Any) -> bytes:
    doc = json.loads(REFERENCE)
    if "mask_token_id" in changes:
        mask = changes.pop("mask_token_id")
        doc["dflash_config"] = {**doc["dflash_config"], "mask_token_id": mask}
    doc.update(changes)
    return (json.dumps(doc, indent=2) + "\n").encode()


@dataclass
class Fleet:
    places: list[Place]
    cli: Cli
    tmp: Path
    ssh: list[str]
    inventory: Path

    def rollout_json(self, config: bytes, name: str, *extra: str) -> tuple[int, dict[str, Any]]:
        path = self.tmp / f"{name}.json"
        path.write_bytes(config)
        done = self.cli.run(
            "rollout", "-i", str(self.inventory), "--from", str(path), "--env",
            f"{CONTROL_ENV}={CONTROL}", "--json", *extra, *self.ssh,
        )  # fmt: skip
        assert done.stdout.strip(), done.stderr
        return done.returncode, json.loads(done.stdout)

    def subs(self) -> list[tuple[str, str]]:
        hosts = [(p.target.split(":", 1)[0], f"<host{i}>") for i, p in enumerate(self.places)]
        return [(str(self.tmp), "<tmp>"), *hosts]


@pytest.fixture
def two_hosts(make_fleet: Any, tmp_path: Path) -> Iterator[Fleet]:
    fleet = make_fleet(2)
    places = [Place(f"g{i}", h, f"{h.alias}:{DRAFTER_DIR}") for i, h in enumerate(fleet.hosts)]
    assert fleet.hosts[0].client is not None
    ssh = ["--ssh-config", str(fleet.hosts[0].client.ssh_config), "--no-agent"]
    (tmp_path / "work").mkdir()
    cli = Cli(tmp_path / "work")
    authority = tmp_path / "old.json"
    authority.write_bytes(REFERENCE)

    def prepare(place: Place) -> None:
        standin = install_standin(place.where, "/root/standin")
        place.put(f"{DRAFTER_DIR}/config.json", REFERENCE)
        place.put(f"{TARGET_DIR}/config.json", samples.REFERENCE_TARGET.read_bytes())
        write_control(place.where, CONTROL, RULES)
        launch_standin(cli, place, standin, ssh, str(authority))

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(prepare, places))
    inventory = tmp_path / "fleet.yaml"
    hosts = "".join(f"  - {{name: g{i}, address: {h.alias}}}\n" for i, h in enumerate(fleet.hosts))
    inventory.write_text(f"defaults:\n  path: {DRAFTER_DIR}\nhosts:\n{hosts}")
    yield Fleet(places, cli, tmp_path, ssh, inventory)


def test_rollout_json_is_pinned(two_hosts: Fleet) -> None:
    code, doc = two_hosts.rollout_json(_variant(mask_token_id=BAD_MASK), "bad")
    assert code != 0
    assert_golden("rollout_rolled_back", doc, two_hosts.subs())
    code, doc = two_hosts.rollout_json(
        _variant(max_position_embeddings=131072), "good", "--max-regression", "5%"
    )
    assert code == 0, doc
    assert_golden("rollout_passed", doc, two_hosts.subs())
