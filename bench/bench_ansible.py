"""The same fleet change by ansible-playbook and by dflash-provision, whole processes, side by side.

Run as root from the repository root (the testbed puts each sshd in its own namespaces)::

    .venv/bin/python bench/bench_ansible.py [--hosts 64] [--repeat 1]

The change: every host's drafter ``config.json`` replaced, from the incident bytes to the
reference bytes (``testbed.samples``). Each tool, in one run:

    drafter_config    ``ansible-playbook`` with the collection's ``dflash.provision.drafter_config``
                      (``path:`` the drafter dir, ``src:`` the authoritative file), over its ssh
                      connection
    repair            ``dflash-provision repair --from FILE -i INVENTORY --json``
    builtin.copy      ``ansible-playbook`` with ``ansible.builtin.copy`` (``src:`` the same file,
                      ``dest:`` the config path)

Both playbooks: ``gather_facts: false``, ``-f 64``, run through ``tests/fixtures/ansible_play.py``
(its INI inventory with ``-F`` the fleet's ssh_config, this repository as the collections path).
Every host is reset to the incident bytes before each tool's run and checked for the reference
bytes after it, both outside the timed part; a host that does not hold them is printed. Ansible's
SSH control masters (ControlPersist) are closed after each run, outside the timed part, so no
run reuses another's connections. One unmeasured warm-up pass first (page cache, bytecode, the
verdict cache of the authoritative config). Wall time: the median of ``--repeat`` runs. Nothing
is asserted: the figures are for a note.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.*, tests.fixtures

from bench.bench_fleet import INCIDENT, MODEL, REFERENCE, Bench
from testbed.hosts import Fleet
from tests.fixtures.ansible_play import Play

CONFIG = f"{MODEL}/config.json"
FORKS = 64


def _playbook(task: str) -> str:
    return f"- hosts: fleet\n  gather_facts: false\n  tasks:\n    - name: the change\n{task}"


class AnsibleBench:
    def __init__(self, fleet: Fleet, work: Path, hosts: int) -> None:
        self.fleet = fleet
        self.hosts = hosts
        self.core = Bench(fleet, work)  # seed, inventory, the authoritative file, the CLI's home
        self.inventory = self.core.inventory(hosts)
        self.play = Play(fleet, work / "ansible", hosts=[h.alias for h in fleet.hosts[:hosts]])
        self.play.tmp.mkdir()
        source = self.core.authority_file
        self.books = {
            "drafter_config": _playbook(
                f"      dflash.provision.drafter_config:\n"
                f"        path: {MODEL}\n        src: {source}\n"
            ),
            "builtin.copy": _playbook(
                f"      ansible.builtin.copy:\n        src: {source}\n        dest: {CONFIG}\n"
            ),
        }

    def reset(self) -> None:
        self.core.seed(self.hosts, INCIDENT)

    def wrong(self) -> list[str]:
        """The hosts whose config is not the reference bytes."""
        wrong = []
        for host in self.fleet.hosts[: self.hosts]:
            path = host.root_dir / "models" / "Qwen3.6-27B-DFlash" / "config.json"
            try:
                ok = path.read_bytes() == REFERENCE
            except OSError:
                ok = False
            if not ok:
                wrong.append(host.name)
        return wrong

    def repair(self) -> str:
        """``dflash-provision repair`` as the fleet bench runs it (its inventory names the
        authoritative file); "" when it succeeded."""
        try:
            self.core.cli("repair", self.hosts)
        except RuntimeError as exc:
            return str(exc)
        return ""

    def ansible(self, tool: str) -> str:
        played = self.play.run(self.books[tool], "-f", str(FORKS))
        return f"exit {played.returncode}: {played.output[-2000:]}" if played.returncode else ""

    def close_masters(self) -> tuple[int, int]:
        """End the ControlPersist masters the last playbook left (they would serve the next):
        (sockets found, sockets left)."""
        sockets = list((self.play.tmp / "cp").glob("*"))
        for socket in sockets:
            subprocess.run(
                ["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "unused"],
                capture_output=True,
                timeout=30,
                check=False,
            )
        return len(sockets), sum(1 for s in sockets if s.exists())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_ansible.py needs root (the testbed's namespaces)")

    with tempfile.TemporaryDirectory(prefix="dflash-bench-ansible-") as tmp:
        work = Path(tmp)
        with Fleet(work / "fleet", args.hosts, address_prefix=None) as fleet:
            bench = AnsibleBench(fleet, work, args.hosts)
            tools: dict[str, Callable[[], str]] = {
                "drafter_config": lambda: bench.ansible("drafter_config"),
                "repair": bench.repair,
                "builtin.copy": lambda: bench.ansible("builtin.copy"),
            }
            walls: dict[str, list[float]] = {tool: [] for tool in tools}
            for run in range(-1, args.repeat):  # run -1: the warm-up, unmeasured
                for tool, fn in tools.items():
                    bench.reset()
                    started = time.monotonic()
                    failed = fn()
                    wall = time.monotonic() - started
                    masters, left = bench.close_masters()
                    label = "warm-up" if run < 0 else f"run {run + 1}"
                    if left:
                        print(f"{label} {tool}: {left} of {masters} ssh control masters left")
                    wrong = bench.wrong()
                    if failed:
                        print(f"{label} {tool}: {failed}")
                    if wrong:
                        print(
                            f"{label} {tool}: {len(wrong)} of {args.hosts} hosts do not hold "
                            f"the reference bytes: {', '.join(wrong[:8])}"
                        )
                    if run >= 0:
                        walls[tool].append(wall)

    medians = {tool: statistics.median(w) for tool, w in walls.items()}
    print(
        f"{args.hosts} hosts, one config.json replaced on each (incident -> reference), whole "
        f"processes, forks/workers {FORKS}, median of {args.repeat}"
    )
    print(f"{'tool':<16} {'wall s':>8} {'s/host':>8} {'vs repair':>10}")
    for tool, wall in medians.items():
        print(f"{tool:<16} {wall:8.2f} {wall / args.hosts:8.3f} {wall / medians['repair']:9.2f}x")


if __name__ == "__main__":
    main()
