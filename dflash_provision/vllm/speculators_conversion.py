"""What the target's vLLM carries of a speculators-layout drafter's conversion, for stage b.

:func:`~dflash_provision.validation.speculators_layout.runtime_view` converts the authoritative
config as the newest vLLM does. Older releases' conversion (``update_dflash`` in
``vllm/transformers_utils/configs/speculators/algos.py``) writes fewer ``dflash_config`` keys:
no ``causal`` before 0.26 (0.20.1-0.25.1 write ``mask_token_id`` and ``target_layer_ids``
only), no ``sample_from_anchor`` before 0.27 (both from 0.28.0 on). Such a key reaches vLLM's
DFlash code absent. Whether that code reads it is the probe's feature detection
(``conversion_reads``: the keys its DFlash modules look up in ``dflash_config``; 0.24.0 reads
``causal`` with ``.get("causal", False)``, 0.20.1 reads neither):

- read: vLLM runs with the key's default, which is what is compared with the authoritative
  value (a drafter that needs ``causal: true`` there is still a finding);
- not read: the key means nothing to that vLLM, and is not compared;
- not known (an older probe, or no DFlash source found): compared as written, as before.

0.20.1's conversion also writes ``target_layer_ids`` as the aux ids themselves (no - 1, unlike
0.24+), beside ``eagle_aux_hidden_state_layer_ids`` = the same ids, which is what its runner
taps (``_get_eagle3_aux_layers_from_config`` reads the eagle ids first; its DFlash model reads
only the length of ``target_layer_ids``). Such a conversion is not a finding: which layers a
vLLM taps is judged from its runners' own answer (features.judge_aux).
"""

from __future__ import annotations

import json
from typing import Any

#: The defaults vLLM's DFlash code reads these keys with where the conversion left them out
#: (``dflash_config.get("causal", False)``; ``sample_from_anchor`` defaults to False in every
#: release that has it).
READ_DEFAULTS: dict[str, object] = {"causal": False, "sample_from_anchor": False}


def _inner(doc: dict[str, Any]) -> dict[str, Any] | None:
    value = doc.get("dflash_config")
    return dict(value) if isinstance(value, dict) else None


def settle_unwritten(
    wanted: dict[str, Any],
    got: dict[str, Any],
    reads: object,
    *,
    aux: tuple[object, object] = (None, None),
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(wanted, got, notes): the authoritative conversion ``wanted`` and vLLM's ``got`` with
    the dflash_config keys vLLM's conversion does not write (or writes raw) settled as that vLLM
    sees them (module docstring); ``reads``: the probe's ``conversion_reads``; ``aux``: the
    ``eagle_aux_hidden_state_layer_ids`` of both. ``notes`` say what was settled."""
    want, have = _inner(wanted), _inner(got)
    if want is None or have is None:
        return wanted, got, []
    notes: list[str] = []
    # Not a list: which keys vLLM reads is not known, and they are compared as written.
    read: list[Any] = reads if isinstance(reads, list) else []
    for key, default in READ_DEFAULTS.items() if isinstance(reads, list) else ():
        if key not in want or key in have:
            continue
        if key in read:
            have[key] = default
            notes.append(
                f"vLLM's speculators conversion does not write dflash_config.{key}; its DFlash "
                f"code reads it as {json.dumps(default)} (its default)"
            )
        else:
            del want[key]
            notes.append(
                f"vLLM's speculators conversion does not write dflash_config.{key} and its "
                "DFlash code does not read it: not compared"
            )
    ids = want.get("target_layer_ids")
    if (
        isinstance(ids, list)
        and all(isinstance(i, int) for i in ids)
        and have.get("target_layer_ids") == [i + 1 for i in ids] == aux[0] == aux[1]
    ):
        have["target_layer_ids"] = ids
        notes.append(
            "vLLM's speculators conversion writes target_layer_ids as the aux ids (no - 1) "
            "beside eagle_aux_hidden_state_layer_ids, which its runners tap: judged from "
            "their aux ids"
        )
    return {**wanted, "dflash_config": want}, {**got, "dflash_config": have}, notes
