"""The README's first command (`make demo`): the main job end to end on built-in defaults.

Everything runs on this machine: a local Hub stand-in plays the Hub, and every step is the real
`dflash-provision` CLI in a subprocess, printed as a shell transcript so a new user sees exactly
what to type on their own fleet.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from dflash_provision.testbed import samples
from dflash_provision.testbed.hub_standin import HubStandin

WORKDIR = Path(".demo")


class Transcript:
    """Runs CLI steps and prints them like a terminal session; remembers failed expectations."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env = env
        self.cwd = cwd
        self.surprises: list[str] = []

    def heading(self, text: str) -> None:
        print(f"\n## {text}", flush=True)

    def cli(self, args: Sequence[str], *, expect: int = 0) -> subprocess.CompletedProcess[str]:
        shown = shlex.join(["dflash-provision", *args])
        print(f"$ {shown}", flush=True)
        done = subprocess.run(
            [sys.executable, "-m", "dflash_provision", *args],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        for line in (done.stdout + done.stderr).rstrip("\n").splitlines():
            print(f"  {line}")
        print(f"  [exit {done.returncode}]", flush=True)
        if done.returncode != expect:
            self.surprises.append(f"{shown}: exit {done.returncode}, expected {expect}")
        return done


def run_demo(workdir: Path = WORKDIR) -> int:
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    incident = workdir / "incident-config.json"
    shutil.copyfile(samples.INCIDENT_DRAFTER, incident)

    with HubStandin() as hub:
        env = dict(os.environ)
        env.update(
            HF_ENDPOINT=hub.url,
            HF_HOME=str((workdir / "hf-home").resolve()),
            HF_HUB_DISABLE_TELEMETRY="1",
            DFLASH_PROVISION_HOME=str((workdir / "state").resolve()),
        )
        env.pop("HF_TOKEN", None)
        t = Transcript(env, workdir)
        print(f"Local Hub stand-in at {hub.url} (plays huggingface.co for this demo)")

        t.heading("1. Fetch the authoritative drafter config, pinned to a commit sha")
        t.cli(["fetch", samples.REFERENCE_REPO, "-o", "config.json"])
        print("  dflash.lock:")
        for line in (workdir / "dflash.lock").read_text().splitlines():
            print(f"    {line}")

        t.heading("2. Validate it: schema, DFlash invariants, what transformers will load")
        t.cli(["validate", "config.json", "--target-config", samples.REFERENCE_TARGET_REPO])

        t.heading("3. The incident's hand-written file, checked against the authoritative one")
        t.cli(["validate", incident.name, "--against", "config.json"], expect=3)
        t.cli(["diff", incident.name, "config.json"], expect=4)

    if t.surprises:
        print("\nDEMO FAILED: " + "; ".join(t.surprises), file=sys.stderr)
        return 1
    print("\nDemo finished: every step behaved as documented.")
    return 0


if __name__ == "__main__":
    sys.exit(run_demo())
