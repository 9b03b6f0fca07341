"""The README is a front page and docs/ holds the rest (issue 19, item 4): every relative link in
README.md and docs/*.md must lead somewhere, to a file that exists and, for `#anchor`, to a
heading of that file as GitHub names it. A page moved or a heading renamed fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# [text](target) and [text](target "title"); images too. Autolinks and bare URLs are not relative.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a `[x](y)` inside a code sample is not a link)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def strip_code_spans(line: str) -> str:
    return re.sub(r"`[^`]*`", "", line)


def github_anchor(heading: str) -> str:
    """GitHub's rule: lowercase, drop punctuation except `-` and `_`, spaces become `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(page: Path) -> set[str]:
    """Every heading's anchor, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in prose_lines(page.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = github_anchor(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        anchors.add(base if count == 0 else f"{base}-{count}")
    return anchors


def relative_links(page: Path) -> list[str]:
    links = []
    for line in prose_lines(page.read_text(encoding="utf-8")):
        for target in LINK.findall(strip_code_spans(line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I):  # http:, mailto: ...
                links.append(target)
    return links


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors_of(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_readme_links_every_docs_page() -> None:
    linked = {
        (ROOT / target.partition("#")[0]).resolve() for target in relative_links(ROOT / "README.md")
    }
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert missing == []


def test_the_readme_stays_a_front_page() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 250


def test_a_broken_link_and_a_wrong_anchor_are_caught(tmp_path: Path) -> None:
    # The checker itself: two good links, a missing file, a missing heading, code ignored.
    other = "# Exit codes: what they mean\n\n## Stress runs: `make stress`\n"
    (tmp_path / "other.md").write_text(other)
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#exit-codes-what-they-mean) [ok](other.md#stress-runs-make-stress)\n"
        "[gone](missing.md) [bad](other.md#exit-codes)\n"
        "```\n[in code](nowhere.md)\n```\n`[in a span](nowhere.md)` [web](https://example.com/x)\n"
    )
    assert broken_links(page) == [
        f"missing.md: no file {tmp_path / 'missing.md'}",
        "other.md#exit-codes: no heading #exit-codes in other.md",
    ]
