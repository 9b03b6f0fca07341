"""Stage d's evidence: an empty completion text is explained, not left for a reader to take for
a failure (the demo's tiny synthetic target serves only <|endoftext|>, which decodes to "").
Unit level: stage d judges a Completion; the real-vLLM demo (tests/test_vllm_real.py) shows it
on a real server."""

from __future__ import annotations

import json

from dflash_provision.source.authority import Authority
from dflash_provision.target import parse_target
from dflash_provision.verify.stage_traffic import Completion, stage_completion
from dflash_provision.verify.stages import CheckContext
from tests.fixtures.runtime import DRAFTER_DIR, REFERENCE


def _ctx() -> CheckContext:
    return CheckContext(
        transport=None,  # type: ignore[arg-type]  # stage d's verdict runs no command
        target=parse_target(f"gpu1:{DRAFTER_DIR}"),
        authority=Authority("test", REFERENCE),
        auth_doc=json.loads(REFERENCE),
        push_fix="dflash-provision push",
    )


def test_an_empty_completion_text_is_explained_in_the_evidence() -> None:
    stage = stage_completion(_ctx(), Completion(True, tokens=8, text=""), [])
    assert stage.passed and stage.summary == "completion of 8 tokens returned"
    assert stage.evidence[0] == "text: ''"
    assert (
        "an empty text is expected from a synthetic model: its 8 tokens decode to nothing"
        in (stage.evidence[1])
    )


def test_a_text_is_shown_without_the_explanation() -> None:
    stage = stage_completion(_ctx(), Completion(True, tokens=2, text=" Paris."), [])
    assert stage.passed and stage.evidence == ["text: ' Paris.'"]
