"""The baseline dflash-provision's fleet layer is measured against: the least a script can do.

A thread pool; per host one SSH connection (TCP_NODELAY; host key checked against known_hosts,
parsed once; the private key loaded once and shared), one exec (``cat FILE`` to read,
``cat > FILE`` to write), then close. No validation, no atomicity, no backups, no history: that
is the point.

    python bench/minimal_paramiko.py --key ID --known-hosts KH --path /root/m/config.json \\
        [--write FILE [--read-back | --atomic]] [--port 22] [--workers 64] 127.0.1.1 127.0.1.2 ...

Prints one JSON object: wall seconds, controller CPU seconds, hosts ok/failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import shlex
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import paramiko

TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Shared:
    """What every connection reuses: the parsed key and known_hosts."""

    key: paramiko.PKey
    host_keys: paramiko.HostKeys
    user: str = "root"
    port: int = 22


def load_shared(key_path: str, known_hosts_path: str, user: str = "root", port: int = 22) -> Shared:
    return Shared(
        paramiko.Ed25519Key.from_private_key_file(key_path),
        paramiko.HostKeys(known_hosts_path),
        user,
        port,
    )


def _exec(shared: Shared, address: str, command: str, stdin: bytes | None) -> tuple[int, bytes]:
    results = _execs(shared, address, [(command, stdin)])
    return results[0]


def _execs(
    shared: Shared, address: str, commands: list[tuple[str, bytes | None]]
) -> list[tuple[int, bytes]]:
    """One connection, the commands one after the other on it (one exec channel each)."""
    sock = socket.create_connection((address, shared.port), timeout=TIMEOUT_S)
    # As dflash-provision does: without it Nagle + delayed ACKs add ~40 ms to each exec.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = TIMEOUT_S
        transport.start_client(timeout=TIMEOUT_S)
        server_key = transport.get_remote_server_key()
        name = address if shared.port == 22 else f"[{address}]:{shared.port}"
        known = shared.host_keys.lookup(name)
        if known is None or known.get(server_key.get_name()) != server_key:
            raise paramiko.BadHostKeyException(address, server_key, server_key)
        transport.auth_publickey(shared.user, shared.key)
        results = []
        for command, stdin in commands:
            channel = transport.open_session(timeout=TIMEOUT_S)
            channel.settimeout(TIMEOUT_S)
            channel.exec_command(command)
            if stdin is not None:
                channel.sendall(stdin)
            channel.shutdown_write()
            chunks = []
            while True:
                chunk = channel.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
            results.append((channel.recv_exit_status(), b"".join(chunks)))
        return results
    finally:
        transport.close()


def read_one(shared: Shared, address: str, path: str) -> str | None:
    """sha256 of the remote file, None when the command failed."""
    status, data = _exec(shared, address, shlex.join(["cat", path]), None)
    return hashlib.sha256(data).hexdigest() if status == 0 else None


def write_one(shared: Shared, address: str, path: str, data: bytes) -> bool:
    status, _ = _exec(shared, address, f"cat > {shlex.quote(path)}", data)
    return status == 0


def write_read_one(shared: Shared, address: str, path: str, data: bytes) -> bool:
    """``cat > FILE`` then ``cat FILE`` on the same connection: the least a write with a separate
    read-back can cost (two execs), for comparison with dflash-provision's push."""
    (wrote, _), (read, back) = _execs(
        shared, address, [(f"cat > {shlex.quote(path)}", data), (shlex.join(["cat", path]), None)]
    )
    return wrote == 0 and read == 0 and back == data


def atomic_write_read_one(shared: Shared, address: str, path: str, data: bytes) -> bool:
    """The least a write with push's guarantees can cost, by hand, in one exec as push does it:
    the bytes into a temp file beside the config and fsynced, the old file kept by a hard link,
    the rename, the directory fsynced, then ``cat FILE`` as the read-back (the shell, cat, sync,
    ln, mv, sync, cat). No lock, no hash check of what arrived, no trust checks, no evidence for a
    cut-off caller, no watchdog."""
    directory = path.rsplit("/", 1)[0] or "/"
    tmp, backup = f"{path}.tmp", f"{path}.bak"
    q = shlex.quote
    write = (
        f"cat > {q(tmp)} && sync {q(tmp)}"
        f" && {{ [ ! -e {q(path)} ] || ln -f {q(path)} {q(backup)}; }}"
        f" && mv -f {q(tmp)} {q(path)} && sync {q(directory)} && cat {q(path)}"
    )
    ((status, back),) = _execs(shared, address, [(write, data)])
    return status == 0 and back == data


def run(
    shared: Shared,
    addresses: list[str],
    path: str,
    *,
    data: bytes | None,
    workers: int,
    read_back: bool = False,
    atomic: bool = False,
) -> list[bool]:
    """Read (``data`` None) or write every host (``read_back``: and read it back on the same
    connection; ``atomic``: with push's guarantees done by hand, see atomic_write_read_one);
    True per host that succeeded."""

    def one(address: str) -> bool:
        try:
            if data is None:
                return read_one(shared, address, path) is not None
            if atomic:
                return atomic_write_read_one(shared, address, path, data)
            if read_back:
                return write_read_one(shared, address, path, data)
            return write_one(shared, address, path, data)
        except (OSError, paramiko.SSHException):
            return False

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(addresses)))) as pool:
        return list(pool.map(one, addresses))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("addresses", nargs="+")
    parser.add_argument("--key", required=True)
    parser.add_argument("--known-hosts", required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--write", help="file whose bytes to write (default: read)")
    parser.add_argument(
        "--read-back", action="store_true", help="with --write: then `cat FILE` (2 execs)"
    )
    parser.add_argument(
        "--atomic",
        action="store_true",
        help="with --write: temp file + fsync, backup link, rename, directory fsync, read-back"
        " (1 exec)",
    )
    parser.add_argument("--port", type=int, default=22)
    parser.add_argument("--workers", type=int, default=64)
    args = parser.parse_args()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    shared = load_shared(args.key, args.known_hosts, port=args.port)
    data = open(args.write, "rb").read() if args.write else None  # noqa: SIM115
    results = run(
        shared,
        args.addresses,
        args.path,
        data=data,
        workers=args.workers,
        read_back=args.read_back,
        atomic=args.atomic,
    )
    wall = time.monotonic() - started
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    json.dump(
        {"wall_s": wall, "cpu_s": cpu, "ok": sum(results), "failed": len(results) - sum(results)},
        sys.stdout,
    )
    print()


if __name__ == "__main__":
    main()
