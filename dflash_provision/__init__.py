"""dflash-provision: make a DFlash drafter's config.json exactly right on every host, and prove it."""

__version__ = "0.1.0"
