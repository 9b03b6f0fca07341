"""bench/delay_relay.py: bytes arrive intact and in order, each turn at least the delay later,
and the relay counts the turns. No timing assertion beyond "at least the delay"."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from bench.delay_relay import RelayPool

RTT_S = 0.05


@pytest.fixture
def echo_server() -> Iterator[tuple[str, int]]:
    """An upstream that echoes what it reads and half-closes after the client's EOF."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                while chunk := conn.recv(65536):
                    conn.sendall(chunk)
                conn.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[:2]
    listener.close()


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(65536)
        assert chunk, "connection closed early"
        data += chunk
    return data


def test_relay_keeps_bytes_and_order_adds_the_delay_and_counts_turns(
    echo_server: tuple[str, int],
) -> None:
    payload = os.urandom(3 * 1024 * 1024)  # many chunks in flight at once
    with RelayPool() as pool:
        relay = pool.add(echo_server, RTT_S)
        with socket.create_connection((relay.address, relay.port), timeout=10) as sock:
            started = time.monotonic()
            sock.sendall(b"ping")
            assert _recv_exactly(sock, 4) == b"ping"
            assert time.monotonic() - started >= RTT_S

            received = bytearray()

            def drain() -> None:
                while chunk := sock.recv(65536):
                    received.extend(chunk)

            reader = threading.Thread(target=drain)
            reader.start()
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)  # the EOF goes through the line too
            reader.join(timeout=30)
            assert not reader.is_alive()
        assert bytes(received) == payload
        deadline = time.monotonic() + 5
        while relay.connections and relay.connections[0].bytes_down < len(payload) + 4:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        (stats,) = relay.take()
    assert stats.bytes_up == stats.bytes_down == len(payload) + 4
    assert stats.turns >= 2  # the ping's answer and the payload's echo
    assert relay.take() == []
