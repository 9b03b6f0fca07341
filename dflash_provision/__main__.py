"""``python -m dflash_provision``. A Ctrl-C while the entry module itself is being imported
ends like any other (the soak sent SIGINTs that landed there on a loaded machine)."""

try:
    from dflash_provision.cli.entry import main
except KeyboardInterrupt:
    import sys

    sys.stderr.write("interrupted\n")
    sys.exit(130)  # errors.ExitCode.INTERRUPTED, not imported here: see cli/entry.py

main()
