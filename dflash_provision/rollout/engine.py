"""The rollout state machine (record.py has the states). Every transition is saved to the
history database BEFORE the step it names is acted on, so that ``--resume`` and ``--abort``
start from the last proved state after a Ctrl-C or a controller crash.

    planned → preflight → baseline → batch k: write (proved) → restart → check →
        passed → batch k+1 … → completed
        failed → rollback of batch k (proved) → rolled_back   (rollback_failed when not proved)
        inconclusive → paused (``--resume`` checks again; never a pass, never a rollback)

A host that fails while its batch passes (within ``--max-fail-percentage``) is restored alone.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import DflashProvisionError, ExitCode, UsageError
from dflash_provision.history.host_key import HostKey
from dflash_provision.history.store import FAILED, default_store, journal
from dflash_provision.remote.ops import read_remote_config
from dflash_provision.rollout import host_ops, what_ran
from dflash_provision.rollout.batches import split
from dflash_provision.rollout.identity import HostMismatch, Identity, same_place
from dflash_provision.rollout.record import CHANGED, Figures, HostState, Rollout, State
from dflash_provision.rollout.store import RolloutRefused
from dflash_provision.server.fix_lines import noted
from dflash_provision.source.authority import Authority
from dflash_provision.source.pinned_files import parse_pinned

if TYPE_CHECKING:
    from dflash_provision.fleet import FleetRun
    from dflash_provision.fleet.run import CountingTransport
    from dflash_provision.inventory import FleetMember
    from dflash_provision.rollout.store import RolloutStore
    from dflash_provision.server.restart import RestartDone
    from dflash_provision.source.authority import Authority
    from dflash_provision.verify.runtime_check import CheckSettings

Progress = Callable[[str], None]

#: Phases a batch still has to take forward (a resumed one included), and failed ones.
_UNDECIDED = frozenset(
    {"pending", "writing", "written", "restarting", "restarted", "checking", "inconclusive"}
)
_FAILED = frozenset({"failed", "rolled_back", "rollback_failed"})

#: The detail of a host that already held and ran the new config (phase "unchanged").
UNCHANGED = "already holds and runs this config: nothing written, not restarted"

EXIT_CODES = {
    State.COMPLETED: ExitCode.OK,
    State.ROLLED_BACK: ExitCode.ROLLED_BACK,
    State.PAUSED: ExitCode.PAUSED,
    State.ABORTED: ExitCode.ABORTED,
    State.ROLLBACK_FAILED: ExitCode.ROLLBACK_FAILED,
    State.REFUSED: ExitCode.ROLLOUT_REFUSED,
}


@dataclass
class Options:
    check: CheckSettings
    env: dict[str, str] = field(default_factory=dict)
    keep_backups: int = 5
    ready_timeout: float = 300.0
    skip_failed_hosts: bool = False
    workers: int = 16


def state_line(state: State, message: str) -> str:
    """ "batch 1/2", not "batch: batch 1/2": a message that already names its state says it."""
    if not message:
        return state.value
    return message if message.startswith(state.value) else f"{state.value}: {message}"


class Engine:
    def __init__(
        self,
        rollout: Rollout,
        members: Sequence[FleetMember],
        run: FleetRun,
        store: RolloutStore,
        options: Options,
        progress: Progress,
    ) -> None:
        self.rollout = rollout
        self.members = {m.name: m for m in members}
        self.run, self.store, self.options, self.progress = run, store, options, progress
        self._lock = threading.Lock()
        self.old: dict[str, bytes] = {}  # each host's old bytes (pre-flight; for the baseline)
        # The env values each host's restart passed (read from its running server): in memory
        # only, for the rollback of a server that died on the new config; never saved.
        self.env_seen: dict[str, dict[str, str]] = {}

    @property
    def new(self) -> Authority:
        r = self.rollout
        pinned = tuple(
            parse_pinned(raw, f"rollout {r.id}: pinned_files[{i}]")
            for i, raw in enumerate(r.pinned_files)
        )
        return Authority(label=r.source, data=r.new_config.encode(), pinned_files=pinned)

    def save(self, line: str | None = None) -> None:
        with self._lock:
            self.store.save(self.rollout)
            if line:
                self.progress(f"rollout {self.rollout.id}: {line}")

    def _journal(self, op: str, host: HostState, what: str) -> Any:
        """A history row for one step (write, restart, check, restore) of one host, "started"
        before the step runs, as push and repair journal theirs."""
        recording = journal(
            default_store(), op, HostKey.of_name(host.name), host.path,
            sha256_before=host.old_sha256,
        )  # fmt: skip
        return _Labelled(recording, f"rollout {self.rollout.id}: {what}")

    @contextlib.contextmanager
    def _open(self, host: HostState) -> Iterator[CountingTransport]:
        """A connection to ``host`` that is the machine the record saved: its host key is
        recorded on the first connection (pre-flight) and must match on every later one
        (HostMismatch: nothing is run there)."""
        transport = self.run.open(self.members[host.name])
        with transport:
            self._check_key(host, transport.host_key())
            yield transport

    def _check_key(self, host: HostState, key: str | None) -> None:
        if host.identity is None:  # a record from before identities: nothing to compare
            return
        saved = Identity.from_dict(host.identity)
        if saved.host_key is None:
            with self._lock:
                host.identity = saved.with_key(key).to_dict()
        elif key is not None and key != saved.host_key:
            raise HostMismatch(
                f"{host.name}: the host key is not the one this rollout began with "
                f"({saved.host_key} → {key}): another machine answers there; nothing was done"
            )

    def _set(self, host: HostState, phase: str, detail: str | None = None) -> None:
        host.phase = phase
        if detail is not None:
            host.detail = detail
        self.save(f"{host.name}: {phase}" + (f" ({detail})" if detail else ""))

    def _each(self, hosts: Sequence[HostState], work: Callable[[HostState], None]) -> None:
        if not hosts:
            return
        pool = ThreadPoolExecutor(max_workers=max(1, min(self.options.workers, len(hosts))))
        try:
            for future in [pool.submit(work, h) for h in hosts]:
                future.result()
        except KeyboardInterrupt:
            # Ctrl-C: no queued host starts; the steps in flight finish and are saved, so
            # the record says where each host stands for --resume / --abort.
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)

    def _state(self, state: State, message: str = "") -> None:
        """Record the state. A progress line only while the run goes on: the state it ends in is
        the caller's to show (the table's last line), not a second time here."""
        self.rollout.state = state
        self.rollout.message = message or self.rollout.message
        going_on = state in (State.PLANNED, State.PREFLIGHT, State.BASELINE, State.BATCH)
        self.save(state_line(state, message) if going_on else None)

    # -- start: pre-flight and baseline -------------------------------------------------------

    def start(self) -> State:
        self.store.hold(self.rollout)  # RolloutHeld (nothing recorded) when a host is taken
        self.store.keep_config(self.rollout.new_config.encode())  # what a later rollout returns to
        try:
            if self._measure_fleet() is not None:
                return self.rollout.state
        except KeyboardInterrupt:
            # Nothing was written: the record lets go of its hosts (a new rollout may start)
            # and stays resumable (--resume starts again from pre-flight).
            stage = self.rollout.state.value
            self._state(
                State.INTERRUPTED, f"Ctrl-C during {stage}, before any write: nothing was written"
            )
            raise
        included = [h for h in self.rollout.hosts if h.phase == "pending"]
        for number, batch in enumerate(split(included, self.rollout.batches), start=1):
            for host in batch:
                host.batch = number
        return self.run_batches()

    def _measure_fleet(self) -> State | None:
        """Pre-flight and baseline of every host; REFUSED when one fails (unless
        --skip-failed-hosts), else None."""
        self._state(State.PREFLIGHT)
        started = time.monotonic()
        self._each(self.rollout.hosts, self._preflight_host)
        self.rollout.add_wall("preflight_s", time.monotonic() - started)
        if self._refuse_or_exclude_failed("pre-flight failed on"):
            return self.rollout.state
        named = [
            (h.name, Identity.from_dict(h.identity))
            for h in self.rollout.hosts
            if h.identity and h.phase == "pending"
        ]
        pairs = same_place(named)  # now with host keys: one machine under two addresses
        if pairs:
            first, second, why = pairs[0]
            self._state(
                State.REFUSED,
                f"{first} and {second} are the same host and drafter file ({why}): keep one of "
                "them; nothing was written",
            )
            return self.rollout.state
        self._state(State.BASELINE)
        started = time.monotonic()
        self._each([h for h in self.rollout.hosts if h.phase == "pending"], self._baseline_host)
        self.rollout.add_wall("baseline_s", time.monotonic() - started)
        if self._refuse_or_exclude_failed("no baseline on"):
            return self.rollout.state
        return None

    def _refuse_or_exclude_failed(self, what: str) -> bool:
        """Hosts that failed pre-flight or baseline: the rollout is REFUSED (True), or with
        --skip-failed-hosts they are left out, named (the detail says why), and it goes on."""
        bad = [h for h in self.rollout.hosts if h.phase == "preflight_failed"]
        if bad and not self.options.skip_failed_hosts:
            names = ", ".join(h.name for h in bad)
            self._state(State.REFUSED, f"{what} {names}: nothing was written")
            return True
        for host in bad:
            self._set(host, "excluded")
        return False

    def _preflight_host(self, host: HostState) -> None:
        member = self.members[host.name]
        try:
            with self._open(host) as transport:
                fresh, old = host_ops.inspect(
                    transport, member, self.new, self.options.env, transport.command_timeout,
                    self.store.config_with_sha, rehash_files=self.rollout.rehash_files,
                    container=host_ops.container_of(host), docker_host=self._docker_host,
                )  # fmt: skip
            if fresh.return_config is not None:  # what ran, kept for any later rollback
                self.store.keep_config(fresh.return_config.encode())
        except DflashProvisionError as exc:
            self._set(host, "preflight_failed", exc.message)
            return
        fresh.phase, fresh.identity = "pending", host.identity
        self.old[host.name] = old or b""
        with self._lock:
            index = self.rollout.hosts.index(host)
            self.rollout.hosts[index] = fresh
        restart = f"restart on port {fresh.port}" if fresh.restart else "file only (no launch)"
        if fresh.server_container:
            restart = f"docker restart of {fresh.server_container['container']} (port {fresh.port})"
        note = f"; NOTE: {fresh.detail}" if fresh.detail else ""
        self.save(f"{host.name}: pre-flight ok, {len(fresh.diff)} change(s), {restart}{note}")

    def _baseline_host(self, host: HostState) -> None:
        if not host.restart:
            return
        current = Authority(label="the current config", data=self.old[host.name])
        verdict = self._measure(host, current, None, "baseline")
        if verdict is not None and verdict.outcome == "inconclusive":
            recorded = host_ops.recorded_reference(
                self.members[host.name], host, current, self.options.check
            )
            if recorded is not None:  # the figures of the last passing check, same prompts
                host.baseline = recorded
                self.save(f"{host.name}: baseline from its acceptance reference {recorded.show()}")
                return
        if verdict is None or verdict.outcome != "passed":
            why = verdict.detail if verdict is not None else host.detail
            self._set(host, "preflight_failed", f"baseline: {why}")
            return
        host.baseline = verdict.figures
        self.save(f"{host.name}: baseline acceptance {host.baseline.show()}")

    def _measure(
        self, host: HostState, authority: Authority, baseline: Figures | None, what: str
    ) -> host_ops.Verdict | None:
        member = self.members[host.name]
        started = time.monotonic()
        try:
            with self._open(host) as transport, self._journal("rollout", host, what) as rec:
                verdict, _ = host_ops.measure(
                    transport,
                    member,
                    authority,
                    host_ops.settings_for(host, self.options.check),
                    self.rollout.gate,
                    baseline,
                    container=host_ops.container_of(host),
                    docker_host=self._docker_host,
                )
                rec.status = "ok" if verdict.outcome == "passed" else verdict.outcome
                rec.message = f"rollout {self.rollout.id}: {what}: {verdict.detail}"
        except DflashProvisionError as exc:
            host.detail = f"{what}: {exc.message}"
            return None
        finally:
            host_ops.timed(host, "check_s", started)
        return verdict

    # -- batches ------------------------------------------------------------------------------

    def run_batches(self) -> State:
        r = self.rollout
        first = max(1, r.batch)
        for number in range(first, r.batch_count + 1):
            r.batch = number
            self._state(State.BATCH, f"batch {number}/{r.batch_count}")
            started = time.monotonic()
            try:
                outcome = self._run_batch(number)
            except KeyboardInterrupt:
                # The steps in flight have finished (_each): the record stays open at this
                # batch, and says so for --status.
                r.message = f"batch {number}/{r.batch_count}, interrupted (Ctrl-C): resume or abort"
                self.save()
                raise
            r.add_wall(f"batch{number}_s", time.monotonic() - started)
            if outcome != "passed":
                return r.state
        if all(h.phase == "unchanged" for h in r.hosts):
            self._state(
                State.COMPLETED,
                "every host already holds and runs this config: nothing written, no server "
                "restarted",
            )
            return r.state
        alone = [h.name for h in r.hosts if h.phase == "rolled_back"]
        left = [h.name for h in r.hosts if h.phase == "excluded"]
        within = f"; restored alone (failed within the tolerance): {', '.join(alone)}"
        out = f"; left out (failed pre-flight or baseline, untouched): {', '.join(left)}"
        self._state(
            State.COMPLETED,
            f"{r.batch_count} batch(es) passed" + (within if alone else "") + (out if left else ""),
        )
        return r.state

    def _run_batch(self, number: int) -> str:
        r = self.rollout
        hosts = r.in_batch(number)
        if any(h.phase in ("rolling_back", "rollback_failed") for h in hosts):
            return self._fail_batch(number, "resuming its rollback")  # a rollback was cut off
        self._each([h for h in hosts if h.phase in _UNDECIDED], self._advance)
        failed = [h for h in hosts if h.phase == "failed"]
        # Hosts that failed within the tolerance and were restored alone still count.
        share = 100.0 * sum(h.phase in _FAILED for h in hosts) / len(hosts)
        if share > r.gate.max_fail_percentage:
            names = ", ".join(h.name for h in hosts if h.phase in _FAILED)
            return self._fail_batch(number, f"{names} failed ({share:.0f}% of the batch)")
        undecided = [h for h in hosts if h.phase == "inconclusive"]
        if undecided:
            names = ", ".join(h.name for h in undecided)
            self._state(
                State.PAUSED,
                f"batch {number}: inconclusive on {names}; resume: {r.command('--resume')}",
            )
            return "paused"
        self._each(failed, self._roll_back_host)  # within the tolerance: restored alone
        if any(h.phase == "rollback_failed" for h in failed):
            return self._finish_rollback(number)
        return "passed"

    def _advance(self, host: HostState) -> None:
        """Take one host from wherever it stands to passed / failed / inconclusive."""
        member = self.members[host.name]
        new = self.new
        try:
            with self._open(host) as transport:
                if host.phase == "writing":  # cut off during the write: what does it hold?
                    sha = host_ops.current_sha(transport, member, transport.command_timeout)
                    self._finish_cut_off_write(host, sha)
                    host.phase = "written" if sha == new.sha256 else "pending"
                if host.phase == "pending" and self._unchanged(host):
                    self._set(host, "unchanged", UNCHANGED)
                    host.new = host.baseline
                    return
                if host.phase == "pending":
                    # --resume included: nothing is written where the restart would be refused
                    host_ops.restart_possible(
                        transport, host, self.options.env, self.env_seen.get(host.name)
                    )
                    self._set(host, "writing")
                    started = time.monotonic()
                    with self._journal("rollout", host, "write") as rec:
                        host.write_row = rec.id  # for --resume, should the controller die now
                        self.save()
                        host.backup = host_ops.write(
                            transport, member, new, self.options.keep_backups, rec
                        )
                    host.write_row = None  # closed by the journal block
                    host_ops.timed(host, "write_s", started)
                    self._set(
                        host, "written", f"proved by read-back; old file kept as {host.backup}"
                    )
                if host.phase in ("written", "restarting"):
                    if not host.restart:
                        self._set(
                            host, "passed", "file written and proved; no server started by launch"
                        )
                        return
                    self._set(host, "restarting")
                    started = time.monotonic()
                    with self._journal("rollout", host, "restart with the recorded launch") as rec:
                        done = self._restart(transport, host, new.document, new.sha256)
                        rec.message = f"{rec.message}: {done.evidence}"
                    self.env_seen[host.name] = done.env
                    host_ops.timed(host, "restart_s", started)
                    self._set(host, "restarted", done.evidence)
        except DflashProvisionError as exc:
            self._set(host, "failed", exc.message)
            return
        self._set(host, "checking")
        verdict = self._measure(host, new, host.baseline, "check")
        if verdict is None:
            self._set(host, "failed", host.detail)
            return
        host.new = verdict.figures
        self._set(host, verdict.outcome, verdict.detail)

    @property
    def _docker_host(self) -> str | None:
        return self.run.connector.docker_host

    def _restart(
        self,
        transport: CountingTransport,
        host: HostState,
        doc: dict[str, Any] | None,
        sha256: str | None,
        *,
        may_be_down: bool = False,
    ) -> RestartDone:
        """The host's server restarted and proved: ``docker restart`` of its container when the
        record says it runs in one, else its recorded launch (``doc`` None: the restored file)."""
        member = self.members[host.name]
        if host.server_container:
            return host_ops.restart_in_container(
                transport, member, host, self.options.ready_timeout,
                docker_host=self._docker_host, python=self.options.check.python,
                may_be_down=may_be_down,
            )  # fmt: skip
        return host_ops.restart(
            transport, host, doc if doc is not None else _old_doc(transport, member),
            self.options.env, self.options.ready_timeout, sha256=sha256,
            may_be_down=may_be_down, remembered=self.env_seen.get(host.name),
        )  # fmt: skip

    def _unchanged(self, host: HostState) -> bool:
        """The host already holds the new bytes and its server was proved to run them (the
        baseline passed measured against them; no server: the file is all there is): nothing
        to write, nothing to restart."""
        if host.old_sha256 != self.rollout.new_sha256:
            return False
        if not host.restart:
            return True
        # A file pushed without a restart holds the new bytes while its server still runs the
        # config it loaded (the launch record's sha256): that server must be restarted.
        loaded = what_ran.ran_sha(host.launch)
        if loaded is not None and loaded != self.rollout.new_sha256:
            return False
        return host.baseline.source == "measured"

    def _finish_cut_off_write(self, host: HostState, sha: str | None) -> None:
        """The journal row of a write the controller died in (still "started") closed with
        what the host holds now: the write happened or it did not."""
        if host.write_row is None:
            return
        if sha == self.rollout.new_sha256:
            status, found = "written", "the new config"
        else:
            status, found = FAILED, "the old config" if sha == host.old_sha256 else "other bytes"
        default_store().record_finish(
            host.write_row,
            status=status,
            sha256_after=sha,
            message=f"rollout {self.rollout.id}: write: cut off (the controller stopped); "
            f"--resume found {found} ({(sha or 'no file')[:12]})",
        )
        host.write_row = None

    # -- rollback and abort -------------------------------------------------------------------

    def _fail_batch(self, number: int, why: str) -> str:
        r = self.rollout
        self.save(f"batch {number} failed: {why}; rolling back")
        hosts = [h for h in r.hosts if h.phase in CHANGED and h.phase != "rolled_back"]
        if not r.rollback_all:
            hosts = [h for h in hosts if h.batch == number]
        self._each(hosts, self._roll_back_host)
        return self._finish_rollback(number, why)

    def _finish_rollback(self, number: int, why: str = "") -> str:
        r = self.rollout
        stuck = [h for h in r.hosts if h.phase == "rollback_failed"]
        if stuck:
            names = ", ".join(h.name for h in stuck)
            self._state(
                State.ROLLBACK_FAILED,
                f"the rollback of {names} is NOT proved; finish it: {r.command('--abort')}",
            )
            return "rollback_failed"
        self._state(State.ROLLED_BACK, f"batch {number} failed: {why}; rolled back, proved")
        return "rolled_back"

    def _roll_back_host(self, host: HostState) -> None:
        member = self.members[host.name]
        self._set(host, "rolling_back")
        try:
            with self._open(host) as transport:
                # --abort included: the file is not restored where the restart would be refused
                host_ops.restart_possible(
                    transport, host, self.options.env, self.env_seen.get(host.name),
                    may_be_down=True,
                )  # fmt: skip
                started = time.monotonic()
                with self._journal("rollback", host, "restore what the server ran") as rec:
                    host_ops.restore(
                        transport, member, host, self.options.keep_backups,
                        self.store.config_with_sha, rec,
                    )  # fmt: skip
                host_ops.timed(host, "write_s", started)
                current = host_ops.current_sha(transport, member, transport.command_timeout)
                if current != host_ops.return_sha(host):
                    raise host_ops.StepFailed(
                        "the file does not hold what the server ran before after restore"
                    )
                if host.restart:
                    started = time.monotonic()
                    done = self._restart(transport, host, None, current, may_be_down=True)
                    self.save(f"{host.name}: restarted on the restored bytes ({done.evidence})")
                    host_ops.timed(host, "restart_s", started)
        except host_ops.NotRecoverable as exc:
            self._set(
                host,
                "rollback_failed",
                f"{exc.message}: nothing was restored; fix: {self._write_back_fix(host)}",
            )
            return
        except DflashProvisionError as exc:
            self._set(
                host, "rollback_failed", f"{exc.message}; retry: {self.rollout.command('--abort')}"
            )
            return
        if host.restart:
            verdict = self._measure_after(host)
            if verdict is None or verdict.outcome != "passed":
                why = verdict.detail if verdict is not None else host.detail
                fix = self.rollout.command("--abort")
                self._set(
                    host,
                    "rollback_failed",
                    f"restored and restarted, but the gate after rollback says: {why}; "
                    f"not proved: measure again and finish with {fix}",
                )
                return
        # The journal's step ("restore what the server ran"), in the same words: what_ran.py
        # decides what that is (the config the server loaded, not always the bytes before the
        # write).
        ran = str(host_ops.return_sha(host))[:12]
        self._set(
            host,
            "rolled_back",
            f"restored what the server ran (sha256 {ran}), proved; acceptance {host.after.show()}",
        )

    def _write_back_fix(self, host: HostState) -> str:
        """The fix line when what the server ran is found nowhere: push those bytes from a file
        named by their sha256, then --abort (restart and measure); the one step no command can
        do, saving that file, is the line's shell comment."""
        sha = str(host_ops.return_sha(host))
        file = f"./what-ran-{sha[:12]}.json"
        target = self.members[host.name].target.display()
        push = ["dflash-provision", "push", target, "--from", file, *self.rollout.connection_args]
        return noted(
            f"{shlex.join(push)} && {self.rollout.command('--abort')}",
            f"first save the config with sha256 {sha} (what the server ran) as {file}",
        )

    def _measure_after(self, host: HostState) -> host_ops.Verdict | None:
        member = self.members[host.name]
        try:
            with self._open(host) as transport:
                read = read_remote_config(transport, member.target.config_path)
        except DflashProvisionError as exc:
            host.detail = f"after rollback: {exc.message}"
            return None
        old = Authority(label="the previous config", data=read.data or b"")
        verdict = self._measure(host, old, host.baseline, "after rollback")
        if verdict is not None:
            host.after = verdict.figures
        return verdict

    def resume(self) -> State:
        """Continue from the last saved step: a batch or a pause goes on where it stood; a
        rollout stopped before any write (refused, interrupted) starts again from pre-flight.
        Either way its hosts are taken again (hold) and must still be the machines the record
        saved (a host key that changed is refused before anything runs)."""
        r = self.rollout
        if r.state in (State.BATCH, State.PAUSED):
            self.store.hold(r)
            self._verify_keys([h for h in r.hosts if h.phase != "excluded"])
            return self.run_batches()
        before_writes = (State.PLANNED, State.PREFLIGHT, State.BASELINE, State.INTERRUPTED,
                         State.REFUSED)  # fmt: skip
        if r.state in before_writes and not any(h.phase in CHANGED for h in r.hosts):
            for host in r.hosts:
                host.phase = "pending"
            return self.start()
        raise UsageError(f"rollout {r.id} is {r.state.value}: nothing to resume")

    def _verify_keys(self, hosts: Sequence[HostState]) -> None:
        """HostMismatch naming every host whose SSH server is not the one the record saved,
        before anything is done (a host that cannot be reached now is left to its step)."""
        mismatched: list[str] = []

        def verify(host: HostState) -> None:
            try:
                with self._open(host):
                    pass
            except HostMismatch as exc:
                with self._lock:
                    mismatched.append(exc.message)
            except DflashProvisionError:
                pass

        self._each(hosts, verify)
        if mismatched:
            raise HostMismatch(
                f"rollout {self.rollout.id}: refused: " + "; ".join(sorted(mismatched))
            )

    def abort(self) -> State:
        r = self.rollout
        refuse_closed(r)
        hosts = [h for h in r.hosts if h.phase in CHANGED and h.phase != "rolled_back"]
        self.store.hold(r)  # RolloutHeld when a newer open rollout holds one of its hosts
        self._verify_keys(hosts)
        self.save("abort: putting back every host this rollout changed")
        self._each(hosts, self._roll_back_host)
        stuck = [h.name for h in r.hosts if h.phase == "rollback_failed"]
        if stuck:
            self._state(
                State.ROLLBACK_FAILED,
                f"the rollback of {', '.join(stuck)} is NOT proved; retry: {r.command('--abort')}",
            )
        else:
            self._state(State.ABORTED, f"{len(hosts)} host(s) put back, proved")
        return r.state


class _Labelled:
    """A journal block whose row says which rollout step it is; a step that raises is
    recorded as failed with its message (the exception still propagates)."""

    def __init__(self, block: Any, message: str) -> None:
        self.block, self.message = block, message

    def __enter__(self) -> Any:
        self.recording = self.block.__enter__()
        self.recording.message = self.message
        return self.recording

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> Any:
        if exc is not None:
            self.recording.status = "failed"
            self.recording.message = f"{self.message}: {getattr(exc, 'message', exc)}"
        return self.block.__exit__(kind, exc, tb)


def refuse_closed(r: Rollout) -> None:
    """RolloutRefused when ``r`` is no longer open: --abort puts back only what an open
    rollout holds (a finished one's hosts may be another rollout's by now)."""
    if r.state.open:
        return
    raise RolloutRefused(f"rollout {r.id} is {r.state.value}: {_not_open_hint(r)}")


def _not_open_hint(r: Rollout) -> str:
    """Why --abort does nothing for a rollout that is no longer open, and what does."""
    if r.state == State.COMPLETED:
        selection = r.check.get("selection") or {}
        hosts = [*(["-i", selection["inventory"]] if selection.get("inventory") else [])]
        hosts += list(selection.get("targets") or ())
        where = shlex.join(hosts) if hosts else "-i INVENTORY"
        return (
            "--abort undoes only an open rollout; a completed one is undone by a new rollout "
            f"of the previous config: `dflash-provision rollout {where} --from PREVIOUS.json` "
            "(each host kept its old file in .dflash-backups)"
        )
    if r.state in (State.REFUSED, State.INTERRUPTED):
        return "it wrote nothing: there is nothing to undo"
    return "its hosts were put back already (--abort undoes only an open rollout)"


def _old_doc(transport: object, member: FleetMember) -> dict[str, object]:
    """The restored file parsed (what launch would add env for); {} when it does not parse."""

    read = read_remote_config(transport, member.target.config_path)  # type: ignore[arg-type]
    try:
        doc = json.loads(read.data or b"")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
