"""``dflash.provision.drafter_facts``: audit one host's drafter config through the play's
connection, as ``audit`` does (the same read, the same judge, the same ``--json`` row).

The result never changes anything; it fails only when the file could not be judged (the host or
container did not answer, the file could not be read): a drifted file is a fact to act on, not a
failed task. The row is also set as the host fact ``dflash_drafter`` so that later tasks can say
``when: dflash_drafter.needs_write``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dflash_provision.ansible_modules.common import (
    HOST_OPTIONS,
    SOURCE_OPTIONS,
    HostArgs,
    SourceArgs,
    failed,
    open_host,
    parse_host,
    parse_source,
    refuse_unknown,
)
from dflash_provision.errors import DflashProvisionError
from dflash_provision.fleet.auditing import audit_on, record_audits
from dflash_provision.fleet.run import CountingTransport, FleetRun
from dflash_provision.history.store import default_store
from dflash_provision.inventory import FleetMember
from dflash_provision.transport.callback import ShellRunner

OPTIONS = (*HOST_OPTIONS, *SOURCE_OPTIONS)
FACT = "dflash_drafter"


@dataclass(frozen=True)
class DrafterFactsArgs:
    host: HostArgs
    source: SourceArgs


def parse_args(args: Mapping[str, Any]) -> DrafterFactsArgs:
    refuse_unknown(args, OPTIONS)
    return DrafterFactsArgs(parse_host(args), parse_source(args))


def gather_drafter_facts(
    runner: ShellRunner, host: str, args: DrafterFactsArgs, *, check_mode: bool = False
) -> dict[str, Any]:
    """The audit row of ``host`` (``audit --json``'s ``hosts[]`` entry) as a task result."""
    try:
        return _gather(runner, host, args, check_mode)
    except DflashProvisionError as exc:
        return failed(exc)


def _gather(
    runner: ShellRunner, host: str, args: DrafterFactsArgs, check_mode: bool
) -> dict[str, Any]:
    spec = args.source.spec()
    authority = spec.load()
    transport, target = open_host(runner, host, args.host)
    member = FleetMember(name=host, target=target, source=spec, origin="ansible task")
    run = FleetRun(lambda _member: authority)
    audit = audit_on(run, member, CountingTransport(transport), time.monotonic())
    if not check_mode:  # as audit does, and as drafter_config's check mode keeps nothing
        record_audits(default_store(), [audit])
    row = audit.to_dict()
    row["needs_write"] = audit.status.needs_write
    judged = audit.status.audited
    return {
        **row,
        "changed": False,
        "failed": not judged,
        "msg": f"{audit.status.value}: {audit.detail}" if audit.detail else audit.status.value,
        "ansible_facts": {FACT: row},
    }
