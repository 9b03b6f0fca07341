"""Putting the authoritative bytes on a target and proving them there: push (write, read back,
report), push --all-files and the preparation both share; the target grammar is
dflash_provision.target, the host-side protocol dflash_provision.remote."""
