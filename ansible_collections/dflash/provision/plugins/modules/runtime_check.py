# Copyright: dflash-provision maintainers
# Apache-2.0 (see galaxy.yml)
# The work is done by the action plugin of the same name, on the controller; this file holds the
# documentation (ansible-doc) and is never run on a host.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: runtime_check
short_description: Prove that the vLLM server runs the provisioned DFlash drafter and accepts
  its drafts
description:
  - Runs dflash-provision runtime-check's stages through the play's connection, (a) the file on
    disk, (b) the host's transformers and vLLM load it, (c) the server's command line and log,
    (d) a completion, (e) acceptance over greedy smoke prompts, and returns each stage's
    evidence and the acceptance figures (runtime-check --json's report).
  - The HTTP requests to the server are made on the host by its Python (the server keeps
    listening on 127.0.0.1).
  - Fails when a stage failed (exit_code 24 for a-d, 25 for acceptance below the gate) and when
    a stage could not tell (inconclusive, exit_code 26, e.g. too few draft tokens or a counter
    reset); a check that cannot tell is never a pass.
  - A pass records its acceptance as the reference a later check compares with.
version_added: "0.1.0"
author: dflash-provision maintainers
extends_documentation_fragment:
  - dflash.provision.drafter
  - dflash.provision.drafter.source
options:
  port:
    description: The server's port (default the port launch started this drafter on, else 8000).
    type: int
  min_acceptance:
    description: The acceptance gate (a fraction).
    type: float
    default: 0.10
  max_regression:
    description: Fail when the mean acceptance length is more than this below the recorded
      reference (10% or 0.1); without it a drop is a warning.
    type: str
  prompts:
    description: Greedy smoke prompts.
    type: int
    default: 3
  max_tokens:
    description: Tokens each smoke prompt generates.
    type: int
    default: 32
  min_draft_tokens:
    description: Fewer draft tokens than this decide nothing (inconclusive).
    type: int
    default: 32
  python:
    description: The host's Python for the loader probe and the requests (default the server's).
    type: str
  model:
    description: The target model for vLLM's resolution (default the server's).
    type: str
  skip_loader:
    description: Skip stage b.
    type: bool
    default: false
  no_long_context:
    description: >-
      Do not send stage e's prompt longer than a sliding-window drafter's window (its
      acceptance past the window against the short prompts'); the result says it was skipped.
    type: bool
    default: false
  no_reference:
    description: Neither compare with the acceptance reference nor record one.
    type: bool
    default: false
  reset_reference:
    description: Do not compare; record this check's figures as the new reference if it passes.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: The server serves the drafter and accepts its drafts
  dflash.provision.runtime_check:
    path: /models/Qwen3.6-27B-DFlash
    lock: dflash.lock
    min_acceptance: 0.3
    max_regression: 10%
"""

RETURN = r"""
ok:
  description: Every stage passed.
  type: bool
  returned: success
exit_code:
  description: The CLI's exit code for the same report (0, 24, 25, 26).
  type: int
  returned: always
inconclusive:
  description: No stage failed but one could not tell.
  type: bool
  returned: success
acceptance_rate:
  description: Stage e's acceptance rate (null when it is no evidence).
  type: float
  returned: success
port:
  description: The port checked.
  type: int
  returned: success
stages:
  description: Each stage's key, name, status, summary, evidence, data (acceptance figures in
    e's), fix and causes.
  type: list
  returned: success
"""
