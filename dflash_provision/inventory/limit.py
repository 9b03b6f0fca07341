"""``--limit PATTERN``: the subset of an inventory a fleet command works on, Ansible's way.

A pattern is terms separated by ``,`` (or ``:``): a host name, a group name, ``all`` or ``*``,
shell wildcards (``gpu-east-*``), ``~REGEX`` (matched from the start, as Ansible does), and the
prefixes ``&`` (and also in) and ``!`` (but not in). Hosts in any plain term are taken, then kept
only if they match every ``&`` term, then those matching a ``!`` term are dropped.

Unlike Ansible, a term that matches nothing is an error, not a warning: a mistyped ``!gpu-prod``
must not turn ``repair --limit 'all,!gpu-prod'`` into a repair of production.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

from dflash_provision.errors import UsageError
from dflash_provision.inventory.model import FleetMember


def select(members: Sequence[FleetMember], pattern: str) -> list[FleetMember]:
    """The members ``pattern`` selects, in inventory order."""
    terms = [t.strip() for t in re.split(r"[,:]", pattern) if t.strip()]
    if not terms:
        raise UsageError(f"--limit {pattern!r}: no host or group named")
    plain = [t for t in terms if t[0] not in "&!"]
    required = [t[1:] for t in terms if t[0] == "&"]
    excluded = [t[1:] for t in terms if t[0] == "!"]
    for term in plain + required + excluded:
        if not any(_matches(term, m) for m in members):
            raise UsageError(f"--limit: {term!r} matches no host or group in the inventory")
    chosen = [
        m
        for m in members
        if (not plain or any(_matches(t, m) for t in plain))
        and all(_matches(t, m) for t in required)
        and not any(_matches(t, m) for t in excluded)
    ]
    if not chosen:
        raise UsageError(f"--limit {pattern!r} leaves no host")
    return chosen


def _matches(term: str, member: FleetMember) -> bool:
    names = (member.name, *member.all_groups)
    if term in ("all", "*"):
        return True
    if term.startswith("~"):
        try:
            regex = re.compile(term[1:])
        except re.error as exc:
            raise UsageError(f"--limit: {term!r}: bad regular expression: {exc}") from None
        return any(regex.match(name) for name in names)
    if any(c in term for c in "*?["):
        return any(fnmatch.fnmatchcase(name, term) for name in names)
    return term in names
