"""The house's floors: every import of a product module points at its own package or one below
it (issue 34 item 2). Imports are read with ``ast`` from every module under dflash_provision/,
the ones inside functions and under ``if TYPE_CHECKING:`` included: a lazy import is still an
arrow, it only moves the moment it is taken. A new top-level package or module must be given its
floor here, which is the point: placing it is a decision, not an accident."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dflash_provision"

#: Bottom to top: a floor may import itself and any floor below it, never one above.
FLOORS: list[tuple[str, str]] = [
    ("dflash_provision", "the package's face: its version"),
    ("errors", "the one error root and the exit codes"),
    ("data_dir", "where local state lives"),
    ("plain_table", "text tables"),
    ("netlookup", "host name lookup with a deadline (the Hub client and SSH routes)"),
    ("target", "the TARGET grammar: HOST/KIND:NAME:PATH"),
    ("formats", "pure parsers and writers: strict JSON, safetensors header, Prometheus text"),
    ("validation", "judging a config's bytes: schema, invariants, effective config, diff"),
    ("source", "where the authoritative bytes come from: Hub, lock file, local file"),
    ("history", "the local store: host keys, entries, acceptance references"),
    ("transport", "connections: SSH, local, containers, a play's own"),
    ("remote", "the remote protocol: sh scripts and their parsers"),
    ("host_state", "judges of what a host holds against the authority (reads over remote)"),
    ("place", "push: write, read back, prove"),
    ("inventory", "fleets: ours and Ansible's"),
    ("fleet", "audit and repair of a fleet, and their report"),
    ("vllm", "what a vLLM says and is: argv, log, metrics, features, the probe"),
    ("server", "a vLLM server's lifecycle: launch, restart, stop, status, readiness"),
    ("verify", "runtime-check: stages, the acceptance gate, diagnosis, fixes, doctor"),
    ("rollout", "batched change of a fleet with the gate between batches"),
    ("ansible_modules", "the library side of the dflash.provision Ansible collection"),
    ("cli", "the commands: the only place that prints"),
    ("__main__", "python -m dflash_provision"),
]

#: (importing module, imported module) -> why this arrow may run up. Keep it empty.
EXCEPTIONS: dict[tuple[str, str], str] = {}

_LEVEL = {name: i for i, (name, _) in enumerate(FLOORS)}


def _module_name(path: Path) -> str:
    parts = ["dflash_provision", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _floor(module: str) -> str:
    """The floor of a dotted name under dflash_provision (its first part below the package)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imports(path: Path) -> set[str]:
    """The dflash_provision modules (or names in them) that ``path`` imports, at any depth."""
    module = _module_name(path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join([*here, base] if base else here)
            if base == "dflash_provision":  # from dflash_provision import history: a floor
                found.update(
                    f"{base}.{alias.name}" if alias.name in _LEVEL else base for alias in node.names
                )
            else:
                found.add(base)
    return {name for name in found if name.split(".")[0] == "dflash_provision"}


def _product_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def up_arrows() -> list[str]:
    arrows = []
    for path in _product_modules():
        module = _module_name(path)
        for imported in sorted(_imports(path)):
            low, high = _floor(module), _floor(imported)
            if _LEVEL.get(high, -1) > _LEVEL.get(low, -1) and (module, imported) not in EXCEPTIONS:
                arrows.append(f"{module} ({low}) -> {imported} ({high})")
    return arrows


def test_every_product_package_has_a_floor() -> None:
    tops = {_floor(_module_name(path)) for path in _product_modules()}
    assert sorted(tops - set(_LEVEL)) == [], "give each new package its floor in FLOORS"


def test_no_import_runs_back_up_the_house() -> None:
    arrows = up_arrows()
    assert arrows == [], f"{len(arrows)} import(s) run back up:\n" + "\n".join(arrows)


def test_every_exception_is_still_needed() -> None:
    """A listed exception whose import is gone is removed, so the list says what is true."""
    present = {
        (_module_name(path), imported) for path in _product_modules() for imported in _imports(path)
    }
    assert sorted(set(EXCEPTIONS) - present) == []
