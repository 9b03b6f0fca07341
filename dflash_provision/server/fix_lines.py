"""A fix line as every report prints it: a command that can be pasted as it is, then ``  # why``
(a shell comment: what the command does not do itself). The fix for a config and weights of two
revisions is here too: launch's pre-flight and runtime-check's stage a both print it
(verify/link_fixes.py holds the other fixes, chosen by what a stage saw)."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dflash_provision.target import Target


def noted(command: str, why: str) -> str:
    """``command`` with ``why`` as a shell comment after it (pasted, the comment is ignored)."""
    return f"{command}  # {why}" if why else command


def weights_fix(push_fix: str, restart: str, target: Target) -> str:
    """The config and the weights are of different revisions: a lock pins every file of one
    revision and ``push --all-files`` puts them in place; from another source the weights'
    files cannot be named here, only checked."""
    then = f" && {restart}" if restart else ""
    if "--lock" in shlex.split(push_fix):
        return noted(
            f"{push_fix} --all-files{then}",
            "puts every file of the lock's one pinned revision in place (config and weights)",
        )
    return noted(
        shlex.join(["dflash-provision", "validate", target.display()]),
        f"names each weight that does not fit; put the config and the safetensors of ONE "
        f"revision in {target.model_dir} (a lock with push --all-files does it)"
        + (f", then {restart}" if restart else ""),
    )
