"""Manual use of the testbed: ``python -m testbed up|single|down``.

``up`` starts a fleet (root) and ``single`` one sshd as the current user; both stay in the
foreground until Ctrl-C / SIGTERM (the hosts die with this process, on purpose). ``down`` kills
whatever a killed ``up`` left under ``--dir``, and refuses (exit 1) while a live ``up`` owns it.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from testbed.hosts import Fleet, FleetError, SingleUserSshd, kill_stale

_TMP = Path(tempfile.gettempdir())


def _wait_for_signal() -> None:
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()


def _up(args: argparse.Namespace) -> int:
    began = time.monotonic()
    fleet = Fleet(args.dir, args.count, address_prefix=args.prefix, port=args.port).start()
    try:
        assert fleet.client is not None
        print(f"{len(fleet)} hosts up in {time.monotonic() - began:.2f}s")
        for h in fleet:
            print(f"  {h.alias}  {h.user}@{h.address}:{h.port}  /root = {h.root_dir}")
        print(f"ssh -F {fleet.client.ssh_config} {fleet.hosts[0].alias} hostname")
        print("Ctrl-C to stop.", flush=True)
        _wait_for_signal()
    finally:
        fleet.stop()
    return 0


def _single(args: argparse.Namespace) -> int:
    with SingleUserSshd(args.dir, args.port) as server:
        assert server.client is not None
        print(f"sshd as {server.user} on {server.address}:{server.port}")
        print(f"ssh -F {server.client.ssh_config} {server.alias} hostname")
        print("Ctrl-C to stop.", flush=True)
        _wait_for_signal()
    return 0


def _down(args: argparse.Namespace) -> int:
    killed = kill_stale(args.dir)
    print(f"killed {len(killed)} process(es)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a fleet of namespaced sshd hosts (root)")
    up.add_argument("--dir", type=Path, default=_TMP / "dflash-fleet")
    up.add_argument("--count", type=int, default=3)
    up.add_argument("--prefix", default="127.0.1.", help="address prefix, e.g. 127.0.1.")
    up.add_argument(
        "--port",
        type=int,
        default=None,
        help="every host's port (default: 2222 or $DFLASH_TESTBED_PORT)",
    )
    up.set_defaults(func=_up)
    single = sub.add_parser("single", help="one sshd as the current user on a high port")
    single.add_argument("--dir", type=Path, default=_TMP / "dflash-sshd")
    single.add_argument("--port", type=int, default=0)
    single.set_defaults(func=_single)
    down = sub.add_parser("down", help="kill testbed processes left under --dir")
    down.add_argument("--dir", type=Path, default=_TMP / "dflash-fleet")
    down.set_defaults(func=_down)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except FleetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
