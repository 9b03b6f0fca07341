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
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
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
    """Everything recognised in a stretch of log. The LAST engine start wins (a restarted server
    appends to the same log); aux layers and metrics are those seen after it."""

    engine: EngineStart | None = None
    aux: AuxLayers | None = None
    spec_lines: list[SpecDecodingLine] = field(default_factory=list)
    fatal: list[str] = field(default_factory=list)
    lines_read: int = 0

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


def parse_log(lines: Iterable[str]) -> LogFacts:
    """Collect the facts of a log (see LogFacts for which occurrence wins)."""
    facts = LogFacts()
    for raw in lines:
        facts.lines_read += 1
        line = raw.rstrip("\r\n")[:MAX_LINE]
        engine = parse_engine_start(line)
        if engine is not None:
            # A new start: what an earlier run logged no longer describes this server.
            facts.engine, facts.aux, facts.spec_lines, facts.fatal = engine, None, [], []
            continue
        aux = parse_aux_layers(line)
        if aux is not None:
            facts.aux = aux
            continue
        spec = parse_spec_decoding(line)
        if spec is not None:
            facts.spec_lines.append(spec)
            continue
        if is_fatal(line):
            facts.fatal.append(line.strip())
    return facts
