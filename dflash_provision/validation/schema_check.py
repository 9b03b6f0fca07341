"""The "schema" layer: JSON Schema (Draft 2020-12) validation, one schema per drafter family.

The schema is chosen by the layout and ``architectures`` (:func:`family_of`); every violation
is listed (not only the first), each with the JSON path of the offending value, e.g.
``dflash_config.target_layer_ids[2]``.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from dflash_provision.formats.json_path import json_path
from dflash_provision.validation.findings import Finding
from dflash_provision.validation.speculators_layout import is_speculators

# architecture name -> schema file name (in the schemas directory)
SCHEMA_FILES: dict[str, str] = {
    "DFlashDraftModel": "dflash-draft-model.schema.json",
    "DFlash2DraftModel": "dflash2-draft-model.schema.json",
}
SUPPORTED_ARCHITECTURES = tuple(SCHEMA_FILES)
# The speculators library's layout has its own schema whatever ``architectures`` says: vLLM
# reads such a file by its speculators_config, not by its architecture.
SPECULATORS_FAMILY = "speculators"
SCHEMA_FILES[SPECULATORS_FAMILY] = "dflash-speculators.schema.json"

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # dflash_provision/, beside the schemas
_MAX_MESSAGE = 200
_REQUIRED = re.compile(r"^'(?P<name>[^']+)' is a required property$")


def schemas_dir() -> Path:
    """Where the schemas live: inside the wheel (force-included) or the repository checkout."""
    for candidate in (_PACKAGE_DIR / "_schemas", _PACKAGE_DIR.parent / "schemas"):
        if (candidate / SCHEMA_FILES["DFlashDraftModel"]).is_file():
            return candidate
    raise FileNotFoundError(
        f"no schemas directory found (looked in {_PACKAGE_DIR / '_schemas'} and "
        f"{_PACKAGE_DIR.parent / 'schemas'})"
    )


def architecture_of(doc: dict[str, Any]) -> str | None:
    """The first supported architecture named in ``architectures``, else None."""
    archs = doc.get("architectures")
    if not isinstance(archs, list):
        return None
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return str(arch)
    return None


def family_of(doc: dict[str, Any]) -> str | None:
    """The drafter family whose schema applies: the speculators layout, else the architecture."""
    return SPECULATORS_FAMILY if is_speculators(doc) else architecture_of(doc)


@cache
def _validator(architecture: str) -> Any:
    # Imported here: jsonschema + referencing cost ~100 ms and most CLI commands never need them.
    from jsonschema import Draft202012Validator
    from jsonschema.validators import extend
    from referencing import Registry, Resource

    directory = schemas_dir()
    resources = []
    for path in sorted(directory.glob("*.schema.json")):
        contents = json.loads(path.read_text(encoding="utf-8"))
        resources.append((contents["$id"], Resource.from_contents(contents)))
    registry: Registry[Any] = Registry().with_resources(resources)
    schema = json.loads((directory / SCHEMA_FILES[architecture]).read_text(encoding="utf-8"))

    # JSON Schema counts 5.0 as an integer; transformers' strict config classes do not, and a
    # float layer count is exactly the kind of hand edit we must catch.
    def is_strict_int(checker: Any, instance: Any) -> bool:
        return isinstance(instance, int) and not isinstance(instance, bool)

    type_checker = Draft202012Validator.TYPE_CHECKER.redefine("integer", is_strict_int)
    validator_cls = extend(Draft202012Validator, type_checker=type_checker)  # type: ignore[no-untyped-call]
    Draft202012Validator.check_schema(schema)
    return validator_cls(schema, registry=registry)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 1] + "…"


def check_schema(doc: dict[str, Any]) -> list[Finding]:
    """Validate ``doc`` against the schema for its architecture; one Finding per violation."""
    architecture = family_of(doc)
    if architecture is None:
        supported = ", ".join(SUPPORTED_ARCHITECTURES)
        found = json.dumps(doc.get("architectures")) if "architectures" in doc else "absent"
        return [
            Finding(
                "schema",
                "architectures",
                f"architectures: {found} names no supported drafter; expected one of {supported} "
                "(or the speculators layout, with a speculators_config)",
            )
        ]
    findings = []
    for error in _validator(architecture).iter_errors(doc):
        parts: list[str | int] = list(error.absolute_path)
        message = error.message
        missing = _REQUIRED.match(message)
        if error.validator == "required" and missing:
            parts.append(missing.group("name"))
            message = "required field is missing"
        path = json_path(parts)
        findings.append(Finding("schema", path, _short(f"{path or '(document)'}: {message}")))
    # iter_errors follows schema order; sort by path so output is stable and reads top-down.
    return sorted(findings, key=lambda f: (f.path, f.message))
