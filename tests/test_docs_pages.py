"""Docs a newcomer can skim (issue 31, item 10): what a page names as needed is what the
Makefile does, and a command's section says how to run it, what it prints and what can go
wrong, with its internals and figures on a page of their own."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def section(page: Path, heading: str) -> str:
    text = page.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_demo_md_names_every_apt_package_make_installs() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    packages = re.search(r"^APT_PACKAGES := (.*)$", makefile, re.MULTILINE)
    assert packages is not None
    wanted = set(packages.group(1).split())
    page = (DOCS / "demo.md").read_text(encoding="utf-8")
    listed = re.search(r"`apt-get install` the system packages(.*?)\)", page, re.DOTALL)
    assert listed is not None
    assert set(re.findall(r"`([a-z0-9-]+)`", listed.group(1))) == wanted


def test_the_fetch_section_is_usage_and_its_internals_have_their_own_page() -> None:
    fetch = section(DOCS / "commands.md", "fetch: the authoritative config, pinned")
    for part in ("**How to run it**", "**What it prints**", "**What can go wrong**"):
        assert part in fetch
    # Internals and figures are elsewhere, linked.
    for internal in ("ETag", "X-Linked", "agent-harnesses", "took 20 s"):
        assert internal not in fetch, internal
    assert "](fetch-internals.md)" in fetch
    internals = (DOCS / "fetch-internals.md").read_text(encoding="utf-8")
    assert "ETag" in internals and "agent-harnesses" in internals
    # No paragraph of the section is a wall (it was one of 25 lines).
    blocks = re.split(r"\n\s*\n", fetch)
    prose = [b for b in blocks if not b.lstrip().startswith(("```", "|", "- "))]
    assert max(len(b.strip().splitlines()) for b in prose) <= 6
    # Every exit code fetch can give beyond 0-2 is in the table of what can go wrong.
    from dflash_provision.cli._help import COMMAND_HELP

    wrong = fetch.split("**What can go wrong**", 1)[1]
    shown = {int(n) for n in re.findall(r"\b(1[0-9])\b", wrong)}
    assert set(COMMAND_HELP["fetch"][1]) - {0, 1, 2} <= shown
