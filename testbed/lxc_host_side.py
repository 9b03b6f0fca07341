"""What a fleet host needs around its LXC containers, apart from the containers themselves:
the pct / incus / lxc (LXD) emulators installed on it, and the clean-up of the cgroups LXC leaves
behind when a host is killed rather than stopped. (``lxc.py`` makes the containers; ``hosts.py``
uses both.)"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def remove_leftover_cgroups(names: Iterable[str]) -> None:
    """Remove empty cgroups LXC left for ``names`` when their host was killed, not stopped.

    A killed host takes its containers' processes with it (PID namespace), but the cgroup
    directories ``lxc.payload.NAME`` / ``lxc.monitor.NAME`` stay behind; empty ones are removed
    bottom-up. Busy ones (a container still running) are left alone.
    """
    wanted = set()
    for name in names:
        wanted |= {f"lxc.payload.{name}", f"lxc.monitor.{name}"}
    if not wanted or not CGROUP_ROOT.is_dir():
        return
    # LXC nests them under the caller's cgroup, which differs per controller (e.g. memory:
    # /process_api/<id>), so look a few levels deep in every hierarchy.
    for top in _find_dirs(CGROUP_ROOT, wanted, max_depth=5):
        for dirpath, _dirs, _files in os.walk(top, topdown=False):
            try:
                os.rmdir(dirpath)
            except OSError:
                break  # still has processes: not a leftover


def _find_dirs(root: Path, names: set[str], max_depth: int) -> list[Path]:
    found: list[Path] = []
    level = [root]
    for _ in range(max_depth):
        next_level = []
        for d in level:
            try:
                entries = [e for e in os.scandir(d) if e.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for e in entries:
                if e.name in names:
                    found.append(Path(e.path))
                elif not e.name.startswith("lxc."):
                    next_level.append(Path(e.path))
        level = next_level
    return found


# --------------------------------------------------------------------------------------------
# pct / incus / lxc (LXD) emulators


_PCT = r"""#!/bin/sh
# pct: EMULATION of Proxmox VE's container CLI for the dflash-provision testbed (Proxmox can't
# run here). VMID N is the LXC container "${prefix}N" in /var/lib/lxc; commands go to lxc-*.
# Supported: exec VMID [--] CMD..., status VMID, push VMID SRC DEST, pull VMID SRC DEST,
# start VMID, stop VMID. Errors mimic pct: unknown VMID -> "Configuration file
# 'nodes/<node>/lxc/N.conf' does not exist" (exit 2); exec/push/pull on a stopped container ->
# "container 'N' not running!" (exit 255, what Perl's die gives). exec passes stdin through and
# exits with the command's status.
prefix='@PREFIX@'
die() { echo "$1" >&2; exit "$2"; }
running() { lxc-info -n "$prefix$1" -s 2>/dev/null | grep -q RUNNING; }
need() {
    [ -n "$1" ] || die "400 not enough arguments" 255
    [ -f "/var/lib/lxc/$prefix$1/config" ] ||
        die "Configuration file 'nodes/$(hostname)/lxc/$1.conf' does not exist" 2
}
need_running() { need "$1"; running "$1" || die "container '$1' not running!" 255; }
cmd=$1
[ $# -gt 0 ] && shift
case "$cmd" in
exec)
    vmid=$1; shift; [ "$1" = "--" ] && shift
    need_running "$vmid"
    exec lxc-attach -n "$prefix$vmid" -- "$@" ;;
status)
    need "$1"
    if running "$1"; then echo "status: running"; else echo "status: stopped"; fi ;;
push)
    need_running "$1"
    exec lxc-attach -n "$prefix$1" -- sh -c 'cat > "$1"' sh "$3" < "$2" ;;
pull)
    need_running "$1"
    lxc-attach -n "$prefix$1" -- cat "$2" > "$3" ;;
start)
    need "$1"; lxc-start -n "$prefix$1" && lxc-wait -n "$prefix$1" -s RUNNING -t 10 ;;
stop)
    need "$1"; lxc-stop -k -n "$prefix$1" ;;
*)
    die "pct (testbed emulation): unknown command '$cmd'" 255 ;;
esac
"""

_INCUS = r"""#!/bin/sh
# @PROG@: EMULATION of the @WHAT@ CLI for the dflash-provision testbed (it can't run here).
# Instance NAME is the LXC container "${prefix}NAME" in /var/lib/lxc; commands go to lxc-*.
# Supported: exec NAME [flags] -- CMD..., info NAME ("Status: RUNNING|STOPPED"), start NAME,
# stop NAME, file push SRC NAME/PATH, file pull NAME/PATH DEST. Errors mimic @PROG@:
# unknown instance -> "Error: Instance not found" (exit 1); exec on a stopped instance ->
# "Error: Instance is not running" (exit 1). exec passes stdin and the command's exit status.
prefix='@PREFIX@'
die() { echo "$1" >&2; exit "$2"; }
running() { lxc-info -n "$prefix$1" -s 2>/dev/null | grep -q RUNNING; }
need() { [ -f "/var/lib/lxc/$prefix$1/config" ] || die "Error: Instance not found" 1; }
need_running() { need "$1"; running "$1" || die "Error: Instance is not running" 1; }
cmd=$1
[ $# -gt 0 ] && shift
case "$cmd" in
exec)
    name=$1; shift
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do shift; done  # flags like --env are ignored
    [ "$1" = "--" ] && shift
    need_running "$name"
    exec lxc-attach -n "$prefix$name" -- "$@" ;;
info)
    need "$1"
    echo "Name: $1"
    if running "$1"; then echo "Status: RUNNING"; else echo "Status: STOPPED"; fi ;;
start)
    need "$1"; lxc-start -n "$prefix$1" && lxc-wait -n "$prefix$1" -s RUNNING -t 10 ;;
stop)
    need "$1"; lxc-stop -k -n "$prefix$1" ;;
file)
    sub=$1; shift
    case "$sub" in
    push) name=${2%%/*}; path=/${2#*/}; need_running "$name"
        exec lxc-attach -n "$prefix$name" -- sh -c 'cat > "$1"' sh "$path" < "$1" ;;
    pull) name=${1%%/*}; path=/${1#*/}; need_running "$name"
        lxc-attach -n "$prefix$name" -- cat "$path" > "$2" ;;
    *) die "Error: unknown command 'file $sub' (testbed emulation)" 1 ;;
    esac ;;
*)
    die "Error: unknown command '$cmd' (testbed emulation)" 1 ;;
esac
"""


def emulator_scripts(prefix: str) -> dict[str, str]:
    """The emulated CLIs by program name: ``pct`` (Proxmox VE), ``incus``, ``lxc`` (LXD client).

    Each is a POSIX sh script over lxc-*; container/instance NAME maps to LXC name
    ``prefix + NAME``. The scripts' headers document commands, error texts and exit codes.
    """
    return {
        "pct": _PCT.replace("@PREFIX@", prefix),
        "incus": _INCUS.replace("@PREFIX@", prefix)
        .replace("@PROG@", "incus")
        .replace("@WHAT@", "Incus"),
        "lxc": _INCUS.replace("@PREFIX@", prefix)
        .replace("@PROG@", "lxc")
        .replace("@WHAT@", "LXD (lxc client)"),
    }
