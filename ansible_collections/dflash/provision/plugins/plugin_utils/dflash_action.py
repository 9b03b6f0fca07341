# Copyright: dflash-provision maintainers
# Apache-2.0 (see galaxy.yml)
"""What every dflash.provision action plugin does: parse the task's options with the library's
own checks, find controller files as ansible.builtin.copy finds its src, and run the library's
task function with the play's connection as the way to the host. The work itself is the
dflash-provision library's (dflash_provision.ansible_modules), never a copy here."""

from __future__ import annotations

import contextlib
import importlib
import os
from typing import TYPE_CHECKING, Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

if TYPE_CHECKING:  # at run time the library is imported in run(), which says when it is missing
    from dflash_provision.transport.callback import ShellRunner


def runner_for(action: ActionBase) -> ShellRunner:
    """The play's connection as a (shell command, stdin) -> (rc, stdout, stderr) function.

    Bytes stay bytes (surrogateescape both ways). No tty: a pty would merge stderr into stdout
    and turn newlines into CRLF. A command without stdin, or with an empty one, reads /dev/null:
    Ansible sends no data for an empty in_data, so the remote side would wait on the
    connection's open stdin for an end that never comes."""
    connection = action._connection
    # A connection plugin without the option (local, docker...) never asks for a tty.
    with contextlib.suppress(KeyError):
        connection.set_option("use_tty", False)

    def run(command: str, stdin: bytes | None) -> tuple[int, bytes, bytes]:
        if not stdin:
            command, stdin = command + " </dev/null", None
        done = action._low_level_execute_command(
            command, sudoable=True, in_data=stdin, encoding_errors="surrogateescape"
        )
        out = done.get("stdout", "").encode("utf-8", "surrogateescape")
        err = done.get("stderr", "").encode("utf-8", "surrogateescape")
        return int(done.get("rc", 0) or 0), out, err

    return run


class DflashAction(ActionBase):
    """Subclasses name the library module (``LIBRARY``), its task function (``TASK``) and the
    options that are controller files (``CONTROLLER_FILES``)."""

    TRANSFERS_FILES = False
    _requires_connection = True
    LIBRARY = ""
    TASK = ""
    CONTROLLER_FILES: tuple[str, ...] = ("src", "lock")
    CHECK_MODE = True  # the task function takes check_mode
    DIFF_MODE = False  # ... and diff_mode

    def run(
        self, tmp: str | None = None, task_vars: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        name = f"dflash.provision.{self.LIBRARY}"
        try:
            from dflash_provision.errors import DflashProvisionError

            library = importlib.import_module(f"dflash_provision.ansible_modules.{self.LIBRARY}")
        except ImportError as exc:
            raise AnsibleActionFail(
                f"{name} needs the dflash-provision package on the controller "
                f"(pip install dflash-provision): {exc}"
            ) from exc
        args = dict(self._task.args)
        try:
            library.parse_args(args)  # the options' own errors first, before any file is sought
            # Controller files, found as ansible.builtin.copy finds its src (the role's or the
            # playbook's files/ directory, then the playbook's directory).
            for option in self.CONTROLLER_FILES:
                if args.get(option) and not os.path.isabs(args[option]):
                    args[option] = self._find_needle("files", args[option])
            parsed = library.parse_args(args)
        except DflashProvisionError as exc:
            raise AnsibleActionFail(f"{name}: {exc.message}") from exc
        host = (task_vars or {}).get("inventory_hostname", "host")
        modes: dict[str, bool] = {}
        if self.CHECK_MODE:
            modes["check_mode"] = bool(self._task.check_mode)
        if self.DIFF_MODE:
            modes["diff_mode"] = bool(self._task.diff)
        result.update(getattr(library, self.TASK)(runner_for(self), host, parsed, **modes))
        return result
