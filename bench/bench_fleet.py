"""Fleet audit / repair speed against the minimal paramiko script, on real sshd hosts.

Run as root (the testbed puts each sshd in its own namespaces)::

    .venv/bin/python bench/bench_fleet.py [--sizes 8,32,64] [--repeat 3]

For each fleet size it prints, side by side, wall time, controller CPU per host
(resource.getrusage: this process for in-process runs, children for CLI runs) and remote
commands per host, for:

    minimal read      bench/minimal_paramiko.py: one connection + one `cat` per host
    audit core        dflash_provision.fleet.audit in this process
    audit CLI         `dflash-provision audit` in a subprocess (includes interpreter start-up)
    minimal write     one connection + one `cat > file` per host
    minimal write+read  the same plus `cat file` on the same connection (2 execs): the floor
                      for any write with a separate read-back
    minimal atomic+read the script doing push's guarantees by hand, in one exec as push does:
                      temp file + fsync, the old file kept by a hard link, rename, directory
                      fsync, then `cat file` (no lock, hash check, trust checks, watchdog or
                      cut-off evidence)
    push core         place.push.push_config per host in a pool of the same size, on
                      an all-drifted fleet: one exec, the atomic write protocol with its
                      read-back and the old bytes (the authoritative config validated once per
                      run, as repair does)
    repair core       dflash_provision.fleet.repair on an all-drifted fleet: write first; the
                      same one exec brings the read-back (the fresh audit) and the old bytes,
                      judged as audit would
    repair CLI        `dflash-provision repair` in a subprocess

and the ratios the product promises: audit core <= 1.2x minimal read, push core <= 1.5x minimal
write (repair is shown next to it), and, whole processes paired at every size, the audit CLI
<= 1.1x the script's read CLI and the repair CLI <= 1.3x its write CLI (and its atomic CLI). It
also
measures `dflash-provision --help` start-up and checks that it imports neither paramiko,
transformers nor huggingface_hub. Timings are medians of ``--repeat`` runs.
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.*, run as a script

from bench import minimal_paramiko
from dflash_provision.fleet import FleetRun, audit, authority_loader, repair
from dflash_provision.inventory import FleetMember
from dflash_provision.place.push import check_authority, push_config
from dflash_provision.source.authority import Authority, SourceSpec
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import Connector
from dflash_provision.transport.options import SshOptions
from testbed import samples
from testbed.hosts import Fleet

MODEL = "/root/models/Qwen3.6-27B-DFlash"
REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()


@dataclass
class Measure:
    what: str
    wall_s: float
    cpu_s: float
    execs_per_host: float
    hosts: int

    @property
    def cpu_ms_per_host(self) -> float:
        return 1000 * self.cpu_s / self.hosts


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def timed(fn: Callable[[], float], who: int = resource.RUSAGE_SELF) -> tuple[float, float, float]:
    """(wall, cpu, execs-per-host) of one call; ``fn`` returns execs per host."""
    cpu0, t0 = _cpu(who), time.monotonic()
    execs = fn()
    return time.monotonic() - t0, _cpu(who) - cpu0, execs


def paired_ratios(
    pairs: int,
    prepare: Callable[[], None],
    baseline: Callable[[], float],
    contender: Callable[[], float],
) -> list[float]:
    """Wall-time ratios contender/baseline, each pair run back to back."""
    ratios = []
    for _ in range(pairs):
        prepare()
        base_wall = timed(baseline)[0]
        prepare()
        ratios.append(timed(contender)[0] / base_wall)
    return ratios


def median_measure(
    what: str,
    hosts: int,
    repeat: int,
    fn: Callable[[], float],
    prepare: Callable[[], None],
    who: int = resource.RUSAGE_SELF,
) -> Measure:
    runs = []
    for _ in range(repeat):
        prepare()
        runs.append(timed(fn, who))
    wall = statistics.median(r[0] for r in runs)
    cpu = statistics.median(r[1] for r in runs)
    return Measure(what, wall, cpu, runs[-1][2], hosts)


class Bench:
    def __init__(self, fleet: Fleet, work: Path) -> None:
        assert fleet.client is not None
        self.fleet = fleet
        self.client = fleet.client
        self.work = work
        self.home = work / "home"
        self.authority_file = work / "authority.json"
        self.authority_file.write_bytes(REFERENCE)
        self.options = SshOptions(
            # Like the minimal script: addresses, one key, no ssh_config to look hosts up in
            # (a config with one block per host costs an O(hosts) lookup per connection).
            ssh_config_path=None,
            known_hosts_path=str(self.client.known_hosts),
            identity_files=(str(self.client.identity),),
            identities_only=True,
            use_agent=False,
        )
        self.shared = minimal_paramiko.load_shared(
            str(self.client.identity), str(self.client.known_hosts), port=fleet.port
        )

    def seed(self, hosts: int, data: bytes) -> None:
        for host in self.fleet.hosts[:hosts]:
            model = host.root_dir / "models" / "Qwen3.6-27B-DFlash"
            model.mkdir(parents=True, exist_ok=True)
            (model / "config.json").write_bytes(data)

    def members(self, hosts: int) -> list[FleetMember]:
        source = SourceSpec(from_file=str(self.authority_file))
        return [
            FleetMember(h.name, parse_target(h.ssh_target(MODEL)), source)
            for h in self.fleet.hosts[:hosts]
        ]

    def inventory(self, hosts: int) -> Path:
        path = self.work / f"fleet-{hosts}.yaml"
        entries = "".join(
            f"  - {{name: {h.name}, address: {h.address}, port: {h.port}, user: root}}\n"
            for h in self.fleet.hosts[:hosts]
        )
        path.write_text(
            f"defaults: {{path: {MODEL}, drafter: {{from: {self.authority_file}}}}}\n"
            f"hosts:\n{entries}"
        )
        return path

    def addresses(self, hosts: int) -> list[str]:
        return [h.address for h in self.fleet.hosts[:hosts]]

    # -- the contenders -------------------------------------------------------------------------

    def minimal(
        self, hosts: int, data: bytes | None, read_back: bool = False, atomic: bool = False
    ) -> float:
        ok = minimal_paramiko.run(
            self.shared,
            self.addresses(hosts),
            f"{MODEL}/config.json",
            data=data,
            workers=64,
            read_back=read_back,
            atomic=atomic,
        )
        assert all(ok), "minimal script failed on some host"
        return 2.0 if read_back else 1.0

    def audit_core(self, hosts: int) -> float:
        run = FleetRun(authority_loader(), connector=Connector(self.options))
        audits = audit(self.members(hosts), run.authority_for, workers=64, run=run)
        assert all(a.status.audited for a in audits), [a.detail for a in audits][:3]
        return statistics.mean(a.execs for a in audits)

    def push_core(self, hosts: int) -> float:
        run = FleetRun(authority_loader(), connector=Connector(self.options))
        loaded = Authority(str(self.authority_file), self.authority_file.read_bytes())
        check_authority(loaded, force=False)  # once per run, like repair

        def one(member: FleetMember) -> int:
            transport = run.open(member)  # counts the execs
            try:
                result = push_config(transport, member.target, loaded, validate=False)
            finally:
                transport.close()
            assert result.status.value == "written", result.to_dict()
            return transport.execs

        with ThreadPoolExecutor(max_workers=min(64, hosts)) as pool:
            execs = list(pool.map(one, self.members(hosts)))
        return statistics.mean(execs)

    def repair_core(self, hosts: int) -> float:
        run = FleetRun(authority_loader(), connector=Connector(self.options))
        repairs = repair(self.members(hosts), run.authority_for, workers=64, run=run)
        assert all(r.final.status.value == "in_sync" for r in repairs), repairs[0].to_dict()
        return statistics.mean(r.execs for r in repairs)

    def cli(self, command: str, hosts: int, home: Path | None = None) -> float:
        """``home``: another state directory (a fresh one: a config never validated here, so
        the verdict cache is cold and transformers is imported, as for a new config)."""
        env = {**os.environ, "DFLASH_PROVISION_HOME": str(home or self.home)}
        argv = [
            sys.executable, "-m", "dflash_provision", command, "-i", str(self.inventory(hosts)),
            "--ssh-config", "/dev/null", "--known-hosts", str(self.client.known_hosts),
            "--identity", str(self.client.identity), "--no-agent", "--json",
        ]  # fmt: skip
        proc = subprocess.run(argv, env=env, capture_output=True, timeout=600, check=False)
        if proc.returncode not in (0, 4):
            raise RuntimeError(f"{command} exited {proc.returncode}: {proc.stderr.decode()}")
        document = json.loads(proc.stdout)
        return float(statistics.mean(h["execs"] for h in document["hosts"]))

    def fresh_home(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="home-", dir=self.work))

    def cli_new_config(self, hosts: int) -> float:
        """``repair`` with a fresh state directory: a config never validated on this controller
        (the verdict cache cold, transformers imported)."""
        return self.cli("repair", hosts, self.fresh_home())

    def minimal_cli(self, hosts: int, data: bytes | None, atomic: bool = False) -> float:
        argv = [
            sys.executable, str(Path(__file__).with_name("minimal_paramiko.py")),
            "--key", str(self.client.identity), "--known-hosts", str(self.client.known_hosts),
            "--path", f"{MODEL}/config.json", "--port", str(self.fleet.hosts[0].port),
            *self.addresses(hosts),
        ]  # fmt: skip
        if data is not None:
            payload = self.work / "payload.json"
            payload.write_bytes(data)
            argv += ["--write", str(payload), *(["--atomic"] if atomic else [])]
        done = subprocess.run(argv, capture_output=True, timeout=600, check=True)
        # The script reports failures in its JSON, not its exit code: a run whose hosts all
        # refused (the wrong port) would time nothing but interpreter start-up.
        failed = json.loads(done.stdout)["failed"]
        if failed:
            raise RuntimeError(f"minimal script: {failed} of {hosts} hosts failed")
        return 1.0


def startup(repeat: int) -> tuple[float, list[str]]:
    code = (
        "import sys\n"
        "from dflash_provision.cli import main as m\n"
        "try:\n    m.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [n for n in ('paramiko', 'transformers', 'huggingface_hub') if n in sys.modules]\n"
        "print(','.join(heavy), file=sys.stderr)\n"
    )
    walls, heavy = [], ""
    for _ in range(repeat):
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
        walls.append(time.monotonic() - t0)
        heavy = proc.stderr.strip()
    return statistics.median(walls), [h for h in heavy.split(",") if h]


def print_paired(paired: dict[str, list[float]], goals: dict[str, float]) -> None:
    """One line per contender: the median of its paired ratios, their range, and its goal."""
    for what, ratios in paired.items():
        ratio = statistics.median(ratios)
        verdict = "met" if ratio <= goals[what] else "MISSED"
        print(
            f"  {what:<26} {ratio:5.2f}x (min {min(ratios):.2f}, max {max(ratios):.2f}; "
            f"goal <= {goals[what]}x): {verdict}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,32,64")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-cli", action="store_true", help="skip the subprocess runs")
    parser.add_argument(
        "--pairs", type=int, default=9, help="paired runs for the goal ratios (largest size)"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if os.geteuid() != 0:
        sys.exit("bench_fleet.py needs root (the testbed's namespaces)")

    with tempfile.TemporaryDirectory(prefix="dflash-bench-") as tmp:
        work = Path(tmp)
        with Fleet(work / "fleet", max(sizes), address_prefix=None) as fleet:
            bench = Bench(fleet, work)
            # Warm-up: imports (paramiko, transformers via a drifted file) and sshd caches.
            bench.seed(max(sizes), INCIDENT)
            bench.audit_core(min(sizes))
            bench.minimal(min(sizes), None)
            if not args.no_cli:
                # The CLI's verdict cache: the "repair CLI" rows then time a config already
                # validated here (the usual case after `fetch` or a first push), and the
                # "new config" row the first time (a fresh state directory each run).
                bench.cli("repair", min(sizes))
            rows: list[tuple[Measure, Measure | None]] = []
            paired_cli: dict[int, dict[str, list[float]]] = {}
            for n in sizes:
                in_sync = partial(bench.seed, n, REFERENCE)
                drifted = partial(bench.seed, n, INCIDENT)
                base_read = median_measure(
                    "minimal read", n, args.repeat, partial(bench.minimal, n, None), in_sync
                )
                rows.append((base_read, None))
                rows.append((median_measure(
                    "audit core (in sync)", n, args.repeat, partial(bench.audit_core, n),
                    in_sync), base_read))  # fmt: skip
                rows.append((median_measure(
                    "audit core (drifted)", n, args.repeat, partial(bench.audit_core, n),
                    drifted), base_read))  # fmt: skip
                base_write = median_measure(
                    "minimal write",
                    n,
                    args.repeat,
                    partial(bench.minimal, n, REFERENCE),
                    drifted,
                )
                rows.append((base_write, None))
                rows.append((median_measure(
                    "minimal write+read", n, args.repeat,
                    partial(bench.minimal, n, REFERENCE, read_back=True), drifted,
                ), base_write))  # fmt: skip
                rows.append((median_measure(
                    "minimal atomic+read", n, args.repeat,
                    partial(bench.minimal, n, REFERENCE, atomic=True), drifted,
                ), base_write))  # fmt: skip
                rows.append((median_measure(
                    "push core", n, args.repeat, partial(bench.push_core, n), drifted
                ), base_write))  # fmt: skip
                rows.append((median_measure(
                    "repair core", n, args.repeat, partial(bench.repair_core, n), drifted
                ), base_write))  # fmt: skip
                if not args.no_cli:
                    children = resource.RUSAGE_CHILDREN
                    cli_read = median_measure(
                        "minimal read CLI", n, args.repeat,
                        partial(bench.minimal_cli, n, None), in_sync, children,
                    )  # fmt: skip
                    rows.append((cli_read, None))
                    rows.append((median_measure(
                        "audit CLI", n, args.repeat, partial(bench.cli, "audit", n),
                        in_sync, children), cli_read))  # fmt: skip
                    cli_write = median_measure(
                        "minimal write CLI", n, args.repeat,
                        partial(bench.minimal_cli, n, REFERENCE), drifted, children,
                    )  # fmt: skip
                    rows.append((cli_write, None))
                    rows.append((median_measure(
                        "repair CLI", n, args.repeat, partial(bench.cli, "repair", n),
                        drifted, children), cli_write))  # fmt: skip
                    # A config never validated on this controller: transformers is imported.
                    rows.append((median_measure(
                        "repair CLI (new config)", n, args.repeat,
                        partial(bench.cli_new_config, n), drifted, children,
                    ), cli_write))  # fmt: skip
                    rows.append((median_measure(
                        "minimal atomic CLI", n, args.repeat,
                        partial(bench.minimal_cli, n, REFERENCE, atomic=True), drifted,
                        children,
                    ), cli_write))  # fmt: skip
                    # Whole processes, each right after its baseline (the CLI's verdict cache
                    # warm: the config was validated by the rows above).
                    paired_cli[n] = {
                        "audit CLI vs read CLI": paired_ratios(
                            args.pairs, in_sync, partial(bench.minimal_cli, n, None),
                            partial(bench.cli, "audit", n),
                        ),
                        "repair CLI vs write CLI": paired_ratios(
                            args.pairs, drifted, partial(bench.minimal_cli, n, REFERENCE),
                            partial(bench.cli, "repair", n),
                        ),
                        "repair CLI vs atomic CLI": paired_ratios(
                            args.pairs, drifted,
                            partial(bench.minimal_cli, n, REFERENCE, atomic=True),
                            partial(bench.cli, "repair", n),
                        ),
                    }  # fmt: skip

            # The machine's speed drifts over minutes (other tenants, page cache, the ext4
            # journal), so medians taken minutes apart can differ by 20 %. Paired runs, each
            # contender right after its baseline, cancel most of that drift.
            n = max(sizes)
            paired = {
                "audit core (in sync)": paired_ratios(
                    args.pairs, lambda: bench.seed(n, REFERENCE),
                    lambda: bench.minimal(n, None), lambda: bench.audit_core(n),
                ),
                "audit core (drifted)": paired_ratios(
                    args.pairs, lambda: bench.seed(n, INCIDENT),
                    lambda: bench.minimal(n, None), lambda: bench.audit_core(n),
                ),
                "push core": paired_ratios(
                    args.pairs, lambda: bench.seed(n, INCIDENT),
                    lambda: bench.minimal(n, REFERENCE), lambda: bench.push_core(n),
                ),
                # What the guarantees cost when written by hand, and repair against that floor.
                "repair core vs atomic": paired_ratios(
                    args.pairs, lambda: bench.seed(n, INCIDENT),
                    lambda: bench.minimal(n, REFERENCE, atomic=True),
                    lambda: bench.repair_core(n),
                ),
            }  # fmt: skip
            paired_note = (
                f"paired ratios at {n} hosts ({args.pairs} pairs, each run right after its "
                "baseline, median):"
            )

    print(f"{'hosts':>5}  {'what':<22} {'wall s':>8} {'CPU ms/host':>12} "
          f"{'execs/host':>10}  vs baseline")  # fmt: skip
    for measure, baseline in rows:
        ratio = f"{measure.wall_s / baseline.wall_s:5.2f}x wall" if baseline else ""
        print(
            f"{measure.hosts:>5}  {measure.what:<22} {measure.wall_s:8.3f} "
            f"{measure.cpu_ms_per_host:12.1f} {measure.execs_per_host:10.1f}  {ratio}"
        )
    goals = {
        "audit core (in sync)": 1.2,
        "audit core (drifted)": 1.2,
        "push core": 1.5,
        "repair core vs atomic": 1.3,
    }
    print("\ngoals at the largest size (ratio of the medians above):")
    largest = max(sizes)
    for measure, baseline in rows:
        if measure.hosts == largest and measure.what in goals and baseline is not None:
            times = measure.wall_s / baseline.wall_s
            verdict = "met" if times <= goals[measure.what] else "MISSED"
            print(f"  {measure.what:<22} {times:5.2f}x (goal <= {goals[measure.what]}x): {verdict}")
    print(f"\n{paired_note}")
    print_paired(paired, goals)
    cli_goals = {
        "audit CLI vs read CLI": 1.1,
        "repair CLI vs write CLI": 1.3,
        "repair CLI vs atomic CLI": 1.3,
    }
    for size, by_what in paired_cli.items():
        print(f"\nwhole processes, paired at {size} hosts ({args.pairs} pairs, median):")
        print_paired(by_what, cli_goals)
    wall, heavy = startup(max(3, args.repeat))
    print(f"\n`dflash-provision --help`: {wall * 1000:.0f} ms (median), heavy imports: "
          f"{', '.join(heavy) or 'none'}")  # fmt: skip


if __name__ == "__main__":
    main()
