"""``audit --all-files`` on real sshd hosts with a drafter of a given size, side by side with
``rsync --checksum`` of the same directory and ``hf download`` run on each host.

Run as root (the testbed puts each sshd in its own namespaces)::

    .venv/bin/python bench/bench_all_files.py [--hosts 64] [--size-mb 100]

The Hub stand-in serves a drafter repo (config, generation config, two safetensors shards of
random bytes as LFS objects, their index); ``fetch --all-files`` pins it; every host gets a copy
of the files (its own inodes). Then, each on the whole fleet (64 at once):

    audit --all-files (hash)     the fleet audit with the files check (fleet/files_audit.py, in
                                 this process), a fresh history: every file hashed on its host
    audit --all-files (proofs)   the same again: files unchanged since the proofs are not hashed
    rsync --checksum (dry run)   ``rsync -a -c -n --stats`` from a controller copy: both sides
                                 read and checksum every file, nothing is transferred
    hf download (check)          ``hf download REPO --revision SHA --local-dir DIR`` for each
                                 host's directory, against the stand-in (what a host does to
                                 fetch it itself; run from the controller on the host's files,
                                 as the host's namespace hides this venv's interpreter)

and then, with the second shard truncated to 1 MB on every host before each (an interrupted
download), what makes it right: ``repair --all-files`` (fleet/files_repair.py in this process:
the shard streamed from the controller's Hub cache), ``rsync --checksum`` for real (its delta
transfer uses the truncated file as a basis) and ``hf download`` again.

Columns: wall time, bytes per host over the connection (audit: the commands' arguments, stdin
and output as the transport carried them; rsync: its --stats total sent + received; hf: the
bytes the stand-in served), host CPU per host (audit and rsync: the CPU of everything the
hosts' sshd ran, from their reaped children's times; hf: the CPU of the processes run on the
hosts) and controller CPU per host.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

DIR = "/root/models/bench-drafter"
REPO = "z-lab/Bench-DFlash-AllFiles"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Row:
    what: str
    wall_s: float
    bytes_per_host: float
    host_cpu_ms: float
    controller_cpu_ms: float
    note: str = ""


def drafter(size_mb: int) -> dict[str, bytes]:
    """A drafter of about ``size_mb`` MB: two shards of random bytes behind a safetensors
    header (the files are hashed, not loaded), an index, the reference config."""
    from testbed import samples

    rng = random.Random(32)
    files: dict[str, bytes] = {}
    half = size_mb * 1024 * 1024 // 2
    for i, name in enumerate(SHARDS):
        header = json.dumps({"__metadata__": {"format": "pt"}, f"w{i}": {
            "dtype": "U8", "shape": [half], "data_offsets": [0, half]}}).encode()  # fmt: skip
        header += b" " * (-len(header) % 8)
        files[name] = len(header).to_bytes(8, "little") + header + rng.randbytes(half)
    weight_map = {f"w{i}": name for i, name in enumerate(SHARDS)}
    files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}).encode()
    files["config.json"] = samples.REFERENCE_DRAFTER.read_bytes()
    files["generation_config.json"] = b'{"_from_model_config": true}\n'
    return files


def children_cpu(pids: Sequence[int]) -> float:
    """Seconds of CPU the processes' reaped descendants used (cutime + cstime)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[13]) + int(fields[14])
    return total / _TICK


def own_children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Bench:
    def __init__(self, fleet: object, hub: object, work: Path, lock: Path, workers: int) -> None:
        self.fleet, self.hub, self.work, self.lock = fleet, hub, work, lock
        self.hosts = fleet.hosts  # type: ignore[attr-defined]
        self.client = fleet.client  # type: ignore[attr-defined]
        self.workers = workers
        self.sshd = [h.sshd_pid for h in self.hosts]

    def _timed(
        self, what: str, action: Callable[[], float], *, host_cpu: Callable[[], float]
    ) -> Row:
        cpu0, host0, wall0 = own_cpu(), host_cpu(), time.monotonic()
        sent = action()
        wall = time.monotonic() - wall0
        # The hosts' sshd reap their sessions a moment after the connections close; only then
        # do those sessions' times count in sshd's children's times.
        time.sleep(2)
        n = len(self.hosts)
        return Row(
            what,
            wall,
            sent / n,
            (host_cpu() - host0) * 1000 / n,
            (own_cpu() - cpu0) * 1000 / n,
        )

    def break_shard(self) -> None:
        """The second shard truncated to 1 MB on every host (an interrupted download)."""
        for host in self.hosts:
            os.truncate(host.root_dir / DIR.removeprefix("/root/") / SHARDS[1], 1024 * 1024)

    def audit(self, what: str, *, repair: bool = False) -> Row:
        from dflash_provision.fleet.files_audit import audit_all_files
        from dflash_provision.fleet.run import CountingTransport, FleetRun, authority_loader
        from dflash_provision.history.store import HistoryStore
        from dflash_provision.inventory import FleetMember
        from dflash_provision.source.authority import SourceSpec
        from dflash_provision.target import parse_target
        from dflash_provision.transport.base import CommandResult, Transport
        from dflash_provision.transport.factory import Connector
        from dflash_provision.transport.options import SshOptions

        carried = [0]

        class Bytes(CountingTransport):
            def run(
                self,
                argv: Sequence[str],
                *,
                stdin: bytes | None = None,
                timeout: float | None = None,
            ) -> CommandResult:
                result = super().run(argv, stdin=stdin, timeout=timeout)
                carried[0] += sum(len(a) for a in argv) + len(stdin or b"")
                carried[0] += len(result.stdout) + len(result.stderr)
                return result

        class Run(FleetRun):
            def open(self, member: FleetMember) -> CountingTransport:
                inner: Transport = self.connector.open(member.target, member.route)
                return Bytes(inner)

        options = SshOptions(
            ssh_config_path=None,
            known_hosts_path=str(self.client.known_hosts),
            identity_files=(str(self.client.identity),),
            identities_only=True,
            use_agent=False,
        )
        source = SourceSpec(lock=str(self.lock))
        members = [FleetMember(h.name, parse_target(h.ssh_target(DIR)), source) for h in self.hosts]
        history = HistoryStore(self.work / "history.sqlite3")

        def action() -> float:
            run = Run(authority_loader(), connector=Connector(options))
            if repair:
                from dflash_provision.fleet.files_repair import repair_all_files

                for member in members:
                    run.authority(member)
                fixed = repair_all_files(
                    members, run, workers=self.workers, dry_run=False, hub_timeout=600,
                    history=history,
                )  # fmt: skip
                assert {r.exit_code for r in fixed} == {0}, fixed[0].to_dict()
                return float(carried[0])
            results = audit_all_files(members, run, workers=self.workers, history=history)
            statuses = {r.files.status.value if r.files else "unchecked" for r in results}
            assert statuses == {"in_sync"}, statuses
            return float(carried[0])

        return self._timed(what, action, host_cpu=lambda: children_cpu(self.sshd))

    def rsync(self, source: Path, *, dry_run: bool = True) -> Row:
        sent = [0]

        def one(host: object) -> None:
            argv = [
                "rsync", "-a", "-c", *(["-n"] if dry_run else []), "--stats", "-e",
                f"ssh -F {self.client.ssh_config}", f"{source}/",
                f"{host.alias}:{DIR}/",  # type: ignore[attr-defined]
            ]  # fmt: skip
            done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True)
            for key in ("Total bytes sent", "Total bytes received"):
                match = re.search(rf"{key}: ([\d,]+)", done.stdout)
                assert match, done.stdout
                sent[0] += int(match.group(1).replace(",", ""))

        def action() -> float:
            with ThreadPoolExecutor(self.workers) as pool:
                list(pool.map(one, self.hosts))
            return float(sent[0])

        what = "rsync --checksum (dry run)" if dry_run else "rsync --checksum (repair)"
        return self._timed(what, action, host_cpu=lambda: children_cpu(self.sshd))

    def hf_download(self, sha: str, sizes: dict[str, int], what: str) -> Row:
        hub = self.hub
        hf = str(Path(sys.executable).parent / "hf")

        def one(host: object) -> None:
            # The host's directory through its controller-side path: a host's mount namespace
            # hides the controller's /root, where this venv's interpreter lives. The same files
            # on the same disk, hashed by the same code: the work `hf download` does there.
            local_dir = host.root_dir / DIR.removeprefix("/root/")  # type: ignore[attr-defined]
            env = {
                **os.environ,
                "HF_ENDPOINT": hub.url,  # type: ignore[attr-defined]
                "HF_HOME": str(self.work / "hf-hosts" / host.name),  # type: ignore[attr-defined]
                "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            }
            argv = [hf, "download", REPO, "--revision", sha, "--local-dir", str(local_dir)]
            subprocess.run(argv, env=env, capture_output=True, timeout=600, check=True)

        def served() -> float:
            """Bodies the stand-in sent: an LFS file's from the "CDN" (its resolve GET is a
            302 without one), any other file's from resolve."""
            from testbed.hub_standin import is_lfs

            total = 0
            for (method, path), n in hub.requests.items():  # type: ignore[attr-defined]
                name = path.rsplit("/", 1)[1]
                lfs_body = "/lfs-cdn/" in path
                plain_body = "/resolve/" in path and not is_lfs(name)
                if method == "GET" and (lfs_body or plain_body):
                    total += n * sizes.get(name, 0)
            return float(total)

        def action() -> float:
            before = served()
            with ThreadPoolExecutor(self.workers) as pool:
                list(pool.map(one, self.hosts))
            return served() - before

        # The hf processes are children of this one: their CPU is our children's.
        row = self._timed(what, action, host_cpu=own_children_cpu)
        row.note = "host CPU: the hf processes"
        return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--size-mb", type=int, default=100)
    parser.add_argument("--workers", type=int, default=64)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_all_files.py needs root (the testbed's namespaces)")

    with tempfile.TemporaryDirectory(prefix="dflash-bench-files-") as tmp:
        work = Path(tmp)
        # Before anything imports huggingface_hub: its constants are read at import.
        os.environ.update(
            HF_HOME=str(work / "hf"), HF_HUB_DISABLE_TELEMETRY="1", DFLASH_PROVISION_HOME=str(work)
        )
        from testbed.hosts import Fleet
        from testbed.hub_standin import HubStandin

        files = drafter(args.size_mb)
        sizes = {name: len(data) for name, data in files.items()}
        sizes |= {hashlib.sha256(data).hexdigest(): len(data) for data in files.values()}
        with HubStandin() as hub, Fleet(work / "fleet", args.hosts, address_prefix=None) as fleet:
            os.environ["HF_ENDPOINT"] = hub.url
            sha = hub.add_repo(REPO, files)
            lock = work / "dflash.lock"
            subprocess.run(
                [sys.executable, "-m", "dflash_provision", "fetch", REPO, "--all-files",
                 "--lock", str(lock)], check=True, capture_output=True, cwd=work,
            )  # fmt: skip
            source = work / "drafter"
            source.mkdir()
            for name, data in files.items():
                (source / name).write_bytes(data)
            for host in fleet.hosts:
                target = host.root_dir / DIR.removeprefix("/root/")
                target.mkdir(parents=True)
                for name in files:
                    shutil.copyfile(source / name, target / name)
            subprocess.run(["sync"], check=True)
            time.sleep(1.1)  # proofs are kept only for files older than their hash's second

            bench = Bench(fleet, hub, work, lock, args.workers)
            rows = [
                bench.audit("audit --all-files (hash)"),
                bench.audit("audit --all-files (proofs)"),
                bench.rsync(source),
                bench.hf_download(sha, sizes, "hf download (check)"),
            ]
            # A shard truncated on every host, made right by each contender in turn.
            bench.break_shard()
            rows.append(bench.audit("repair --all-files", repair=True))
            bench.break_shard()
            rows.append(bench.rsync(source, dry_run=False))
            bench.break_shard()
            rows.append(bench.hf_download(sha, sizes, "hf download (repair)"))
    total = sum(sizes[name] for name in files)
    print(
        f"{args.hosts} hosts, a drafter of {total / 1e6:.1f} MB ({len(files)} files), "
        f"{args.workers} at once"
    )
    print(
        f"{'':30} {'wall s':>8} {'bytes/host':>12} {'host CPU ms/host':>17} {'ctl CPU ms/host':>16}"
    )
    for row in rows:
        print(
            f"{row.what:30} {row.wall_s:8.2f} {row.bytes_per_host:12.0f} "
            f"{row.host_cpu_ms:17.0f} {row.controller_cpu_ms:16.1f}  {row.note}"
        )


if __name__ == "__main__":
    main()
