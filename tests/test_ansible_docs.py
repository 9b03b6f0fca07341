"""The collection's documentation, read by real ansible-doc (ansible-test's ansible-doc sanity
test needs pip inside its own venv, which this machine's Python cannot create): every module is
documented, its shared options come from the one doc fragment, and what is documented is what
the library's option check accepts, no more and no less."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
MODULES = ("drafter_config", "drafter_facts", "runtime_check", "server")
# Every module file the collection ships, found on disk: a new module is checked without being
# added to a list here.
SHIPPED = sorted(
    p.stem
    for p in (REPO / "ansible_collections/dflash/provision/plugins/modules").glob("*.py")
    if not p.name.startswith("_")
)


def _ansible_doc(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    ansible_doc = Path(sys.executable).with_name("ansible-doc")
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(REPO), "ANSIBLE_HOME": str(home)}
    env["ANSIBLE_NOCOLOR"] = "1"
    return subprocess.run(
        [str(ansible_doc), *args],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``ansible-doc --json`` of every shipped module, by short name: one run for all of them
    (ansible-doc takes several; each run costs a second of start-up)."""
    names = [f"dflash.provision.{name}" for name in SHIPPED]
    done = _ansible_doc(["--json", *names], tmp_path_factory.mktemp("ansible-home"))
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return {name.removeprefix("dflash.provision."): doc for name, doc in found.items()}


def test_every_shipped_module_is_checked() -> None:
    assert sorted(MODULES) == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_ansible_doc_renders_every_module_as_text(
    name: str, tmp_path: Path, docs: dict[str, Any]
) -> None:
    """What a user types first: `ansible-doc dflash.provision.NAME`, the text page. --json does
    not render the descriptions, so a description YAML read as a mapping (an item with ': ' in
    it) passed --json and failed here with "Unable to retrieve documentation"."""
    done = _ansible_doc([f"dflash.provision.{name}"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "ERROR" not in done.stderr, done.stderr
    page = done.stdout
    assert f"dflash.provision.{name}" in page.splitlines()[0]
    doc = docs[name]["doc"]
    # Every option and the whole description are on the page (the text is re-wrapped: compare
    # words).
    listed = set(re.findall(r"^[-=] (\w+)", page, re.MULTILINE))  # '=' marks a required one
    assert set(doc["options"]) <= listed
    words = " ".join(page.split())
    for item in doc["description"]:
        assert isinstance(item, str), item
        assert " ".join(item.split())[:40] in words, item


@pytest.mark.parametrize("name", MODULES)
def test_ansible_doc_documents_exactly_the_options_the_library_accepts(
    name: str, docs: dict[str, Any]
) -> None:
    doc = docs[name]
    library = importlib.import_module(f"dflash_provision.ansible_modules.{name}")
    assert sorted(doc["doc"]["options"]) == sorted(library.OPTIONS)
    assert doc["doc"]["short_description"] and doc["examples"] and doc["return"]
    # The shared options come from the one fragment (ansible-doc has merged it in).
    assert doc["doc"]["options"]["path"]["description"] == (
        "The drafter directory on the host (absolute)."
    )
