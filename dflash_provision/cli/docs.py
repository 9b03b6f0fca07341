"""The command reference, generated from the click commands themselves: every command's
``--help`` (description, SOURCE / TARGET forms, options, exit codes) as one Markdown page.

    python -m dflash_provision.cli.docs > docs/cli.md        (or: make docs)

``tests/test_cli_docs.py`` fails when docs/cli.md differs from what this prints, so the page
cannot drift from the help. The width is fixed (not the terminal's) so the output is the same on
every machine.
"""

from __future__ import annotations

import click

from dflash_provision.cli.main import COMMANDS, cli

WIDTH = 100
PROG = "dflash-provision"
REGENERATE = "make docs  (python -m dflash_provision.cli.docs > docs/cli.md)"


def _context(command: click.Command, name: str, parent: click.Context | None) -> click.Context:
    # The command's own context settings (-h as well as --help), at a fixed width.
    return click.Context(
        command,
        info_name=name,
        parent=parent,
        terminal_width=WIDTH,
        max_content_width=WIDTH,
        **command.context_settings,
    )


def render() -> str:
    """The whole page, Markdown."""
    root = _context(cli, PROG, None)
    lines = [
        "# Command reference",
        "",
        "<!-- Generated from the click commands: do not edit by hand. Regenerate with",
        f"     {REGENERATE} -->",
        "",
        "Each section is the command's own `--help`. Exit codes are explained in full in the",
        "[docs/exit-codes.md](exit-codes.md).",
        "",
    ]
    lines += [f"- [`{name}`](#{name}): {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", f"## {PROG}", "", "```text", cli.get_help(root), "```", ""]
    for name in COMMANDS:
        command = cli.get_command(root, name)
        if command is None:  # a module not present in this build
            continue
        lines += [
            f"## {name}",
            "",
            "```text",
            command.get_help(_context(command, name, root)),
            "```",
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    click.echo(render(), nl=False)


if __name__ == "__main__":
    main()
