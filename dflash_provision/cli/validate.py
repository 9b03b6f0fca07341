"""``dflash-provision validate SOURCE``: every validation layer, one section each."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from dflash_provision.cli._connect import source_connection_options
from dflash_provision.cli._json_document import echo_document
from dflash_provision.cli._sources import load_source
from dflash_provision.errors import ExitCode
from dflash_provision.transport.factory import Connector
from dflash_provision.validation.findings import LAYERS, Finding, ValidationReport

if TYPE_CHECKING:
    from dflash_provision.host_state.weights_check import WeightsCheck
    from dflash_provision.source.authority import Authority

_MARKS = {"passed": "✓", "failed": "✗", "skipped": "-"}


def render_report(
    report: ValidationReport,
    *,
    against_label: str | None = None,
    notes: dict[str, list[str]] | None = None,
) -> list[str]:
    """Human lines: a ✓/✗ header per layer, each finding (and note) indented below it, then
    the verdict."""
    lines = [report.source]
    for layer in LAYERS:
        status = report.layers.get(layer, "skipped")
        title: str = layer
        if layer == "against" and against_label:
            title = f"against {against_label}"
        lines.append(f"{_MARKS[status]} {title}" + (" (skipped)" if status == "skipped" else ""))
        for finding in report.findings_for(layer):
            prefix = "warning: " if finding.severity == "warning" else ""
            lines.append(f"    {prefix}{finding.message}")
        lines += [f"    {note}" for note in (notes or {}).get(layer, [])]
    errors = len(report.errors)
    lines.append("valid" if report.ok else f"INVALID: {errors} error{'s' if errors != 1 else ''}")
    return lines


@click.command(name="validate")
@click.argument("source")
@click.option(
    "--target-config",
    "target_source",
    metavar="SOURCE",
    help="The target model's config: check hidden_size, vocab_size and layer counts against it.",
)
@click.option(
    "--against",
    "against_source",
    metavar="SOURCE",
    help="The authoritative config: every differing field is an error.",
)
@click.option(
    "--no-effective",
    is_flag=True,
    help="Skip loading through transformers (faster; misses loader rewrites).",
)
@click.option(
    "--num-speculative-tokens",
    type=click.IntRange(min=1),
    metavar="N",
    help="The vLLM --speculative-config num_speculative_tokens you will serve with: it must be "
    "at most block_size - 1 (more drafts than that accept nothing).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@source_connection_options
@click.pass_context
def command(
    ctx: click.Context,
    source: str,
    target_source: str | None,
    against_source: str | None,
    no_effective: bool,
    num_speculative_tokens: int | None,
    as_json: bool,
    connection: Connector,
) -> None:
    """Check a config: JSON, schema, DFlash invariants, loader effects, target fit, drift.

    SOURCE is a config.json file, a directory holding one, a Hub repo id (owner/name[@rev]) or
    a remote TARGET such as root@gpu1:/root/models/X (forms below). For a directory (local, or on
    a target) the safetensors headers beside the config are checked against it too (layer counts,
    sizes, fc width, vocabulary rows): only the headers are read.
    Exits 0 when every layer passes, 3 when any finding is an error.
    """
    from dflash_provision.validation.validate import validate_config

    def load(spec: str) -> Authority:
        return load_source(spec, connector=connection)

    loaded = load(source)
    target = load(target_source) if target_source else None
    against = load(against_source) if against_source else None
    report = validate_config(
        loaded.data,
        label=loaded.label,
        target=target.data if target else None,
        against=against.data if against else None,
        effective=not no_effective,
        num_speculative_tokens=num_speculative_tokens,
    )
    weights = _record_weights(report, source, loaded.data, target, connection)
    if as_json:
        payload = report.to_dict()
        if target is not None:
            payload["target_source"] = target.label
        if against is not None:
            payload["against_source"] = against.label
        if weights is not None:
            payload["weights"] = weights.to_dict()
        echo_document(payload)
    else:
        notes = {"weights": _weights_notes(weights)} if weights is not None else None
        label = against.label if against else None
        from dflash_provision.cli._render import echo_wrapped

        echo_wrapped(render_report(report, against_label=label, notes=notes))
    if not report.ok:
        ctx.exit(int(ExitCode.INVALID))


def _record_weights(
    report: ValidationReport,
    source: str,
    data: bytes,
    target: Authority | None,
    connection: Connector,
) -> WeightsCheck | None:
    """The weights layer: recorded for a directory source (skipped for a file or a repo id)."""
    from dflash_provision.host_state.weights_check import check_source
    from dflash_provision.validation.validate import parse_config

    doc = parse_config(data).doc
    weights = None
    if doc is not None:
        target_bytes = target.data if target else None
        weights = check_source(source, doc, target_config=target_bytes, connector=connection)
    if weights is None or not weights.checked:
        report.record("weights", None)
        return weights
    report.record("weights", [Finding("weights", "", line) for line in weights.mismatches])
    return weights


def _weights_notes(weights: WeightsCheck) -> list[str]:
    return [weights.detail, *weights.notes] if weights.detail else list(weights.notes)
