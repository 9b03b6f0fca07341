"""Paths to the bundled sample configs (see data/README.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).parent / "data"

REFERENCE_DRAFTER = DATA_DIR / "qwen3.6-27b-dflash.config.json"
INCIDENT_DRAFTER = DATA_DIR / "incident-wrong.config.json"
REFERENCE_TARGET = DATA_DIR / "qwen3.6-27b-target.config.json"
QWEN3_8B_DRAFTER = DATA_DIR / "qwen3-8b-dflash-b16.config.json"
QWEN36_35B_A3B_DRAFTER = DATA_DIR / "qwen3.6-35b-a3b-dflash.config.json"
DFLASH2_DRAFTER = DATA_DIR / "qwen3.8-27b-dflash2.config.json"
# The reference drafter in the speculators library's layout (vLLM serves it from its directory).
SPECULATORS_DRAFTER = DATA_DIR / "qwen3.6-27b-speculators-dflash.config.json"

REFERENCE_REPO = "z-lab/Qwen3.6-27B-DFlash"
REFERENCE_TARGET_REPO = "Qwen/Qwen3.6-27B"


def load_json(path: Path) -> dict[str, Any]:
    """A sample config, parsed."""
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data
