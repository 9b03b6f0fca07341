"""The Prometheus text exposition format (version 0.0.4), written: the one writer of the
node_exporter textfiles that ``audit``, ``runtime-check`` and ``rollout`` leave with
``--prometheus FILE``.

A family is ``# HELP``, ``# TYPE`` and its samples, in the order given. Escapes follow the format:
in a label value a backslash, a double quote and a line feed are written ``\\\\``, ``\\"`` and
``\\n``; in HELP text a backslash and a line feed (a quote stays as it is). A host name, a path or a
group comes from an inventory, so any of them may hold those characters; a name or label name
outside the format's grammar is a bug here, refused with ValueError rather than written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


@dataclass(frozen=True)
class Sample:
    """One line of a family: its labels (in this order) and its value."""

    labels: Mapping[str, str]
    value: float


@dataclass
class MetricFamily:
    """A metric's HELP, TYPE and samples. ``digits``: decimals a non-integer value is written
    with (a duration to the microsecond: 6; a Unix time to the millisecond: 3)."""

    name: str
    help: str
    kind: str = "gauge"
    samples: list[Sample] = field(default_factory=list)
    digits: int = 6

    def add(self, value: float, **labels: str) -> None:
        self.samples.append(Sample(labels, value))


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def labels_text(labels: Mapping[str, str]) -> str:
    """``{a="1",b="2"}``; nothing for no labels."""
    for name in labels:
        if not _LABEL_NAME.match(name) or name.startswith("__"):
            raise ValueError(f"not a Prometheus label name: {name!r}")
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels.items()) + "}"


def value_text(value: float, digits: int = 6) -> str:
    """An int (a bool: 0 or 1) as it is, a float with ``digits`` decimals; NaN and the
    infinities as the format spells them."""
    if isinstance(value, bool | int):
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.{digits}f}"


def render(families: Iterable[MetricFamily]) -> str:
    """The text of ``families``: one block each, one line per sample, a final newline."""
    lines: list[str] = []
    for family in families:
        if not _METRIC_NAME.match(family.name):
            raise ValueError(f"not a Prometheus metric name: {family.name!r}")
        if family.kind not in _TYPES:
            raise ValueError(f"not a Prometheus metric type: {family.kind!r}")
        lines.append(f"# HELP {family.name} {escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for sample in family.samples:
            labels = labels_text(sample.labels)
            lines.append(f"{family.name}{labels} {value_text(sample.value, family.digits)}")
    return "\n".join(lines) + "\n"
