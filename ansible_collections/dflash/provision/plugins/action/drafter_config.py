# Copyright: dflash-provision maintainers
# Apache-2.0 (see galaxy.yml)
"""Action plugin for dflash.provision.drafter_config: a thin face on
dflash_provision.playbook.drafter_config, which resolves and validates the source here, on the
controller, and runs push's write-and-prove protocol through this play's connection."""

from __future__ import annotations

import contextlib
import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase


def runner_for(action):
    """The play's connection as a (shell command, stdin) -> (rc, stdout, stderr) function.

    Bytes stay bytes (surrogateescape both ways). No tty: a pty would merge stderr into stdout
    and turn newlines into CRLF. A command without stdin reads /dev/null, so it never waits on
    the connection's open stdin."""
    connection = action._connection
    # A connection plugin without the option (local, docker...) never asks for a tty.
    with contextlib.suppress(KeyError):
        connection.set_option("use_tty", False)

    def run(command, stdin):
        if stdin is None:
            command = command + " </dev/null"
        done = action._low_level_execute_command(
            command, sudoable=True, in_data=stdin, encoding_errors="surrogateescape"
        )
        out = done.get("stdout", "").encode("utf-8", "surrogateescape")
        err = done.get("stderr", "").encode("utf-8", "surrogateescape")
        return int(done.get("rc", 0) or 0), out, err

    return run


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        try:
            from dflash_provision.errors import DflashProvisionError
            from dflash_provision.playbook.drafter_config import (
                apply_drafter_config,
                parse_args,
            )
        except ImportError as exc:
            raise AnsibleActionFail(
                f"dflash.provision needs the dflash-provision package on the controller "
                f"(pip install dflash-provision): {exc}"
            ) from exc
        args = dict(self._task.args)
        try:
            parse_args(args)  # the options' own errors first, before any file is looked for
            # Controller files, found as ansible.builtin.copy finds its src (the role's or the
            # playbook's files/ directory, then the playbook's directory).
            for name in ("src", "lock"):
                if args.get(name) and not os.path.isabs(args[name]):
                    args[name] = self._find_needle("files", args[name])
            parsed = parse_args(args)
        except DflashProvisionError as exc:
            raise AnsibleActionFail(f"dflash.provision.drafter_config: {exc.message}") from exc
        host = (task_vars or {}).get("inventory_hostname", "host")
        outcome = apply_drafter_config(
            runner_for(self),
            host,
            parsed,
            check_mode=bool(self._task.check_mode),
            diff_mode=bool(self._task.diff),
        )
        result.update(outcome)
        return result
