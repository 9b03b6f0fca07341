"""One deadline per HTTP request, unit level: a local server that drips its answer one byte at a
time, asked through LocalAccess and through the in-container program (run here by this python
over the local transport: the same program a container's python runs). The real-component tests
are in test_runtime_deadlines.py. A request that hangs fails the test through the outer join,
not through a timed assertion."""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dflash_provision.server.access import ContainerAccess, DeadlineReached, LocalAccess
from dflash_provision.transport.local import LocalTransport

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n" + b"x" * 1000


@pytest.fixture
def dripping_port() -> Iterator[int]:
    """A server that sends ANSWER one byte every 0.3 s to each client."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            for i in range(len(ANSWER)):
                if stop.wait(0.3):
                    return
                try:
                    conn.sendall(ANSWER[i : i + 1])
                except OSError:
                    return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield int(server.getsockname()[1])
    stop.set()
    server.close()


def _finishes(call: Callable[[], Any]) -> BaseException | Any:
    """``call()``'s result or exception; fails the test if it is still running after 60 s."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(call())
        except BaseException as exc:
            box.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)
    assert box, "the request did not end at its deadline"
    return box[0]


def test_a_dripping_answer_costs_one_deadline_not_one_per_read(dripping_port: int) -> None:
    access = LocalAccess(dripping_port)
    outcome = _finishes(lambda: access.request("GET", "/metrics", timeout=2.0))
    assert isinstance(outcome, DeadlineReached)
    assert outcome.message.startswith("GET /metrics: the server sent ")
    assert outcome.message.endswith("bytes in 2 s and did not finish: deadline reached")
    assert 0 < outcome.received < len(ANSWER)


def test_the_in_container_program_keeps_the_deadline_too(dripping_port: int) -> None:
    access = ContainerAccess(LocalTransport(), dripping_port, python=sys.executable)
    outcome = _finishes(lambda: access.request("GET", "/health", timeout=2.0))
    assert isinstance(outcome, DeadlineReached)
    assert "GET /health:" in outcome.message and "deadline reached" in outcome.message
