# Copyright: dflash-provision maintainers
# Apache-2.0 (see galaxy.yml)
# The work is done by the action plugin of the same name, on the controller; this file holds the
# documentation (ansible-doc) and is never run on a host.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: drafter_config
short_description: Make a DFlash drafter's config.json the authoritative one, proved
description:
  - Resolves and validates the authoritative config on the controller with the dflash-provision
    library (a lock file, a Hub repo at a commit, or a local file), then writes it on the host
    with dflash-provision push's protocol through the play's connection, in one remote command
    (lock, temp file in the directory, fsync, backup, rename, directory fsync, then the read-back
    of the file opened again by its path, compared with the bytes meant), and records the write
    in the dflash-provision history.
  - Runs on hosts without Python (busybox containers); the host side is POSIX sh.
version_added: "0.1.0"
author: dflash-provision maintainers
extends_documentation_fragment:
  - dflash.provision.drafter
  - dflash.provision.drafter.source
options:
  mkdir:
    description: Create a missing drafter directory.
    type: bool
    default: false
  keep_backups:
    description: How many old files to keep in .dflash-backups (default as push's).
    type: int
"""

EXAMPLES = r"""
- name: The drafter config, pinned by the lock file beside the playbook
  dflash.provision.drafter_config:
    path: /models/Qwen3.6-27B-DFlash
    lock: dflash.lock

- name: Inside an LXC container on the host
  dflash.provision.drafter_config:
    path: /models/Qwen3.6-27B-DFlash
    src: files/config.json
    container: lxc:vllm1

- name: Inside the Docker container that serves vLLM (rootless Docker's socket)
  dflash.provision.drafter_config:
    path: /models/Qwen3.6-27B-DFlash
    lock: dflash.lock
    container: docker:vllm
    docker_host: unix:///run/user/1000/docker.sock
"""

RETURN = r"""
status:
  description: As push --json says it (written, unchanged, dry-run, failed, not-applied,
    replaced, unknown).
  type: str
  returned: always
old_sha256:
  description: The file's sha256 before (null when there was none).
  type: str
  returned: success
new_sha256:
  description: The authoritative bytes' sha256.
  type: str
  returned: always
backup:
  description: The old file's name in .dflash-backups (null when nothing was kept).
  type: str
  returned: success
readback_sha256:
  description: The sha256 the read-back found (the file opened again by its path, in the write's
    own command).
  type: str
  returned: success
proof:
  description: What proves the write (the read-back matched), null when nothing was written.
  type: str
  returned: always
diff:
  description: The semantic changes, one line per field.
  type: list
  returned: always
"""
