"""Where this controller keeps its state: the history database and the verdict cache.

A module of its own so that finding the directory (``validate`` asks, for the verdict cache)
does not import the history store and sqlite3.
"""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "DFLASH_PROVISION_HOME"


def data_dir() -> Path:
    """``$DFLASH_PROVISION_HOME``, else ``platformdirs.user_data_dir("dflash-provision")``
    (on Linux ``~/.local/share/dflash-provision``); created by whoever writes first."""
    override = os.environ.get(HOME_ENV)
    if override:
        return Path(override).expanduser()
    import platformdirs  # deferred: only commands that keep state need it

    return Path(platformdirs.user_data_dir("dflash-provision"))
