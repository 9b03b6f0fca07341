"""Fleet audit / repair at a real fleet's latency, against the minimal paramiko script.

Run as root (the testbed puts each sshd in its own namespaces)::

    .venv/bin/python bench/bench_latency.py [--hosts 64] [--rtt-ms 50] [--repeat 3]

This kernel has no ``sch_netem``, so latency comes from ``bench/delay_relay.py``: one delaying
TCP relay per test host (listening on the host's own loopback address, port + 1000, forwarding
to its sshd), a delay line of RTT/2 in each direction. Both contenders are pointed at the
relays: the CLI by an inventory with the relay's address and port, the script by ``--port``,
both with a known_hosts whose names are the relays' (``[addr]:port``, the hosts' own keys).

Whole processes, side by side in one run, each contender right after its baseline:

    minimal read        ``minimal_paramiko.py``: one connection + ``cat FILE`` per host
    audit CLI           ``dflash-provision audit -i INVENTORY --json`` (in sync, then drifted)
    minimal write       ``minimal_paramiko.py --write``: one connection + ``cat > FILE``
    minimal write+read  the same plus ``cat FILE`` on the same connection (2 execs)
    minimal atomic+read push's guarantees by hand in one exec (temp file + fsync, backup link,
                        rename, directory fsync, ``cat FILE``): see minimal_paramiko.py
    repair CLI          ``dflash-provision repair -i INVENTORY --json`` on an all-drifted fleet
                        (the row the fleet bench compares with the minimal write)

And, without a baseline (the states the minimal script has no counterpart for):

    audit CLI (missing)   every host without the file (the read script says so: one exec)
    repair CLI (in sync)  every host in sync (the write finds the bytes there: one exec)
    push CLI (1 host)     ``dflash-provision push ssh://root@RELAY:PORT/MODEL --from FILE`` to
                          the first host, drifted (its execs: the protocol's one, not reported)

Columns: wall time (median of ``--repeat``), the ratio to the baseline (median of the paired
ratios), per host: SSH connections, round trips and exec requests, the contender's CPU (its
whole process, user + system, start-up included, divided by the hosts), and the relays' CPU
(this process's thread): the relays share the 2 cores with everything else, so a relay that
became the bottleneck would show here.

How the round trips are counted: the relay counts, per connection, the *turns* of the traffic:
each time it reads data from the server after the last data it read came from the client. A
client that waits for the answer before it speaks again pays one RTT per turn; what both sides
send at once (SSH's banners, KEXINIT) is no extra turn, and a request the client pipelines
behind another without waiting is none either. The sum over a host's connections, averaged over
the hosts, is "round trips/host"; round trips × RTT is the least wall time a host can cost (the
TCP handshake is on loopback and not delayed: one more RTT per connection on a real link, for
both contenders alike). Exec requests are encrypted, so the relay cannot see them: the CLI's
come from its ``--json`` report (``execs`` per host), the script's from its design (1 or 2).

Count protocol turns at ``--rtt-ms 200``: a turn is only seen as one when the other side is
quicker to answer than the delay, and at 50 ms a host slowed by the shared cores (its script's
processes waiting for a core) can answer in two pieces, which the relay counts as one turn more.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.*, run as a script

from bench.delay_relay import Relay, RelayPool
from testbed import samples
from testbed.hosts import Fleet, known_hosts_name

MODEL = "/root/models/Qwen3.6-27B-DFlash"
REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()
RELAY_PORT_OFFSET = 1000
BENCH = Path(__file__).resolve().parent


@dataclass
class Run:
    wall_s: float
    connections: float  # per host
    round_trips: float  # per host
    execs: float  # per host
    cpu_ms: float  # the contender's process (user + system), per host
    relay_cpu_s: float  # this process: the relays' thread


@dataclass
class Row:
    what: str
    baseline: Row | None = None
    hosts: int | None = None  # how many hosts it contacts (the first ones): all when None
    runs: list[Run] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)

    def median(self, pick: Callable[[Run], float]) -> float:
        return statistics.median(pick(r) for r in self.runs)


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class LatencyBench:
    def __init__(self, fleet: Fleet, relays: list[Relay], work: Path, rtt_s: float) -> None:
        assert fleet.client is not None
        self.fleet = fleet
        self.client = fleet.client
        self.relays = relays
        self.work = work
        self.rtt_s = rtt_s
        self.home = work / "home"
        self.authority = work / "authority.json"
        self.authority.write_bytes(REFERENCE)
        self.payload = work / "payload.json"
        self.payload.write_bytes(REFERENCE)
        self.known_hosts = work / "relay_known_hosts"
        self.known_hosts.write_text(
            "".join(
                f"{known_hosts_name(r.address, r.port)} {h.host_public_key}\n"
                for h, r in zip(fleet.hosts, relays, strict=True)
            )
        )
        self.inventory = work / "fleet.yaml"
        entries = "".join(
            f"  - {{name: {h.name}, address: {r.address}, port: {r.port}, user: root}}\n"
            for h, r in zip(fleet.hosts, relays, strict=True)
        )
        self.inventory.write_text(
            f"defaults: {{path: {MODEL}, drafter: {{from: {self.authority}}}}}\nhosts:\n{entries}"
        )

    def seed(self, data: bytes) -> None:
        for host in self.fleet.hosts:
            model = host.root_dir / "models" / "Qwen3.6-27B-DFlash"
            model.mkdir(parents=True, exist_ok=True)
            (model / "config.json").write_bytes(data)

    def measured(self, fn: Callable[[], float], hosts: int | None = None) -> Run:
        """One run of ``fn`` (returns execs per host), with the relays' counts of it, per host
        of the first ``hosts`` (all when None) that it contacts."""
        for relay in self.relays:
            relay.take()
        child0, self0 = _cpu(resource.RUSAGE_CHILDREN), _cpu(resource.RUSAGE_SELF)
        started = time.monotonic()
        execs = fn()
        wall = time.monotonic() - started
        child1, self1 = _cpu(resource.RUSAGE_CHILDREN), _cpu(resource.RUSAGE_SELF)
        time.sleep(self.rtt_s)  # the last closes travel through the delay line
        per_host = [relay.take() for relay in self.relays][:hosts]
        n = len(per_host)
        return Run(
            wall,
            sum(len(c) for c in per_host) / n,
            sum(s.turns for c in per_host for s in c) / n,
            execs,
            1000 * (child1 - child0) / n,
            self1 - self0,
        )

    def minimal(self, write: bool, read_back: bool = False, atomic: bool = False) -> float:
        argv = [
            sys.executable, str(BENCH / "minimal_paramiko.py"),
            "--key", str(self.client.identity), "--known-hosts", str(self.known_hosts),
            "--port", str(self.relays[0].port), "--path", f"{MODEL}/config.json",
            *(r.address for r in self.relays),
        ]  # fmt: skip
        if write:
            argv += ["--write", str(self.payload)]
        if read_back:
            argv.append("--read-back")
        if atomic:
            argv.append("--atomic")
        proc = subprocess.run(argv, capture_output=True, timeout=600, check=True)
        result = json.loads(proc.stdout)
        assert result["failed"] == 0, result
        return 2.0 if read_back else 1.0

    def missing(self) -> None:
        for host in self.fleet.hosts:
            model = host.root_dir / "models" / "Qwen3.6-27B-DFlash"
            model.mkdir(parents=True, exist_ok=True)
            (model / "config.json").unlink(missing_ok=True)

    def push_first(self) -> float:
        """``push`` to the first host by its relay: the protocol's one exec (push's --json
        report does not count them)."""
        relay = self.relays[0]
        argv = [
            sys.executable, "-m", "dflash_provision", "push",
            f"ssh://root@{relay.address}:{relay.port}{MODEL}", "--from", str(self.authority),
            "--ssh-config", "/dev/null", "--known-hosts", str(self.known_hosts),
            "--identity", str(self.client.identity), "--no-agent", "--json",
        ]  # fmt: skip
        env = {**os.environ, "DFLASH_PROVISION_HOME": str(self.home)}
        proc = subprocess.run(argv, env=env, capture_output=True, timeout=600, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"push exited {proc.returncode}: {proc.stderr.decode()}")
        return 1.0

    def cli(self, command: str) -> float:
        env = {**os.environ, "DFLASH_PROVISION_HOME": str(self.home)}
        argv = [
            sys.executable, "-m", "dflash_provision", command, "-i", str(self.inventory),
            "--ssh-config", "/dev/null", "--known-hosts", str(self.known_hosts),
            "--identity", str(self.client.identity), "--no-agent", "--json",
        ]  # fmt: skip
        proc = subprocess.run(argv, env=env, capture_output=True, timeout=600, check=False)
        if proc.returncode not in (0, 4):
            raise RuntimeError(f"{command} exited {proc.returncode}: {proc.stderr.decode()}")
        hosts = json.loads(proc.stdout)["hosts"]
        assert len(hosts) == len(self.relays), len(hosts)
        return float(statistics.mean(h["execs"] for h in hosts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_latency.py needs root (the testbed's namespaces)")
    rtt_s = args.rtt_ms / 1000

    with tempfile.TemporaryDirectory(prefix="dflash-bench-latency-") as tmp:
        work = Path(tmp)
        with Fleet(work / "fleet", args.hosts, address_prefix=None) as fleet, RelayPool() as pool:
            relays = [
                pool.add((h.address, h.port), rtt_s, (h.address, h.port + RELAY_PORT_OFFSET))
                for h in fleet.hosts
            ]
            bench = LatencyBench(fleet, relays, work, rtt_s)
            in_sync = lambda: bench.seed(REFERENCE)  # noqa: E731
            drifted = lambda: bench.seed(INCIDENT)  # noqa: E731
            read = Row("minimal read")
            write = Row("minimal write")
            plan: list[tuple[Row, Callable[[], None], Callable[[], float]]] = [
                (read, in_sync, lambda: bench.minimal(write=False)),
                (Row("audit CLI (in sync)", read), in_sync, lambda: bench.cli("audit")),
                (read, drifted, lambda: bench.minimal(write=False)),
                (Row("audit CLI (drifted)", read), drifted, lambda: bench.cli("audit")),
                (write, drifted, lambda: bench.minimal(write=True)),
                (Row("minimal write+read", write), drifted,
                 lambda: bench.minimal(write=True, read_back=True)),
                (write, drifted, lambda: bench.minimal(write=True)),
                (Row("minimal atomic+read", write), drifted,
                 lambda: bench.minimal(write=True, atomic=True)),
                (write, drifted, lambda: bench.minimal(write=True)),
                (Row("repair CLI (drifted)", write), drifted, lambda: bench.cli("repair")),
                (Row("audit CLI (missing)"), bench.missing, lambda: bench.cli("audit")),
                (Row("repair CLI (in sync)"), in_sync, lambda: bench.cli("repair")),
                (Row("push CLI (1 host)", hosts=1), drifted, bench.push_first),
            ]  # fmt: skip
            # Warm-up (page cache, bytecode, the verdict cache for both configs): unmeasured.
            for _row, prepare, fn in plan:
                prepare()
                fn()
            for _ in range(args.repeat):
                for row, prepare, fn in plan:
                    prepare()
                    run = bench.measured(fn, row.hosts)
                    if row.baseline is not None:
                        row.ratios.append(run.wall_s / row.baseline.runs[-1].wall_s)
                    row.runs.append(run)
            rows: list[Row] = []
            for row, _prepare, _fn in plan:
                if row not in rows:
                    rows.append(row)

    print(
        f"{args.hosts} hosts, {args.rtt_ms:g} ms round trip (delay relay per host), whole "
        f"processes, median of {args.repeat} (ratios: median of the paired runs)"
    )
    print(
        f"{'what':<22} {'wall s':>7} {'vs baseline':>18} {'conns/host':>10} "
        f"{'round trips/host':>16} {'x RTT s':>8} {'execs/host':>10} {'CPU ms/host':>11} "
        f"{'relay CPU s':>11}"
    )
    for row in rows:
        ratio = ""
        if row.baseline is not None:
            ratio = f"{statistics.median(row.ratios):.2f}x"
            ratio += f" ({min(row.ratios):.2f}-{max(row.ratios):.2f})"
        trips = row.median(lambda r: r.round_trips)
        print(
            f"{row.what:<22} {row.median(lambda r: r.wall_s):7.2f} {ratio:>18} "
            f"{row.median(lambda r: r.connections):10.1f} {trips:16.1f} "
            f"{trips * rtt_s:8.2f} {row.median(lambda r: r.execs):10.1f} "
            f"{row.median(lambda r: r.cpu_ms):11.1f} {row.median(lambda r: r.relay_cpu_s):11.2f}"
        )
    print("baselines: audit rows vs the minimal read just before; minimal write+read and repair "
          "vs the minimal write just before")  # fmt: skip


if __name__ == "__main__":
    main()
