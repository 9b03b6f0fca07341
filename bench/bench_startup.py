"""Whole-process start-up of the everyday commands, next to a baseline build.

Run as root (the one host is a real sshd in its own namespaces)::

    .venv/bin/python bench/bench_startup.py [--runs 9] [--baseline OTHER/bin/dflash-provision]

It sets up once: a local Hub stand-in, ``fetch`` (so ``dflash.lock`` and the HF cache hold the
published config), one testbed host, and a first ``push`` to it. Then it times, as a user meets
them, three commands in fresh processes (cold interpreter, warm page cache: one unmeasured run
of each first):

    validate   dflash-provision validate config.json           (the published config)
    push       dflash-provision push h01:/root/models/X         (second push: "unchanged")
    audit      dflash-provision audit h01:/root/models/X        (1 host, in sync)

Each figure is the wall time of the whole process, from start to exit, taken with
``time.perf_counter`` around ``subprocess.run``; median (min-max) of ``--runs`` runs. With
``--baseline`` the same commands run through the other executable, alternating A B A B so that
a drift in the machine's speed hits both alike, and the ratio is taken pair by pair.

``--hold`` sets everything up, prints the environment and the commands, and waits for Enter:
time the commands with any external tool meanwhile.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dflash_provision.testbed import samples
from dflash_provision.testbed.hosts import Fleet
from dflash_provision.testbed.hub_standin import HubStandin

MODEL = "/root/models/Qwen3.6-27B-DFlash"


@dataclass(frozen=True)
class Setup:
    workdir: Path
    env: dict[str, str]
    commands: dict[str, list[str]]  # name -> arguments after the program


@contextmanager
def prepared(workdir: Path, program: list[str]) -> Iterator[Setup]:
    """The Hub stand-in, the lock, one host holding the config: what a second push meets."""
    with HubStandin() as hub, Fleet(workdir / "fleet", 1, address_prefix=None) as fleet:
        assert fleet.client is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "DFLASH_"))}
        env.update(
            HF_ENDPOINT=hub.url,
            HF_HOME=str(workdir / "hf-home"),
            HF_HUB_DISABLE_TELEMETRY="1",
            DFLASH_PROVISION_HOME=str(workdir / "state"),
        )
        host = fleet.hosts[0]
        ssh = ["--ssh-config", str(fleet.client.ssh_config)]
        target = f"{host.name}:{MODEL}"
        commands = {
            "validate": ["validate", "config.json"],
            "push": ["push", target, *ssh],
            "audit": ["audit", target, "--lock", "dflash.lock", *ssh],
        }
        setup = Setup(workdir, env, commands)
        run(setup, program, ["fetch", samples.REFERENCE_REPO, "-o", "config.json"])
        run(setup, program, ["push", target, "--mkdir", *ssh])
        yield setup


def run(setup: Setup, program: list[str], args: list[str]) -> float:
    """Wall seconds of one whole process; a failing command stops the benchmark."""
    started = time.perf_counter()
    done = subprocess.run(
        [*program, *args],
        cwd=setup.workdir,
        env=setup.env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)}: exit {done.returncode}\n{done.stderr.decode()}")
    return elapsed


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def measure(setup: Setup, program: list[str], baseline: list[str] | None, runs: int) -> None:
    print(f"{'command':<10} {'this build':<22}" + (f" {'baseline':<22} ratio" if baseline else ""))
    for name, args in setup.commands.items():
        run(setup, program, args)  # warm the page cache (and, for this build, its caches)
        if baseline:
            run(setup, baseline, args)
        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(runs):
            ours.append(run(setup, program, args))
            if baseline:
                theirs.append(run(setup, baseline, args))
        line = f"{name:<10} {spread(ours):<22}"
        if baseline:
            ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
            line += f" {spread(theirs):<22} {statistics.median(ratios):.2f}x"
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--baseline", help="another dflash-provision executable to compare")
    parser.add_argument("--hold", action="store_true", help="set up, print, wait for Enter")
    options = parser.parse_args()
    program = [str(Path(sys.executable).parent / "dflash-provision")]
    baseline = [options.baseline] if options.baseline else None
    workdir = Path(tempfile.mkdtemp(prefix="dflash-bench-startup-")).resolve()
    try:
        with prepared(workdir, program) as setup:
            if options.hold:
                print(f"cd {workdir}")
                for key in ("HF_ENDPOINT", "HF_HOME", "HF_HUB_DISABLE_TELEMETRY"):
                    print(f"export {key}={setup.env[key]}")
                print(f"export DFLASH_PROVISION_HOME={setup.env['DFLASH_PROVISION_HOME']}")
                for args in setup.commands.values():
                    print(" ".join(["dflash-provision", *args]))
                input("set up; press Enter to stop\n")
                return
            measure(setup, program, baseline, options.runs)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
