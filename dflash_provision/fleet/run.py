"""State shared by the workers of one audit or repair: authoritative configs, verdicts, counters."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from dflash_provision.fleet.interrupt import Stopping
from dflash_provision.host_state.file_status import judge
from dflash_provision.inventory import FleetMember
from dflash_provision.source.authority import Authority, SourceSpec
from dflash_provision.transport.base import CommandResult, Transport
from dflash_provision.transport.factory import Connector

if TYPE_CHECKING:
    from dflash_provision.host_state.file_status import Judgement
    from dflash_provision.remote.ops import RemoteRead
    from dflash_provision.transport.factory import Connector

AuthorityFor = Callable[[FleetMember], Authority]


def authority_loader() -> AuthorityFor:
    """``authority_for(member)``: load the member's drafter source (FleetRun caches per source)."""

    def load(member: FleetMember) -> Authority:
        return member.source.load()

    return load


class Memo:
    """Compute a value once per key, even when many threads ask at the same time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: dict[Any, Future[Any]] = {}

    def get(self, key: Any, compute: Callable[[], Any]) -> Any:
        with self._lock:
            future = self._futures.get(key)
            owner = future is None
            if future is None:
                future = Future()
                self._futures[key] = future
        if owner:
            try:
                future.set_result(compute())
            except BaseException as exc:
                future.set_exception(exc)
        return future.result()

    def __len__(self) -> int:
        return len(self._futures)


class CountingTransport(Transport):
    """Counts the commands run through it (the benchmark's "round trips per host")."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.description = inner.description
        self.execs = 0

    @property
    def command_timeout(self) -> float:
        return self.inner.command_timeout

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        self.execs += 1
        return self.inner.run(argv, stdin=stdin, timeout=timeout)

    def connect(self) -> None:
        self.inner.connect()

    def close(self) -> None:
        self.inner.close()

    def host_key(self) -> str | None:
        return self.inner.host_key()


class FleetRun:
    """State shared by the workers of one audit or repair: authorities and verdict caches."""

    def __init__(self, authority_for: AuthorityFor, *, connector: Connector | None = None) -> None:
        self.authority_for = authority_for
        self.connector = connector or Connector()
        self._authorities = Memo()
        self._verdicts = Memo()
        # The shortest wait after which a silent host counts as timed out (see classify_exception).
        ssh = self.connector.ssh
        self.handshake_timeout = min(ssh.connect_timeout, ssh.banner_timeout)
        self._cpu_lock = threading.Lock()
        #: Set on Ctrl-C: no new host is contacted and no new write starts (fleet/interrupt.py);
        #: the hosts in flight get one step: a connection (each of its three steps within
        #: --connect-timeout) and two commands (repair's read and write).
        self.stopping = Stopping(
            3 * ssh.connect_timeout + 2 * ssh.command_timeout,
            f"--connect-timeout {ssh.connect_timeout:g} s per connection step, "
            f"--command-timeout {ssh.command_timeout:g} s per command",
        )
        self.validations = 0  # how many times validate_config ran (tests, benchmark)

    def authority(self, member: FleetMember) -> Authority:
        def load() -> Authority:
            authority = self.authority_for(member)
            _ = authority.document  # parsed now: one that does not parse stops the run
            return authority

        key: SourceSpec | str = member.source if member.source.is_set else member.name
        result: Authority = self._authorities.get(key, load)
        return result

    def open(self, member: FleetMember) -> CountingTransport:
        transport = self.connector.open(member.target, member.route, sudo=member.become)
        return CountingTransport(transport)

    def verdict(self, read: RemoteRead, authority: Authority) -> Judgement:
        """file_status.judge of ``read``, once per distinct content and authority: a fleet of
        hosts holding the same wrong file costs one validation."""
        if not read.present or read.sha256 is None or read.sha256 == authority.sha256:
            return judge(read, authority)  # nothing worth remembering: no validation runs
        result: Judgement = self._verdicts.get(
            (read.sha256, authority.sha256), lambda: self._judge(read, authority)
        )
        return result

    def _judge(self, read: RemoteRead, authority: Authority) -> Judgement:
        # The counter needs the lock; validation itself is thread-safe (effective.py serialises
        # the transformers import) and runs once per distinct file thanks to the verdict cache.
        with self._cpu_lock:
            self.validations += 1
        return judge(read, authority)
