"""The history as lines that fit the width, as ``git log --oneline`` or ``journalctl`` print.

No cell is ever cut: a record's time, op, host and status are always whole. The message is
last, in its column (wrapped there) when it has room to be read, else under its row, indented and
wrapped to the width (journalctl's continuation lines). When even the other columns do not fit,
the less needed parts go first, in this order: the login (``who``), the hashes' length (12
characters, then 7: git's short form), the year, the hashes, "started (incomplete)" said as
"incomplete"; a host name still too long then starts the lines under its row.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dflash_provision.history.store import HistoryEntry

GAP = "  "
MESSAGE_MIN = 40  # a message column narrower than this: the message goes under its row
INCOMPLETE = "started (incomplete)"
_GOOD = frozenset({"ok", "in_sync", "written", "unchanged", "passed", "dry-run", "repaired"})

Paint = Callable[[str, str], str]  # (text, colour) -> text as shown


def plain(text: str, colour: str) -> str:
    return text


@dataclass(frozen=True)
class _Layout:
    who: bool
    sha_chars: int  # 0: no hash column
    year: bool
    short_incomplete: bool = False  # "incomplete" for "started (incomplete)"
    host_below: bool = False  # the host starts the lines under the row (a host too long)


# Tried in this order: the first whose row fits is used.
_LAYOUTS = (
    _Layout(who=True, sha_chars=12, year=True),
    _Layout(who=False, sha_chars=12, year=True),
    _Layout(who=False, sha_chars=7, year=True),
    _Layout(who=False, sha_chars=7, year=False),
    _Layout(who=False, sha_chars=0, year=False),
    _Layout(who=False, sha_chars=0, year=False, short_incomplete=True),
    _Layout(who=False, sha_chars=0, year=False, short_incomplete=True, host_below=True),
)


def status_colour(entry: HistoryEntry) -> str:
    if entry.incomplete:
        return "yellow"
    return "green" if entry.status in _GOOD else "red"


def history_lines(entries: Sequence[HistoryEntry], width: int, paint: Paint = plain) -> list[str]:
    """The table's lines for ``width`` columns (header first)."""
    longest = max((len(_message(e)) for e in entries), default=0)
    room = min(longest, MESSAGE_MIN)  # a short message needs only its own length
    for layout in _LAYOUTS:
        columns = _columns(entries, layout)
        if _fixed(columns) + room <= width:  # the message in its column, room to be read
            return _render(entries, columns, width, paint, inline=True)
        if _fixed(columns) - len(GAP) <= width:  # the message under its row
            return _render(entries, columns, width, paint, inline=False)
    return _render(entries, _columns(entries, _LAYOUTS[-1]), width, paint, inline=False)


def _message(entry: HistoryEntry) -> str:
    return " ".join(entry.message.split())


def _fixed(columns: list[tuple[str, int, list[str]]]) -> int:
    """The width of the columns before the message, with the gap after each."""
    return sum(w for _, w, _ in columns) + len(GAP) * len(columns)


def _cells(entry: HistoryEntry, layout: _Layout) -> dict[str, str]:
    when = entry.started_at[:19].replace("T", " ")
    cells = {"when": when if layout.year else when[5:]}
    if layout.who:
        cells["who"] = entry.who
    cells["op"] = entry.op
    if not layout.host_below:
        cells["host"] = entry.host
    incomplete = "incomplete" if layout.short_incomplete else INCOMPLETE
    cells["status"] = incomplete if entry.incomplete else entry.status
    if layout.sha_chars:
        n = layout.sha_chars
        cells["sha"] = f"{(entry.sha256_before or '-')[:n]} → {(entry.sha256_after or '-')[:n]}"
    return cells


def _headers(layout: _Layout) -> dict[str, str]:
    sha = "sha256 before → after" if layout.sha_chars == 12 else "sha256 old → new"
    return {
        "when": "when (UTC)",
        "who": "who",
        "op": "op",
        "host": "host",
        "status": "status",
        "sha": sha,
    }


def _columns(entries: Sequence[HistoryEntry], layout: _Layout) -> list[tuple[str, int, list[str]]]:
    """(header, width, cells) per column, in order."""
    headers = _headers(layout)
    rows = [_cells(e, layout) for e in entries]
    names = list(rows[0]) if rows else ["when", "op", "host", "status"]
    return [
        (
            headers[name],
            max(len(headers[name]), *(len(r[name]) for r in rows)),
            [r[name] for r in rows],
        )
        for name in names
    ]


def _render(
    entries: Sequence[HistoryEntry],
    columns: list[tuple[str, int, list[str]]],
    width: int,
    paint: Paint,
    *,
    inline: bool,
) -> list[str]:
    message_width = width - _fixed(columns)
    host_below = "host" not in [header for header, _, _ in columns]
    status_at = [header for header, _, _ in columns].index("status")
    header = GAP.join(h.ljust(w) for h, w, _ in columns)
    lines = [(header + GAP + "message") if inline else header.rstrip()]
    indent = " " * _fixed(columns)
    for i, entry in enumerate(entries):
        parts = []
        for k, (_, w, cells) in enumerate(columns):
            text = cells[i]
            if k == status_at:  # the colour on the word only, the padding outside it
                text = paint(text, status_colour(entry)) + " " * (w - len(text))
            parts.append(text.ljust(w))
        row = GAP.join(parts)
        message = _message(entry)
        if host_below:
            message = f"{entry.host}: {message}" if message else entry.host
        if not message:
            lines.append(row.rstrip())
        elif inline:
            wrapped = textwrap.wrap(message, max(message_width, 1), break_on_hyphens=False)
            lines.append(row + GAP + wrapped[0])
            lines.extend(indent + more for more in wrapped[1:])
        else:
            lines.append(row.rstrip())
            room = max(width - 4, 20)
            wrapped = textwrap.wrap(message, room, break_on_hyphens=False)
            lines.extend("    " + part for part in wrapped)
    return lines
