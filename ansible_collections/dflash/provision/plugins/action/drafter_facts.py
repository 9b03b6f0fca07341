# Copyright: dflash-provision maintainers
# Apache-2.0 (see galaxy.yml)
"""Action plugin for dflash.provision.drafter_facts: audit's read and judge of one host
(dflash_provision.ansible_modules.drafter_facts) through this play's connection."""

from __future__ import annotations

from ansible_collections.dflash.provision.plugins.plugin_utils.dflash_action import DflashAction


class ActionModule(DflashAction):
    LIBRARY = "drafter_facts"
    TASK = "gather_drafter_facts"
