# Copyright: dflash-provision maintainers
# Apache-2.0 (see galaxy.yml)
"""Action plugin for dflash.provision.drafter_config:
dflash_provision.ansible_modules.drafter_config resolves and validates the source here, on the
controller, and runs push's write-and-prove protocol through this play's connection."""

from __future__ import annotations

from ansible_collections.dflash.provision.plugins.plugin_utils.dflash_action import DflashAction


class ActionModule(DflashAction):
    LIBRARY = "drafter_config"
    TASK = "apply_drafter_config"
    DIFF_MODE = True
