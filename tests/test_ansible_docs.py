"""The collection's documentation, read by real ansible-doc (ansible-test's ansible-doc sanity
test needs pip inside its own venv, which this machine's Python cannot create): every module is
documented, its shared options come from the one doc fragment, and what is documented is what
the library's option check accepts, no more and no less."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MODULES = ("drafter_config", "drafter_facts", "runtime_check", "server")


def _doc(name: str, home: Path) -> dict:  # type: ignore[type-arg]
    ansible_doc = Path(sys.executable).with_name("ansible-doc")
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(REPO), "ANSIBLE_HOME": str(home)}
    done = subprocess.run(
        [str(ansible_doc), "--json", f"dflash.provision.{name}"],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)[f"dflash.provision.{name}"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", MODULES)
def test_ansible_doc_documents_exactly_the_options_the_library_accepts(
    name: str, tmp_path: Path
) -> None:
    doc = _doc(name, tmp_path)
    library = importlib.import_module(f"dflash_provision.playbook.{name}")
    assert sorted(doc["doc"]["options"]) == sorted(library.OPTIONS)
    assert doc["doc"]["short_description"] and doc["examples"] and doc["return"]
    # The shared options come from the one fragment (ansible-doc has merged it in).
    assert doc["doc"]["options"]["path"]["description"] == (
        "The drafter directory on the host (absolute)."
    )
