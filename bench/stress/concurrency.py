"""Concurrency (issue 11 item 10): simultaneous pushes to one file, and concurrent repairs.

Rounds of 8 simultaneous pushes of 8 different configs (same meaning, different bytes) to one
``config.json`` on a real sshd host, alternating two ways of running them:

  threads    8 threads of this process, the core API (``push_config``), each on its own SSH
             connection, released together by a barrier
  processes  8 ``dflash-provision push --json`` processes started together

Per round, checked against the truth on disk:

- exactly one complete config wins: the final file is byte-identical to one of the 8;
- every push's reported outcome: its bytes landed iff they are the final file or one of the
  round's backups (``--keep-backups`` is large enough to keep them all; every rename turns the
  previous file into a backup). A push that says written / replaced (landed, then replaced by
  another writer) must have landed; one that says failed / not-applied must not have. Mismatches
  are counted and printed ("unknown" is counted apart);
- an audit reader (``read_remote_config``, the read the fleet audit makes) loops on its own
  connection during the round and must never see partial content.

Then 4 concurrent ``dflash-provision repair`` processes over one drifted fleet: every host must
end in sync.

Exit 1 when a round has no single complete winner, the reader saw partial content, or the fleet
is not in sync after the repairs (``--strict-outcomes``: also on an outcome mismatch).

    sudo .venv/bin/python -m bench.stress.concurrency           # 20 rounds, 8 writers, 8 hosts
    sudo .venv/bin/python -m bench.stress.concurrency --quick   # 2 rounds, 3 hosts
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.stress import _common as c
from dflash_provision.place.push import push_config
from dflash_provision.remote.ops import ReadStatus, read_remote_config
from dflash_provision.remote.proof import WriteOptions
from dflash_provision.source.authority import Authority
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import open_transport
from dflash_provision.transport.options import SshOptions
from testbed import samples
from testbed.hosts import Fleet, Host

WRITERS = 8
KEEP = 50
LANDED_CLAIMS = ("written", "unchanged", "replaced")
NOT_LANDED_CLAIMS = ("failed", "not-applied")


@dataclass
class Claim:
    writer: int
    status: str  # the push's status, or "error: ..." when it raised / printed no JSON
    message: str = ""


@dataclass
class RoundResult:
    mode: str
    winner: int | None  # index of the config that won; None: no complete config
    claims: list[Claim]
    landed: set[int]
    reads: int = 0
    partial_reads: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    unknown: int = 0


class Reader(threading.Thread):
    """Reads the file again and again on one connection, as an audit does, until stopped."""

    def __init__(self, host: Host, options: SshOptions, known: set[bytes]) -> None:
        super().__init__(daemon=True)
        self.target = parse_target(f"{host.alias}:{c.MODEL}")
        self.options = options
        self.known = known
        self.stop = threading.Event()
        self.reads = 0
        self.partial: list[str] = []

    def run(self) -> None:
        with open_transport(self.target, self.options) as transport:
            while not self.stop.is_set():
                read = read_remote_config(transport, self.target.config_path, remote_hash=False)
                self.reads += 1
                if read.status is not ReadStatus.PRESENT or read.data not in self.known:
                    self.partial.append(f"{read.status}: {(read.data or b'')[:40]!r}")


def _reset(host: Host, base: bytes) -> Path:
    model = host.root_dir / c.MODEL.removeprefix("/root/")
    shutil.rmtree(model / ".dflash-backups", ignore_errors=True)
    c.seed(host, base)
    return model


def _landed(model: Path, pool: list[bytes]) -> tuple[int | None, set[int]]:
    final = (model / "config.json").read_bytes()
    seen = [final]
    backups = model / ".dflash-backups"
    seen += [p.read_bytes() for p in backups.iterdir() if p.name.startswith("config.json.2")]
    landed = {pool.index(d) for d in seen if d in pool}
    return (pool.index(final) if final in pool else None), landed


def _push_threads(host: Host, options: SshOptions, pool: list[bytes]) -> list[Claim]:
    target = parse_target(f"{host.alias}:{c.MODEL}")
    barrier = threading.Barrier(len(pool))
    claims: list[Claim] = [Claim(i, "error: did not run") for i in range(len(pool))]

    def one(i: int) -> None:
        try:
            with open_transport(target, options) as transport:
                transport.connect()
                barrier.wait(timeout=120)
                result = push_config(
                    transport,
                    target,
                    Authority(label=f"writer {i}", data=pool[i]),
                    validate=False,
                    write=WriteOptions(keep_backups=KEEP, timeout=60),
                )
            claims[i] = Claim(i, result.status.value, result.message)
        except Exception as exc:  # a raised error is an outcome to check too
            claims[i] = Claim(i, f"error: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(pool))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return claims


def _push_processes(
    host: Host, pool_files: list[Path], home: Path, flags: list[str]
) -> list[Claim]:
    argv = ["push", f"{host.alias}:{c.MODEL}", "--json", "--keep-backups", str(KEEP)]
    started = time.monotonic()
    procs = [c.cli_popen([*argv, "--from", str(f), *flags], home, home.parent) for f in pool_files]
    claims = []
    for i, proc in enumerate(procs):
        done = c.wait_cli(proc, started, 180)
        if done is None:
            claims.append(Claim(i, "error: hung (killed after 180 s)"))
            continue
        try:
            data = json.loads(done.stdout)
            claims.append(Claim(i, str(data["status"]), str(data.get("message", ""))))
        except (ValueError, KeyError, TypeError):
            claims.append(Claim(i, f"error: exit {done.returncode}: {done.stderr.strip()[-160:]}"))
    return claims


def _judge(result: RoundResult) -> None:
    for claim in result.claims:
        landed = claim.writer in result.landed
        if claim.status == "unknown":
            result.unknown += 1
        elif claim.status in LANDED_CLAIMS and not landed:
            result.mismatches.append(f"writer {claim.writer} said {claim.status}, never landed")
        elif claim.status not in LANDED_CLAIMS and landed:
            said = f"{claim.status} ({claim.message[:90]})" if claim.message else claim.status
            result.mismatches.append(f"writer {claim.writer} said {said}, but its bytes landed")


def run_round(
    mode: str,
    host: Host,
    options: SshOptions,
    pool: list[bytes],
    files: list[Path],
    home: Path,
    flags: list[str],
) -> RoundResult:
    base = c.configs(1, first_indent=40)[0]
    model = _reset(host, base)
    reader = Reader(host, options, {base, *pool})
    reader.start()
    time.sleep(0.3)  # the reader is connected and reading before the writers start
    if mode == "threads":
        claims = _push_threads(host, options, pool)
    else:
        claims = _push_processes(host, files, home, flags)
    reader.stop.set()
    reader.join(60)
    winner, landed = _landed(model, pool)
    result = RoundResult(mode, winner, claims, landed, reader.reads, reader.partial)
    _judge(result)
    return result


def repair_check(fleet: Fleet, hosts: list[Host], cfg: Path, want: bytes, home: Path) -> bool:
    """4 concurrent repair processes over drifted ``hosts``; True when all end in sync."""
    # Another meaning, not only other bytes: a file with the same values in other formatting is
    # in sync, and repair rightly leaves it alone.
    drifted = samples.INCIDENT_DRAFTER.read_bytes()
    for h in hosts:
        _reset(h, drifted)
    targets = [f"{h.alias}:{c.MODEL}" for h in hosts]
    argv = ["repair", *targets, "--from", str(cfg), *c.connection_flags(fleet)]
    started = time.monotonic()
    procs = [c.cli_popen(argv, home, home.parent) for _ in range(4)]
    done = [c.wait_cli(p, started, 300) for p in procs]
    wall = time.monotonic() - started
    codes = ["hung" if d is None else str(d.returncode) for d in done]
    in_sync = [
        (h.root_dir / c.MODEL.removeprefix("/root/") / "config.json").read_bytes() == want
        for h in hosts
    ]
    c.line("4 concurrent repairs: exit codes", ", ".join(codes) + f" ({wall:.1f} s)")
    c.line("hosts in sync after the repairs", f"{sum(in_sync)}/{len(hosts)}")
    for d in done:
        if d is not None and d.returncode != 0:
            print("  repair stderr:", d.stderr.strip().splitlines()[-3:], flush=True)
    return all(in_sync)


def _report(results: list[RoundResult]) -> bool:
    bad_rounds = [r for r in results if r.winner is None]
    partial = sum(len(r.partial_reads) for r in results)
    mismatches = [m for r in results for m in r.mismatches]
    statuses = collections.Counter(cl.status.split(":")[0] for r in results for cl in r.claims)
    print()
    for mode in ("threads", "processes"):
        mine = [r for r in results if r.mode == mode]
        if mine:
            c.line(
                f"{mode}: rounds / single complete winner",
                f"{len(mine)} / {sum(1 for r in mine if r.winner is not None)}",
            )
    c.line("rounds without one complete winner (must be 0)", len(bad_rounds))
    c.line("pushes", sum(len(r.claims) for r in results))
    c.line("reported outcomes", ", ".join(f"{k}×{v}" for k, v in sorted(statuses.items())))
    c.line("outcome mismatches (reported vs on disk)", len(mismatches))
    c.line("outcome unknown", sum(r.unknown for r in results))
    c.line("audit reads during the pushes", sum(r.reads for r in results))
    c.line("audit reads with partial content (must be 0)", partial)
    for m in mismatches[:12]:
        print("  mismatch:", m)
    for r in results:
        for p in r.partial_reads[:3]:
            print("  partial read:", p)
    return not bad_rounds and partial == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds; repairs over 3 hosts")
    parser.add_argument("--rounds", type=int, help="rounds of 8 simultaneous pushes (20)")
    parser.add_argument("--repair-hosts", type=int, help="hosts the 4 repairs share (8)")
    parser.add_argument(
        "--strict-outcomes", action="store_true", help="exit 1 on an outcome mismatch too"
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 20)
    repair_hosts = args.repair_hosts or (3 if args.quick else 8)
    c.require_testbed()
    with tempfile.TemporaryDirectory(prefix="stress-concurrency-") as tmp:
        base = Path(tmp)
        fleet = c.start_fleet(base / "fleet", 1 + repair_hosts)
        try:
            return _run(fleet, base, rounds, args.strict_outcomes)
        finally:
            fleet.stop()


def _run(fleet: Fleet, base: Path, rounds: int, strict: bool) -> int:
    pool = c.configs(WRITERS)
    home, workdir = base / "home", base / "work"
    workdir.mkdir()
    files = []
    for i, data in enumerate(pool):
        files.append(workdir / f"config-{i}.json")
        files[-1].write_bytes(data)
    c.warm_verdicts(home, pool)
    options = c.ssh_options(fleet, connect=10, command=60)
    host = fleet.hosts[0]
    print(f"stress concurrency: {rounds} rounds of {WRITERS} pushes to {host.alias}", flush=True)
    results = []
    for n in range(rounds):
        mode = "threads" if n % 2 == 0 else "processes"
        r = run_round(mode, host, options, pool, files, home, c.connection_flags(fleet))
        results.append(r)
        print(
            f"  round {n + 1} ({mode}): winner {r.winner}, landed {len(r.landed)}/{WRITERS}, "
            f"statuses {[cl.status[:40] for cl in r.claims]}, reads {r.reads}",
            flush=True,
        )
    ok = _report(results)
    ok = repair_check(fleet, fleet.hosts[1:], files[0], pool[0], home) and ok
    mismatches = sum(len(r.mismatches) for r in results)
    failed = not ok or (strict and mismatches > 0)
    print("RESULT:", "FAIL" if failed else "ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
