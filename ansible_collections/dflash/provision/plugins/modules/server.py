# Copyright: dflash-provision maintainers
# Apache-2.0 (see galaxy.yml)
# The work is done by the action plugin of the same name, on the controller; this file holds the
# documentation (ansible-doc) and is never run on a host.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: server
short_description: Restart the vLLM server dflash-provision launch started, with its recorded
  launch
description:
  - Finds the launch record of the server that dflash-provision launch started for I(path) on
    the host, stops that server and starts it again with the same command line and env names,
    then waits until it is ready and proves it, as dflash-provision rollout restarts a host.
  - The env values are read on the host from the running server's /proc/PID/environ at the
    moment of the restart (the login must be the server's user or root); I(env) overrides them;
    nothing is stored.
  - Everything that can refuse is checked before the server is stopped (one launch record, the
    config on disk parses, the pidfile names the launch's own server, so that stop would not be
    refused, e.g. behind a site wrapper that adds arguments; each env value readable or in
    I(env)), so a refused restart leaves the old server running.
  - Proved means the old process (pid and start time) is gone, a new one runs the recorded
    command line, its own engine start-up record names the drafter and N, and it answers;
    anything else fails the task with what was found (exit_code 20).
  - Check mode reports what would be restarted and touches nothing.
version_added: "0.1.0"
author: dflash-provision maintainers
extends_documentation_fragment:
  - dflash.provision.drafter
options:
  state:
    description: Only C(restarted).
    type: str
    default: restarted
    choices: [restarted]
  port:
    description: The server's port, when the drafter is launched on several.
    type: int
  env:
    description: Values for env names the launch record holds, overriding those read from the
      running server (values are never stored).
    type: dict
  ready_timeout:
    description: Seconds to wait for /health.
    type: float
    default: 900
"""

EXAMPLES = r"""
- name: Restart the server so it reads the new config
  dflash.provision.server:
    path: /models/Qwen3.6-27B-DFlash
    state: restarted
    env:
      HF_TOKEN: "{{ vault_hf_token }}"
"""

RETURN = r"""
port:
  description: The port of the restarted server.
  type: int
  returned: success
was_running:
  description: Whether the server was running before.
  type: bool
  returned: success
drafter_sha256:
  description: The sha256 of the config the restarted server reads.
  type: str
  returned: success
argv:
  description: The recorded command line it was started with.
  type: list
  returned: success
evidence:
  description: What proved the restart (old pid gone, new pid, its engine record).
  type: str
  returned: success
"""
