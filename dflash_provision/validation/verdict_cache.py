"""Remembered validation verdicts, so the same config is judged by transformers once per machine.

Loading transformers costs about 2 s per process, and every push, repair and audit of a drifted
host validates a config that this machine has usually judged before. A verdict (the findings of
the parse, schema, invariants and effective layers) depends only on the config's bytes and on
the rules that judged them, so it is stored under a key made of:

- the sha256 of the config bytes (and ``--num-speculative-tokens``, which the invariants use);
- the installed transformers version (read from its package metadata, without importing it);
- the rules: this package's version and a digest of the validation modules and JSON Schemas, so
  an upgrade, a new schema or an edited rule in a checkout never reuses an old verdict.

Entries live in ``<data dir>/verdicts/`` (the history's directory: ``DFLASH_PROVISION_HOME`` or
the platform's user data directory), one small JSON file per config, written atomically. The
cache is only an optimisation: an unreadable, corrupt or foreign entry is ignored, a directory
that cannot be written is skipped, and ``DFLASH_PROVISION_NO_VERDICT_CACHE=1`` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from dflash_provision import __version__
from dflash_provision.data_dir import data_dir
from dflash_provision.validation.findings import Finding, ValidationReport
from dflash_provision.validation.schema_check import schemas_dir

DISABLE_ENV = "DFLASH_PROVISION_NO_VERDICT_CACHE"
CACHED_LAYERS = ("parse", "schema", "invariants", "effective")
FORMAT = 1  # bump when the entry's shape changes
MAX_ENTRY_BYTES = 1 << 20  # an entry is ~1 KB; anything bigger is not ours
# What decides a verdict besides the bytes: change any of these files and old verdicts expire.
_RULE_MODULES = (
    "validate.py",
    "../formats/strict_json.py",  # what parses at all (nesting, numbers): a rule like the others
    "../formats/json_path.py",  # how a finding names its place
    "schema_check.py",
    "invariants.py",
    "effective.py",
    "findings.py",
    "speculators_layout.py",
    "speculators_checks.py",
)


def enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "") in ("", "0")


def transformers_version() -> str:
    """The installed transformers version, without importing it (that costs ~2 s): the name of
    its ``.dist-info`` directory beside the package, else its metadata (~30 ms more)."""
    spec = find_spec("transformers")
    if spec is None or spec.origin is None:
        return "absent"
    site = Path(spec.origin).parent.parent
    found = sorted(site.glob("transformers-*.dist-info"))
    if len(found) == 1:
        return found[0].name.removeprefix("transformers-").removesuffix(".dist-info")
    from importlib import metadata

    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return "unknown"


@cache
def rules_digest() -> str:
    """sha256 over this package's version, the transformers version and the rule files."""
    digest = hashlib.sha256(f"{FORMAT}\0{__version__}\0{transformers_version()}".encode())
    package = Path(__file__).resolve().parent
    files = [package / name for name in _RULE_MODULES]
    files += sorted(schemas_dir().glob("*.json"))
    for path in files:
        digest.update(b"\0" + path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def entry_path(data: bytes, num_speculative_tokens: int | None) -> Path:
    config_sha = hashlib.sha256(data).hexdigest()
    suffix = "" if num_speculative_tokens is None else f"-n{num_speculative_tokens}"
    return data_dir() / "verdicts" / rules_digest()[:16] / f"{config_sha}{suffix}.json"


def lookup(data: bytes, num_speculative_tokens: int | None) -> list[tuple[str, list[Finding]]]:
    """The cached layers as (layer, findings) in report order; [] when there is no usable
    entry."""
    if not enabled():
        return []
    try:
        path = entry_path(data, num_speculative_tokens)
        with path.open("rb") as handle:
            if not _ours(os.fstat(handle.fileno())):
                return []
            raw = handle.read(MAX_ENTRY_BYTES + 1)
        if len(raw) > MAX_ENTRY_BYTES:
            return []
        entry = json.loads(raw)
        if entry.get("format") != FORMAT or entry.get("rules") != rules_digest():
            return []
        layers: list[tuple[str, list[Finding]]] = []
        for layer in CACHED_LAYERS:
            layers.append((layer, [_finding(layer, item) for item in entry["layers"][layer]]))
        return layers
    except (OSError, ValueError, KeyError, TypeError):
        return []  # absent, unreadable or not ours: judge the config again


def store(data: bytes, num_speculative_tokens: int | None, report: ValidationReport) -> None:
    """Remember the report's data-only layers; never fails the validation that produced it."""
    if not enabled() or report.layers.get("effective") in (None, "skipped"):
        return  # a file that does not parse costs nothing to judge again
    layers: dict[str, list[dict[str, str]]] = {layer: [] for layer in CACHED_LAYERS}
    for finding in report.findings:
        if finding.layer in layers:
            layers[finding.layer].append(finding.to_dict())
    try:
        entry = {"format": FORMAT, "rules": rules_digest(), "layers": layers}
        path = entry_path(data, num_speculative_tokens)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        import tempfile  # here: tempfile imports shutil, random, bz2, lzma (only writers need it)

        fd, tmp = tempfile.mkstemp(prefix=".verdict-", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(entry, handle)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        return  # read-only home, full disk, a file where the directory should be: no cache


def _ours(status: os.stat_result) -> bool:
    """A verdict says "this config is valid": trust only a regular file this user wrote and
    nobody else can change (a shared DFLASH_PROVISION_HOME must not let others plant one)."""
    return (
        stat.S_ISREG(status.st_mode)
        and status.st_uid == os.geteuid()
        and not status.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _finding(layer: str, item: dict[str, Any]) -> Finding:
    if item["layer"] != layer:
        raise ValueError("finding filed under another layer")
    return Finding(
        layer=item["layer"],
        path=str(item["path"]),
        message=str(item["message"]),
        severity=item.get("severity", "error"),
    )
