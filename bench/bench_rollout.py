"""Where a rollout's time goes: a healthy 6-host rollout in 3 batches on the vLLM stand-in.

Run as root (the test bed's sshd hosts live in namespaces; the sixth host's drafter is inside an
LXC busybox container behind it, as in tests/test_rollout_standin.py)::

    .venv/bin/python bench/bench_rollout.py [--repeat 3] [--no-container]

Each run: six servers (the vLLM STAND-IN, a test double, started by ``launch``) hold the
reference config; ``dflash-provision rollout --batches 1,25%,100% --json`` (a whole CLI
process) changes one harmless value on all of them. It prints the rollout's wall time, its
per-step walls (pre-flight, baseline, each batch) and, summed over the hosts, the time spent in
writes, restarts and checks (the record's per-host ``timings``), the median over ``--repeat``
runs. Nothing is asserted: these are figures for the note and docs/rollout.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from testbed import samples
from testbed.hosts import Fleet, Host
from testbed.lxc import Container
from testbed.vllm_standin_install import (
    CONTROL_ENV,
    install_standin,
    standin_container,
    write_control,
)

DRAFTER_DIR = "/root/models/Qwen3.6-27B-DFlash"
TARGET_DIR = "/root/models/Qwen3.6-27B"
CONTROL = "/root/standin/control.json"
CLI = [sys.executable, "-m", "dflash_provision"]


def _put(place: Host | Container, path: str, data: bytes) -> None:
    argv = ["sh", "-c", 'mkdir -p "${1%/*}" && cat > "$1"', "sh", path]
    if isinstance(place, Host):
        place.exec(argv, data, check=True)
    else:
        place.attach(argv, data)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=1800, check=False
    )


@contextmanager
def bed(base: Path, with_container: bool) -> Iterator[tuple[list[str], Path, dict[str, str]]]:
    """Six serving places launched on the reference config: (ssh args, inventory, env)."""
    with ExitStack() as stack:
        fleet = stack.enter_context(Fleet(base / "fleet", 6, address_prefix=None))
        assert fleet.client is not None
        ssh = ["--ssh-config", str(fleet.client.ssh_config), "--no-agent"]
        env = {**os.environ, "DFLASH_PROVISION_HOME": str(base / "state")}
        places: list[tuple[str, Host | Container, str]] = [
            (h.alias, h, f"{h.alias}:{DRAFTER_DIR}") for h in fleet.hosts[:5]
        ]
        inventory = [f"      - {h.alias}" for h in fleet.hosts[:5]]
        last = fleet.hosts[5]
        if with_container:
            container = standin_container(last)
            stack.callback(container.destroy)
            places.append(("h06-ct", container, f"{last.alias}/lxc:{container.name}:{DRAFTER_DIR}"))
            where = f"address: {last.alias}, container: 'lxc:{container.name}'"
            inventory.append(f"      - {{name: h06-ct, {where}}}")
        else:
            places.append((last.alias, last, f"{last.alias}:{DRAFTER_DIR}"))
            inventory.append(f"      - {last.alias}")
        authority = base / "old.json"
        authority.write_bytes(samples.REFERENCE_DRAFTER.read_bytes())

        def prepare(place: tuple[str, Host | Container, str]) -> None:
            _, where, target = place
            standin = install_standin(where, "/root/standin")
            _put(where, f"{DRAFTER_DIR}/config.json", authority.read_bytes())
            _put(where, f"{TARGET_DIR}/config.json", samples.REFERENCE_TARGET.read_bytes())
            write_control(where, CONTROL, {})
            done = _cli(
                ["launch", target, "--model", TARGET_DIR, "--from", str(authority),
                 "--vllm", standin.vllm, "--python", standin.python,
                 "--port", str(_free_port()), "--env", f"{CONTROL_ENV}={CONTROL}",
                 "--ready-timeout", "300", "--no-check", *ssh],
                env, base,
            )  # fmt: skip
            if done.returncode != 0:
                raise SystemExit(f"launch {target} failed: {done.stdout}{done.stderr}")

        with ThreadPoolExecutor(3) as pool:
            list(pool.map(prepare, places))
        path = base / "fleet.yaml"
        path.write_text(
            f"defaults:\n  path: {DRAFTER_DIR}\ngroups:\n  serving:\n    hosts:\n"
            + "\n".join(inventory)
            + "\n"
        )
        yield ssh, path, env


def one_rollout(
    base: Path, ssh: list[str], inventory: Path, env: dict[str, str], n: int
) -> dict[str, Any]:
    doc = json.loads(samples.REFERENCE_DRAFTER.read_bytes())
    doc["max_position_embeddings"] = 131072 + n  # a harmless change, another one each run
    new = base / f"new-{n}.json"
    new.write_text(json.dumps(doc, indent=2) + "\n")
    started = time.monotonic()
    done = _cli(
        ["rollout", "-i", str(inventory), "--from", str(new), "--batches", "1,25%,100%",
         "--env", f"{CONTROL_ENV}={CONTROL}", "--json", *ssh],
        env, base,
    )  # fmt: skip
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"rollout exit {done.returncode}: {done.stdout[-2000:]}{done.stderr}")
    record: dict[str, Any] = json.loads(done.stdout)
    sums: dict[str, float] = {}
    for host in record["hosts"]:
        for key, seconds in host.get("timings", {}).items():
            sums[key] = sums.get(key, 0.0) + float(seconds)
    return {"wall": wall, "walls": record.get("walls", {}), "sums": sums}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-container", action="store_true", help="six sshd hosts, no LXC")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_rollout: needs root (namespaced sshd hosts)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        base = Path(tmp)
        with bed(base, not args.no_container) as (ssh, inventory, env):
            runs = [one_rollout(base, ssh, inventory, env, n) for n in range(args.repeat)]
    median = statistics.median
    print(f"6-host rollout, batches 1,25%,100% (1+1+4 hosts), {args.repeat} run(s), medians:")
    print(f"  whole CLI process   {median(r['wall'] for r in runs):6.1f} s")
    order = {"preflight_s": 0, "baseline_s": 1}
    for key in sorted(runs[0]["walls"], key=lambda k: (order.get(k, 2), k)):
        print(f"  step {key:<14} {median(r['walls'].get(key, 0.0) for r in runs):6.1f} s")
    print("  summed over the hosts (they overlap within a batch; checks: baseline and gate):")
    for key in sorted(runs[0]["sums"]):
        total = median(r["sums"].get(key, 0.0) for r in runs)
        print(f"    {key:<16} {total:6.1f} s  ({total / 6:.2f} s per host)")
    load = os.getloadavg()[0]
    print(f"  (load average at the end: {load:.1f} on {os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
