"""Step 1, config: ``Include`` in ssh_config, which paramiko's parser does not know (it keeps it
as an unknown key, so hosts defined in ``~/.ssh/config.d/*`` would silently not exist).

The includes are expanded into one text before paramiko parses it, with OpenSSH's rules: each
argument is a glob (``~`` expanded; a relative path is under ``~/.ssh``, as for any user config);
files are read in sorted order; a pattern matching nothing is no error; nesting stops at 16
levels. An Include inside a ``Host``/``Match`` block is conditional on that block, and after the
included text the enclosing block resumes: its header line is repeated (``Host *`` at the top
level), so lines after the Include are not captured by the last block of the included file. A
file included inside a block may not open blocks of its own (OpenSSH would apply them only where
the enclosing block applies, which one flat text cannot say): that is a usage error.
"""

from __future__ import annotations

import glob
import os
import re
import shlex

from dflash_provision.errors import UsageError

MAX_DEPTH = 16  # as OpenSSH's READCONF_MAX_DEPTH
_KEYWORD = re.compile(r"\s*(\w+)(?:\s*=\s*|\s+)(.*)")


def expand_includes(path: str) -> tuple[str, tuple[str, ...]]:
    """The text of ``path`` with every Include replaced by the files it names, and every file
    that was read (``path`` first)."""
    files: list[str] = []
    text = _expand(path, 0, files, None)
    return text, tuple(files)


def included_files(path: str) -> tuple[str, ...]:
    """Every file the config at ``path`` reads, itself first (what its cache depends on).

    Runs before every connection: a config without the word "include" is not scanned line by
    line (a fleet's config may hold a block per host).
    """
    try:
        with open(path, "rb") as handle:
            if b"include" not in handle.read().lower():
                return (path,)
        return expand_includes(path)[1]
    except (OSError, UsageError):
        return (path,)  # the parse that follows reports the problem


def _expand(path: str, depth: int, files: list[str], enclosing: str | None) -> str:
    """``enclosing``: the Host/Match line of the block the Include of ``path`` sits in (None at
    the top level): the lines of ``path`` before its own first Host/Match belong to it."""
    if depth > MAX_DEPTH:
        raise UsageError(f"ssh config {path}: Include nested more than {MAX_DEPTH} deep")
    with open(path, encoding="utf-8", errors="replace") as handle:
        lines = handle.read().splitlines()
    files.append(path)
    out: list[str] = []
    header = enclosing  # the Host/Match line whose block we are in
    for line in lines:
        match = _KEYWORD.match(line)
        keyword = match.group(1).lower() if match else ""
        if match is not None and keyword in ("host", "match"):
            if enclosing is not None:
                # OpenSSH applies such a block only where the enclosing one applies too (an AND
                # that one flat text cannot say): refuse rather than widen it.
                raise UsageError(
                    f"ssh config {path}: has its own {match.group(1)} block but"
                    f" is included inside {enclosing.strip()!r}; include it at the top level"
                )
            header = line
        if keyword != "include":
            out.append(line)
            continue
        assert match is not None
        try:
            patterns = shlex.split(match.group(2), comments=True)
        except ValueError as exc:
            raise UsageError(f"ssh config {path}: bad Include line {line!r}: {exc}") from None
        for pattern in patterns:
            for included in sorted(glob.glob(_absolute(pattern))):
                if os.path.isfile(included):
                    out.append(_expand(included, depth + 1, files, header))
        out.append(header if header is not None else "Host *")
    return "\n".join(out)


def _absolute(pattern: str) -> str:
    expanded = os.path.expanduser(pattern)
    return (
        expanded
        if os.path.isabs(expanded)
        else os.path.join(os.path.expanduser("~/.ssh"), expanded)
    )
