# Copyright: dflash-provision maintainers
# Apache-2.0 (see galaxy.yml)
# The work is done by the action plugin of the same name, on the controller; this file holds the
# documentation (ansible-doc) and is never run on a host.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: drafter_facts
short_description: Audit a DFlash drafter's config.json against the authoritative one
description:
  - Reads the host's config.json through the play's connection in one command and judges it
    against the authoritative config as dflash-provision audit does, returning audit --json's
    row for the host (status, detail, sha256, diff, findings) and setting it as the host fact
    C(dflash_drafter).
  - Changes nothing. Fails only when the file could not be judged (not readable, the container
    not running); a drifted file is reported, not failed, so a later task can act on it.
  - Runs on hosts without Python (busybox containers).
version_added: "0.1.0"
author: dflash-provision maintainers
extends_documentation_fragment:
  - dflash.provision.drafter
  - dflash.provision.drafter.source
"""

EXAMPLES = r"""
- name: Audit the drafter config
  dflash.provision.drafter_facts:
    path: /models/Qwen3.6-27B-DFlash
    lock: dflash.lock

- name: Write it only where it drifted
  dflash.provision.drafter_config:
    path: /models/Qwen3.6-27B-DFlash
    lock: dflash.lock
  when: dflash_drafter.needs_write
"""

RETURN = r"""
status:
  description: The judge's word, as audit --json says it (in_sync, same_values, drifted,
    missing, invalid, loader_normalised, permission_denied, container_not_running, error...).
  type: str
  returned: always
needs_write:
  description: The host answered and its file is not the authoritative bytes.
  type: bool
  returned: success
detail:
  description: One line for humans.
  type: str
  returned: always
sha256:
  description: The host file's sha256 (null when it could not be read).
  type: str
  returned: always
expected_sha256:
  description: The authoritative bytes' sha256.
  type: str
  returned: always
diff:
  description: For a drifted file, the changes, one line per field.
  type: list
  returned: always
findings:
  description: For an invalid file, what the validation found.
  type: list
  returned: always
"""
