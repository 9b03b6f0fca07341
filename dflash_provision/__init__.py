"""dflash-provision: make a DFlash drafter's config.json right on every host, and prove it."""

__version__ = "0.1.0"
