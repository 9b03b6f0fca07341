"""Whole-process start-up of the everyday commands, next to ``ssh true`` and a baseline build.

Run as root (the one host is a real sshd in its own namespaces)::

    .venv/bin/python bench/bench_startup.py [--runs 9] [--baseline OTHER/bin/dflash-provision]

It sets up once: a local Hub stand-in, ``fetch`` (so ``dflash.lock`` and the HF cache hold the
published config), one testbed host, and a first ``push`` to it. Then it times, as a user meets
them, these commands in fresh processes (cold interpreter, warm page cache: one unmeasured run
of each first):

    validate      dflash-provision validate config.json        (the published config)
    push          dflash-provision push h01:/root/models/X      (second push: "unchanged")
    audit         dflash-provision audit h01:/root/models/X     (1 host, in sync)
    verify        dflash-provision verify h01:/root/models/X    (in sync)
    unreachable   dflash-provision push ssh://root@ADDR/... --from fresh.json
                  (a refused address, a config never validated: exit 5 in the connect time)
    ssh true      ssh -F SSH_CONFIG h01 true                    (OpenSSH: the floor for one login)

Each figure is the wall time of the whole process, from start to exit, taken with
``time.perf_counter`` around ``subprocess.run``, and its CPU time (user + system, from
``getrusage(RUSAGE_CHILDREN)``); median (min-max) of ``--runs`` runs. The load average
(``os.getloadavg``) is printed before and after: on a shared machine wall time follows it, CPU
time much less. With ``--baseline`` the dflash-provision commands also run through the other
executable, alternating A B A B so that a drift in the machine's speed hits both alike, and the
ratio is taken pair by pair.

The commands run without ``PYTHONDONTWRITEBYTECODE`` (dropped from the environment if set), so
they use cached bytecode as an installed package does, not a fresh compile of every module.

``--hold`` sets everything up, prints the environment and the commands, and waits for Enter:
time the commands with any external tool meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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

from testbed import samples
from testbed.hosts import Fleet, refused_address
from testbed.hub_standin import HubStandin

MODEL = "/root/models/Qwen3.6-27B-DFlash"
PROGRAM = "dflash-provision"  # in a Case's argv: replaced by the build being measured


@dataclass(frozen=True)
class Case:
    name: str
    argv: list[str]  # PROGRAM first for the builds compared, else a program of its own
    exit_code: int = 0


@dataclass(frozen=True)
class Setup:
    workdir: Path
    env: dict[str, str]
    cases: list[Case]


@contextmanager
def prepared(workdir: Path, program: list[str]) -> Iterator[Setup]:
    """The Hub stand-in, the lock, one host holding the config: what a second push meets."""
    with HubStandin() as hub, Fleet(workdir / "fleet", 1, address_prefix=None) as fleet:
        assert fleet.client is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "DFLASH_"))}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.update(
            HF_ENDPOINT=hub.url,
            HF_HOME=str(workdir / "hf-home"),
            HF_HUB_DISABLE_TELEMETRY="1",
            DFLASH_PROVISION_HOME=str(workdir / "state"),
        )
        host = fleet.hosts[0]
        ssh = ["--ssh-config", str(fleet.client.ssh_config)]
        target = f"{host.name}:{MODEL}"
        fresh = samples.load_json(samples.REFERENCE_DRAFTER)
        fresh["_comment"] = "never validated: the push must fail before validating"
        (workdir / "fresh.json").write_text(json.dumps(fresh))
        address, port = refused_address()
        refused = f"ssh://root@{address}:{port}{MODEL}"
        cases = [
            Case("validate", [PROGRAM, "validate", "config.json"]),
            Case("push", [PROGRAM, "push", target, *ssh]),
            Case("audit", [PROGRAM, "audit", target, "--lock", "dflash.lock", *ssh]),
            Case("verify", [PROGRAM, "verify", target, *ssh]),
            Case("unreachable", [PROGRAM, "push", refused, "--from", "fresh.json"], 5),
            Case("ssh true", fleet.client.ssh_argv(host.alias, ["true"])),
        ]
        setup = Setup(workdir, env, cases)
        run(
            setup,
            program,
            Case("fetch", [PROGRAM, "fetch", samples.REFERENCE_REPO, "-o", "config.json"]),
        )
        run(setup, program, Case("first push", [PROGRAM, "push", target, "--mkdir", *ssh]))
        yield setup


def run(setup: Setup, program: list[str], case: Case) -> tuple[float, float]:
    """(wall, CPU) seconds of one whole process; an unexpected exit stops the benchmark."""
    argv = [*program, *case.argv[1:]] if case.argv[0] == PROGRAM else case.argv
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        argv, cwd=setup.workdir, env=setup.env, capture_output=True, timeout=120, check=False
    )
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != case.exit_code:
        sys.exit(f"{case.name}: exit {done.returncode}\n{done.stderr.decode()}")
    return elapsed, cpu


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def measure(setup: Setup, program: list[str], baseline: list[str] | None, runs: int) -> None:
    print(load(), flush=True)
    header = f"{'command':<12} {'wall':<22} {'cpu':<8}"
    print(header + (f" {'baseline wall':<22} {'cpu':<8} ratio" if baseline else ""))
    for case in setup.cases:
        compared = baseline is not None and case.argv[0] == PROGRAM
        run(setup, program, case)  # warm the page cache (and, for this build, its caches)
        if compared and baseline:
            run(setup, baseline, case)
        ours: list[tuple[float, float]] = []
        theirs: list[tuple[float, float]] = []
        for _ in range(runs):
            ours.append(run(setup, program, case))
            if compared and baseline:
                theirs.append(run(setup, baseline, case))
        cpu = statistics.median(c for _, c in ours)
        line = f"{case.name:<12} {spread([w for w, _ in ours]):<22} {cpu:.2f} s"
        if theirs:
            ratios = [a[0] / b[0] for a, b in zip(ours, theirs, strict=True)]
            their_cpu = statistics.median(c for _, c in theirs)
            line += f"   {spread([w for w, _ in theirs]):<22} {their_cpu:.2f} s"
            line += f"   {statistics.median(ratios):.2f}x"
        print(line, flush=True)
    print(load(), flush=True)


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
                print("unset PYTHONDONTWRITEBYTECODE")
                for case in setup.cases:
                    print(" ".join(case.argv))
                input("set up; press Enter to stop\n")
                return
            measure(setup, program, baseline, options.runs)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
