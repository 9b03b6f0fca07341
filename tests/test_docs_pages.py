"""Docs a newcomer can skim (issue 31, item 10): what a page names as needed is what the
Makefile does, and a command's section says how to run it, what it prints and what can go
wrong, with its internals and figures on a page of their own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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


# The pages a user reads to run the tool: how to run each command, what it prints, what can go
# wrong. Internals (which module does it, how a stage reads its evidence) and figures (what a
# run costs) live on pages of their own: layout.md, *-internals.md, benchmarks.md, tests.md.
USAGE_PAGES = (
    "commands.md",
    "runtime.md",
    "rollout.md",
    "audit-repair.md",
    "demo.md",
    "exit-codes.md",
    "flags.md",
    "monitoring.md",
)
# The project's own source, by path: what a usage page leaves to layout.md.
_OWN_SOURCE = re.compile(
    r"(dflash_provision/|\b(?:check|cli|fleet|inventory|place|remote|rollout|runtime|source|"
    r"transport)/[\w/]+\.(?:py|sh)\b)"
)
_FIGURES = re.compile(r"median of \d|make bench|measured on this|\d+ s per host|\d-core machine")


def _first_block(page: Path) -> str:
    """The first block after the page's title, HTML comments (the generated page's) skipped."""
    text = re.sub(r"<!--.*?-->", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    title, _, rest = text.partition("\n")
    assert title.startswith("# "), f"{page.name}: no title"
    return re.split(r"\n\s*\n", rest.strip(), maxsplit=1)[0]


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_each_docs_page_starts_with_what_it_is_for(page: str) -> None:
    first = _first_block(DOCS / page)
    # A paragraph of prose: not a heading, a code block, a table or a list.
    assert not first.lstrip().startswith(("#", "```", "|", "- ", "    ")), (page, first[:80])
    assert len(first.split()) >= 8, (page, first)


@pytest.mark.parametrize("page", USAGE_PAGES)
def test_usage_pages_keep_internals_and_figures_on_their_own_pages(page: str) -> None:
    text = (DOCS / page).read_text(encoding="utf-8")
    assert not _OWN_SOURCE.findall(text), (page, _OWN_SOURCE.findall(text))
    assert not _FIGURES.findall(text), (page, _FIGURES.findall(text))


def test_runtime_md_is_usage_and_links_its_internals() -> None:
    runtime = (DOCS / "runtime.md").read_text(encoding="utf-8")
    check = section(DOCS / "runtime.md", "Runtime: runtime-check and doctor")
    for part in ("**What it checks**", "**What it prints**", "**What can go wrong**"):
        assert part in check
    for internal in ("How stage c reads the server", "## What each stage can tell", "curve"):
        assert internal not in runtime, internal
    assert "](runtime-internals.md)" in runtime
    internals = (DOCS / "runtime-internals.md").read_text(encoding="utf-8")
    assert (
        "How stage c reads the server" in internals and "## What each stage can tell" in internals
    )
    # No paragraph of the usage page is a wall (a list's items are not one paragraph).
    assert max(_paragraph_lengths(runtime)) <= 20


def _paragraph_lengths(text: str) -> list[int]:
    """Each prose paragraph's lines, up to the first list item in it."""
    lengths = []
    for block in re.split(r"\n\s*\n", text):
        if block.lstrip().startswith(("```", "|", "- ", "    ")):
            continue
        lines = block.strip().splitlines()
        item = next((i for i, line in enumerate(lines) if re.match(r"(\d+\.|-) ", line)), None)
        lengths.append(len(lines[:item]))
    return lengths
