"""The README's first command (`make demo`) runs the main job end to end: keep it working."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_demo_runs_every_step_as_documented(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "DFLASH_"))}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from dflash_provision.testbed.demo import "
            "run_demo; sys.exit(run_demo(Path(sys.argv[1])))",
            str(tmp_path / "demo"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "Demo finished: every step behaved as documented." in out
    # What a new user should see happen, in order.
    steps = [
        "revision  main -> d1f1a5b0c0ffee00000000000000000000000001",
        "dflash_config.mask_token_id: 248064, authoritative 248070",
        "set use_sliding_window: true",
        "read back and matched",
        "drift:",
        "6 hosts: 2 in sync, 1 drifted, 1 missing, 1 invalid, 1 loader normalised",
        "6 in sync now",
        "dflash_config_in_sync{",
    ]
    position = 0
    for text in steps:
        found = out.find(text, position)
        assert found >= 0, f"{text!r} missing (or out of order) in the demo output"
        position = found
