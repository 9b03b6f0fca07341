"""The soak's stand-in vLLM servers (bench/stress/soak.py): installed and launched on the serving
hosts, and launched again, through the real CLI as a user would, when a fault stopped them.

A fault that stops a host's sshd (PID 1 of its namespaces) ends every process there, the server
with it; a rollout's pre-flight then refuses the host ("its launched server is dead") and an
abort cannot prove a rollback without it. Before each rollout and abort the soak brings every
server back with what ``status`` and ``launch`` document (docs/runtime.md), retried under one
deadline per host:

  ``status TARGET --port P --json``  exit 21 (nothing runs): ``launch`` it; a server that
      answers /health: nothing to do; one that is still starting: wait for it (polled) and
      replace it with ``launch --restart`` if it never answers; an unreachable host: try again.
  ``launch ... --from F``  with F the bytes the host holds now (launch's pre-flight compares
      them): exit 4 (the file changed between that read and the pre-flight: another operation
      wrote) is retried with the bytes read again, never by writing (a push would be a writer
      the soak's judge does not know of); exit 22 "runs a different launch" (a server that
      came up meanwhile, or one started for other bytes) is retried with ``--restart``, as the
      message says; anything else (not ready in time, unreachable) is retried as it was.

Every failed attempt is counted by its cause, with a first example, and printed in the report.
"""

from __future__ import annotations

import collections
import json
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from bench.stress import _common as c
from testbed import samples
from testbed.hosts import Host
from testbed.vllm_standin_install import CONTROL_ENV, install_standin, write_control

#: Where the stand-in lives on a serving host, its control file, the target model's directory,
#: and the incident's mask_token_id, which the stand-in serves at 1 % (its ``by_mask_token``
#: rule, as tests/test_rollout_standin.py uses it).
STANDIN_DIR = "/root/standin"
CONTROL = f"{STANDIN_DIR}/control.json"
TARGET_DIR = "/root/models/Qwen3.6-27B"
BAD_MASK = 248064
RULES = {"by_mask_token": {str(BAD_MASK): {"acceptance": 0.01}}}
READY_TIMEOUT = 60.0
#: One deadline for bringing one host's server back, every attempt included: two launches
#: that wait their whole readiness timeout, and the status reads between them.
RELAUNCH_S = 3 * READY_TIMEOUT
#: How long a server that is "starting" (alive, /health not answering) is waited for before
#: it is replaced: the stand-in answers within a few seconds of its start, even under load.
STARTING_S = 20.0
PAUSE_S = 1.0
#: A ``status`` run: Python's start-up on a loaded machine, a connection, a few reads.
STATUS_TIMEOUT_S = 60.0


class ServingHost(Protocol):
    """What the soak knows of a serving host (soak.HostState)."""

    host: Host
    down: bool  # its sshd is stopped by a fault


H = TypeVar("H", bound=ServingHost)


@dataclass
class Relaunches:
    """What bringing the servers back took: hosts found without a ready server, hosts brought
    back, hosts given up at the deadline, and every failed attempt by cause."""

    needed: int = 0
    done: int = 0
    gave_up: int = 0
    causes: collections.Counter[str] = field(default_factory=collections.Counter)
    examples: dict[str, str] = field(default_factory=dict)


class StandinServers(Generic[H]):
    def __init__(
        self,
        serving: Sequence[H],
        *,
        base: Path,
        home: Path,
        flags: Sequence[str],
        model: str,
        read_config: Callable[[H], bytes | None],
        now: Callable[[], float],
    ) -> None:
        self.serving = list(serving)
        self.base = base
        self.home = home  # the controller whose CLI launches (launch records are on the hosts)
        self.flags = list(flags)
        self.model = model
        self.read_config = read_config
        self.now = now
        self.ports = {hs.host.name: _free_port() for hs in self.serving}
        self.standin: dict[str, tuple[str, str]] = {}  # host -> (vllm, python)
        self.locks = {hs.host.name: threading.Lock() for hs in self.serving}
        self.stats = Relaunches()
        self.stats_lock = threading.Lock()

    def install(self) -> None:
        """The stand-in on each serving host, with the target model's config and the control
        file, launched there (a start that fails here fails the soak: nothing to roll out)."""
        for hs in self.serving:
            host = hs.host
            standin = install_standin(host, STANDIN_DIR)
            self.standin[host.name] = (standin.vllm, standin.python)
            target = samples.REFERENCE_TARGET.read_bytes()
            host.exec(["sh", "-c", 'mkdir -p "${1%/*}" && cat > "$1"', "sh",
                       f"{TARGET_DIR}/config.json"], target, check=True)  # fmt: skip
            write_control(host, CONTROL, RULES)
            if not self.ensure(hs):
                raise RuntimeError(f"the stand-in server on {host.name} did not start")
        with self.stats_lock:
            self.stats = Relaunches()  # the first launches are set-up, not relaunches

    def ensure(self, hs: H) -> bool:
        """The server on ``hs`` answers /health, launched again if need be (see the module's
        docstring); False when it could not be brought back within RELAUNCH_S."""
        with self.locks[hs.host.name]:
            return _Attempts(self, hs).run()

    def count(self, cause: str, example: str) -> None:
        with self.stats_lock:
            self.stats.causes[cause] += 1
            self.stats.examples.setdefault(cause, f"t={self.now():.1f}s {example}")

    def tally(self, outcome: str) -> None:
        with self.stats_lock:
            if outcome == "needed":
                self.stats.needed += 1
            elif outcome == "done":
                self.stats.done += 1
            else:
                self.stats.gave_up += 1

    def target(self, hs: H) -> str:
        return f"{hs.host.alias}:{self.model}"


class _Attempts(Generic[H]):
    """One host's way back to a ready server, under one deadline."""

    def __init__(self, servers: StandinServers[H], hs: H) -> None:
        self.s = servers
        self.hs = hs
        self.name = hs.host.name
        self.deadline = time.monotonic() + RELAUNCH_S
        self.work = servers.base / "launch" / self.name
        self.work.mkdir(parents=True, exist_ok=True)
        self.restart = False
        self.starting_since: float | None = None
        self.needed = False
        self.last = ""  # the last failure, for a give-up's example

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self) -> bool:
        while self.left() > 0:
            if self.hs.down:  # a fault has its sshd stopped: it comes back within seconds
                self.last = "its sshd stopped by a fault"
                time.sleep(min(PAUSE_S, max(self.left(), 0)))
                continue
            state = self.status()
            if state == "ready":
                if self.needed:
                    self.s.tally("done")
                return True
            if not self.needed:
                self.needed = True
                self.s.tally("needed")
            if state == "starting" and not self.waited_enough():
                time.sleep(PAUSE_S)
                continue
            if state in ("starting", "unhealthy"):
                self.restart = True  # alive, never ready: replace it
            if state in ("not-running", "starting", "unhealthy") and self.launch():
                self.s.tally("done")
                return True
        if not self.needed:
            self.s.tally("needed")
        self.s.tally("gave_up")
        last = f"{self.name}: {RELAUNCH_S:.0f} s, last: {self.last}"
        self.s.count("gave up at the deadline", last)
        return False

    def waited_enough(self) -> bool:
        now = time.monotonic()
        if self.starting_since is None:
            self.starting_since = now
        return now - self.starting_since >= STARTING_S

    def fail(self, cause: str, said: str) -> None:
        self.last = f"{cause}: {said}"[:300]
        self.s.count(cause, f"{self.name}: {said}"[:300])
        time.sleep(min(PAUSE_S, max(self.left(), 0)))

    def cli(self, argv: list[str], timeout: float) -> c.Finished:
        return c.run_measured(argv, self.s.home, self.work, max(1.0, min(timeout, self.left())))

    def status(self) -> str:
        """``status``'s state ("ready", "starting", "unhealthy", "not-running"), or "" when
        it could not tell (the failure counted)."""
        done = self.cli(["status", self.s.target(self.hs), "--port",
                         str(self.s.ports[self.name]), "--json", *self.s.flags],
                        STATUS_TIMEOUT_S)  # fmt: skip
        doc = _json(done.stdout)
        if done.returncode in (0, 21) and isinstance(doc, dict):
            return str(doc.get("state"))
        self.fail(f"status exit {done.returncode}{_what(done.returncode)}", _last(done.stderr))
        return ""

    def launch(self) -> bool:
        data = self.s.read_config(self.hs)
        if data is None:
            self.fail("no config on the host to launch with", "")
            return False
        now = self.work / "config.json"
        now.write_bytes(data)
        vllm, python = self.s.standin[self.name]
        argv = ["launch", self.s.target(self.hs), "--model", TARGET_DIR, "--from", str(now),
                "--vllm", vllm, "--python", python, "--port", str(self.s.ports[self.name]),
                "--env", f"{CONTROL_ENV}={CONTROL}", "--ready-timeout", str(READY_TIMEOUT),
                "--no-check", *(["--restart"] if self.restart else []), *self.s.flags]  # fmt: skip
        done = self.cli(argv, READY_TIMEOUT + STATUS_TIMEOUT_S)
        if done.returncode == 0:
            return True
        said = _last(done.stderr)
        how = " --restart" if self.restart else ""
        if done.returncode == 22 and "runs a different launch" in done.stderr:
            self.restart = True  # what the message says to do
        self.fail(f"launch{how} exit {done.returncode}{_what(done.returncode)}", said)
        return False


#: What an exit code of status or launch means here (docs/exit-codes.md), for the counts.
_MEANING = {
    -9: "killed at the deadline",
    4: "the file changed after it was read (read again)",
    5: "unreachable",
    6: "login failed",
    7: "a remote step failed",
    20: "the server exited or was not ready",
    21: "nothing runs there",
    22: "the port is held by another launch (then --restart) or another process",
    23: "vLLM unusable",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _what(code: int) -> str:
    meaning = _MEANING.get(code)
    return f" ({meaning})" if meaning else ""


def _last(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1][:240] if lines else ""


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None
