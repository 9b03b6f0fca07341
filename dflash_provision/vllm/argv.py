"""The speculative config of a ``vllm serve`` command line, read with vLLM's own rules.

vLLM 0.32's ``FlexibleArgumentParser.parse_args`` (vllm/utils/argparse_utils.py), then
argparse and ``EngineArgs.create_speculative_config`` (vllm/engine/arg_utils.py):

- in an option's name (between ``--`` and the first ``.`` or ``=``) ``_`` means ``-``;
- ``--opt value`` and ``--opt=value``; ``-sc`` is ``--speculative-config``; argparse takes a
  unique prefix of a long option (``--speculative``);
- a repeated option: the LAST one wins (argparse's store action);
- dotted forms (``--speculative-config.method dflash``) are merged into one JSON object that is
  appended AFTER all other arguments, so they replace any plain ``--speculative-config``;
- ``--spec-method``, ``--spec-model`` and ``--spec-tokens`` add their key (vLLM refuses to start
  when the JSON has the same key);
- the JSON's keys may use ``-`` for ``_``;
- ``--config FILE`` (YAML) is read by the server, not by us: its options come BEFORE the command
  line's, so a speculative config on the command line still wins, but without one the file may
  hold it and this module cannot tell (``unknown`` says so).

Pure functions over the argv the target's /proc shows; nothing is evaluated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

SPEC_OPTION = "--speculative-config"
_SHORT = "-sc"
# Long options of `vllm serve` 0.32 that start with "--spec" (for argparse's prefix matching).
_SPEC_LONG = ("--speculative-config", "--spec-method", "--spec-model", "--spec-tokens")
_OTHER_SPEC_PREFIXED = ("--specialize-active-lora",)
_SPEC_KEYS = {
    "--spec-method": "method",
    "--spec-model": "model",
    "--spec-tokens": "num_speculative_tokens",
}


@dataclass(frozen=True)
class ArgvSpec:
    """What vLLM makes of a command line's speculative options."""

    config: dict[str, Any] | None  # the effective JSON object (None: none, or unreadable)
    given: list[str] = field(default_factory=list)  # each speculative option as written
    problems: list[str] = field(default_factory=list)  # what would make vLLM refuse or differ
    unknown: str | None = None  # why the effective config cannot be known from argv alone

    @property
    def repeated(self) -> bool:
        return sum(1 for g in self.given if _is_plain(g)) > 1


def _is_plain(given: str) -> bool:
    """A plain (not dotted, not --spec-*) speculative-config option, as written."""
    name = canonical(given.split(" ", 1)[0]).split("=", 1)[0]
    return "." not in name and _expand(name) == SPEC_OPTION


def canonical(arg: str) -> str:
    """An option's name as vLLM sees it: ``_`` → ``-`` before the first ``.`` or ``=``."""
    if not arg.startswith("--"):
        return arg
    name, eq, value = arg.partition("=")
    head, dot, tail = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail + eq + value


def _expand(name: str) -> str | None:
    """argparse's match of a long option name among the speculative ones (exact, or a unique
    prefix of all of serve's --spec* options), else None."""
    if name == _SHORT or name in _SPEC_LONG:
        return SPEC_OPTION if name == _SHORT else name
    if not name.startswith("--spe"):
        return None
    hits = [opt for opt in _SPEC_LONG + _OTHER_SPEC_PREFIXED if opt.startswith(name)]
    return hits[0] if len(hits) == 1 and hits[0] in _SPEC_LONG else None


def serve_args(argv: list[str]) -> list[str]:
    """The arguments after the ``serve`` word (the whole argv when there is none), up to ``--``."""
    args = list(argv)
    if "serve" in args:
        args = args[args.index("serve") + 1 :]
    if "--" in args:
        args = args[: args.index("--")]
    return args


def read_speculative(argv: list[str]) -> ArgvSpec:
    """The speculative config ``vllm serve`` would run with (see the module docstring)."""
    raw = serve_args(argv)
    args = [canonical(a) for a in raw]
    given: list[str] = []  # as written (evidence), not as canonicalised
    plain: str | None = None
    dotted: dict[str, Any] = {}
    extra: dict[str, str] = {}
    has_config_file = False
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        head, dot, path = name.partition(".")
        option = _expand(head) if head.startswith("-") else None
        takes = not eq and i + 1 < len(args)
        if head == "--config" and not dot:
            has_config_file = True
        if option is None:
            i += 1
            continue
        if not eq and not takes:
            given.append(raw[i])
            break  # argparse: "expected one argument": vLLM would not start
        text = value if eq else args[i + 1]
        given.append(raw[i] if eq else f"{raw[i]} {text}")
        if dot and option == SPEC_OPTION:
            _merge(dotted, path.split("."), _dotted_value(text))
        elif option == SPEC_OPTION:
            plain = text
        else:
            extra[_SPEC_KEYS[option]] = text
        i += 1 if eq else 2
    return _resolve(plain, dotted, extra, given, has_config_file)


def _resolve(
    plain: str | None,
    dotted: dict[str, Any],
    extra: dict[str, str],
    given: list[str],
    has_config_file: bool,
) -> ArgvSpec:
    problems: list[str] = []
    config: dict[str, Any] | None = None
    if dotted:  # appended after everything: it replaces a plain --speculative-config
        config = dotted
    elif plain is not None:
        try:
            parsed = json.loads(plain)
        except ValueError:
            problems.append(f"{SPEC_OPTION} is not JSON: {plain[:200]!r}")
            parsed = None
        if parsed is not None and not isinstance(parsed, dict):
            problems.append(f"{SPEC_OPTION} is not a JSON object: {plain[:200]!r}")
        config = parsed if isinstance(parsed, dict) else None
    if extra:
        config = dict(config or {})
        for key, text in extra.items():
            if key in {k.replace("-", "_") for k in config}:
                problems.append(f"--spec-* and {SPEC_OPTION}['{key}'] both given: vLLM refuses")
            config[key] = _typed(key, text)
    if config is not None:
        config = {str(k).replace("-", "_"): v for k, v in config.items()}
    unknown = None
    if has_config_file and config is None:
        unknown = (
            "the command line has --config FILE and no speculative option: the server may take "
            "its speculative config from that file, which this check does not read"
        )
    return ArgvSpec(config, given, problems, unknown)


def _dotted_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _typed(key: str, text: str) -> Any:
    if key == "num_speculative_tokens":
        try:
            return int(text)
        except ValueError:
            return text
    return text


def _merge(into: dict[str, Any], keys: list[str], value: Any) -> None:
    """vLLM's recursive_dict_update of one dotted option (the later value wins)."""
    node = into
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[keys[-1]] = value


# -- settings that hide what the server would otherwise show ------------------------------------

#: vLLM's logging variables (vllm/envs.py, 0.32) that can leave no readable INFO record: a level
#: above INFO, a prefix before vLLM's record format, a custom dictConfig, or no config at all.
LOGGING_ENV = (
    "VLLM_LOGGING_LEVEL",
    "VLLM_LOGGING_PREFIX",
    "VLLM_LOGGING_CONFIG_PATH",
    "VLLM_CONFIGURE_LOGGING",
)
_QUIET_LEVELS = ("WARNING", "ERROR", "CRITICAL")


def has_switch(argv: list[str], switch: str) -> bool:
    """``vllm serve`` was given ``switch`` (``--disable-log-stats``; ``_`` spelled ``-`` too)."""
    return any(canonical(arg).partition("=")[0] == switch for arg in serve_args(argv))


def logging_settings(argv: list[str]) -> list[str]:
    """The command line's logging options that change what vLLM's log shows (vLLM 0.32's
    LoggingConfig: ``--log-level``, ``--logging-config[.FIELD]``, ``--log-config-file``), each
    as written; empty when it leaves vLLM's records at INFO in a format log.py reads (the
    default text one or the JSON formatter)."""
    args = [canonical(a) for a in serve_args(argv)]
    found: list[str] = []
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        field_name = name.partition(".")[2].replace("-", "_")
        shown = f"{name} {value}".strip()
        if name == "--log-level" or field_name == "log_level":
            if value.upper() in _QUIET_LEVELS:
                found.append(shown)
        elif _custom_logging(name, field_name, value):
            found.append(shown)
        elif name == "--logging-config":
            found.extend(_logging_json(value))
    return found


def _custom_logging(name: str, field_name: str, value: str) -> bool:
    """A custom dictConfig file, or vLLM told to configure no logging at all."""
    if name == "--log-config-file" or field_name == "pylogging_config_file":
        return True
    return field_name == "configure_logging" and value.lower() in ("false", "0", "no")


def _logging_json(text: str) -> list[str]:
    try:
        doc = json.loads(text)
    except ValueError:
        return [f"--logging-config {text[:200]}"]
    if not isinstance(doc, dict):
        return [f"--logging-config {text[:200]}"]
    doc = {str(k).replace("-", "_"): v for k, v in doc.items()}
    shown = f"--logging-config {text[:200]}"
    level = doc.get("log_level")
    if isinstance(level, str) and level.upper() in _QUIET_LEVELS:
        return [shown]
    if doc.get("pylogging_config_file") or doc.get("configure_logging") is False:
        return [shown]
    return []


# -- the speculative method vLLM infers when the config names none -----------------------------


def inferred_method(model: Any, architectures: Any) -> tuple[str, str]:
    """The method vLLM gives a speculative config without ``method``, and why: vLLM 0.32's
    ``SpeculativeConfig.__post_init__`` (vllm/config/speculative.py) looks at the drafter's
    path, lower-cased, then its architectures, in this order: ``eagle-`` → eagle, ``eagle3`` →
    eagle3, ``dflash`` or the MuseGlimmerAssistantModel architecture → dflash, ``dspark`` →
    dspark; else (for the drafters this tool provisions) ``draft_model``: a plain draft model,
    not DFlash. A dotted name without ``/`` is a custom proposer class."""
    path = model if isinstance(model, str) else ""
    archs = [str(a) for a in architectures] if isinstance(architectures, list) else []
    lowered = path.lower()
    parts = path.split(".")
    if path and "/" not in path and len(parts) >= 2 and all(p.isidentifier() for p in parts):
        return "custom_class", f"the drafter {path!r} reads as a proposer class's import path"
    if path in ("ngram", "[ngram]"):
        return "ngram", f"the drafter is {path!r}"
    for needle, method in (("eagle-", "eagle"), ("eagle3", "eagle3"), ("dflash", "dflash")):
        if needle in lowered:
            return method, f"the drafter's path {path!r} contains {needle!r}"
    if "MuseGlimmerAssistantModel" in archs:
        return "dflash", "the drafter's architecture is MuseGlimmerAssistantModel"
    if "dspark" in lowered:
        return "dspark", f"the drafter's path {path!r} contains 'dspark'"
    return "draft_model", (
        f"neither the drafter's path {path!r} contains 'dflash' nor does its architecture "
        f"({', '.join(archs) or 'none'}) name a DFlash model vLLM recognises"
    )
