"""Flags defined once for the commands that share them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


def source_option_list(*, fleet: bool) -> list[Callable[[Any], Any]]:
    """``--repo``, ``--revision``, ``--from`` and ``--lock``: the one definition every command
    that takes an authoritative source uses (push, verify, rollback, launch, doctor, and the
    fleet commands audit, repair, runtime-check), so a flag means the same everywhere.

    ``fleet``: the commands where these override an inventory's drafter (the help says so).
    """
    # The fleet commands: these beat an inventory's drafter; ./dflash.lock serves plain TARGETs.
    over = "; overrides the inventory" if fleet else ""
    default = "for plain TARGETs " if fleet else ""
    return [
        click.option(
            "--repo",
            metavar="OWNER/NAME[@REV]",
            help=f"Authoritative config from the Hub{over}; without a revision, main is resolved "
            "now and the output names the commit.",
        ),
        click.option(
            "--revision",
            metavar="REV",
            help="Revision for --repo: a branch, tag or commit sha (beats an @REV in --repo).",
        ),
        click.option(
            "--from",
            "from_file",
            type=click.Path(exists=True),
            help="Authoritative config from a local file or a directory holding config.json"
            f"{over}.",
        ),
        click.option(
            "--lock",
            type=click.Path(dir_okay=False),
            help=f"Authoritative config pinned in a lock file (default {default}./dflash.lock "
            f"when present){over}.",
        ),
    ]
