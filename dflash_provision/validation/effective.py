"""The "effective" layer: what transformers actually loads from the file.

A runtime never sees config.json; it sees ``AutoConfig.from_pretrained(dir)``. Qwen3Config quietly
rewrites fields: ``sliding_window`` becomes None when ``use_sliding_window`` is false, an absent
``layer_types`` is rebuilt from ``max_window_layers``, ``rope_theta`` moves into
``rope_parameters`` (and ``rope_scaling`` replaces ``rope_parameters`` wholesale), absent fields
take class defaults. Every critical field the loader changes or drops is an error naming the fix.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import warnings
from functools import cache
from pathlib import Path
from typing import Any

from dflash_provision.validation.findings import Finding
from dflash_provision.validation.speculators_layout import (
    LAYER_CONFIG,
    is_speculators,
    layer_config,
)

# Plain fields compared value for value; rope is compared by meaning in _check_rope.
CRITICAL_FIELDS = (
    "sliding_window",
    "use_sliding_window",
    "layer_types",
    "max_window_layers",
    "num_hidden_layers",
    "hidden_size",
    "vocab_size",
    "head_dim",
    "dflash_config",
    "block_size",
    "num_target_layers",
    "is_causal",
)
# Absent from the file but given a value by the loader: harmful only for these.
_DEFAULT_MATTERS = ("sliding_window", "num_hidden_layers", "hidden_size", "vocab_size", "head_dim")
_MISSING = object()
_MAX_MESSAGE = 300


def _show(value: Any) -> str:
    return "absent" if value is _MISSING else json.dumps(value, default=str)


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 1] + "…"


# Two threads importing transformers at once can see a half-initialised module ("module
# 'transformers' has no attribute 'AutoConfig'"), and functools.cache does not stop the second
# caller from running the body concurrently: serialise the first call.
_IMPORT_LOCK = threading.Lock()


def _auto_config() -> Any:
    """Import transformers once per process (thread-safe), with its chatter off."""
    with _IMPORT_LOCK:
        return _import_auto_config()


@cache
def _import_auto_config() -> Any:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import transformers

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return transformers.AutoConfig


def load_effective(doc: dict[str, Any]) -> tuple[Any | None, str | None]:
    """Load ``doc`` the way a runtime does. Returns (config, None) or (None, one-line error)."""
    auto_config = _auto_config()
    with tempfile.TemporaryDirectory(prefix="dflash-effective-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(doc), encoding="utf-8")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # rope_scaling FutureWarning and friends
                config = auto_config.from_pretrained(tmp, trust_remote_code=False)
        except Exception as exc:  # any loader failure is the finding, whatever its type
            message = str(exc).replace(tmp, "<dir>")
            return None, _one_line(f"{type(exc).__name__}: {message}")
    return config, None


def check_effective(doc: dict[str, Any]) -> list[Finding]:
    """Compare the raw file's critical fields with what transformers loads."""
    if is_speculators(doc):
        return check_effective_speculators(doc)
    config, error = load_effective(doc)
    if config is None:
        return [
            Finding(
                "effective",
                "",
                f"transformers cannot load this config (runtimes will refuse it): {error}",
            )
        ]
    findings: list[Finding] = []
    for name in CRITICAL_FIELDS:
        finding = _compare_field(doc, config, name)
        if finding is not None:
            findings.append(finding)
    findings += _check_rope(doc, config)
    if not any(f.path == "sliding_window" for f in findings):
        findings += _check_coherence(config)
    return findings


def _loaded(config: Any, name: str) -> Any:
    value = getattr(config, name, _MISSING)
    # Round-trip through JSON so tuples/ints compare the way the file's values do.
    return value if value is _MISSING else json.loads(json.dumps(value, default=str))


def _compare_field(doc: dict[str, Any], config: Any, name: str) -> Finding | None:
    raw = doc.get(name, _MISSING)
    loaded = _loaded(config, name)
    if raw is _MISSING:
        if name == "layer_types" and loaded is not _MISSING:
            return _layer_types_rebuilt(doc, loaded)
        if name in _DEFAULT_MATTERS and loaded not in (_MISSING, None):
            return Finding(
                "effective",
                name,
                f"{name} is absent; transformers uses its default {_show(loaded)}: write "
                f"{name} explicitly",
            )
        return None
    if _same(raw, loaded):
        return None
    if loaded is _MISSING:
        return Finding(
            "effective",
            name,
            f"{name}: file {_show(raw)}, transformers drops it (loaded config has no {name}); "
            "runtimes will not see it",
        )
    if name == "sliding_window" and doc.get("use_sliding_window") is not True:
        sliding = _sliding_indexes(doc.get("layer_types"))
        why = f" while layer_types has sliding_attention at {sliding}" if sliding else ""
        return Finding(
            "effective",
            name,
            f"sliding_window: file {_show(raw)}, transformers loads {_show(loaded)} because "
            f"use_sliding_window is {_show(doc.get('use_sliding_window', _MISSING))}{why}; "
            "set use_sliding_window: true",
        )
    return Finding(
        "effective",
        name,
        f"{name}: file {_show(raw)}, transformers loads {_show(loaded)}; write a value the "
        "loader keeps",
    )


def _layer_types_rebuilt(doc: dict[str, Any], loaded: list[Any]) -> Finding:
    window_layers = doc.get("max_window_layers", _MISSING)
    source = (
        f"max_window_layers {_show(window_layers)}"
        if window_layers is not _MISSING
        else "the default max_window_layers"
    )
    return Finding(
        "effective",
        "layer_types",
        f"layer_types is absent; transformers rebuilds it from {source} and "
        f"use_sliding_window as {_show(loaded)}: write layer_types explicitly",
    )


def _sliding_indexes(layer_types: Any) -> list[int]:
    if not isinstance(layer_types, list):
        return []
    return [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]


def _same(raw: Any, loaded: Any) -> bool:
    # Type-strict: the loader turning 2048 into 2048.0 (or True into 1) is a change too.
    return json.dumps(raw, sort_keys=True) == json.dumps(loaded, sort_keys=True)


def _check_coherence(config: Any) -> list[Finding]:
    """The loaded config itself must not have sliding layers without a window."""
    sliding = _sliding_indexes(_loaded(config, "layer_types"))
    if sliding and _loaded(config, "sliding_window") in (None, _MISSING):
        return [
            Finding(
                "effective",
                "sliding_window",
                f"transformers loads sliding_attention at layers {sliding} with sliding_window "
                "null; set sliding_window to the trained window and use_sliding_window: true",
            )
        ]
    return []


def _loaded_rope(config: Any) -> dict[str, Any]:
    """The loaded rope settings as one dict (transformers 5 ``rope_parameters``, or 4's split)."""
    params = _loaded(config, "rope_parameters")
    if isinstance(params, dict):
        return params
    merged: dict[str, Any] = {}
    scaling = _loaded(config, "rope_scaling")
    if isinstance(scaling, dict):
        merged.update(scaling)
    theta = _loaded(config, "rope_theta")
    if theta is not _MISSING:
        merged["rope_theta"] = theta
    return merged


def _check_rope(doc: dict[str, Any], config: Any) -> list[Finding]:
    """Compare rope by meaning: wherever the file puts a value, the loader must use it."""
    loaded = _loaded_rope(config)
    findings = []
    sources: list[tuple[str, dict[str, Any]]] = []
    if "rope_theta" in doc:
        sources.append(("rope_theta", {"rope_theta": doc["rope_theta"]}))
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(doc.get(key), dict):
            sources.append((key, doc[key]))
    for prefix, values in sources:
        for name, raw in values.items():
            loaded_name = "rope_type" if name == "type" else name
            got = loaded.get(loaded_name, _MISSING)
            # Numbers by value: 10000000 and 1e7 are the same theta; the loader may emit either.
            same = raw == got if _is_number(raw) and _is_number(got) else _same(raw, got)
            if not same:
                path = prefix if prefix == "rope_theta" else f"{prefix}.{name}"
                findings.append(
                    Finding(
                        "effective",
                        path,
                        f"{path}: file {_show(raw)}, transformers uses {loaded_name} "
                        f"{_show(got)}; keep rope settings in one place (rope_parameters, or "
                        "rope_theta with rope_scaling) so they agree",
                    )
                )
    if not any("rope_theta" in values for _, values in sources) and "rope_theta" in loaded:
        findings.append(
            Finding(
                "effective",
                "rope_theta",
                f"rope_theta is absent; transformers uses its default "
                f"{_show(loaded['rope_theta'])}: write the trained rope_theta explicitly",
            )
        )
    return findings


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_effective_speculators(doc: dict[str, Any]) -> list[Finding]:
    """The effective layer for the speculators layout.

    transformers' AutoConfig cannot load this layout without remote code (``auto_map`` names the
    speculators library's DFlashSpeculatorConfig; runtimes never run remote code for it). What a
    runtime sees is vLLM's conversion (speculators_layout.runtime_view), which keeps
    ``transformer_layer_config`` as written but replaces a ``dflash_config`` inside it: that loss
    is an error. The speculators library itself builds a transformers config from
    ``transformer_layer_config`` (Qwen3Config unless it names another model_type); what that
    loader changes is reported as warnings, since vLLM does not go through it.
    """
    findings: list[Finding] = []
    tlc = layer_config(doc)
    inner = tlc.get("dflash_config")
    if inner is not None:
        keys = sorted(inner) if isinstance(inner, dict) else []
        findings.append(
            Finding(
                "effective",
                f"{LAYER_CONFIG}.dflash_config",
                f"{LAYER_CONFIG}.dflash_config {_show(keys)}: vLLM's speculators conversion "
                "replaces it with one built from the top-level fields (aux_hidden_state_layer_ids, "
                "mask_token_id, sample_from_anchor, sliding_window_non_causal): these keys are "
                "lost",
            )
        )
    loadable = dict(tlc)
    loadable.setdefault("model_type", "qwen3")  # the speculators library's default class
    config, error = load_effective(loadable)
    if config is None:
        message = f"transformers cannot build {LAYER_CONFIG} ({error})"
        return [*findings, Finding("effective", LAYER_CONFIG, message, "warning")]
    found = [_compare_field(tlc, config, name) for name in CRITICAL_FIELDS]
    found += _check_rope(tlc, config)
    for finding in found:
        if finding is not None and finding.path not in ("dflash_config", "block_size"):
            findings.append(
                Finding(
                    "effective",
                    f"{LAYER_CONFIG}.{finding.path}",
                    f"{LAYER_CONFIG} as the speculators library loads it: {finding.message}",
                    "warning",
                )
            )
    return findings
