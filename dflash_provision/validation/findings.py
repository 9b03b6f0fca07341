"""Validation results as data: one Finding per problem, grouped into a ValidationReport.

Every validation layer (parse, schema, invariants, effective, against, target) reports its own
status, so a reader, human or fleet audit, can tell *where* a config went wrong, not only that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Layer = Literal["parse", "schema", "invariants", "effective", "against", "target", "weights"]
Severity = Literal["error", "warning"]
LayerStatus = Literal["passed", "failed", "skipped"]

# Report order; also the order the CLI prints sections in.
# "weights": the safetensors headers beside the config (validate of a directory or a target).
LAYERS: tuple[Layer, ...] = (
    "parse",
    "schema",
    "invariants",
    "effective",
    "target",
    "weights",
    "against",
)


@dataclass(frozen=True)
class Finding:
    """One problem: which layer saw it, where in the document, what is wrong and how to fix it."""

    layer: Layer
    path: str  # "dflash_config.mask_token_id"; "" for the whole document
    message: str  # one line: names the field, both values where relevant, the fix when known
    severity: Severity = "error"

    def to_dict(self) -> dict[str, str]:
        return {
            "layer": self.layer,
            "path": self.path,
            "message": self.message,
            "severity": self.severity,
        }


@dataclass
class ValidationReport:
    """All findings for one source, with the status of every layer that ran (or did not)."""

    source: str
    findings: list[Finding] = field(default_factory=list)
    layers: dict[str, LayerStatus] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True only when no finding is an error (warnings do not fail a config)."""
        return not any(f.severity == "error" for f in self.findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def findings_for(self, layer: Layer) -> list[Finding]:
        return [f for f in self.findings if f.layer == layer]

    def record(self, layer: Layer, findings: list[Finding] | None) -> None:
        """Store one layer's outcome; ``None`` means the layer was skipped."""
        if findings is None:
            self.layers[layer] = "skipped"
            return
        self.findings.extend(findings)
        failed = any(f.severity == "error" for f in findings)
        self.layers[layer] = "failed" if failed else "passed"

    @property
    def loader_normalised(self) -> bool:
        """True when transformers would load something other than the file says: the file
        parses and passes the schema (so it loads), and the effective layer failed.

        The one rule for ``validate --json`` and fleet audit alike. A broken invariant does
        not change it: what the loader does to the file is the sharper fact.
        """
        if self.layers.get("effective") != "failed":
            return False
        return all(self.layers.get(layer) != "failed" for layer in ("parse", "schema"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "ok": self.ok,
            "error_count": len(self.errors),
            "loader_normalised": self.loader_normalised,
            "layers": dict(self.layers),
            "findings": [f.to_dict() for f in self.findings],
        }
