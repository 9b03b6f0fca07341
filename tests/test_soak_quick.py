"""The fault soak (bench/stress/soak.py, `make soak`) in a short form: two fixed seeds, a minute
each, 4 testbed sshd hosts, the real CLI 3 at a time under the randomized fault schedule.

The soak exits 1 on any violation (a config that is none of the known ones, a leftover after
settling, an outcome the host's bytes contradict, a command past its bound, a traceback, a
history gap) and when one of its six planted violations goes undetected; so does this test,
with the soak's own report (seed and time of each example) in its message.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testbed.hosts import missing_prerequisites

pytestmark = [pytest.mark.integration, pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("seed", [35, 3501])
def test_one_minute_soak_finds_no_violation_and_its_detectors_fire(seed: int) -> None:
    reason = missing_prerequisites()
    if reason:
        pytest.skip(f"testbed: {reason}")
    argv = ["--minutes", "1", "--hosts", "4", "--seed", str(seed)]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.stress.soak", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = proc.stdout + proc.stderr[-3000:]
    assert proc.returncode == 0, report
    assert f"seed (replay: --seed)                        {seed}" in proc.stdout
    assert "planted violations detected                  6 of 6" in proc.stdout, report
    for kind in ("corrupt", "leftovers", "contradicted", "over-bound", "traceback", "history"):
        assert f"{kind} (must be 0)" in proc.stdout
    # Rollouts on the stand-in servers are among the operations (issue 35).
    operations = next(x for x in proc.stdout.splitlines() if x.startswith("operations"))
    assert " rollout " in operations, report
