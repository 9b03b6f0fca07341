"""The demo's terminal: shows each command exactly as a user types it, runs exactly that text in
``sh`` from the directory the demo was started in, and prints the output as an 80-column
terminal would show it without cutting a phrase.

Setup lines (``cd``, ``export``, a shell variable) are printed once and replayed before every
later command, so the printed lines, pasted in order into a shell from the same directory, do
what the demo did. A long change list that was already shown is summarised the second time.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

WIDTH = 80
INDENT = "  "  # output lines are indented under their command
# "path: old → new" (diff, verify, push) and "path: old, authoritative new" (validate --against)
_PATH = r"(?:^\s*|\s\s)(?P<path>[\w.\[\]\"-]+): "
_ARROW = re.compile(_PATH + r"(?P<old>.+) → (?P<new>.+)$")
_AGAINST = re.compile(_PATH + r"(?P<old>.+), authoritative (?P<new>.+)$")
_SUMMARISE_FROM = 4  # a repeated run of at least this many changes is summarised
COMMAND_TIMEOUT_S = 300.0  # one demo command; a real vLLM start-up passes its own


def quote(word: str) -> str:
    """A literal shell word (paths, JSON names); variables are written by the caller."""
    return shlex.quote(word)


@dataclass
class Transcript:
    """Runs shell lines and prints them like a terminal session; remembers surprises."""

    root: Path  # where the demo was started: the repository root for `make demo`
    env: dict[str, str]
    setup: list[str] = field(default_factory=list)
    surprises: list[str] = field(default_factory=list)
    steps: int = 0
    _seen_changes: dict[str, str] = field(default_factory=dict)  # change -> where first shown

    def heading(self, text: str) -> None:
        self.steps += 1
        print(f"\n## {self.steps}. {text}", flush=True)

    def say(self, text: str) -> None:
        """A comment line in the transcript (a shell comment, so pasting it is harmless)."""
        for part in wrap(text, WIDTH - 2):
            print(f"# {part.strip()}", flush=True)

    def set(self, words: Sequence[str]) -> None:
        """A setup line (cd, export, VAR=...): shown once, replayed before every command."""
        line = " ".join(words)
        self.show(words)
        self._sh(line, quiet=True)
        self.setup.append(line)

    def show(self, words: Sequence[str]) -> None:
        for line in command_lines(words):
            print(line, flush=True)

    def run(
        self,
        words: Sequence[str],
        *,
        expect: int = 0,
        timeout: float = COMMAND_TIMEOUT_S,
        in_order: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Show ``words`` as one command line and run exactly that text.

        ``in_order``: stderr as a terminal shows it, between the stdout lines written around it
        (progress lines of a long wait); otherwise after stdout, as one block.
        """
        self.show(words)
        done = self._sh(" ".join(words), timeout=timeout, in_order=in_order)
        self._print_output(done.stdout + (done.stderr or ""), where=f"step {self.steps}")
        print(f"{INDENT}[exit {done.returncode}]", flush=True)
        if done.returncode != expect:
            shown = " ".join(words)
            self.surprises.append(f"{shown}: exit {done.returncode}, expected {expect}")
        return done

    def _sh(
        self,
        line: str,
        *,
        quiet: bool = False,
        timeout: float = COMMAND_TIMEOUT_S,
        in_order: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        script = "\n".join([*self.setup, line])
        done = subprocess.run(
            ["sh", "-c", script],
            env=self.env,
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if in_order else subprocess.PIPE,
            text=True,
            timeout=timeout,
            check=False,
        )
        if quiet and done.returncode != 0:
            self.surprises.append(f"{line}: exit {done.returncode}: {done.stderr.strip()}")
        return done

    def _print_output(self, text: str, *, where: str) -> None:
        if is_json(text):  # `--json`: shown as JSON that still parses (see wrap_json)
            for line in text.rstrip("\n").splitlines():
                for part in wrap_json(INDENT + line, WIDTH):
                    print(part, flush=True)
            return
        for line in self._summarised(text.rstrip("\n").splitlines(), where):
            for part in wrap(INDENT + line, WIDTH):
                print(part, flush=True)

    def _summarised(self, lines: list[str], where: str) -> list[str]:
        """Runs of changes already shown earlier become their first change and one line saying
        so (also inside a table cell, where a change may be wrapped over two lines)."""
        out: list[str] = []
        run: list[tuple[list[str], str, int]] = []  # (raw lines, change key, column)

        def flush() -> None:
            if len(run) >= _SUMMARISE_FROM and all(key in self._seen_changes for _, key, _ in run):
                raw, key, column = run[0]
                out.extend(raw)
                first = self._seen_changes[key]
                out.append(" " * column + f"… and {len(run) - 1} more: the same as in {first}")
            else:
                out.extend(line for raw, _, _ in run for line in raw)
            for _, key, _ in run:
                self._seen_changes.setdefault(key, where)
            run.clear()

        index = 0
        while index < len(lines):
            raw = [lines[index]]
            found = change_at(lines[index])
            follows = lines[index + 1] if index + 1 < len(lines) else ""
            fragment = follows[:1].isspace() and change_at(follows) is None
            if found is None and fragment:  # a change wrapped in a table cell?
                found = change_at(lines[index].rstrip() + " " + follows.strip())
                if found is not None and found[1] < len(lines[index].rstrip()):
                    raw.append(follows)
                else:
                    found = None
            index += len(raw)
            if found is None:
                flush()
                out.extend(raw)
            else:
                run.append((raw, *found))
        flush()
        return out


def change_at(line: str) -> tuple[str, int] | None:
    """(``path: old → new``, its column) for a line that shows one change in either form, at
    its start or after a gap of two spaces (a table cell); else None."""
    for pattern in (_ARROW, _AGAINST):
        found = pattern.search(line)
        if found:
            key = f"{found['path']}: {found['old']} → {found['new']}"
            return key, found.start("path")
    return None


def command_lines(words: Sequence[str]) -> list[str]:
    """``$ words...`` wrapped at word boundaries with `` \\`` continuations, as one pastes them."""
    lines: list[str] = []
    current = "$"
    for word in words:
        if len(current) + 1 + len(word) > WIDTH - 2 and current != "$":
            lines.append(current + " \\")
            current = "   "
        current += " " + word
    lines.append(current)
    return lines


def is_json(text: str) -> bool:
    """The whole output is one JSON document (an object or an array)."""
    import json

    if not text.lstrip().startswith(("{", "[")):
        return False
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def wrap_json(line: str, width: int) -> list[str]:
    """A JSON line too wide for ``width``: broken between a key and its value, which JSON
    allows, never inside a string (a line that still does not fit stays whole)."""
    if len(line) <= width:
        return [line]
    key_end = line.find('": ')
    if key_end < 0 or not line.lstrip().startswith('"'):
        return [line]
    indent = len(line) - len(line.lstrip())
    return [line[: key_end + 2], " " * (indent + 4) + line[key_end + 3 :]]


def wrap(line: str, width: int) -> list[str]:
    """Fit ``line`` in ``width`` columns: break after the last "; " or ", " that leaves a
    reasonable first part, else at the last space; continuation lines are indented under the
    text. A single word wider than the line (a long path, a JSON value, a metric with its
    labels) is broken inside (see _break_in_word) and never shortened: a path or JSON shown is
    the whole of it."""
    indent = len(line) - len(line.lstrip())
    hanging = " " * (indent + 4)
    parts: list[str] = []
    while len(line) > width:
        cut = _break_at(line, width, indent) or _break_in_word(line, width, indent)
        parts.append(line[:cut].rstrip())
        line = hanging + line[cut:].lstrip()
        indent = len(hanging)
    parts.append(line)
    return parts


def _break_at(line: str, width: int, indent: int) -> int | None:
    window = line[: width + 1]
    for mark in ("; ", ", "):
        at = window.rfind(mark, 0, width)
        if at > indent + (width - indent) // 3:
            return at + len(mark)
    at = window.rfind(" ", indent + 1, width + 1)
    return at + 1 if at > indent else None


def _break_in_word(line: str, width: int, indent: int) -> int:
    """Where to break a word wider than the line: after its last "," or "}" (between a JSON
    value's or a metric's labels), else its last "/" (a path), that leaves a reasonable first
    part; else at the width."""
    window = line[:width]
    for marks in ((",", "}"), ("/",)):
        at = max(window.rfind(mark) for mark in marks)
        if at > indent + (width - indent) // 3:
            return at + 1
    return width


def relative_or_absolute(path: Path, base: Path) -> str:
    """``$PWD/rel`` when ``path`` is under ``base`` (what a user types), else the absolute path."""
    try:
        return '"$PWD/' + str(path.resolve().relative_to(base.resolve())) + '"'
    except ValueError:
        return quote(str(path))


def program_on_path(root: Path) -> str | None:
    """The directory holding the ``dflash-provision`` console script, as an export a user types
    (``export PATH="$PWD/.venv/bin:$PATH"``), or None when it is already on PATH."""
    import sys

    bindir = Path(sys.executable).parent
    if not (bindir / "dflash-provision").exists():
        return None
    if any(Path(p) == bindir for p in os.environ.get("PATH", "").split(os.pathsep) if p):
        return None
    where = relative_or_absolute(bindir, root).strip('"')
    return f'PATH="{where}:$PATH"'
