"""Read what a vLLM server says about itself in its log: engine version, the speculative config
it runs with, which auxiliary layers the drafter reads, SpecDecoding metrics and fatal lines.

Pure parsing of text lines (no I/O): the runtime check reads the tail of the server's log through
the transport and hands the lines here. Formats follow vLLM's own log calls (v0.2x-0.32), e.g.::

    INFO ... Initializing a V1 LLM engine (v0.32.0) with config: model='/m/T', ...,
        speculative_config=SpeculativeConfig(method='dflash', model='/m/D', num_spec_tokens=4), ...
    INFO ... Using auxiliary layers from speculative config: (2, 4)
    INFO ... Using Eagle3 auxiliary layers from config: [2, 17, 32, 47, 62]
    INFO ... Using Eagle3 auxiliary layers from model: (2, 33, 61)      <- fallback: ids NOT used
    INFO ... SpecDecoding metrics: Mean acceptance length: 2.37, Accepted throughput: 8.90 tokens/s,
        Drafted throughput: 97.50 tokens/s, Accepted: 89 tokens, Drafted: 975 tokens,
        Per-position acceptance rate: 0.600, 0.385, Avg Draft acceptance rate: 9.1%

Everything here is untrusted text from a remote process: lines are length-capped, numbers are
parsed with anchored patterns, and nothing is evaluated.

Which lines count (a client can put text into the log: with ``--enable-log-requests`` vLLM logs
each request, at DEBUG with its prompt): only vLLM's own log RECORDS, in its logger's format at
the start of a line (``[(PROC pid=N) ]LEVEL MM-DD HH:MM:SS [file.py:N] message``, ANSI colours
ignored), whose MESSAGE starts with the phrase; never a continuation line of a multi-line message
(vLLM's NewLineFormatter ends the line before it with ``\r``); and only the start-up records of
THIS launch: after the last ``==== dflash-provision launch`` line that ``launch`` writes before
it starts the server, and before the server reports ready (vLLM's ``Starting vLLM server on``,
or uvicorn's ``Application startup complete.``), when no client request can have been served.
vLLM's JSON formatter (0.32+: ``--logging-config.formatter json``, pythonjsonlogger with the
keys ``asctime levelname name processName process message``) writes one JSON object a line; such
a line is a record when it parses as an object whose ``name`` is one of vLLM's loggers
(``vllm...``; uvicorn's for the ready line) and whose ``levelname`` and ``message`` are strings
(a message's line breaks are escaped, so there are no continuation lines).

What this module cannot read, it counts rather than guesses: a prefix set with
VLLM_LOGGING_PREFIX, a custom logging config, or a level above INFO (the start-up records are
INFO) leave no readable INFO record before ready, and ``LogFacts.info_records`` is then 0;
``unreadable_why`` names the setting that explains it (stage c says "cannot tell").
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

MAX_LINE = 8192  # a longer line is cut before matching (a hostile log cannot make regexes slow)

_ENGINE = re.compile(r"Initializing a V\d+ LLM engine \(v(?P<version>[^\s)]+)\) with config: ")
_MODEL = re.compile(r"(?:^|[\s,(])model='(?P<model>(?:[^'\\]|\\.)*)'")
_SPEC = re.compile(r"speculative_config=SpeculativeConfig\((?P<body>[^)]*)\)")
_SPEC_FIELD = re.compile(r"(?P<key>\w+)=(?:'(?P<str>(?:[^'\\]|\\.)*)'|(?P<raw>[^,]+))")
_AUX = re.compile(
    r"Using (?:Eagle3 )?auxiliary layers from (?P<source>speculative config|config|model): "
    r"(?P<ids>.*)$"
)
_INTS = re.compile(r"-?\d+")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PROC = r"(?:\([A-Za-z_][\w.-]*(?: [\w.-]+)? pid=\d+\) )?"
_RECORD = re.compile(
    _PROC + r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d "
    r"\[(?P<where>[^\]\s]+):\d+\] (?P<message>.*)"
)
_UVICORN_READY = re.compile(_PROC + r"INFO:\s+Application startup complete\.\s*")
_READY_MESSAGES = ("Starting vLLM server on ", "Starting vLLM API server ")
#: What ``server/scripts/start.sh`` writes before each start (a client cannot begin a line).
LAUNCH_MARKER = re.compile(r"==== dflash-provision launch on port \d+ at \S+\s*")
_SPEC_METRICS = re.compile(
    r"SpecDecoding metrics: Mean acceptance length: (?P<mean>[\d.]+), .*?"
    r"Accepted: (?P<accepted>\d+) tokens, Drafted: (?P<drafted>\d+) tokens"
    r"(?:, Per-position acceptance rate: (?P<per_pos>[\d., ]*?))?"
    r", Avg Draft acceptance rate: (?P<rate>[\d.]+)%"
)
# Lines that end (or doom) a start-up or a request. vLLM's own wording for the DFlash failures
# is matched first; the generic levels catch the rest.
_FATAL = re.compile(
    r"DFlash sliding attention requires|NotImplementedError|EngineCore failed to start|"
    r"Engine core initialization failed|Traceback \(most recent call last\)|"
    r"\b(?:ERROR|CRITICAL)\b|^\w*(?:Error|Exception): "
)


@dataclass(frozen=True)
class EngineStart:
    """The engine's start-up line: version, target model and the speculative config in force."""

    version: str
    model: str | None
    spec_method: str | None
    spec_model: str | None
    num_spec_tokens: int | None
    line: str


@dataclass(frozen=True)
class AuxLayers:
    """Which target hidden states the drafter reads. ``fallback`` True when vLLM took the model's
    defaults ("from model"): the drafter config's target_layer_ids were NOT used."""

    source: str  # "speculative config", "config" or "model"
    ids: tuple[int, ...]
    line: str

    @property
    def fallback(self) -> bool:
        return self.source == "model"


@dataclass(frozen=True)
class SpecDecodingLine:
    """One periodic SpecDecoding metrics line (counts are for vLLM's last logging interval)."""

    mean_acceptance_length: float
    accepted: int
    drafted: int
    per_position: tuple[float, ...]
    avg_acceptance_rate: float  # 0..1 (the log prints a percentage)
    line: str


@dataclass
class LogFacts:
    """Everything recognised in a stretch of log (see the module docstring for which lines
    count). A launch line starts afresh (the log is appended across launches); of several engine
    starts before ready the LAST wins; aux layers are those seen after it."""

    engine: EngineStart | None = None
    aux: AuxLayers | None = None
    spec_lines: list[SpecDecodingLine] = field(default_factory=list)
    fatal: list[str] = field(default_factory=list)
    lines_read: int = 0
    launch: str | None = None  # the launch line this launch's start-up begins after
    ready: str | None = None  # the line where the server reported ready (start-up ends)
    not_records: int = 0  # start-up phrases seen outside a vLLM record (a client's text...)
    records: int = 0  # vLLM's own records of this launch before ready (any level)
    info_records: int = 0  # ... at INFO or DEBUG: where the start-up records would be
    json_records: int = 0  # ... written by vLLM's JSON formatter

    def to_dict(self) -> dict[str, Any]:
        engine = self.engine
        return {
            "engine_version": engine.version if engine else None,
            "model": engine.model if engine else None,
            "speculative_method": engine.spec_method if engine else None,
            "speculative_model": engine.spec_model if engine else None,
            "num_spec_tokens": engine.num_spec_tokens if engine else None,
            "aux_layers": list(self.aux.ids) if self.aux else None,
            "aux_layers_source": self.aux.source if self.aux else None,
            "spec_decoding_lines": len(self.spec_lines),
            "fatal": list(self.fatal),
            "lines_read": self.lines_read,
            "launch_line": self.launch,
            "ready_line": self.ready,
            "phrases_outside_records": self.not_records,
            "records": self.records,
            "info_records": self.info_records,
            "json_records": self.json_records,
        }


def _unquote(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def parse_engine_start(line: str) -> EngineStart | None:
    """The ``Initializing a V1 LLM engine (vX) with config: ...`` line, or None."""
    line = line[:MAX_LINE]
    match = _ENGINE.search(line)
    if match is None:
        return None
    config = line[match.end() :]
    spec = _SPEC.search(config)
    fields: dict[str, str] = {}
    if spec is not None:
        for item in _SPEC_FIELD.finditer(spec.group("body")):
            value = item.group("str")
            fields[item.group("key")] = (
                _unquote(value) if value is not None else item.group("raw").strip()
            )
        config = config[: spec.start()] + config[spec.end() :]  # its model= is the drafter's
    model = _MODEL.search(config)
    tokens = fields.get("num_spec_tokens") or fields.get("num_speculative_tokens")
    return EngineStart(
        version=match.group("version"),
        model=_unquote(model.group("model")) if model else None,
        spec_method=fields.get("method"),
        spec_model=fields.get("model"),
        num_spec_tokens=int(tokens) if tokens and tokens.isdigit() else None,
        line=line,
    )


def parse_aux_layers(line: str) -> AuxLayers | None:
    """``Using [Eagle3 ]auxiliary layers from <source>: (2, 4)`` (tuple, list or bare), or None."""
    line = line[:MAX_LINE]
    match = _AUX.search(line)
    if match is None:
        return None
    ids = tuple(int(n) for n in _INTS.findall(match.group("ids")))
    return AuxLayers(source=match.group("source"), ids=ids, line=line)


def parse_spec_decoding(line: str) -> SpecDecodingLine | None:
    """A ``SpecDecoding metrics: ...`` line, or None."""
    line = line[:MAX_LINE]
    match = _SPEC_METRICS.search(line)
    if match is None:
        return None
    per_pos = match.group("per_pos") or ""
    return SpecDecodingLine(
        mean_acceptance_length=float(match.group("mean")),
        accepted=int(match.group("accepted")),
        drafted=int(match.group("drafted")),
        per_position=tuple(float(p) for p in per_pos.split(",") if p.strip()),
        avg_acceptance_rate=float(match.group("rate")) / 100.0,
        line=line,
    )


def is_fatal(line: str) -> bool:
    """True for lines that report a failure (vLLM's DFlash errors, ERROR/CRITICAL, tracebacks)."""
    return _FATAL.search(line[:MAX_LINE]) is not None


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def record_of(line: str) -> tuple[str, str] | None:
    """(level, message) of one of vLLM's own log records, or None for any other line."""
    plain = _ANSI.sub("", line[:MAX_LINE]).rstrip()
    if plain.startswith("{"):
        return json_record_of(plain)
    match = _RECORD.fullmatch(plain)
    return (match.group("level"), match.group("message")) if match else None


def json_record_of(line: str, loggers: tuple[str, ...] = ("vllm",)) -> tuple[str, str] | None:
    """(level, message) of a record of vLLM's JSON formatter (see the module docstring) whose
    logger is one of ``loggers`` (or below one), else None."""
    try:
        doc = json.loads(line[:MAX_LINE])
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    name, level, message = doc.get("name"), doc.get("levelname"), doc.get("message")
    if not (isinstance(name, str) and isinstance(level, str) and isinstance(message, str)):
        return None
    if level not in _LEVELS or not any(name == n or name.startswith(n + ".") for n in loggers):
        return None
    return level, message[:MAX_LINE]


def is_ready_line(line: str) -> bool:
    """The line where the API server reports that it serves (start-up is over)."""
    plain = _ANSI.sub("", line[:MAX_LINE]).rstrip()
    if _UVICORN_READY.fullmatch(plain):
        return True
    uvicorn = json_record_of(plain, ("uvicorn",)) if plain.startswith("{") else None
    if uvicorn is not None and uvicorn[1].strip() == "Application startup complete.":
        return True
    record = record_of(plain)
    return record is not None and record[1].startswith(_READY_MESSAGES)


_PHRASES = ("Initializing a V", "Using auxiliary layers", "Using Eagle3 auxiliary layers")


def log_lines(text: str) -> list[tuple[str, bool]]:
    """The log's lines, each with True when it continues the line before it (vLLM's
    NewLineFormatter writes a message's inner line breaks as ``\\r\\n`` + its prefix, so such a
    line looks like a record of its own: the ``\\r`` before it tells)."""
    out: list[tuple[str, bool]] = []
    continued = False
    for raw in text.split("\n"):
        out.append((raw.rstrip("\r"), continued))
        continued = raw.endswith("\r")
    if out and out[-1][0] == "":
        out.pop()
    return out


def parse_startup(text: str) -> LogFacts:
    """The facts of a server log's text (bytes as read, not split on ``\\r``)."""
    return parse_log(log_lines(text))


def parse_log(lines: Iterable[str | tuple[str, bool]]) -> LogFacts:
    """Collect the facts of a log (see LogFacts for which occurrence wins). ``lines``: text
    lines, or (line, continues-the-previous-line) pairs from ``log_lines``."""
    facts = LogFacts()
    for item in lines:
        raw, continued = item if isinstance(item, tuple) else (item, False)
        facts.lines_read += 1
        line = raw.rstrip("\r\n")[:MAX_LINE]
        if LAUNCH_MARKER.fullmatch(line) and not continued:
            # A new launch: what an earlier run logged no longer describes this server.
            facts = LogFacts(lines_read=facts.lines_read, launch=line.strip())
            continue
        record = None if continued else record_of(line)
        message = record[1] if record else None
        if message is not None and message.startswith("SpecDecoding metrics: "):
            spec = parse_spec_decoding(message)
            if spec is not None:
                facts.spec_lines.append(spec)
            continue
        if facts.ready is not None:
            continue  # served requests since: nothing after this line is start-up evidence
        if not continued and is_ready_line(line):
            facts.ready = line.strip()
            continue
        if record is not None:
            facts.records += 1
            facts.info_records += record[0] in ("INFO", "DEBUG")
            facts.json_records += line.lstrip().startswith("{")
        _startup_line(facts, line, message, record)
    return facts


def _startup_line(
    facts: LogFacts, line: str, message: str | None, record: tuple[str, str] | None
) -> None:
    if message is not None and message.startswith("Initializing a V"):
        engine = parse_engine_start(message)
        if engine is not None:
            facts.engine, facts.aux, facts.fatal = replace(engine, line=line), None, []
            return
    if message is not None and message.startswith(("Using auxiliary", "Using Eagle3 auxiliary")):
        aux = parse_aux_layers(message)
        if aux is not None:
            facts.aux = replace(aux, line=line)
            return
    if message is None and any(phrase in line for phrase in _PHRASES):
        facts.not_records += 1
    if (record is not None and record[0] in ("ERROR", "CRITICAL")) or is_fatal(line):
        facts.fatal.append(line.strip())
