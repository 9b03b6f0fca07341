# Copyright: dflash-provision maintainers
# Apache-2.0 (see galaxy.yml)
"""Action plugin for dflash.provision.runtime_check: runtime-check's stages a-e for one host's
server (dflash_provision.ansible_modules.runtime_check) through this play's connection."""

from __future__ import annotations

from ansible_collections.dflash.provision.plugins.plugin_utils.dflash_action import DflashAction


class ActionModule(DflashAction):
    LIBRARY = "runtime_check"
    TASK = "run_runtime_check"
    CHECK_MODE = False  # it changes nothing on the host: check mode runs it as it is
