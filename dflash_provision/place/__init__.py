"""Putting the authoritative bytes on a target and proving them there: the target grammar
(HOST/KIND:NAME:PATH) and push (write, read back, report); the host-side protocol it runs is
dflash_provision.remote."""
