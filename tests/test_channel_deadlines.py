"""The exec requests' deadlines (transport/ssh/channel_deadlines.py): one thread for the process,
not one per command. The deadline firing at a frozen host is test_remote_timeouts.py's
``test_host_that_freezes_after_the_session_opens_does_not_hold_the_command``; here the queue's
own order, and the thread count over many commands on a real sshd host."""

from __future__ import annotations

import threading
import time

import pytest

from dflash_provision.target import parse_target
from dflash_provision.transport.factory import open_transport
from dflash_provision.transport.ssh.channel_deadlines import Deadlines
from tests.fixtures.ssh import client_options


def test_deadlines_fire_in_time_order_and_a_cancelled_one_never_fires():
    deadlines = Deadlines()
    fired: list[str] = []
    done = threading.Event()
    late = deadlines.add(0.6, lambda: (fired.append("late"), done.set()))
    cancelled = deadlines.add(0.2, lambda: fired.append("cancelled"))
    # Added last, due first: the thread, asleep until 0.2 s, wakes for it.
    early = deadlines.add(0.05, lambda: fired.append("early"))
    cancelled.cancel()
    started = time.monotonic()
    assert done.wait(5)
    assert fired == ["early", "late"]
    assert (early.fired, cancelled.fired, late.fired) == (True, False, True)
    assert 0.5 < time.monotonic() - started < 2


def test_a_deadline_cancelled_after_it_fired_stays_fired():
    deadlines = Deadlines()
    done = threading.Event()
    entry = deadlines.add(0.0, done.set)
    assert done.wait(5)
    entry.cancel()
    assert entry.fired and not entry.live


@pytest.mark.integration
@pytest.mark.root
def test_commands_on_a_real_host_start_no_thread_each(ssh_host, monkeypatch):
    target = parse_target(f"{ssh_host.alias}:/root")
    with open_transport(target, client_options(ssh_host)) as transport:
        assert transport.run(["true"]).exit_status == 0  # connected: paramiko's thread is up
        started: list[str] = []
        real_start = threading.Thread.start

        def counted(thread: threading.Thread) -> None:
            started.append(thread.name)
            real_start(thread)

        monkeypatch.setattr(threading.Thread, "start", counted)
        for _ in range(10):
            assert transport.run(["true"]).exit_status == 0
    # The deadline thread may start once per process (here, or in an earlier test); a thread
    # per exec request made it 10.
    assert len(started) <= 1, started
