"""What every command's ``--help`` ends with: the SOURCE / TARGET forms it takes and every exit
code it can return, from one table (so help, docs/cli.md and docs/exit-codes.md say the same).

``main.LazyGroup`` attaches ``epilog(name)`` to each command as it loads it; the command modules
keep their own description and options. An exit code listed here must be one the command can
return (errors.ExitCode; docs/exit-codes.md has the long meanings).
"""

from __future__ import annotations

from dflash_provision.errors import ExitCode

# The forms, each a paragraph (click rewraps it to the terminal).
TARGET_FORM = (
    "TARGET: [USER@]HOST:/PATH over SSH (HOST may be an ~/.ssh/config alias; "
    "ssh://[USER@]HOST[:PORT]/PATH carries a port), HOST/KIND:NAME:/PATH inside a container on "
    "that host (KIND lxc, pct, incus, lxd, docker or podman), KIND:NAME:/PATH in a container "
    "here, or a local /PATH. PATH is the model directory or its .json file. E.g. "
    "root@gpu1:/root/models/X, gpu1/lxc:c1:/root/models/X, pve1/pct:101:/root/models/X, "
    "gpu1/docker:vllm:/models/X, /srv/models/X."
)
SOURCE_FORM = (
    "SOURCE: a local config.json file, a directory holding one, a Hub repo id OWNER/NAME[@REV], "
    "or a TARGET (forms under TARGET; read over SSH / in the container, with the connection "
    "options)."
)
AUTHORITY_FORM = (
    "Authoritative config: --repo OWNER/NAME[@REV] [--revision REV] (no revision: main, "
    "resolved now; the output names the commit), --from FILE, --lock FILE; none given: "
    "./dflash.lock when it exists (in fleet commands: for plain TARGETs; inventory hosts keep "
    "their drafter)."
)
FLEET_FORM = (
    "Hosts: -i INVENTORY (dflash-provision YAML, Ansible YAML or INI; --limit PATTERN picks "
    "some) and/or plain TARGETs (forms under TARGET). The key file is --identity KEY."
)
REPO_FORM = "REPO_ID: OWNER/NAME or OWNER/NAME@REV (a branch, tag or commit sha)."
INIT_FORM = (
    "DRAFTER_DIR: an absolute path on this machine. Pinned source: --lock FILE, --repo "
    "OWNER/NAME --revision COMMIT (40 hex digits), or --from FILE. See docs/containers.md for "
    "a pod's init container."
)

# One-line meanings, short enough for a help screen.
MEANING: dict[int, str] = {
    0: "success",
    1: "unexpected error (a bug; --debug shows the traceback)",
    2: "usage: bad arguments, target, inventory or input file",
    3: "the config is invalid (a validation layer failed)",
    4: "drift: a config differs from the authoritative one",
    5: "unreachable: refused, timed out, name not resolved",
    6: "login failed, host key unknown or changed, sudo needs a password",
    7: "a remote step failed: read, permission, disk full, read-only, no dir",
    8: "the container does not exist or is not running",
    9: "done, but the history or --prometheus file could not be written",
    10: "Hub: repository not found",
    11: "Hub: gated repository, no token or no access",
    12: "Hub: revision not found",
    13: "Hub: file not in the repository",
    14: "Hub unreachable and nothing cached",
    15: "HF_HUB_OFFLINE and nothing cached",
    16: "Hub: the bytes do not match what the Hub declared",
    17: "outcome unknown: a write was cut off; run verify",
    20: "launch failed: the server exited, logged a fatal error or was not ready",
    21: "not running: no server of ours on that port",
    22: "port taken by another launch or a foreign process",
    23: "vLLM unusable on the target, or it cannot run this drafter as asked",
    24: "a stage a-d failed: the server does not run what was provisioned",
    25: "stages a-d passed, acceptance is below --min-acceptance",
    26: "inconclusive: no stage failed, but one could not tell (never a pass)",
    27: "rollout: a batch failed its gate and was rolled back, proved",
    28: "rollout: paused on an inconclusive check (--resume ID continues)",
    29: "rollout: aborted, every changed host put back, proved",
    30: "rollout: a rollback could not be proved (the hosts and the command are printed)",
    31: "rollout: not started: pre-flight failed, or an open rollout holds a host",
    130: "interrupted (Ctrl-C); what was done is printed and recorded",
}

_HUB = (10, 11, 12, 13, 14, 15, 16)
_CONNECT = (5, 6, 7, 8)  # reaching a target: network, login, remote step, container
_BASE = (0, 1, 2)

# command -> (forms, exit codes) ; the codes in the order a reader scans them.
COMMAND_HELP: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {
    "fetch": ((REPO_FORM,), (*_BASE, *_HUB)),
    "validate": ((SOURCE_FORM, TARGET_FORM), (*_BASE, 3, *_CONNECT, *_HUB)),
    "diff": ((SOURCE_FORM, TARGET_FORM), (*_BASE, 3, 4, *_CONNECT, *_HUB)),
    "push": ((TARGET_FORM, AUTHORITY_FORM), (*_BASE, 3, 4, *_CONNECT, 9, *_HUB, 17)),
    "verify": ((TARGET_FORM, AUTHORITY_FORM), (*_BASE, 3, 4, *_CONNECT, *_HUB)),
    "rollback": ((TARGET_FORM, AUTHORITY_FORM), (*_BASE, 3, 4, *_CONNECT, 9, *_HUB, 17)),
    "audit": ((FLEET_FORM, TARGET_FORM, AUTHORITY_FORM), (*_BASE, 3, 4, *_CONNECT, 9, *_HUB, 130)),
    "repair": ((FLEET_FORM, TARGET_FORM, AUTHORITY_FORM), (*_BASE, 3, 4, *_CONNECT, 9, *_HUB, 130)),
    "history": ((), (*_BASE, 9)),
    "launch": (
        (TARGET_FORM, AUTHORITY_FORM),
        (*_BASE, 3, 4, *_CONNECT, *_HUB, 20, 22, 23, 24, 25, 26, 130),
    ),
    "status": ((TARGET_FORM,), (*_BASE, *_CONNECT, 21, 22)),
    "stop": ((TARGET_FORM,), (*_BASE, *_CONNECT, 21)),
    "logs": ((TARGET_FORM,), (*_BASE, *_CONNECT, 21)),
    "runtime-check": (
        (TARGET_FORM, FLEET_FORM, AUTHORITY_FORM),
        (*_BASE, 3, *_CONNECT, 9, *_HUB, 24, 25, 26),
    ),
    "doctor": ((TARGET_FORM, AUTHORITY_FORM), (*_BASE, 3, 4, *_CONNECT, *_HUB, 24, 25, 26)),
    "rollout": (
        (FLEET_FORM, TARGET_FORM, AUTHORITY_FORM),
        (*_BASE, 3, *_CONNECT, 9, *_HUB, 27, 28, 29, 30, 31, 130),
    ),
    "init": ((INIT_FORM,), (*_BASE, 3, 7, *_HUB, 17)),
}

# What a code means for one command, where it says more than MEANING (fleet roll-ups).
_SPECIFIC: dict[tuple[str, int], str] = {
    ("audit", 4): "a host's file is not the authoritative bytes: same_values, drifted, missing, "
    "invalid, loader_normalised",
    ("audit", 7): "none known wrong, some unchecked: the first of 7, 8, 6, 5 present",
    ("repair", 4): "with --dry-run: something would be written",
    ("repair", 7): "a write failed or was skipped, or a written host is not in sync",
    ("verify", 4): "the file differs (same_values too: other bytes) or is missing (diff printed)",
    ("runtime-check", 5): "unreachable (the fleet form: some hosts not checked)",
    ("doctor", 4): "the file on disk differs from the authoritative config",
    ("status", 22): "the port is held by a process this login cannot see",
    ("launch", 130): "Ctrl-C during the readiness wait: the server keeps starting (stop named)",
    ("runtime-check", 9): "checked, but the acceptance reference could not be recorded",
    ("init", 3): "the drafter config is invalid or does not fit --target-config: nothing written",
    ("init", 7): "the write failed or was not proved (permission, disk full, read-only, no dir)",
}


def epilog(name: str) -> str | None:
    """The text appended to ``name``'s --help: its forms, then ``Exit codes:`` one per line."""
    entry = COMMAND_HELP.get(name)
    if entry is None:
        return None
    forms, codes = entry
    # "\b" keeps click from rewrapping the code lines into one paragraph.
    lines = [f"  {code:>3}  {_SPECIFIC.get((name, code), MEANING[code])}" for code in codes]
    return "\n\n".join([*forms, "\b\nExit codes:\n" + "\n".join(lines)])


def _check_table() -> None:
    """Every code in the table is a documented ExitCode."""
    known = {int(code) for code in ExitCode}
    unknown = {c for _, codes in COMMAND_HELP.values() for c in codes} - known
    assert not unknown, unknown  # a typo in this table, caught by the tests importing it


_check_table()
