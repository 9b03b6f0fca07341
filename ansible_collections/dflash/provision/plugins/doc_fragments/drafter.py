# Copyright: dflash-provision maintainers
# Apache-2.0 (see galaxy.yml)
"""The options every dflash.provision module shares, documented once
(extends_documentation_fragment: dflash.provision.drafter and dflash.provision.drafter.source)."""

from __future__ import annotations


class ModuleDocFragment:
    # Where the drafter is and how the host is reached.
    DOCUMENTATION = r"""
options:
  path:
    description: The drafter directory on the host (absolute).
    type: str
    required: true
  container:
    description: The drafter (and its server) is inside this container on the host,
      C(lxc:NAME), C(pct:ID), C(incus:NAME), C(lxd:NAME), C(docker:NAME) or C(podman:NAME)
      (as a target's HOST/KIND:NAME).
    type: str
  docker_host:
    description: The Docker daemon of a C(docker:NAME) container, as C(docker -H) and the CLI's
      --docker-host (e.g. C(unix:///run/user/1000/docker.sock)); default docker's own on the
      host.
    type: str
  command_timeout:
    description: Seconds each remote command may run (as the CLI's --command-timeout); at the
      limit the task fails and the host's script is ended there.
    type: float
    default: 60
"""

    # The authoritative config: exactly one of lock, repo (+ revision), src.
    SOURCE = r"""
options:
  lock:
    description: A dflash.lock on the controller (as the CLI's --lock).
    type: str
  repo:
    description: A Hub repo OWNER/NAME (as --repo); with I(revision).
    type: str
  revision:
    description: The commit (or branch, tag) of I(repo) (as --revision).
    type: str
  src:
    description: A config file on the controller (as the CLI's --from); a relative name is found
      as ansible.builtin.copy finds its src.
    type: str
"""
