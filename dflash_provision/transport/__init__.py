"""Transports run one command on a machine (local, SSH, inside a container) and return bytes."""

from dflash_provision.transport.base import CommandResult, Transport

__all__ = ["CommandResult", "Transport"]
