"""Function-local imports only where they earn their place (issue 34 item 4): every ``import``
inside a function in dflash_provision/ is listed in ``ALLOWED`` below, keyed by the module's
path and the module it imports, with the reason it is not at the top of its module:

- ``cycle: a -> b -> a``: the top-level import would close an import cycle;
- ``heavy: LIBRARY``: it defers a library that is slow to import (or optional on a target);
- ``start-up: WHAT``: it keeps a product subtree (or a slow standard module) off the start path
  of the CLI's commands, so ``--version``, ``--help`` and the light commands stay fast.

Anything else belongs at the top of its module. An entry that no longer matches an import fails
too, so the list shrinks with the code. Imports under ``if TYPE_CHECKING:`` are not local
imports: they never run. Reading the tree with ``ast`` needs no host: a fast test.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dflash_provision"

_REASON = re.compile(r"(cycle|heavy|start-up): \S.*")

# fmt: off
#: (path under dflash_provision/, imported module) -> why the import stays inside a function.
ALLOWED: dict[tuple[str, str], str] = {
    ("cli/_fleet.py", "dflash_provision.fleet"):
        "start-up: fleet stays off `audit --help`, `repair --help`, `rollout --help`, "
        "`runtime-check --help`",
    ("cli/_fleet.py", "dflash_provision.inventory"):
        "start-up: inventory stays off `audit --help`, `repair --help`, `rollout --help`, "
        "`runtime-check --help`",
    ("cli/_fleet.py", "dflash_provision.inventory.common"):
        "start-up: inventory.common stays off `audit --help`, `repair --help`, `rollout --help`, "
        "`runtime-check --help`",
    ("cli/_fleet.py", "dflash_provision.inventory.limit"):
        "start-up: inventory.limit stays off `audit --help`, `repair --help`, `rollout --help`, "
        "`runtime-check --help`",
    ("cli/_fleet.py", "rich.progress"): "heavy: rich",
    ("cli/_json_document.py", "dflash_provision.fleet.classify"):
        "start-up: fleet.classify stays off every --help",
    ("cli/_render.py", "dflash_provision.place.push"):
        "start-up: place.push stays off `audit --help`, `push --help`, `repair --help`, `rollback "
        "--help`",
    ("cli/_render.py", "dflash_provision.plain_table"):
        "start-up: plain_table stays off `audit --help`, `push --help`, `repair --help`, "
        "`rollback --help`",
    ("cli/_render.py", "rich.console"): "heavy: rich",
    ("cli/_render.py", "shutil"):
        "start-up: shutil (bz2, lzma) stays off every command until it draws a table",
    ("cli/_runtime.py", "dflash_provision.cli._render"):
        "start-up: cli._render stays off `doctor --help`, `launch --help`, `logs --help`, "
        "`rollout --help`, `runtime-check --help`, `status --help`, `stop --help`",
    ("cli/_runtime.py", "dflash_provision.server.container_server"):
        "start-up: server.container_server stays off `doctor --help`, `launch --help`, `logs "
        "--help`, `rollout --help`, `runtime-check --help`, `status --help`, `stop --help`",
    ("cli/_runtime.py", "dflash_provision.verify.diagnosis"):
        "start-up: verify.diagnosis stays off `doctor --help`, `launch --help`, `logs --help`, "
        "`rollout --help`, `runtime-check --help`, `status --help`, `stop --help`",
    ("cli/_sources.py", "dflash_provision.remote.ops"):
        "start-up: remote.ops stays off `diff` and `validate` of local files",
    ("cli/audit.py", "dflash_provision.cli._all_files"):
        "start-up: cli._all_files stays off `audit --help`",
    ("cli/audit.py", "dflash_provision.fleet"): "start-up: fleet stays off `audit --help`",
    ("cli/audit.py", "dflash_provision.fleet.interrupt"):
        "start-up: fleet.interrupt stays off `audit --help`",
    ("cli/audit.py", "dflash_provision.fleet.report"):
        "start-up: fleet.report stays off `audit --help`",
    ("cli/audit.py", "dflash_provision.history.store"):
        "start-up: history.store stays off `audit --help`",
    ("cli/diff.py", "dflash_provision.validation.diff"):
        "start-up: validation.diff stays off `diff --help`",
    ("cli/diff.py", "dflash_provision.validation.validate"):
        "start-up: validation.validate stays off `diff --help`",
    ("cli/doctor.py", "dflash_provision.server.container_server"):
        "start-up: server.container_server stays off `doctor --help`",
    ("cli/doctor.py", "dflash_provision.verify.doctor"):
        "start-up: verify.doctor stays off `doctor --help`",
    ("cli/doctor.py", "dflash_provision.verify.runtime_check"):
        "start-up: verify.runtime_check stays off `doctor --help`",
    ("cli/entry.py", "contextlib"):
        "start-up: entry.py imports nothing at module level, so a Ctrl-C while the CLI imports is "
        "caught in main()",
    ("cli/entry.py", "dflash_provision.cli.main"):
        "start-up: entry.py imports nothing at module level, so a Ctrl-C while the CLI imports is "
        "caught in main()",
    ("cli/entry.py", "gc"):
        "start-up: entry.py imports nothing at module level, so a Ctrl-C while the CLI imports is "
        "caught in main()",
    ("cli/entry.py", "os"):
        "start-up: entry.py imports nothing at module level, so a Ctrl-C while the CLI imports is "
        "caught in main()",
    ("cli/entry.py", "sys"):
        "start-up: entry.py imports nothing at module level, so a Ctrl-C while the CLI imports is "
        "caught in main()",
    ("cli/entry.py", "threading"):
        "start-up: entry.py imports nothing at module level, so a Ctrl-C while the CLI imports is "
        "caught in main()",
    ("cli/fetch.py", "dflash_provision.source.authority"):
        "start-up: source.authority stays off `fetch --help`",
    ("cli/fetch.py", "dflash_provision.source.hub"):
        "start-up: source.hub stays off `fetch --help`",
    ("cli/fetch.py", "dflash_provision.source.hub_tree"):
        "start-up: source.hub_tree stays off `fetch --help`",
    ("cli/fetch.py", "dflash_provision.source.lockfile"):
        "start-up: source.lockfile stays off `fetch --help`",
    ("cli/history.py", "dflash_provision.cli._history_view"):
        "start-up: cli._history_view stays off `history --help`",
    ("cli/history.py", "dflash_provision.cli._render"):
        "start-up: cli._render stays off `history --help`",
    ("cli/history.py", "dflash_provision.history.host_key"):
        "start-up: history.host_key stays off `history --help`",
    ("cli/history.py", "dflash_provision.history.store"):
        "start-up: history.store stays off `history --help`",
    ("cli/history.py", "shutil"):
        "start-up: shutil (bz2, lzma) stays off `history` until it draws a table",
    ("cli/init.py", "dflash_provision.place.prepare"):
        "start-up: place.prepare stays off `init --help`",
    ("cli/init.py", "dflash_provision.place.push"): "start-up: place.push stays off `init --help`",
    ("cli/init.py", "dflash_provision.remote.proof"):
        "start-up: remote.proof stays off `init --help`",
    ("cli/launch.py", "dflash_provision.cli._docker_launch"):
        "start-up: cli._docker_launch stays off `launch --help`",
    ("cli/launch.py", "dflash_provision.server.drafter_files"):
        "start-up: server.drafter_files stays off `launch --help`",
    ("cli/launch.py", "dflash_provision.server.launch"):
        "start-up: server.launch stays off `launch --help`",
    ("cli/launch.py", "dflash_provision.server.preflight"):
        "start-up: server.preflight stays off `launch --help`",
    ("cli/launch.py", "dflash_provision.server.restart"):
        "start-up: server.restart stays off `launch --help`",
    ("cli/launch.py", "dflash_provision.verify.runtime_check"):
        "start-up: verify.runtime_check stays off `launch --help`",
    ("cli/logs.py", "dflash_provision.server.locate"):
        "start-up: server.locate stays off `logs --help`",
    ("cli/logs.py", "dflash_provision.server.process"):
        "start-up: server.process stays off `logs --help`",
    ("cli/main.py", "dflash_provision.cli._help"):
        "start-up: the epilog table (cli/_help.py) stays off --version and --help; a command's "
        "help loads it",
    ("cli/main.py", "difflib"):
        "start-up: difflib stays off every command; only a mistyped command name needs it",
    ("cli/push.py", "dflash_provision.cli._all_files"):
        "start-up: cli._all_files stays off `push --help`",
    ("cli/push.py", "dflash_provision.history.host_key"):
        "start-up: history.host_key stays off `push --help`",
    ("cli/push.py", "dflash_provision.history.store"):
        "start-up: history.store stays off `push --help`",
    ("cli/push.py", "dflash_provision.place.push"): "start-up: place.push stays off `push --help`",
    ("cli/push.py", "dflash_provision.remote.proof"):
        "start-up: remote.proof stays off `push --help`",
    ("cli/push.py", "dflash_provision.source.pinned_source"):
        "start-up: source.pinned_source stays off `push --help`",
    ("cli/repair.py", "dflash_provision.cli._all_files"):
        "start-up: cli._all_files stays off `repair --help`",
    ("cli/repair.py", "dflash_provision.fleet"): "start-up: fleet stays off `repair --help`",
    ("cli/repair.py", "dflash_provision.fleet.interrupt"):
        "start-up: fleet.interrupt stays off `repair --help`",
    ("cli/repair.py", "dflash_provision.fleet.report"):
        "start-up: fleet.report stays off `repair --help`",
    ("cli/repair.py", "dflash_provision.history.store"):
        "start-up: history.store stays off `repair --help`",
    ("cli/repair.py", "dflash_provision.remote.proof"):
        "start-up: remote.proof stays off `repair --help`",
    ("cli/rollback.py", "dflash_provision.history.host_key"):
        "start-up: history.host_key stays off `rollback --help`",
    ("cli/rollback.py", "dflash_provision.history.store"):
        "start-up: history.store stays off `rollback --help`",
    ("cli/rollback.py", "dflash_provision.place.push"):
        "start-up: place.push stays off `rollback --help`",
    ("cli/rollback.py", "dflash_provision.remote.proof"):
        "start-up: remote.proof stays off `rollback --help`",
    ("cli/rollout.py", "dflash_provision.fleet.report"):
        "start-up: fleet.report stays off `rollout --help`",
    ("cli/rollout.py", "dflash_provision.history.store"):
        "start-up: history.store stays off `rollout --help`",
    ("cli/rollout.py", "dflash_provision.place.push"):
        "start-up: place.push stays off `rollout --help`",
    ("cli/rollout.py", "dflash_provision.rollout.engine"):
        "start-up: rollout.engine stays off `rollout --help`",
    ("cli/rollout.py", "dflash_provision.rollout.plan"):
        "start-up: rollout.plan stays off `rollout --help`",
    ("cli/rollout.py", "dflash_provision.rollout.prometheus"):
        "start-up: rollout.prometheus stays off `rollout --help`",
    ("cli/rollout.py", "dflash_provision.rollout.record"):
        "start-up: rollout.record stays off `rollout --help`",
    ("cli/rollout.py", "dflash_provision.rollout.store"):
        "start-up: rollout.store stays off `rollout --help`",
    ("cli/rollout.py", "dflash_provision.verify.reference"):
        "start-up: verify.reference stays off `rollout --help`",
    ("cli/rollout.py", "dflash_provision.verify.runtime_check"):
        "start-up: verify.runtime_check stays off `rollout --help`",
    ("cli/runtime_check.py", "dflash_provision.fleet.report"):
        "start-up: fleet.report stays off `runtime-check --help`",
    ("cli/runtime_check.py", "dflash_provision.inventory.common"):
        "start-up: inventory.common stays off `runtime-check --help`",
    ("cli/runtime_check.py", "dflash_provision.server.container_server"):
        "start-up: server.container_server stays off `runtime-check --help`",
    ("cli/runtime_check.py", "dflash_provision.verify.fleet_check"):
        "start-up: verify.fleet_check stays off `runtime-check --help`",
    ("cli/runtime_check.py", "dflash_provision.verify.reference"):
        "start-up: verify.reference stays off `runtime-check --help`",
    ("cli/runtime_check.py", "dflash_provision.verify.runtime_check"):
        "start-up: verify.runtime_check stays off `runtime-check --help`",
    ("cli/status.py", "dflash_provision.server.container_server"):
        "start-up: server.container_server stays off `status --help`",
    ("cli/status.py", "dflash_provision.server.locate"):
        "start-up: server.locate stays off `status --help`",
    ("cli/status.py", "dflash_provision.server.status"):
        "start-up: server.status stays off `status --help`",
    ("cli/stop.py", "dflash_provision.server.container_server"):
        "start-up: server.container_server stays off `stop --help`",
    ("cli/stop.py", "dflash_provision.server.locate"):
        "start-up: server.locate stays off `stop --help`",
    ("cli/stop.py", "dflash_provision.server.process"):
        "start-up: server.process stays off `stop --help`",
    ("cli/runtime_check.py", "dflash_provision.cli._render"):
        "start-up: cli._render stays off `runtime-check --help` and a single host's check",
    ("cli/validate.py", "dflash_provision.cli._render"):
        "start-up: cli._render stays off `validate --help`",
    ("cli/validate.py", "dflash_provision.host_state.weights_check"):
        "start-up: host_state.weights_check stays off `validate --help`",
    ("cli/validate.py", "dflash_provision.validation.validate"):
        "start-up: validation.validate stays off `validate --help`",
    ("cli/verify.py", "dflash_provision.cli._all_files"):
        "start-up: cli._all_files stays off `verify --help`",
    ("cli/verify.py", "dflash_provision.place.push"):
        "start-up: place.push stays off `verify --help`",
    ("data_dir.py", "platformdirs"):
        "start-up: platformdirs stays off every command given DFLASH_PROVISION_HOME",
    ("history/host_key.py", "dflash_provision.target"):
        "start-up: target (the TARGET grammar) stays off `history`, which reads keys without "
        "parsing targets",
    ("inventory/common.py", "yaml"): "heavy: yaml (PyYAML)",
    ("plain_table.py", "rich.table"): "heavy: rich",
    ("plain_table.py", "rich.text"): "heavy: rich",
    ("remote/place_files.py", "huggingface_hub"): "heavy: huggingface_hub",
    ("source/authority.py", "dflash_provision.source.hub"):
        "start-up: source.hub (the Hub client) stays off every command given a local config",
    ("source/hub.py", "dflash_provision.source.hub_deadline"):
        "start-up: hub_deadline (its stream class subclasses httpx2's) stays off a push that "
        "reads its locked config from the HF cache",
    ("source/hub.py", "httpx"): "heavy: httpx",
    ("source/hub.py", "httpx2"): "heavy: httpx2",
    ("source/hub.py", "huggingface_hub"): "heavy: huggingface_hub",
    ("source/hub.py", "huggingface_hub.errors"): "heavy: huggingface_hub",
    ("source/hub.py", "urllib.request"):
        "heavy: urllib.request (http.client, email), only to ask a proxy",
    ("source/hub_deadline.py", "httpx2"): "heavy: httpx2",
    ("source/hub_deadline.py", "huggingface_hub"): "heavy: huggingface_hub",
    ("source/hub_deadline.py", "huggingface_hub.utils._http"): "heavy: huggingface_hub",
    ("source/hub_tree.py", "huggingface_hub"): "heavy: huggingface_hub",
    ("source/hub_tree.py", "huggingface_hub.hf_api"): "heavy: huggingface_hub",
    ("source/lockfile.py", "dflash_provision.source.hub"):
        "start-up: source.hub (the Hub client) stays off every command that reads a lock file",
    ("source/lockfile.py", "dflash_provision.source.pinned_files"):
        "start-up: source.pinned_files stays off the --help of every command (cli/_connect.py "
        "imports the lock file module)",
    ("source/lockfile.py", "tempfile"):
        "start-up: tempfile (random, shutil, bz2, lzma) stays off every command that reads a lock "
        "file; only a writer needs it",
    ("transport/factory.py", "dflash_provision.transport.container"):
        "start-up: a transport is imported when a target of its kind is opened; --help and local "
        "commands load none",
    ("transport/factory.py", "dflash_provision.transport.local"):
        "start-up: a transport is imported when a target of its kind is opened; --help and local "
        "commands load none",
    ("transport/factory.py", "dflash_provision.transport.ssh"):
        "start-up: transport.ssh (and paramiko) is imported when an SSH target is opened; --help "
        "and local commands load none",
    ("transport/factory.py", "dflash_provision.transport.sudo"):
        "start-up: a transport is imported when a target of its kind is opened; --help and local "
        "commands load none",
    ("transport/ssh/paramiko_import.py", "invoke"): "heavy: invoke (paramiko optional)",
    ("transport/ssh/paramiko_import.py", "paramiko"): "heavy: paramiko",
    ("transport/ssh/paramiko_import.py", "paramiko.config"): "heavy: paramiko",
    ("validation/effective.py", "transformers"): "heavy: transformers",
    ("validation/schema_check.py", "jsonschema"): "heavy: jsonschema",
    ("validation/schema_check.py", "jsonschema.validators"): "heavy: jsonschema",
    ("validation/schema_check.py", "referencing"): "heavy: referencing (jsonschema)",
    ("validation/validate.py", "dflash_provision.validation.effective"):
        "start-up: effective (transformers' loader) stays off a validate answered from the "
        "verdict cache and off `diff`",
    ("validation/validate.py", "dflash_provision.validation.verdict_cache"):
        "start-up: verdict_cache (and data_dir) stays off `diff`, which judges no verdict",
    ("validation/verdict_cache.py", "importlib"):
        "start-up: importlib.metadata (and email) stays off a validate that reads the "
        "transformers version from its dist-info directory",
    ("validation/verdict_cache.py", "tempfile"):
        "start-up: tempfile (random, shutil, bz2, lzma) stays off a validate answered from the "
        "verdict cache; only a new verdict is written",
    ("vllm/probe.py", "transformers"): "heavy: transformers",
    ("vllm/probe.py", "vllm"): "heavy: vllm (optional on the target: the probe runs without it)",
    ("vllm/probe.py", "vllm.config"):
        "heavy: vllm (optional on the target: the probe runs without it)",
    ("vllm/probe.py", "vllm.engine.arg_utils"):
        "heavy: vllm (optional on the target: the probe runs without it)",
    ("vllm/probe.py", "vllm.envs"):
        "heavy: vllm (optional on the target: the probe runs without it)",
    ("vllm/probe.py", "vllm.model_executor.models"):
        "heavy: vllm (optional on the target: the probe runs without it)",
    ("vllm/probe.py", "vllm.transformers_utils.configs.speculators"):
        "heavy: vllm (optional on the target: the probe runs without it)",
    ("vllm/probe.py", "vllm.transformers_utils.configs.speculators.base"):
        "heavy: vllm (optional on the target: the probe runs without it)",
    ("vllm/probe.py", "vllm.triton_utils"):
        "heavy: vllm (optional on the target: the probe runs without it)",
    ("vllm/probe.py", "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils"):
        "heavy: vllm (optional on the target: the probe runs without it)",
}
# fmt: on


def _module_name(package: Path, path: Path) -> str:
    parts = ["dflash_provision", *path.relative_to(package).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(package: Path, name: str) -> bool:
    """Whether ``name`` is a module or package of dflash_provision."""
    if not name.startswith("dflash_provision."):
        return False
    relative = package.joinpath(*name.split(".")[1:])
    return relative.with_suffix(".py").is_file() or (relative / "__init__.py").is_file()


def _imported(package: Path, path: Path, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The modules one import statement names: ``from a import b`` names ``a.b`` when that is a
    module of the package, else ``a``."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = node.module or ""
    if node.level:
        parent = _module_name(package, path).split(".")
        if path.name != "__init__.py":
            parent = parent[:-1]
        parent = parent[: len(parent) - (node.level - 1)]
        base = ".".join([*parent, *([base] if base else [])])
    return {
        f"{base}.{alias.name}" if _is_module(package, f"{base}.{alias.name}") else base
        for alias in node.names
    }


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def local_imports(package: Path = PACKAGE) -> dict[tuple[str, str], list[int]]:
    """(path, imported module) -> the lines of every import inside a function in ``package``."""
    found: dict[tuple[str, str], list[int]] = {}

    def walk(path: Path, node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            if in_function and isinstance(child, ast.Import | ast.ImportFrom):
                where = path.relative_to(package).as_posix()
                for module in _imported(package, path, child):
                    found.setdefault((where, module), []).append(child.lineno)
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            walk(path, child, inside)

    for path in sorted(package.rglob("*.py")):
        walk(path, ast.parse(path.read_text(encoding="utf-8")), False)
    return found


def test_every_function_local_import_is_allowed_with_its_reason() -> None:
    unlisted = [
        f"{path}:{lines[0]} imports {module} inside a function"
        for (path, module), lines in sorted(local_imports().items())
        if (path, module) not in ALLOWED
    ]
    assert unlisted == [], (
        "move these imports to the top of their module, or list them in ALLOWED with the "
        "cycle, heavy library or start-up path they protect:\n  " + "\n  ".join(unlisted)
    )


def test_every_allowed_entry_still_matches_a_local_import() -> None:
    found = local_imports()
    stale = [f"{path}: {module}" for path, module in sorted(ALLOWED) if (path, module) not in found]
    assert stale == [], "no longer imported inside a function: remove from ALLOWED:\n  " + (
        "\n  ".join(stale)
    )


def test_every_reason_names_its_class() -> None:
    bad = {key: why for key, why in ALLOWED.items() if not _REASON.fullmatch(why)}
    assert bad == {}, "a reason starts with 'cycle: ', 'heavy: ' or 'start-up: '"


def test_the_walk_finds_imports_in_functions_only_and_skips_type_checking(tmp_path: Path) -> None:
    # The counter itself, on a package of its own: what it must find and what it must not.
    package = tmp_path / "dflash_provision"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "leaf.py").write_text("")
    (package / "sub" / "user.py").write_text(
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import csv\n"
        "def f():\n"
        "    import shlex\n"
        "    from . import leaf\n"
        "    from .leaf import thing\n"
        "    if TYPE_CHECKING:\n"
        "        import json\n"
        "    def inner():\n"
        "        import zlib\n"
        "class C:\n"
        "    import glob\n"
        "    async def m(self):\n"
        "        import gzip\n"
    )
    assert local_imports(package) == {
        ("sub/user.py", "shlex"): [6],
        ("sub/user.py", "dflash_provision.sub.leaf"): [7, 8],
        ("sub/user.py", "zlib"): [12],
        ("sub/user.py", "gzip"): [16],
    }
