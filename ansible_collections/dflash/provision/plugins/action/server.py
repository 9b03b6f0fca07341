# Copyright: dflash-provision maintainers
# Apache-2.0 (see galaxy.yml)
"""Action plugin for dflash.provision.server: restart the server launch started for a drafter
directory with its recorded launch (dflash_provision.ansible_modules.server), through this play's
connection."""

from __future__ import annotations

from ansible_collections.dflash.provision.plugins.plugin_utils.dflash_action import DflashAction


class ActionModule(DflashAction):
    LIBRARY = "server"
    TASK = "restart_server"
    CONTROLLER_FILES = ()
