"""Acceptance references keyed by the vLLM version that served them.

The same drafter, config and prompts accept differently on another vLLM release (a DFlash2
drafter: 3.19 -> 2.66 tokens per step from 0.27.1 to 0.28.0, issue 29), so a reference recorded
on one version is no yardstick for a server running another: the gate compares with it for the
record but does not fail on the drop (verify/acceptance_gate.py, ``reference_mismatch``).

The version is the server's own answer to ``GET /version`` (vLLM's
``entrypoints/serve/instrumentator/basic.py`` ``show_version``: ``{"version": VLLM_VERSION}``,
present from 0.20.1 to 0.34.0), else the engine's start-up line or the probe
(verify/reference.py ``vllm_version``): a dev build's ``0.1.dev20904+g179dd0fa9`` is its own
version, compared as text. The version sits in the reference's figures (``vllm_version``); the
history store's lookup filters on it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import DflashProvisionError
from dflash_provision.verify.reference import from_figures

if TYPE_CHECKING:
    from dflash_provision.history.references import ReferenceKey
    from dflash_provision.history.store import HistoryStore
    from dflash_provision.verify.reference import Reference

#: ``{"version": "0.32.0"}`` is a few dozen bytes; anything past this is not that answer.
VERSION_BYTES = 4096
_MAX_VERSION = 200


def server_version(access: Any, timeout: float) -> str | None:
    """The server's ``GET /version`` answer, None when it gives none (an old or foreign server,
    a proxy that hides the path, a reply that is not vLLM's shape)."""
    try:
        reply = access.request("GET", "/version", timeout=timeout, max_bytes=VERSION_BYTES)
    except DflashProvisionError:
        return None
    if reply.status != 200 or getattr(reply, "truncated", False):
        return None
    try:
        version = json.loads(reply.body).get("version")
    except (ValueError, AttributeError, TypeError):
        return None
    if isinstance(version, str) and 0 < len(version) <= _MAX_VERSION and version.isprintable():
        return version
    return None


def mismatch(reference: Reference, version: str | None) -> str | None:
    """Why ``reference`` is no yardstick for a server running ``version`` (None: it is)."""
    if version is not None and reference.vllm_version == version:
        return None
    recorded = reference.vllm_version or "an unknown vLLM version"
    if reference.vllm_version is not None:
        recorded = f"vLLM {recorded}"
    running = f"vLLM {version}" if version else "a vLLM whose version it does not say"
    return (
        f"the acceptance reference of {reference.recorded_at} was recorded on {recorded}, this "
        f"server runs {running}: acceptance moves between vLLM releases with the same config, "
        "so a drop against it is not gated (a pass records this version's own reference)"
    )


def lookup(
    store: HistoryStore, key: ReferenceKey, version: str | None
) -> tuple[Reference | None, str | None]:
    """The reference to compare with and, when it is of another or unknown version, why it is
    not gated on: this version's newest, else the newest of any version. Raises the store's
    DflashProvisionError."""
    if version is not None:
        found = store.latest_reference(key, vllm_version=version)
        same = from_figures(*found) if found is not None else None
        if same is not None:
            return same, None
    found = store.latest_reference(key)
    other = from_figures(*found) if found is not None else None
    if other is None:
        return None, None
    return other, mismatch(other, version)
