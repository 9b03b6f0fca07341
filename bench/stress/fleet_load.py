"""Load and faults (issue 11 item 11): ``audit`` of 200 real sshd hosts, 30 of them faulty.

Starts a testbed fleet of 200 hosts (each a real sshd in its own namespaces), puts the
published config on each, and runs the real ``dflash-provision audit`` process twice over all of
them (every host a TARGET on the command line, ``--workers 64``, the default timeouts):

  healthy   every host answers
  faulty    10 hung (sshd SIGSTOPped: TCP connects, no banner), 10 stopped (refused), 10 with
            the model directory read-only (a read-only bind mount: still in sync), the rest
            healthy; the faulty hosts are spread over the fleet at random

Printed: wall time of each run, the bound for the faulty run (the healthy run's wall time +
one ``--connect-timeout``, what a hung host costs, + a fixed margin), what a serial wait on the
hung hosts would cost (hung × connect timeout), the statuses found, and the controller's peak
memory (``ru_maxrss`` of the CLI process, from ``wait4``). Exit 1 when the faulty run exceeds
the bound or a host is classified wrongly.

    sudo .venv/bin/python -m bench.stress.fleet_load           # 200 hosts, 10/10/10 faulty
    sudo .venv/bin/python -m bench.stress.fleet_load --quick   # 20 hosts, 2/2/2, 3 s timeout
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from bench.stress import _common as c
from testbed import samples
from testbed.hosts import Fleet

MARGIN_S = 15.0


def audit(
    fleet: Fleet, cfg: Path, home: Path, connect: float, command: float
) -> tuple[c.Finished, dict[str, str]]:
    """One real ``audit`` over every host; its result and each host's status."""
    targets = [f"{h.alias}:{c.MODEL}" for h in fleet.hosts]
    argv = ["audit", *targets, "--from", str(cfg), "--json", "--workers", "64"]
    argv += ["--connect-timeout", str(connect), "--command-timeout", str(command)]
    done = c.run_measured([*argv, *c.connection_flags(fleet)], home, home.parent, timeout=900)
    statuses: dict[str, str] = {}
    try:
        data = json.loads(done.stdout)
        hosts = data["hosts"] if isinstance(data, dict) else data
        for entry in hosts:
            # Named as on the command line (alias:path): the alias is the host.
            name = str(entry.get("host") or entry.get("name")).split(":", 1)[0]
            statuses[name] = str(entry["status"])
    except (ValueError, KeyError, TypeError) as exc:
        print(f"  cannot read the audit's JSON ({exc}): {done.stderr.strip()[-300:]}")
    return done, statuses


def _describe(label: str, done: c.Finished, statuses: dict[str, str]) -> None:
    counts = collections.Counter(statuses.values())
    c.line(f"{label}: wall time", f"{done.wall_s:.1f} s (exit {done.returncode})")
    c.line(f"{label}: controller peak RSS", f"{done.maxrss_kib / 1024:.0f} MiB")
    c.line(f"{label}: statuses", ", ".join(f"{k}×{v}" for k, v in sorted(counts.items())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 hosts, 2 of each fault")
    parser.add_argument("--hosts", type=int, help="fleet size (200)")
    parser.add_argument("--faulty", type=int, help="hosts of each fault (10)")
    parser.add_argument("--connect-timeout", type=float, help="audit's --connect-timeout (10)")
    parser.add_argument("--command-timeout", type=float, help="audit's --command-timeout (60)")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    count = args.hosts or (20 if args.quick else 200)
    faulty = args.faulty or (2 if args.quick else 10)
    connect = args.connect_timeout or (3.0 if args.quick else 10.0)
    command = args.command_timeout or (20.0 if args.quick else 60.0)
    c.require_testbed()
    with tempfile.TemporaryDirectory(prefix="stress-load-") as tmp:
        base = Path(tmp)
        t0 = time.monotonic()
        fleet = c.start_fleet(base / "fleet", count)
        c.line(f"fleet of {count} sshd hosts started in", f"{time.monotonic() - t0:.1f} s")
        try:
            return _run(fleet, base, faulty, connect, command, random.Random(args.seed))
        finally:
            fleet.stop()


def _run(
    fleet: Fleet, base: Path, faulty: int, connect: float, command: float, rng: random.Random
) -> int:
    data = samples.REFERENCE_DRAFTER.read_bytes()
    home, work = base / "home", base / "work"
    work.mkdir()
    cfg = work / "config.json"
    cfg.write_bytes(data)
    c.warm_verdicts(home, [data])
    for h in fleet.hosts:
        c.seed(h, data)
    healthy, statuses = audit(fleet, cfg, home, connect, command)
    _describe("healthy", healthy, statuses)
    ok = healthy.returncode == 0 and set(statuses.values()) == {"in_sync"}

    picked = rng.sample(fleet.hosts, 3 * faulty)
    hung, stopped, readonly = picked[:faulty], picked[faulty : 2 * faulty], picked[2 * faulty :]
    for h in hung:
        h.hang()
    for h in stopped:
        h.stop()
    for h in readonly:
        h.make_readonly(c.MODEL)
    try:
        done, statuses = audit(fleet, cfg, home, connect, command)
    finally:
        for h in hung:
            h.resume()
    bound = healthy.wall_s + connect + MARGIN_S
    _describe("faulty", done, statuses)
    c.line("faulty: bound (healthy + connect timeout + 15 s)", f"{bound:.1f} s")
    c.line("a serial wait on the hung hosts would be", f"{faulty * connect:.0f} s")
    expected = {h.alias: "in_sync" for h in fleet.hosts}
    expected.update({h.alias: "unreachable_timeout" for h in hung})
    expected.update({h.alias: "unreachable_refused" for h in stopped})
    wrong = {k: v for k, v in statuses.items() if expected.get(k) != v}
    if len(statuses) != len(expected):
        wrong["(hosts in the output)"] = f"{len(statuses)} of {len(expected)}"
    c.line("hosts classified wrongly (must be 0)", len(wrong))
    for name, status in list(wrong.items())[:10]:
        print(f"  {name}: {status}, expected {expected.get(name)}")
    ok = ok and done.wall_s <= bound and not wrong and done.returncode == 5
    print("RESULT:", "ok" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
