"""The key of an acceptance reference: what makes two runtime-checks comparable. The store keeps
each passing check's figures under it (``HistoryStore.record_reference``/``latest_reference``)."""

from __future__ import annotations

from dataclasses import dataclass

from dflash_provision.history.host_key import HostKey


@dataclass(frozen=True)
class ReferenceKey:
    """What makes two runtime-checks comparable: the same host and server port, the same
    drafter config (the authority's sha256) and the same smoke prompts (their digest)."""

    host: HostKey
    path: str
    server_port: int
    drafter_sha256: str
    prompts_sha256: str
