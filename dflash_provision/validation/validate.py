"""Validate one config through every layer and collect the findings into a ValidationReport.

Layers: parse → schema → invariants → effective (transformers) → target → against. All layers
run even when an earlier one fails, so one report shows everything wrong at once; only a document
that does not parse into a JSON object stops the rest (they are then "skipped").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dflash_provision.formats import strict_json
from dflash_provision.formats.json_path import json_path
from dflash_provision.validation.diff import Change, render_value, semantic_diff
from dflash_provision.validation.findings import Finding, Layer, ValidationReport
from dflash_provision.validation.invariants import check_invariants, check_target
from dflash_provision.validation.schema_check import check_schema


@dataclass
class ParseResult:
    """The parsed document (None when unusable) and what was wrong with the text."""

    doc: dict[str, Any] | None
    findings: list[Finding] = field(default_factory=list)


class _DuplicateKeys:
    """object_pairs_hook that builds dicts and remembers keys given twice.

    json.loads silently keeps the last of two equal keys, which is exactly how a hand-edited
    file shows one value to a reader and another to the loader.
    """

    def __init__(self) -> None:
        self.seen: list[tuple[dict[str, Any], str, Any, Any]] = []

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for key, value in pairs:
            if key in obj:
                self.seen.append((obj, key, obj[key], value))
            obj[key] = value
        return obj


def _paths_of(doc: Any, prefix: list[str | int]) -> dict[int, list[str | int]]:
    """id(container) -> its path, to locate the objects that held duplicate keys."""
    found: dict[int, list[str | int]] = {id(doc): prefix}
    children: Any = (
        doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    )
    for key, value in children:
        if isinstance(value, dict | list):
            found.update(_paths_of(value, [*prefix, key]))
    return found


def json_error_text(exc: json.JSONDecodeError) -> str:
    """The decoder's message as one whole phrase with its position. Some of its messages end in
    "at" and expect the position after them ("Unterminated string starting at")."""
    trailing = _trailing_comma(exc.doc, exc.pos)
    if trailing is not None:
        return trailing
    where = f"line {exc.lineno}, column {exc.colno}"
    if exc.msg.endswith(" at"):
        return f"invalid JSON: {exc.msg[:1].lower()}{exc.msg[1:]} {where}"
    return f"invalid JSON at {where}: {exc.msg}"


def _trailing_comma(text: str, pos: int) -> str | None:
    """The most common hand edit gone wrong, a comma after the last key or item, said as such
    at the comma: the decoder says "Expecting property name enclosed in double quotes" at the
    closing brace (before Python 3.13), which names neither the comma nor where it is."""
    comma = pos if text[pos : pos + 1] == "," else len(text[:pos].rstrip()) - 1
    if comma < 0 or text[comma : comma + 1] != ",":
        return None
    after = text[comma + 1 :].lstrip()[:1]
    before = text[:comma].rstrip()[-1:]
    if after not in ("}", "]") or before in ("{", "[", ","):
        return None
    line = text.count("\n", 0, comma) + 1
    column = comma - (text.rfind("\n", 0, comma) + 1) + 1
    last = "key" if after == "}" else "item"
    return (
        f"invalid JSON at line {line}, column {column}: a trailing comma after the last {last} "
        f"(before the closing '{after}'); JSON allows none: delete it"
    )


def parse_config(data: bytes, *, layer: Layer = "parse", what: str = "") -> ParseResult:
    """Parse bytes into a JSON object, reporting position of syntax errors and duplicate keys."""
    prefix = f"{what}: " if what else ""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        message = f"{prefix}not UTF-8 (byte {exc.start}: {exc.reason}); save the file as UTF-8"
        return ParseResult(None, [Finding(layer, "", message)])
    hook = _DuplicateKeys()
    try:
        doc = strict_json.loads(text, object_pairs_hook=hook)
    except json.JSONDecodeError as exc:
        return ParseResult(None, [Finding(layer, "", prefix + json_error_text(exc))])
    except strict_json.StrictJsonError as exc:
        return ParseResult(None, [Finding(layer, exc.path, f"{prefix}invalid JSON: {exc}")])
    if not isinstance(doc, dict):
        kind = type(doc).__name__.replace("NoneType", "null").replace("list", "array")
        message = f"{prefix}top level is {kind}; a config.json must be a JSON object"
        return ParseResult(None, [Finding(layer, "", message)])
    findings = []
    paths = _paths_of(doc, [])
    for obj, key, first, last in hook.seen:
        path = json_path([*paths.get(id(obj), []), key])
        findings.append(
            Finding(
                layer,
                path,
                f"{prefix}{path} appears twice ({render_value(first)}, then "
                f"{render_value(last)}); loaders keep the last value: delete one",
            )
        )
    return ParseResult(doc, findings)


def against_findings(doc: Any, authoritative: Any) -> list[Finding]:
    """Every semantic difference from the authoritative config, as an "against" error."""
    return [_against_finding(change) for change in semantic_diff(doc, authoritative)]


def _against_finding(change: Change) -> Finding:
    path = change.path or "(document)"
    if change.kind == "added":  # present only in the authoritative config
        message = f"{path}: absent, authoritative {render_value(change.new)}"
    elif change.kind == "removed":  # present only in this file
        message = f"{path}: {render_value(change.old)}, absent from authoritative"
    else:
        message = f"{path}: {render_value(change.old)}, authoritative {render_value(change.new)}"
        if change.kind == "type_changed":
            message += f" (type {type(change.old).__name__}, authoritative "
            message += f"{type(change.new).__name__})"
    return Finding("against", change.path, message)


def validate_config(
    data: bytes,
    *,
    label: str,
    target: bytes | None = None,
    against: bytes | None = None,
    effective: bool = True,
    num_speculative_tokens: int | None = None,
) -> ValidationReport:
    """Run every layer on ``data``; layers not asked for (or not runnable) are "skipped".

    With ``effective`` the verdict of the data-only layers comes from the verdict cache when this
    machine has judged the same bytes under the same rules before
    (dflash_provision.validation.verdict_cache), so transformers is imported only for a config it
    has not seen.
    """
    from dflash_provision.validation import verdict_cache

    report = ValidationReport(source=label)
    cached = verdict_cache.lookup(data, num_speculative_tokens) if effective else []
    for layer, findings in cached:
        report.record(layer, findings)  # type: ignore[arg-type]
    if not cached:
        _judge(report, data, effective=effective, num_speculative_tokens=num_speculative_tokens)
        if effective:
            verdict_cache.store(data, num_speculative_tokens, report)
    doc = parse_config(data).doc  # cheap; the comparisons need the document itself
    if doc is None:
        for layer in ("target", "against"):
            report.record(layer, None)  # type: ignore[arg-type]
        return report
    _compare(report, doc, target=target, against=against)
    return report


def _judge(
    report: ValidationReport, data: bytes, *, effective: bool, num_speculative_tokens: int | None
) -> None:
    """The layers that depend on the bytes alone: parse, schema, invariants, effective."""
    parsed = parse_config(data)
    report.record("parse", parsed.findings)
    doc = parsed.doc
    if doc is None:
        for layer in ("schema", "invariants", "effective"):
            report.record(layer, None)
        return
    report.record("schema", check_schema(doc))
    report.record(
        "invariants", check_invariants(doc, num_speculative_tokens=num_speculative_tokens)
    )
    if effective:
        from dflash_provision.validation.effective import check_effective  # imports transformers

        report.record("effective", check_effective(doc))
    else:
        report.record("effective", None)


def _compare(
    report: ValidationReport, doc: dict[str, Any], *, target: bytes | None, against: bytes | None
) -> None:
    """The layers that compare with another config: target fit and --against."""
    if target is None:
        report.record("target", None)
    else:
        target_parsed = parse_config(target, layer="target", what="target config")
        target_findings = list(target_parsed.findings)
        if target_parsed.doc is not None:
            target_findings += check_target(doc, target_parsed.doc)
        report.record("target", target_findings)

    if against is None:
        report.record("against", None)
    else:
        auth = parse_config(against, layer="against", what="authoritative config")
        against_list = list(auth.findings)
        if auth.doc is not None:
            against_list += against_findings(doc, auth.doc)
        report.record("against", against_list)
