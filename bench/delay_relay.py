"""A delaying TCP relay: a stand-in for network latency on a kernel without ``sch_netem``.

Each relay listens on a loopback address and forwards every connection to one upstream (a test
host's sshd). Both directions are a *delay line*: a chunk read at time t is written to the other
side at t + RTT/2, while later chunks keep being read and queued behind it, so order and
throughput are kept (not stop-and-wait) and a request/response turn costs one RTT, as on a real
link. A half-close (EOF) travels through the line like data.

What is not emulated: the TCP handshake to the relay completes on loopback at once (on a real
link ``connect`` costs one more RTT, for every client alike), and there is no bandwidth limit.

Round trips are counted per connection as *turns*: each time the relay reads data from the
server after the last data it read came from the client (client → server, then server →
client) is one turn. A client that waits for an answer before it speaks again pays one RTT per
turn; bytes sent in both directions at once (SSH's banners and KEXINIT) make no extra turn. The
traffic is encrypted, so exec requests cannot be seen here: the bench takes those from the
callers' own counters.

    python bench/delay_relay.py --listen 127.0.0.1:2223 --to 127.0.1.1:2222 --rtt-ms 50
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

CHUNK = 65536
CLIENT = "c"
SERVER = "s"


@dataclass
class ConnectionStats:
    """What one relayed connection carried."""

    turns: int = 0
    bytes_up: int = 0  # client -> server
    bytes_down: int = 0  # server -> client
    last: str = ""  # the side the last chunk was read from

    def saw(self, side: str, size: int) -> None:
        if side == SERVER:
            self.bytes_down += size
            if self.last == CLIENT:
                self.turns += 1
        else:
            self.bytes_up += size
        self.last = side


@dataclass
class Relay:
    """One listener and the connections it relayed."""

    listen: tuple[str, int]
    upstream: tuple[str, int]
    delay_s: float
    connections: list[ConnectionStats] = field(default_factory=list)
    server: asyncio.Server | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def address(self) -> str:
        return self.listen[0]

    @property
    def port(self) -> int:
        return self.listen[1]

    def take(self) -> list[ConnectionStats]:
        """The connections relayed since the last call (and forget them)."""
        with self.lock:
            taken, self.connections = self.connections, []
        return taken

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A handler cancelled at close must not end cancelled: Python 3.11's stream callback
        # then logs a CancelledError traceback for every open connection.
        with contextlib.suppress(asyncio.CancelledError):
            await self._relay(reader, writer)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stats = ConnectionStats()
        with self.lock:
            self.connections.append(stats)
        _nodelay(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        _nodelay(up_writer)
        await asyncio.gather(
            _delay_line(reader, up_writer, self.delay_s, lambda n: stats.saw(CLIENT, n)),
            _delay_line(up_reader, writer, self.delay_s, lambda n: stats.saw(SERVER, n)),
            return_exceptions=True,
        )
        for w in (writer, up_writer):
            w.close()
            with contextlib.suppress(OSError):
                await w.wait_closed()


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _delay_line(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    delay_s: float,
    seen: Callable[[int], None],
) -> None:
    """Copy reader to writer, each chunk (and the EOF) RTT/2 after it was read."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read() -> None:
        try:
            while True:
                chunk = await reader.read(CHUNK)
                if chunk:
                    seen(len(chunk))
                await queue.put((loop.time() + delay_s, chunk))
                if not chunk:
                    return
        except OSError:
            await queue.put((loop.time() + delay_s, b""))

    async def write() -> None:
        while True:
            due, chunk = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not chunk:
                with contextlib.suppress(OSError):
                    if writer.can_write_eof():
                        writer.write_eof()
                return
            writer.write(chunk)
            await writer.drain()

    reading = asyncio.ensure_future(read())
    try:
        await write()
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await reading


class RelayPool:
    """Relays on one asyncio loop in a background thread (start with ``with``)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.relays: list[Relay] = []

    def __enter__(self) -> RelayPool:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout=30)

    def add(
        self, upstream: tuple[str, int], rtt_s: float, listen: tuple[str, int] = ("127.0.0.1", 0)
    ) -> Relay:
        """A relay to ``upstream`` delaying each direction by ``rtt_s / 2``; port 0: any."""
        relay = Relay(listen, upstream, rtt_s / 2)

        async def start() -> None:
            relay.server = await asyncio.start_server(
                relay.handle, listen[0], listen[1], backlog=256
            )
            relay.listen = relay.server.sockets[0].getsockname()[:2]

        self._call(start())
        self.relays.append(relay)
        return relay

    def close(self) -> None:
        if not self.thread.is_alive():
            return

        async def stop() -> None:
            for relay in self.relays:
                if relay.server is not None:
                    relay.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self._call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def _endpoint(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, type=_endpoint, help="ADDRESS:PORT")
    parser.add_argument("--to", required=True, type=_endpoint, help="ADDRESS:PORT upstream")
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    args = parser.parse_args()
    with RelayPool() as pool:
        relay = pool.add(args.to, args.rtt_ms / 1000, args.listen)
        print(f"relaying {relay.address}:{relay.port} -> {args.to[0]}:{args.to[1]}, "
              f"RTT {args.rtt_ms:g} ms; Ctrl-C ends")  # fmt: skip
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
        for n, stats in enumerate(relay.take(), 1):
            print(f"connection {n}: {stats.turns} turns, {stats.bytes_up} B up, "
                  f"{stats.bytes_down} B down")  # fmt: skip


if __name__ == "__main__":
    main()
