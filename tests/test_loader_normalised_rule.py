"""One rule decides "loader_normalised": `validate --json` and `audit` agree on every file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testbed import samples
from tests.fixtures.cli import run_cli_in_process


def _reference_with(**changes: Any) -> bytes:
    doc = samples.load_json(samples.REFERENCE_DRAFTER)
    for key, value in changes.items():
        if value is None:
            del doc[key]
        else:
            doc[key] = value
    return json.dumps(doc, indent=2).encode()


HOST_FILES = {
    "in-sync": samples.REFERENCE_DRAFTER.read_bytes(),
    "drifted": samples.INCIDENT_DRAFTER.read_bytes(),
    "no-layer-types": _reference_with(layer_types=None),  # only the loader objects
    # Breaks an invariant too: validate once said "not loader_normalised", audit said it was.
    "no-sliding-window": _reference_with(use_sliding_window=False),
    "not-json": b"{ nope",
}


@pytest.mark.integration
def test_validate_json_and_audit_agree_on_which_files_are_loader_normalised(
    tmp_path: Path,
) -> None:
    dirs = {}
    for name, data in HOST_FILES.items():
        directory = tmp_path / "hosts" / name
        directory.mkdir(parents=True)
        (directory / "config.json").write_bytes(data)
        dirs[name] = directory
    home = tmp_path / "home"

    validated = {}
    for name, directory in dirs.items():
        proc = run_cli_in_process("validate", directory / "config.json", "--json", home=home)
        assert proc.stdout, proc.stderr
        validated[name] = json.loads(proc.stdout)["loader_normalised"]

    proc = run_cli_in_process(
        "audit", "--json", "--from", samples.REFERENCE_DRAFTER, *dirs.values(),
        home=home,
    )  # fmt: skip
    hosts = json.loads(proc.stdout)["hosts"]
    audited = {
        name: host["status"] == "loader_normalised" for name, host in zip(dirs, hosts, strict=True)
    }
    assert [h["path"] for h in hosts] == [str(d / "config.json") for d in dirs.values()]

    assert validated == audited
    assert validated == {
        "in-sync": False,
        "drifted": False,
        "no-layer-types": True,
        "no-sliding-window": True,
        "not-json": False,
    }
