"""Crash consistency (issue 11 item 9): pushes interrupted at random points, then checked.

Each trial starts a real ``dflash-provision push`` process to one target and interrupts it:

  ctl-kill      SIGKILL of the CLI process (the controller dies)
  ctl-int       SIGINT of the CLI process (Ctrl-C)
  session-kill  SIGKILL of the host's per-connection sshd (the remote session dies)
  freeze        SIGSTOP of everything in the host (sshd, sessions, scripts, containers) until
                the CLI has given up (past --command-timeout), then SIGCONT
  disk-full     the model directory on a small tmpfs with a random number of free pages, fewer
                than the new config needs (the write runs out of space part way); sshd hosts only

at a random delay: mostly counted from the moment the push's SSH session appears on the host
(so the interrupt lands in the remote work), some from the process start. Targets: several
sshd hosts and a busybox LXC container inside one more host (``hNN/lxc:NAME:/root/...``), one
worker thread per target.

After every trial: the file is byte-identical to the old or the new config and parses (else
"corrupt"); history has the push's row (by the CLI's pid) whenever the new bytes landed; then a
next push (core API) must succeed and leave no temp file and no lock directory behind
("leftovers"). Exit 1 when corrupt > 0, leftovers > 0, a landed write is missing from history,
or a CLI process did not end within its bound.

    sudo .venv/bin/python -m bench.stress.crash            # 200 trials, 4 hosts + 1 container
    sudo .venv/bin/python -m bench.stress.crash --quick    # 10 trials, 2 hosts + 1 container
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.stress import _common as c
from dflash_provision.history.store import HistoryStore, default_db_path
from dflash_provision.place.push import PushStatus, push_config
from dflash_provision.remote.proof import WriteOptions
from dflash_provision.source.authority import Authority
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import open_transport
from dflash_provision.transport.options import SshOptions
from testbed.hosts import FILLER_NAME, Fleet, Host
from testbed.lxc import Container, busybox_container, unique_name

FAULTS = ("ctl-kill", "ctl-int", "session-kill", "freeze", "disk-full")
CONNECT_TIMEOUT = 3.0
COMMAND_TIMEOUT = 6.0
#: A CLI process must end within this (its own timeouts are far below): else it "hung".
CLI_BOUND_S = 90.0
PAGE = 4096


@dataclass
class StressTarget:
    """One place a push goes: an sshd host's model directory, or a container's behind a host."""

    spec: str  # the CLI's TARGET
    host: Host  # the host whose sessions carry the push (the container's host for a container)
    container: Container | None = None

    @property
    def name(self) -> str:
        return self.spec.split(":", 1)[0]

    def read(self) -> bytes | None:
        if self.container is not None:  # its rootfs is a plain directory the controller sees
            try:
                return (self._container_model() / "config.json").read_bytes()
            except OSError:
                return None
        proc = self.host.exec(["cat", f"{c.MODEL}/config.json"], text=False, timeout=60)
        return proc.stdout if proc.returncode == 0 else None

    def _container_model(self) -> Path:
        assert self.container is not None
        return self.container.rootfs / c.MODEL.removeprefix("/")

    def _listing(self) -> tuple[list[str], list[str]]:
        if self.container is not None:
            model = self._container_model()
            backups = model / ".dflash-backups"
            return os.listdir(model), os.listdir(backups) if backups.is_dir() else []
        script = f"cd {c.MODEL} && ls -A . && echo /// && ls -A .dflash-backups 2>/dev/null"
        listing = self.host.exec(["sh", "-c", script], timeout=60).stdout
        top, _, backups = listing.partition("///")
        return top.split(), backups.split()

    def leftovers(self) -> list[str]:
        """Names the write protocol must not leave: temp files, lock directories, and anything
        else beside config.json (the flock lock FILE stays by design: a kernel lock dies with
        its holder, and the next push took it)."""
        top, backups = self._listing()
        bad = [n for n in top if n not in ("config.json", ".dflash-backups", FILLER_NAME)]
        bad += [
            f".dflash-backups/{n}" for n in backups if "dflash-tmp" in n or n.endswith(".lockdir")
        ]
        return bad


@dataclass
class Trial:
    target: str
    fault: str
    outcome: str = ""  # old / new / corrupt
    exit_code: int | None = None  # None: killed by us, or hung
    reported: str = ""  # the CLI's JSON status, or its error line
    history: str = ""  # the history row's status for this pid, "" when none
    leftovers: list[str] = field(default_factory=list)
    hung: bool = False
    note: str = ""


@dataclass
class Plan:
    configs: list[bytes]
    big: bytes
    files: dict[bytes, Path]
    home: Path
    workdir: Path
    flags: list[str]
    options: SshOptions
    store: HistoryStore


def _session_then(target: StressTarget, proc: subprocess.Popen[bytes], rng: random.Random) -> None:
    """Sleep until the interrupt moment: 25 % from the process start (0-2.5 s), else from the
    push's SSH session appearing on the host (0-0.6 s into it)."""
    if rng.random() < 0.25:
        time.sleep(rng.uniform(0.0, 2.5))
        return
    deadline = time.monotonic() + 30
    while not c.sessions(target.host) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(rng.uniform(0.0, 0.6))


def _prepare_disk_full(target: StressTarget, plan: Plan, rng: random.Random) -> str:
    pages = len(plan.big) // PAGE
    free = rng.randrange(0, pages) * PAGE
    target.host.fill_disk(c.MODEL, size=f"{len(plan.big) * 4 // 1024}k")
    target.host.exec(
        ["truncate", "-s", f"-{free}", f"{c.MODEL}/{FILLER_NAME}"], check=True, timeout=60
    )
    return f"{free // PAGE} free pages of {pages + 1} needed"


def run_trial(target: StressTarget, fault: str, plan: Plan, rng: random.Random) -> Trial:
    trial = Trial(target.name, fault)
    old = target.read()
    if fault == "disk-full":
        new = plan.big
        trial.note = _prepare_disk_full(target, plan, rng)
    else:
        new = rng.choice([cfg for cfg in plan.configs if cfg != old])
    argv = ["push", target.spec, "--from", str(plan.files[new]), "--json", "--keep-backups", "3"]
    argv += ["--connect-timeout", str(CONNECT_TIMEOUT), "--command-timeout", str(COMMAND_TIMEOUT)]
    started = time.monotonic()
    proc = c.cli_popen(argv + plan.flags, plan.home, plan.workdir)
    frozen: list[int] = []
    try:
        if fault in ("ctl-kill", "ctl-int", "session-kill", "freeze"):
            _session_then(target, proc, rng)
            if fault == "ctl-kill":
                proc.send_signal(signal.SIGKILL)
            elif fault == "ctl-int":
                proc.send_signal(signal.SIGINT)
            elif fault == "session-kill":
                c.kill_pids(c.sessions(target.host), signal.SIGKILL)
            else:
                frozen = c.freeze(target.host)
        done = c.wait_cli(proc, started, CLI_BOUND_S)
    finally:
        c.thaw(frozen)
    trial.hung = done is None
    if done is not None and done.returncode >= 0:
        trial.exit_code = done.returncode
        trial.reported = _reported(done.stdout, done.stderr)
    if not c.wait_sessions_gone(target.host, 60):
        trial.note += " (a remote session outlived 60 s)"
    seen = target.read()
    trial.outcome = "old" if seen == old else "new" if seen == new else "corrupt"
    if trial.outcome == "corrupt":
        trial.note += f" file: {seen[:60]!r}" if seen is not None else " file missing"
    trial.history = _history_status(plan.store, proc.pid)
    _next_push(target, trial, seen, plan)
    return trial


def _reported(stdout: str, stderr: str) -> str:
    try:
        return str(json.loads(stdout)["status"])
    except (ValueError, KeyError, TypeError):
        lines = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
        return lines[-1][:160] if lines else stderr.strip()[-160:]


def _history_status(store: HistoryStore, pid: int) -> str:
    rows = [r for r in store.query(op="push", limit=400) if r.pid == pid]
    return rows[0].status if rows else ""


def _next_push(target: StressTarget, trial: Trial, seen: bytes | None, plan: Plan) -> None:
    """The push after the interrupted one must work at once and leave nothing behind."""
    if trial.fault == "disk-full":
        target.host.exec(["rm", "-f", f"{c.MODEL}/{FILLER_NAME}"], check=True)
    data = next(cfg for cfg in plan.configs if cfg != seen)
    parsed = parse_target(target.spec)
    try:
        with open_transport(parsed, plan.options) as transport:
            result = push_config(
                transport,
                parsed,
                Authority(label="next", data=data),
                validate=False,
                write=WriteOptions(keep_backups=3, timeout=30),
            )
        if result.status is not PushStatus.WRITTEN:
            trial.leftovers.append(f"next push {result.status}: {result.message}")
    except Exception as exc:  # a failed next push is a finding, not a crash
        trial.leftovers.append(f"next push raised {type(exc).__name__}: {exc}")
    trial.leftovers += target.leftovers()
    if trial.fault == "disk-full":
        target.host.undo_mounts()


def _worker(
    target: StressTarget,
    faults: list[str],
    plan: Plan,
    seed: int,
    out: list[Trial],
    lock: threading.Lock,
) -> None:
    rng = random.Random(seed)
    for fault in faults:
        try:
            trial = run_trial(target, fault, plan, rng)
        except Exception as exc:  # report it, go on with the other trials
            trial = Trial(target.name, fault, outcome="error", note=f"{type(exc).__name__}: {exc}")
            if fault == "disk-full":
                _undo_quietly(target.host)
        with lock:
            out.append(trial)
            n = len(out)
        notable = trial.outcome not in ("old", "new") or trial.leftovers or trial.exit_code == 1
        if n % 10 == 0 or notable:
            print(
                f"  [{n}] {trial.target} {trial.fault}: {trial.outcome}, exit {trial.exit_code},"
                f" reported {trial.reported!r}, history {trial.history!r}"
                f"{', leftovers ' + repr(trial.leftovers) if trial.leftovers else ''}"
                f"{', ' + trial.note.strip() if trial.note.strip() else ''}",
                flush=True,
            )


def _undo_quietly(host: Host) -> None:
    try:
        host.undo_mounts()
    except Exception as exc:
        print(f"  (undo mounts on {host.name}: {exc})", flush=True)


def _schedule(targets: list[StressTarget], trials: int, rng: random.Random) -> list[list[str]]:
    """Per target, a shuffled list of faults, as even as the target allows."""
    plans: list[list[str]] = []
    for i, target in enumerate(targets):
        count = trials // len(targets) + (1 if i < trials % len(targets) else 0)
        usable = [f for f in FAULTS if f != "disk-full" or target.container is None]
        # Offsets that interleave: every target meets every fault it can, even in a short run.
        faults = [usable[(k + i) % len(usable)] for k in range(count)]
        rng.shuffle(faults)
        plans.append(faults)
    return plans


def _report(trials: list[Trial], wall: float) -> int:
    outcomes = collections.Counter(t.outcome for t in trials)
    corrupt = outcomes["corrupt"] + outcomes["error"]
    leftovers = sum(1 for t in trials if t.leftovers)
    hung = sum(1 for t in trials if t.hung)
    unrecorded = [t for t in trials if t.outcome == "new" and not t.history]
    said_untouched = [
        t
        for t in trials
        if t.outcome == "new" and (t.reported in ("failed", "not-applied") or t.history == "failed")
    ]
    false_success = [t for t in trials if t.outcome == "old" and t.reported == "written"]
    print()
    c.line("trials", len(trials))
    c.line("old (file byte-identical to the old config)", outcomes["old"])
    c.line("new (file byte-identical to the new config)", outcomes["new"])
    c.line("corrupt (neither, or unparsable; must be 0)", corrupt)
    c.line("leftovers after the next push (must be 0)", leftovers)
    c.line("CLI did not end within its bound (must be 0)", hung)
    c.line("new bytes on disk, no history row (must be 0)", len(unrecorded))
    c.line("new bytes on disk, reported/recorded failed", len(said_untouched))
    c.line("old bytes on disk, reported written", len(false_success))
    c.line("wall time", f"{wall:.0f} s")
    print(f"\n{'fault':<14}{'trials':>7}{'old':>6}{'new':>6}{'corrupt':>8}{'left':>6}  exits")
    for fault in FAULTS:
        mine = [t for t in trials if t.fault == fault]
        if not mine:
            continue
        count = collections.Counter(t.outcome for t in mine)
        exits = collections.Counter(
            "signal" if t.exit_code is None else str(t.exit_code) for t in mine
        )
        print(
            f"{fault:<14}{len(mine):>7}{count['old']:>6}{count['new']:>6}"
            f"{count['corrupt'] + count['error']:>8}{sum(1 for t in mine if t.leftovers):>6}  "
            + ", ".join(f"{k}×{v}" for k, v in sorted(exits.items()))
        )
    history = collections.Counter(t.history or "(no row)" for t in trials)
    print("history rows:", ", ".join(f"{k}×{v}" for k, v in sorted(history.items())))
    for t in said_untouched[:5] + false_success[:5]:
        print(f"  outcome mismatch: {t}")
    failed = corrupt > 0 or leftovers > 0 or hung > 0 or unrecorded
    print("RESULT:", "FAIL" if failed else "ok")
    return 1 if failed else 0


def _targets(fleet: Fleet, container: Container) -> list[StressTarget]:
    *plain, container_host = fleet.hosts
    targets = [StressTarget(f"{h.alias}:{c.MODEL}", h) for h in plain]
    spec = f"{container_host.alias}/lxc:{container.name}:{c.MODEL}"
    targets.append(StressTarget(spec, container_host, container))
    return targets


def _seed_all(targets: list[StressTarget], data: bytes) -> None:
    for t in targets:
        if t.container is None:
            c.seed(t.host, data)
        else:
            directory = t.container.rootfs / c.MODEL.removeprefix("/")
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "config.json").write_bytes(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 trials, 2 hosts + 1 container")
    parser.add_argument("--trials", type=int, help="number of interrupted pushes (default 200)")
    parser.add_argument("--hosts", type=int, help="sshd hosts besides the container's (4)")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    trials = args.trials or (10 if args.quick else 200)
    hosts = args.hosts or (2 if args.quick else 4)
    c.require_testbed(need_lxc=True)
    c.restore_sigint()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="stress-crash-") as tmp:
        base = Path(tmp)
        fleet = c.start_fleet(base / "fleet", hosts + 1)
        container = None
        try:
            container = busybox_container(host=fleet.hosts[-1], name=unique_name("stress"))
            targets = _targets(fleet, container)
            plan = _plan(base, fleet)
            _seed_all(targets, plan.configs[0])
            print(f"stress crash: {trials} trials over {[t.name for t in targets]}", flush=True)
            results: list[Trial] = []
            lock = threading.Lock()
            started = time.monotonic()
            _run_workers(targets, _schedule(targets, trials, rng), plan, rng, results, lock)
            return _report(results, time.monotonic() - started)
        finally:
            if container is not None:
                container.destroy()
            fleet.stop()


def _plan(base: Path, fleet: Fleet) -> Plan:
    configs, big = c.configs(6), c.big_config()
    home, workdir = base / "home", base / "work"
    workdir.mkdir()
    files = {}
    for i, data in enumerate([*configs, big]):
        files[data] = workdir / f"config-{i}.json"
        files[data].write_bytes(data)
    c.warm_verdicts(home, [*configs, big])
    store = HistoryStore(default_db_path())
    options = c.ssh_options(fleet, connect=10, command=30)
    return Plan(configs, big, files, home, workdir, c.connection_flags(fleet), options, store)


def _run_workers(
    targets: list[StressTarget],
    schedule: list[list[str]],
    plan: Plan,
    rng: random.Random,
    results: list[Trial],
    lock: threading.Lock,
) -> None:
    threads = [
        threading.Thread(
            target=_worker, args=(t, faults, plan, rng.randrange(1 << 30), results, lock)
        )
        for t, faults in zip(targets, schedule, strict=True)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


if __name__ == "__main__":
    sys.exit(main())
