"""The fault soak (issue 35): the real CLI, several at a time, against testbed sshd hosts under a
randomized, bounded, self-undoing fault schedule, checked all along and at the end.

Operations (each a ``python -m dflash_provision`` process, or ansible-playbook running the
drafter_config module, from one of two controllers with their
own histories): push, rollback, repair and audit (``-i`` over 1-3 hosts), verify, and rollout:
the last two hosts serve the vLLM stand-in (testbed/vllm_standin.py, a test double), and a
rollout there is a canary and one batch (``--batches 1,100%``), each host written, its server
restarted and gated; one in four rolls out the incident's mask_token_id, which the stand-in
serves at 1 %, so the canary fails and is rolled back. One rollout runs at a time, whichever
controller starts it; a rollout left open (paused, killed, rollback not proved) in either
controller's history is aborted (``rollout --abort``, an operation too) before the next one, and
a server a fault stopped is brought back first with ``status`` and ``launch [--restart]``
(bench/stress/soak_servers.py, its failed attempts counted by cause). Faults:

  cli-kill      SIGKILL of an operation's CLI process, 0.1-3 s after it started
  cli-int       SIGINT (Ctrl-C) of it, likewise
  script-kill   SIGKILL of the dflash scripts running on a host (the host-side write killed)
  freeze        SIGSTOP of everything in a host (sshd, sessions, scripts) for 1-14 s
  disk-full     the model directory on a small tmpfs for 2-8 s: filled up, or sized so that
                the temp file fits and nothing more
  read-only     the model directory read-only for 2-8 s
  sshd-restart  the host's sshd (PID 1 of its namespace: every session and script with it)
                stopped for 1-5 s, then started again
  burst         4-8 pushes of different configs to one host at once

Every fault is undone by the thread that made it, and at the end whatever is left is undone.

Checked (six counts; the first examples of each are printed with the seed and the time):

  corrupt       a config that is none of the known configs' bytes, or absent, at any sampled
                moment (every host, every ~0.5 s, and at the end of every operation)
  leftovers     after settling (faults undone, one more push per host): any file in the model
                directory or its .dflash-backups that is not by design (backups, the lock,
                marks: named in the output)
  contradicted  an outcome the host's bytes contradict while no other writer could explain it
                (the operation ran alone on its hosts: no other operation, no disk fault
                mounted or unmounted, no killed write still running)
  over-bound    a command that ran past its bound: start-up + connect + 5 command timeouts
                (docs/reliability.md "The soak")
  traceback     a Python traceback on a command's stderr
  history       a history that cannot be read (``history --json``), or a reported write with
                no row of its pid and status

Before it ends it plants one violation of each kind and proves each detector fires; a detector
that does not makes the run fail too. Exit 1 on any violation.

    sudo .venv/bin/python -m bench.stress.soak --minutes 10 --hosts 8 --seed 123
    make soak SOAK_ARGS="--minutes 30 --hosts 16"

A rollout's claims, per host, from its record (``--json``): ``passed`` / ``unchanged`` in a
completed rollout hold its new sha256, ``rolled_back`` what the host's server ran at baseline
(the record's ``return_sha256``), ``pending`` and ``excluded`` the bytes the host held before.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.stress import _common as c
from bench.stress.soak_servers import BAD_MASK, CONTROL, READY_TIMEOUT, StandinServers
from testbed import samples
from testbed.hosts import Fleet, Host
from testbed.vllm_standin_install import CONTROL_ENV

OPERATIONS = ("push", "rollback", "repair", "audit", "verify", "ansible", "rollout")
HOST_FAULTS = ("script-kill", "freeze", "disk-full", "read-only", "sshd-restart", "burst")
CLI_FAULTS = ("cli-kill", "cli-int")
KINDS = ("corrupt", "leftovers", "contradicted", "over-bound", "traceback", "history")
#: A rollout host's phases whose record detail says why the rollout did not complete.
_WHY_PHASES = ("preflight_failed", "failed", "rollback_failed")
CONNECT_TIMEOUT = 3.0
COMMAND_TIMEOUT = 6.0
#: Python start-up and imports on a loaded 2-core machine, before any connection is tried.
STARTUP_S = 15.0
#: Write (T), the settle step's retry window (T), its lock wait and run (2 T), a describing
#: read (T): the longest path of one host's write, after connecting (proof.py, settle.py).
BOUND_S = STARTUP_S + CONNECT_TIMEOUT + 5 * COMMAND_TIMEOUT
CONFIGS = 6
KEEP = 5
PAGE = 4096
#: By-design files in <model>/.dflash-backups (see write.sh): backups, the lock, the marks
#: settle.sh reads.
BY_DESIGN = ("backup config.json.<UTC stamp>[.NNN]", "config.json.lock",
             "config.json.mark.<nonce>")  # fmt: skip
#: Rollout: the hosts that serve the stand-in (the fleet's last two; bench/stress/soak_servers.py).
SERVING = 2
#: Pre-flight and baseline (a connection, reads and a runtime-check per host), then per step
#: (canary, batch, a rollback): a write, a restart within the ready timeout, a gate check.
ROLLOUT_BOUND_S = BOUND_S + 3 * (5 * COMMAND_TIMEOUT + READY_TIMEOUT + 4 * COMMAND_TIMEOUT)


@dataclass
class Example:
    at_s: float
    text: str
    detail: str = ""  # printed under the first example (a traceback's last lines)


@dataclass
class HostState:
    host: Host
    lock: threading.Lock = field(default_factory=threading.Lock)
    active: set[int] = field(default_factory=set)
    touched: int = 0  # bumped by every operation start and every disk fault (un)mount
    faulted: bool = False  # a host fault is on it (one at a time)
    tmpfs: bool = False  # its model directory is a tmpfs (read it from inside the host)
    down: bool = False  # its sshd is stopped


@dataclass
class Op:
    op_id: int
    kind: str
    home: Path
    hosts: list[HostState]
    cfg: int
    argv: list[str]
    fault: str = ""
    bound: float = BOUND_S
    #: Called before the judge samples the hosts (the planted contradiction's other writer).
    before_judge: Callable[[], object] | None = None
    #: A program other than the CLI (ansible-playbook) and its environment; ``results``: the
    #: file its per-task results are written to (tests/fixtures/ansible_callbacks).
    program: list[str] | None = None
    env: dict[str, str] | None = None
    results: Path | None = None
    #: An abort: each host's phase in the record before it ran (read from the history).
    earlier_phases: dict[str, str] = field(default_factory=dict)


class Soak:
    def __init__(self, args: argparse.Namespace, fleet: Fleet, base: Path) -> None:
        self.seed: int = args.seed
        self.rng = random.Random(self.seed)
        self.minutes: float = args.minutes
        self.workers: int = args.workers
        self.fleet = fleet
        self.base = base
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.hosts = [HostState(h) for h in fleet.hosts]
        # The configs the workers write, and (last) the one only rollouts write: the incident's
        # mask_token_id, which fails the canary's gate.
        self.datas = [*c.configs(CONFIGS), _bad_config()]
        self.known = {d: i for i, d in enumerate(self.datas)}
        self.cfg_paths = []
        for i, data in enumerate(self.datas):
            path = base / f"config{i}.json"
            path.write_bytes(data)
            self.cfg_paths.append(path)
        self.homes = [base / "controller-a", base / "controller-b"]
        for home in self.homes:
            home.mkdir()
            c.warm_verdicts(home, self.datas)
        self.inventory = base / "fleet.yaml"
        names = ", ".join(h.name for h in fleet.hosts)
        self.inventory.write_text(
            f"defaults:\n  path: {c.MODEL}\n  drafter:\n    from: {self.cfg_paths[0]}\n"
            f"groups:\n  gpu:\n    hosts: [{names}]\n"
        )
        self.serving = self.hosts[-SERVING:]
        self.serving_inventory = base / "serving.yaml"
        self.serving_inventory.write_text(
            f"defaults:\n  path: {c.MODEL}\nhosts:\n"
            + "".join(f"  - {hs.host.alias}\n" for hs in self.serving)
        )
        #: One rollout (or abort) at a time on the serving hosts, whichever controller runs
        #: it: a second one would only be refused (an open rollout holds its hosts), so every
        #: rollout still open in either controller's history is aborted before the next starts.
        self.rollout_lock = threading.Lock()
        self.flags = [*c.connection_flags(fleet), "--connect-timeout", str(CONNECT_TIMEOUT),
                      "--command-timeout", str(COMMAND_TIMEOUT)]  # fmt: skip
        self.servers = StandinServers(
            self.serving, base=base, home=self.homes[0], flags=self.flags, model=c.MODEL,
            read_config=self.read_config, now=self.now,
        )  # fmt: skip
        self.next_id = 0
        self.ops: collections.Counter[str] = collections.Counter()
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.faults: collections.Counter[str] = collections.Counter()
        self.violations: dict[str, list[Example]] = {k: [] for k in KINDS}
        self.planting: str | None = None
        self.planted: dict[str, list[Example]] = {k: [] for k in KINDS}
        self.reported: list[tuple[Path, int, str, str, str]] = []  # home, pid, op, host, status
        self.judged = 0
        #: SIGINTs that landed in the interpreter's own start-up (site, runpy), before any of
        #: the project's code ran: Python prints that traceback, nothing here can catch it.
        self.startup_tracebacks = 0
        #: Why writes did not land, as the CLI named it (step/reason), with a first example:
        #: every failure should name its real cause (disk full, read-only, a frozen host, a
        #: cut-off session), not the step that noticed it.
        self.causes: collections.Counter[str] = collections.Counter()
        self.cause_examples: dict[str, str] = {}
        self.samples = 0
        self.longest: dict[str, float] = {}  # the longest run of each kind of operation, s
        self.stop = threading.Event()

    # -- bookkeeping ---------------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.t0

    def violation(self, kind: str, text: str, detail: str = "") -> None:
        with self.lock:
            bucket = self.planted if self.planting == kind else self.violations
            bucket[kind].append(Example(self.now(), text, detail))

    def new_id(self) -> int:
        with self.lock:
            self.next_id += 1
            return self.next_id

    def begin(self, hs: HostState, op_id: int) -> tuple[bool, int]:
        with hs.lock:
            alone = not hs.active
            hs.active.add(op_id)
            hs.touched += 1
            return alone, hs.touched

    def alone_since(self, hs: HostState, start: tuple[bool, int]) -> bool:
        with hs.lock:
            return start[0] and hs.touched == start[1]

    def end(self, hs: HostState, op_id: int) -> None:
        with hs.lock:
            hs.active.discard(op_id)

    def touch(self, hs: HostState) -> None:
        with hs.lock:
            hs.touched += 1

    # -- the hosts' files ----------------------------------------------------------------------

    def read_config(self, hs: HostState) -> bytes | None:
        """The host's config as a reader on the host sees it now (None: absent)."""
        path = hs.host.root_dir / c.MODEL.removeprefix("/root/") / "config.json"
        if hs.tmpfs:
            with contextlib.suppress(Exception):
                done = hs.host.exec(["cat", f"{c.MODEL}/config.json"], text=False, timeout=10)
                if done.returncode == 0:
                    return bytes(done.stdout)
                return None
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def check_known(self, hs: HostState, when: str) -> bytes | None:
        data = self.read_config(hs)
        with self.lock:
            self.samples += 1
        if data not in self.known:
            what = "absent" if data is None else f"{len(data)} bytes, sha256 {_sha(data)[:12]}"
            self.violation("corrupt", f"{hs.host.name} {when}: {what}, none of the known configs")
        return data

    def sampler(self) -> None:
        while not self.stop.is_set():
            for hs in self.hosts:
                self.check_known(hs, "sampled")
            self.stop.wait(0.5)

    # -- operations ----------------------------------------------------------------------------

    def make_op(
        self,
        kind: str,
        rng: random.Random,
        *,
        host: HostState | None = None,
        cfg: int | None = None,
    ) -> Op:
        if True:  # each thread draws from its own generator (see main: the seed)
            home = rng.choice(self.homes)
            cfg = rng.randrange(CONFIGS) if cfg is None else cfg
            if kind in ("repair", "audit"):
                hosts = rng.sample(self.hosts, k=min(len(self.hosts), rng.randint(1, 3)))
            elif kind == "rollout":
                hosts = list(self.serving)
                cfg = CONFIGS if rng.random() < 0.25 else cfg  # the canary fails: rolled back
            else:
                hosts = [host or rng.choice(self.hosts)]
            fault = ""
            if kind != "audit" and rng.random() < 0.15:
                fault = rng.choice(CLI_FAULTS)
        names = ",".join(h.host.name for h in hosts)
        target = f"{hosts[0].host.alias}:{c.MODEL}"
        src = ["--from", str(self.cfg_paths[cfg])]
        argv = {
            "push": ["push", target, *src, "--json"],
            "rollback": ["rollback", target, "--json"],
            "verify": ["verify", target, *src, "--json"],
            "repair": [
                "repair",
                "-i",
                str(self.inventory),
                "-l",
                names,
                *src,
                "--json",
                "--workers",
                "3",
            ],
            "audit": [
                "audit",
                "-i",
                str(self.inventory),
                "-l",
                names,
                *src,
                "--json",
                "--workers",
                "3",
            ],
            "ansible": [],  # see _ansible
            "rollout": [
                "rollout",
                "-i",
                str(self.serving_inventory),
                *src,
                "--batches",
                "1,100%",
                "--ready-timeout",
                str(READY_TIMEOUT),
                # The servers were launched with the stand-in's control env: its value is
                # given again (a launch record keeps only the name).
                "--env",
                f"{CONTROL_ENV}={CONTROL}",
                "--json",
            ],
        }[kind]
        op = Op(self.new_id(), kind, home, hosts, cfg, [*argv, *self.flags], fault)
        if kind == "ansible":
            self._ansible(op)
        if kind == "rollout":
            op.bound = ROLLOUT_BOUND_S
        return op

    def abort_op(self, home: Path, rollout_id: str, hosts: list[HostState]) -> Op:
        """``rollout --abort ID`` of an open rollout: every host it changed put back."""
        argv = ["rollout", "--abort", rollout_id, "--env", f"{CONTROL_ENV}={CONTROL}",
                "--ready-timeout", str(READY_TIMEOUT), "--json", *self.flags]  # fmt: skip
        op = Op(self.new_id(), "rollout-abort", home, hosts, 0, argv, "", ROLLOUT_BOUND_S)
        op.earlier_phases = _record_phases(home, rollout_id)
        return op

    # -- rollouts on the stand-in servers ------------------------------------------------------

    def run_rollout(self, op: Op, rng: random.Random) -> None:
        """A rollout on the serving hosts, one at a time whichever controller runs it: first
        every rollout still open in either controller's history is aborted (it holds the hosts:
        the new one would only be refused), the servers a fault stopped are brought back
        (soak_servers.py), then the rollout, then an abort of what it left open."""
        with self.rollout_lock:
            for home in self.homes:
                self.abort_open(home, rng)
            for hs in op.hosts:
                self.servers.ensure(hs)
            self.run_op(op, rng)
            self.abort_open(op.home, rng)

    def abort_open(self, home: Path, rng: random.Random | None = None) -> None:
        for rollout_id in _open_rollouts(home):
            for hs in self.serving:  # as before a rollout: a server a fault stopped
                self.servers.ensure(hs)
            self.run_op(self.abort_op(home, rollout_id, list(self.serving)), rng)

    def _ansible(self, op: Op) -> None:
        """The same write through the Ansible drafter_config module (ansible-playbook, its ssh
        connection): a play on the op's host, its task result read from a callback's file."""
        run = self.base / "ansible" / str(op.op_id)
        run.mkdir(parents=True)
        assert self.fleet.client is not None
        name = op.hosts[0].host.alias
        (run / "inventory.ini").write_text(
            f"[fleet]\n{name} ansible_host={name}\n\n[fleet:vars]\n"
            f"ansible_ssh_common_args='-F {self.fleet.client.ssh_config}'\n"
        )
        (run / "play.yml").write_text(
            "- hosts: fleet\n  gather_facts: false\n  tasks:\n"
            "    - name: soak\n      dflash.provision.drafter_config:\n"
            f"        path: {c.MODEL}\n        src: {self.cfg_paths[op.cfg]}\n"
            f"        command_timeout: {COMMAND_TIMEOUT}\n"
        )
        op.results = run / "results.jsonl"
        op.program = [str(Path(sys.executable).with_name("ansible-playbook")), "-i",
                      str(run / "inventory.ini"), str(run / "play.yml")]  # fmt: skip
        op.env = {
            **c.cli_env(op.home),
            "ANSIBLE_COLLECTIONS_PATH": str(c.REPO_ROOT),
            "ANSIBLE_CALLBACK_PLUGINS": str(c.REPO_ROOT / "tests/fixtures/ansible_callbacks"),
            "ANSIBLE_CALLBACKS_ENABLED": "dflash_results",
            "ANSIBLE_LOCAL_TEMP": str(run / "local"),
            "ANSIBLE_HOME": str(run / "home"),
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(run / "cp"),
            "ANSIBLE_NOCOLOR": "1",
            "DFLASH_RESULTS_FILE": str(op.results),
        }
        # ansible-playbook's own start-up (its plugins, a worker process) on a busy machine.
        op.bound = BOUND_S + 30

    def run_op(self, op: Op, rng: random.Random | None = None) -> None:
        with self.lock:
            self.ops[op.kind] += 1
            if op.fault:
                self.faults[op.fault] += 1
        starts = {id(hs): self.begin(hs, op.op_id) for hs in op.hosts}
        before = {id(hs): self.read_config(hs) for hs in op.hosts}
        workdir = self.base / "work"
        workdir.mkdir(exist_ok=True)
        started = time.monotonic()
        if op.program is not None:
            proc = subprocess.Popen(op.program, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, cwd=workdir, env=op.env)  # fmt: skip
        else:
            proc = c.cli_popen(op.argv, op.home, workdir)
        if op.fault:
            delay = (rng or self.rng).uniform(0.1, 3.0)
            timer = threading.Timer(delay, _signal, (proc, op.fault))
            timer.start()
        done = c.wait_cli(proc, started, max(op.bound, 20) * 3)
        wall = time.monotonic() - started
        with self.lock:
            self.longest[op.kind] = max(self.longest.get(op.kind, 0.0), wall)
        label = f"op {op.op_id} {op.kind} {' '.join(h.host.name for h in op.hosts)}"
        if done is None or wall > op.bound:
            self.violation("over-bound", f"{label}: ran {wall:.1f} s, bound {op.bound:.0f} s")
        if done is not None and "Traceback" in done.stderr and not _in_python_startup(done):
            tail = done.stderr.strip().splitlines()
            self.violation(
                "traceback",
                f"{label} (exit {done.returncode}): {tail[-1][:160]}",
                detail="\n".join(tail[-40:]),
            )
        if done is not None and "Traceback" in done.stderr and _in_python_startup(done):
            with self.lock:
                self.startup_tracebacks += 1
        doc = _json(done.stdout) if done is not None else None
        if op.results is not None:
            doc = _task_result(op.results)
        writes = op.kind in ("push", "rollback", "repair", "ansible", "rollout", "rollout-abort")
        lingering = writes and (done is None or done.returncode in (-9, 17) or doc is None)
        if op.before_judge is not None:
            op.before_judge()
        for hs in op.hosts:
            after = self.check_known(hs, f"after {label}")
            alone = self.alone_since(hs, starts[id(hs)])
            claim = self._judge(op, hs, doc, done, before[id(hs)], after, alone, label)
            with self.lock:
                self.outcomes[f"{op.kind}:{claim or '(none)'}"] += 1
                if alone and claim:
                    self.judged += 1
        if lingering:
            # A write cut off with no settled answer may still be running on the host (a frozen
            # one, when thawed): no check counts the host as alone until none runs there.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and any(
                not hs.down and c.scripts(hs.host) for hs in op.hosts
            ):
                time.sleep(0.2)
        for hs in op.hosts:
            self.end(hs, op.op_id)

    def _judge(
        self,
        op: Op,
        hs: HostState,
        doc: object,
        done: c.Finished | None,
        before: bytes | None,
        after: bytes | None,
        alone: bool,
        label: str,
    ) -> str:
        """The outcome the command claimed for ``hs`` ("" when none), checked against the
        host's bytes when nothing else could have changed them."""
        want = self.datas[op.cfg]
        name = hs.host.name
        code = done.returncode if done is not None else None
        claim, holds = "", None  # holds: what the claim says of the bytes (a predicate)
        if op.kind in ("push", "rollback", "ansible") and isinstance(doc, dict):
            claim = str(doc.get("status"))
            if done is not None and op.kind != "ansible":  # its rows carry a worker's pid
                self.reported.append((op.home, done.pid, op.kind, name, claim))
            new = doc.get("new_sha256")
            if claim not in ("written", "unchanged"):
                cause = f"{op.kind} {claim}: {doc.get('failed_step')}/{doc.get('reason')}"
                with self.lock:
                    self.causes[cause] += 1
                    self.cause_examples.setdefault(
                        cause, f"t={self.now():.1f}s {label}: {str(doc.get('message'))[:200]}"
                    )
            if claim in ("written", "unchanged"):
                holds = lambda b: _sha(b) == new  # noqa: E731
            elif claim == "failed":
                holds = lambda b: b == before  # noqa: E731
            elif claim == "replaced":
                holds = lambda b: False  # noqa: E731 - only another writer explains it
            elif claim == "not-applied":
                holds = lambda b: _sha(b) != new  # noqa: E731
        elif op.kind in ("rollout", "rollout-abort") and isinstance(doc, dict):
            # A rollout's every phase is its own; an abort's only where the host was not
            # already rolled back before it ran (see _rollout_claim).
            earlier = op.earlier_phases.get(name)
            own = op.kind == "rollout" or earlier not in (None, "rolled_back")
            claim, holds = self._rollout_claim(doc, name, before, own)
            # A record has a state; a refusal before any record is an error document (status,
            # reason, error: as every command's --json).
            state = str(doc.get("state") or f"{doc.get('status')}/{doc.get('reason')}")
            if state != "completed" and hs is op.hosts[0]:  # once per rollout
                cause = f"{op.kind} {state}"
                said = str(doc.get("message") or doc.get("error"))[:200]
                rows = doc.get("hosts")
                said += "".join(  # why each host failed or was not proved, as the record says
                    f" | {h.get('name')} {h.get('phase')}: {str(h.get('detail'))[:300]}"
                    for h in (rows if isinstance(rows, list) else [])
                    if isinstance(h, dict) and h.get("phase") in _WHY_PHASES
                )
                with self.lock:
                    self.causes[cause] += 1
                    self.cause_examples.setdefault(cause, f"t={self.now():.1f}s {label}: {said}")
        elif op.kind == "verify" and code in (0, 4):
            claim = "in_sync" if code == 0 else "drifted"
            holds = (lambda b: b == want) if code == 0 else (lambda b: b != want)
        elif op.kind in ("audit", "repair") and isinstance(doc, dict):
            rows = [h for h in doc.get("hosts", []) if isinstance(h, dict)]
            row = next((h for h in rows if h.get("name") == name), None)
            if row is not None and op.kind == "audit":
                claim = str(row.get("status"))
                if claim == "in_sync":
                    holds = lambda b: b == want  # noqa: E731
                elif claim in ("drifted", "same_values"):
                    holds = lambda b: b != want  # noqa: E731
            elif row is not None:
                claim = str(row.get("action"))
                final = (row.get("after") or row.get("before") or {}).get("status")
                if claim == "wrote" and done is not None:
                    self.reported.append((op.home, done.pid, "repair", name, "written"))
                if claim in ("wrote", "in_sync") and final == "in_sync":
                    holds = lambda b: b == want  # noqa: E731
        if alone and holds is not None and not holds(after):
            self.violation(
                "contradicted",
                f"{label} from {op.home.name} said {claim!r} (exit {code}) for {name} with "
                f"config{op.cfg}; the host held {self.name_bytes(before)} before and "
                f"{self.name_bytes(after)} after, no other writer",
                detail=_claim_evidence(doc, name),
            )
        return claim

    def name_bytes(self, data: bytes | None) -> str:
        """Which known config ``data`` is, with its sha256's first digits (the --json
        documents name bytes by sha256)."""
        if data is None:
            return "absent"
        return f"config{self.known.get(data, '?')} (sha256 {_sha(data)[:12]})"

    def _rollout_claim(
        self, doc: dict[str, object], name: str, before: bytes | None, own: bool
    ) -> tuple[str, Callable[[bytes | None], bool] | None]:
        """``state/phase`` a rollout's record gives ``name`` and what it says of the bytes.

        A ``rolled_back`` host holds what its server ran at baseline (the record's
        ``return_sha256``, decided in pre-flight), which is not the bytes the pre-flight read when
        a push without a restart came before: ``old_sha256`` only where the record has no
        ``return_sha256``.

        ``own``: this operation's run gave the host its phase (a rollout: every host; an
        ``--abort``: a host that was not ``rolled_back`` before it ran). An abort leaves a host
        that an earlier run already rolled back alone (engine.abort acts on the changed hosts
        that are not ``rolled_back``): that phase in its record is history, not a claim about
        the bytes now, and other writers may have written since; a host the abort itself put
        back is judged like a rollout's."""
        state = str(doc.get("state") or f"{doc.get('status')}/{doc.get('reason')}")
        hosts = doc.get("hosts")
        row = next((h for h in hosts if isinstance(h, dict) and h.get("name") == name), None) \
            if isinstance(hosts, list) else None  # fmt: skip
        if row is None:
            return f"{state}/-", None
        phase = str(row.get("phase"))
        new = row.get("new_sha256") or doc.get("new_sha256")
        old = row.get("return_sha256") or row.get("old_sha256")
        holds: Callable[[bytes | None], bool] | None = None
        if state == "completed" and phase in ("passed", "unchanged"):
            holds = lambda b: _sha(b) == new  # noqa: E731
        elif phase == "rolled_back" and old and own:
            holds = lambda b: _sha(b) == old  # noqa: E731
        elif phase in ("pending", "excluded"):
            holds = lambda b: b == before  # noqa: E731
        return f"{state}/{phase}", holds

    def worker(self, deadline: float, rng: random.Random) -> None:
        while time.monotonic() < deadline and not self.stop.is_set():
            kind = rng.choice(OPERATIONS)
            if kind == "rollout":
                self.run_rollout(self.make_op(kind, rng), rng)
            else:
                self.run_op(self.make_op(kind, rng), rng)

    # -- host faults ---------------------------------------------------------------------------

    def fault_loop(self, deadline: float, rng: random.Random) -> None:
        threads: list[threading.Thread] = []
        while time.monotonic() < deadline and not self.stop.is_set():
            self.stop.wait(rng.uniform(1.0, 3.0))
            with self.lock:
                free = [hs for hs in self.hosts if not hs.faulted]
                if len(free) <= len(self.hosts) // 2 or time.monotonic() >= deadline:
                    continue
                hs = rng.choice(free)
                kind = rng.choice(HOST_FAULTS)
                hs.faulted = True
                self.faults[kind] += 1
            seconds = {
                "freeze": rng.uniform(1, 14),
                "sshd-restart": rng.uniform(1, 5),
            }.get(kind, rng.uniform(2, 8))
            size_pages = rng.choice((0, 1, 1, 2, 3))  # 0: filled up
            burst = random.Random(rng.random())
            th = threading.Thread(target=self._fault, args=(hs, kind, seconds, size_pages, burst))
            th.start()
            threads.append(th)
        for th in threads:
            th.join(120)

    def _fault(
        self, hs: HostState, kind: str, seconds: float, pages: int, rng: random.Random
    ) -> None:
        host = hs.host
        try:
            if kind == "script-kill":
                c.kill_pids(c.scripts(host), signal.SIGKILL)
            elif kind == "freeze":
                pids = c.freeze(host)
                time.sleep(seconds)
                c.thaw(pids)
            elif kind in ("disk-full", "read-only"):
                self.touch(hs)
                if kind == "disk-full":
                    # Filled up (0), or room for what is there and ``pages`` more (1: the temp
                    # file fits, the write's mark does not).
                    size = (self.pages_used(hs) + pages) * PAGE if pages else 64 * PAGE
                    host.fill_disk(c.MODEL, size=str(size), fill=not pages)
                    hs.tmpfs = True
                else:
                    host.make_readonly(c.MODEL)
                time.sleep(seconds)
                self.touch(hs)
                hs.tmpfs = False
                host.undo_mounts(lazy=True)
                self.touch(hs)
            elif kind == "sshd-restart":
                hs.down = True
                host.stop()
                time.sleep(seconds)
                host.start(timeout=60)
                hs.down = False
            elif kind == "burst":
                n = rng.randint(4, 8)
                ops = [self.make_op("push", rng, host=hs, cfg=i % CONFIGS) for i in range(n)]
                runs = [random.Random(rng.random()) for _ in ops]
                threads = [
                    threading.Thread(target=self.run_op, args=(op, r))
                    for op, r in zip(ops, runs, strict=True)
                ]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join(BOUND_S * 4)
        except Exception as exc:  # a fault that could not be made or undone: say so, go on
            print(f"soak: fault {kind} on {host.name}: {exc}", file=sys.stderr, flush=True)
        finally:
            self._undo(hs)
            if kind in ("disk-full", "read-only"):
                self.touch(hs)  # whatever the undo unmounted changed the bytes readers see
            hs.faulted = False

    def pages_used(self, hs: HostState) -> int:
        """tmpfs pages the model directory's files take (hard links once)."""
        model = hs.host.root_dir / c.MODEL.removeprefix("/root/")
        seen: set[int] = set()
        pages = 0
        bdir = model / ".dflash-backups"
        for path in [*model.iterdir(), *(bdir.iterdir() if bdir.is_dir() else ())]:
            with contextlib.suppress(OSError):
                st = path.lstat()
                if path.is_file() and st.st_ino not in seen:
                    seen.add(st.st_ino)
                    pages += -(-st.st_size // PAGE)
        return pages

    def _undo(self, hs: HostState) -> None:
        """Whatever a fault left: thawed, unmounted, started."""
        host = hs.host
        if not host.running:
            with contextlib.suppress(Exception):
                host.start(timeout=60)
            hs.down = False
        if host.sshd_pid is not None:
            c.thaw([host.sshd_pid, *c.descendants(host.sshd_pid)])
        if hs.tmpfs or getattr(host, "_mounts", None):
            hs.tmpfs = False
            with contextlib.suppress(Exception):
                host.undo_mounts(lazy=True)
        if host.running:  # a fault that failed half way may have mounted without saying so
            with contextlib.suppress(Exception):
                host.exec(["sh", "-c", 'while mountpoint -q "$1"; do umount -l "$1"; done',
                           "sh", c.MODEL])  # fmt: skip

    # -- the end -------------------------------------------------------------------------------

    def settle(self) -> tuple[dict[str, int], collections.Counter[str]]:
        """Faults undone, no session left, one push per host (cfg 0); then the leftovers."""
        for hs in self.hosts:
            self._undo(hs)
        for hs in self.hosts:
            c.wait_sessions_gone(hs.host, 60)
        for home in self.homes:
            self.abort_open(home)
        before = self.leftovers(count_as_violation=False)
        ops = [self.make_op("push", self.rng, host=hs, cfg=0) for hs in self.hosts]
        for op in ops:
            op.fault = ""
            self.run_op(op)
        self.leftovers()
        return before, self.by_design()

    def leftovers(self, *, count_as_violation: bool = True) -> dict[str, int]:
        found: dict[str, int] = {}
        for hs in self.hosts:
            model = hs.host.root_dir / c.MODEL.removeprefix("/root/")
            names = [n for n in os.listdir(model) if n not in ("config.json", ".dflash-backups")]
            bdir = model / ".dflash-backups"
            listed = os.listdir(bdir) if bdir.is_dir() else []
            names += [f".dflash-backups/{n}" for n in listed if not _by_design(n)]
            for n in names:
                key = n.split(".dflash-tmp.")[0] + ".dflash-tmp.*" if "dflash-tmp" in n else n
                found[key] = found.get(key, 0) + 1
                if count_as_violation:
                    self.violation("leftovers", f"{hs.host.name}: {n}")
        return found

    def by_design(self) -> collections.Counter[str]:
        kept: collections.Counter[str] = collections.Counter()
        for hs in self.hosts:
            bdir = hs.host.root_dir / c.MODEL.removeprefix("/root/") / ".dflash-backups"
            for n in os.listdir(bdir) if bdir.is_dir() else []:
                if _by_design(n):
                    kept[_design_kind(n)] += 1
        return kept

    def check_history(self) -> None:
        for home in self.homes:
            done = c.run_measured(["history", "--json", "--last", "1000000"], home,
                                  self.base / "work", 120)  # fmt: skip
            if done.returncode != 0 or _json(done.stdout) is None:
                self.violation(
                    "history", f"{home.name}: history --json exit {done.returncode}: "
                    f"{done.stderr.strip()[-160:]}",
                )  # fmt: skip
        self.check_rows(self.reported)

    def check_rows(self, reported: Sequence[tuple[Path, int, str, str, str]]) -> None:
        rows: dict[Path, set[tuple[int, str, str, str]]] = {}
        for home, pid, op, name, status in reported:
            if status not in ("written", "replaced"):
                continue
            if home not in rows:
                rows[home] = _rows(home)
            if not any(r[0] == pid and r[1] == op and r[2].startswith(name) and r[3] == status
                       for r in rows[home]):  # fmt: skip
                self.violation(
                    "history", f"{home.name}: {op} pid {pid} on {name} reported {status!r}, "
                    "no such row",
                )  # fmt: skip

    # -- planted violations --------------------------------------------------------------------

    def plant(self) -> None:
        """One violation of each kind, through the same detectors."""
        hs = self.hosts[0]
        config = hs.host.root_dir / c.MODEL.removeprefix("/root/") / "config.json"
        self.planting = "corrupt"
        config.write_bytes(self.datas[0][:-7])
        self.check_known(hs, "planted")
        config.write_bytes(self.datas[0])

        self.planting = "leftovers"
        stray = config.parent / ".dflash-backups" / "config.json.dflash-tmp.424242"
        stray.write_bytes(b"")
        self.leftovers()
        stray.unlink()

        self.planting = "contradicted"
        op = self.make_op("push", self.rng, host=hs, cfg=1)
        op.fault = ""
        op.before_judge = lambda: config.write_bytes(self.datas[2])  # a writer nobody registered
        self.run_op(op)

        self.planting = "over-bound"
        op = self.make_op("verify", self.rng, host=hs, cfg=2)
        op.fault, op.bound = "", 0.0
        self.run_op(op)

        self.planting = "traceback"
        op = self.make_op("verify", self.rng, host=hs, cfg=2)
        op.fault, op.argv = "", ["--debug", "validate", str(self.base / "no-such-config.json")]
        self.run_op(op)

        self.planting = "history"
        op = self.make_op("push", self.rng, host=hs, cfg=3)
        op.fault, op.home = "", self.homes[0]
        mark = len(self.reported)
        self.run_op(op)
        planted = self.reported[mark:]
        self.reported = self.reported[:mark]
        for _, pid, *_ in planted:
            with sqlite3.connect(self.homes[0] / "history.sqlite3") as db:
                db.execute("DELETE FROM events WHERE pid = ?", (pid,))
        self.check_rows(planted)
        self.planting = None

    # -- report --------------------------------------------------------------------------------

    def report(self, wall: float, before: dict[str, int], kept: collections.Counter[str]) -> int:
        line = c.line
        line("seed (replay: --seed)", self.seed)
        line("minutes, hosts, CLIs at a time", f"{self.minutes:g}, {len(self.hosts)}, "
             f"{self.workers}")  # fmt: skip
        line("wall time", f"{wall:.0f} s")
        line("operations", f"{sum(self.ops.values())}: " + _counts(self.ops))
        line("faults", f"{sum(self.faults.values())}: " + _counts(self.faults))
        line("longest run by operation, s", ", ".join(
            f"{k} {v:.0f}" for k, v in sorted(self.longest.items())))  # fmt: skip
        line("outcomes claimed", _counts(self.outcomes))
        line("outcomes judged (ran alone on the host)", self.judged)
        line("config samples", self.samples)
        relaunch = self.servers.stats
        line("stand-in servers found not ready before a rollout or abort", relaunch.needed)
        line("  brought back (status, launch [--restart])", relaunch.done)
        line("  given up at the deadline", relaunch.gave_up)
        line("  failed attempts, by cause", sum(relaunch.causes.values()))
        for cause, n in sorted(relaunch.causes.items()):
            print(f"    {n:5d}  {cause}    first: {relaunch.examples[cause]}", flush=True)
        line("writes not done, by cause (step/reason)", sum(self.causes.values()))
        for cause, n in sorted(self.causes.items()):
            print(f"    {n:5d}  {cause}    first: {self.cause_examples[cause]}", flush=True)
        line("leftovers before settling (cleaned by the next write)", _counts(before) or 0)
        line("kept by design after settling", _counts(kept) or 0)
        line("Ctrl-C tracebacks in Python's own start-up (out of reach)", self.startup_tracebacks)
        bad = 0
        for kind in KINDS:
            found = self.violations[kind]
            bad += len(found)
            line(f"{kind} (must be 0)", len(found))
            # Every contradiction (up to 50: each is to be investigated), with the claim's
            # evidence from its document; the first 3 of the other kinds.
            shown = found[:50] if kind == "contradicted" else found[:3]
            for i, ex in enumerate(shown):
                print(f"    seed {self.seed} t={ex.at_s:.1f}s  {ex.text}", flush=True)
                if ex.detail and (i == 0 or kind == "contradicted"):
                    print("      | " + ex.detail.replace("\n", "\n      | "), flush=True)
            if len(found) > len(shown):
                print(f"    ... and {len(found) - len(shown)} more", flush=True)
        missed = [k for k in KINDS if not self.planted[k]]
        line("planted violations detected", f"{len(KINDS) - len(missed)} of {len(KINDS)}"
             + (f" (MISSED: {', '.join(missed)})" if missed else ""))  # fmt: skip
        for kind in KINDS:
            for ex in self.planted[kind][:1]:
                print(f"    planted {kind}: {ex.text}", flush=True)
        return 1 if bad or missed else 0


def _signal(proc: object, fault: str) -> None:
    assert isinstance(proc, subprocess.Popen)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL if fault == "cli-kill" else signal.SIGINT)


def _bad_config() -> bytes:
    """The reference drafter config with the incident's mask_token_id."""
    doc = json.loads(samples.REFERENCE_DRAFTER.read_bytes())
    doc["dflash_config"] = {**doc["dflash_config"], "mask_token_id": BAD_MASK}
    return (json.dumps(doc, indent=2) + "\n").encode()


def _claim_evidence(doc: object, name: str) -> str:
    """What a document said of ``name``, for a contradiction's example: push's fields, or a
    rollout's id and state with the host's row, or a fleet command's row (one JSON line)."""
    if not isinstance(doc, dict):
        return ""
    keep = ("id", "state", "status", "old_sha256", "new_sha256", "failed_step", "reason",
            "message", "error")  # fmt: skip
    shown: dict[str, object] = {k: doc[k] for k in keep if k in doc}
    rows = doc.get("hosts")
    if isinstance(rows, list):
        row = next((h for h in rows if isinstance(h, dict) and h.get("name") == name), None)
        shown["host"] = row
    return json.dumps(shown, default=str)[:1500]


def _record_phases(home: Path, rollout_id: str) -> dict[str, str]:
    """Each host's phase in a rollout's record as the history holds it now ({} if unread)."""
    try:
        with contextlib.closing(sqlite3.connect(home / "history.sqlite3", timeout=30)) as db:
            row = db.execute("SELECT record FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
    except sqlite3.Error:
        return {}
    doc = _json(row[0]) if row else None
    hosts = doc.get("hosts") if isinstance(doc, dict) else None
    return {str(h.get("name")): str(h.get("phase"))
            for h in (hosts if isinstance(hosts, list) else []) if isinstance(h, dict)}  # fmt: skip


def _open_rollouts(home: Path) -> list[str]:
    """Ids of the rollouts still open in a controller's history (they hold their hosts)."""
    done = ("completed", "rolled_back", "aborted", "refused", "interrupted")
    try:
        with contextlib.closing(sqlite3.connect(home / "history.sqlite3", timeout=30)) as db:
            rows = db.execute("SELECT id, state FROM rollouts ORDER BY created_at").fetchall()
    except sqlite3.Error:
        return []  # no rollout yet (no table)
    return [str(r[0]) for r in rows if r[1] not in done]


def _in_python_startup(done: c.Finished) -> bool:
    """A KeyboardInterrupt traceback with no frame of this project: raised in the
    interpreter's start-up (site's .pth files, runpy) before ``python -m dflash_provision`` ran
    any of its code."""
    return "KeyboardInterrupt" in done.stderr and "dflash_provision" not in done.stderr


def _sha(data: bytes | None) -> str:
    return hashlib.sha256(data).hexdigest() if data is not None else ""


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _task_result(path: Path) -> dict[str, object] | None:
    """The drafter_config task's result (push's fields), from the callback's file."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        doc = _json(line)
        if isinstance(doc, dict) and isinstance(doc.get("result"), dict):
            result: dict[str, object] = doc["result"]
            return result if "status" in result else None
    return None


def _rows(home: Path) -> set[tuple[int, str, str, str]]:
    with sqlite3.connect(home / "history.sqlite3") as db:
        return {(int(r[0]), str(r[1]), str(r[2]), str(r[3]))
                for r in db.execute("SELECT pid, op, host, status FROM events")}  # fmt: skip


def _by_design(name: str) -> bool:
    return _design_kind(name) != ""


def _design_kind(name: str) -> str:
    rest = name.removeprefix("config.json.")
    if rest == name:
        return ""
    if rest == "lock":
        return name
    if rest.startswith("mark."):
        return "config.json.mark.*"
    stamp = rest.split(".")
    if len(stamp[0]) == 16 and stamp[0][8] == "T" and stamp[0].endswith("Z"):
        return "backups"
    return ""


def _counts(counter: collections.Counter[str] | dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.stress.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--workers", type=int, default=3, help="CLIs at a time (default 3)")
    parser.add_argument("--seed", type=int, default=None, help="replay a run (it prints its own)")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 10**9)
    if args.hosts < 2:
        parser.error("--hosts must be at least 2")
    c.require_testbed()
    c.restore_sigint()
    print(f"soak: seed {args.seed} ({args.minutes:g} min, {args.hosts} hosts, "
          f"{args.workers} CLIs at a time)", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="dflash-soak-") as tmp:
        base = Path(tmp)
        fleet = c.start_fleet(base / "fleet", args.hosts)
        try:
            return _run(args, fleet, base)
        finally:
            fleet.stop()


def _run(args: argparse.Namespace, fleet: Fleet, base: Path) -> int:
    soak = Soak(args, fleet, base)
    for host in fleet.hosts:
        c.seed(host, soak.datas[0])
    soak.servers.install()
    started = time.monotonic()
    deadline = started + args.minutes * 60
    sampler = threading.Thread(target=soak.sampler, daemon=True)
    sampler.start()
    # One generator per thread, each from the seed: a replay makes the same choices
    # (operations, hosts, configs, faults, delays) in each thread; how the threads interleave
    # is the machine's.
    faults = threading.Thread(
        target=soak.fault_loop, args=(deadline, random.Random(f"{args.seed}-faults"))
    )
    faults.start()
    workers = [
        threading.Thread(target=soak.worker, args=(deadline, random.Random(f"{args.seed}-w{i}")))
        for i in range(args.workers)
    ]
    for th in workers:
        th.start()
    for th in workers:
        th.join()
    faults.join()
    soak.stop.set()
    sampler.join(10)
    before, kept = soak.settle()
    soak.check_history()
    soak.plant()
    return soak.report(time.monotonic() - started, before, kept)


if __name__ == "__main__":
    sys.exit(main())
