"""The shipped package stands on its own and its tree shows the pipeline: the test bed is a
package of its own beside tests/ and bench/ (the wheel ships only dflash_provision), nothing
shipped imports it, and every stage is a package that says its job."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "dflash_provision"


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_shipped_module_imports_the_test_bed() -> None:
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if any(name == "testbed" or name.startswith("testbed.") for name in _imported_modules(path))
    ]
    assert offenders == []


def test_the_test_bed_lives_beside_tests_and_bench_not_in_the_product() -> None:
    assert (REPO / "testbed" / "__init__.py").is_file()
    assert not (PACKAGE / "testbed").exists()


#: What stays at the package's top: what every stage shares (the exit-code table, the state
#: directory, text tables, name lookup, the TARGET grammar). Every other module lives in its
#: stage's package (tests/test_house_layers.py gives each its floor).
TOP_LEVEL = {"__init__", "__main__", "errors", "data_dir", "plain_table", "netlookup", "target"}


def test_the_top_level_holds_only_what_every_stage_shares() -> None:
    assert {p.stem for p in PACKAGE.glob("*.py")} == TOP_LEVEL


def test_every_package_says_its_job_in_its_docstring() -> None:
    """A newcomer finds where a concept lives from the tree and these first lines."""
    silent = [
        str(init.parent.relative_to(REPO))
        for init in PACKAGE.rglob("__init__.py")
        if len(ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or "") < 40
    ]
    assert silent == []


def test_exit_codes_come_from_one_table_not_from_the_console_entry() -> None:
    """The console entry (cli/entry.py) is the process's start, not a table of constants: no
    module imports it (the Ctrl-C code 130 is ExitCode.INTERRUPTED, beside every other code)."""
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "__main__.py" and "dflash_provision.cli.entry" in _imported_modules(path)
    ]
    assert offenders == []


def _private_imports(path: Path) -> list[str]:
    """``from dflash_provision.X import _name``: another module's private name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dflash_provision")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]


def test_no_module_imports_another_modules_private_name() -> None:
    """What one module shares with another is public (the remote protocol's reply parser, the
    Prometheus label writer, launch's env rules): a private name imported elsewhere is a home
    that was never made one."""
    offenders = {
        str(path.relative_to(PACKAGE)): names
        for path in PACKAGE.rglob("*.py")
        if (names := _private_imports(path))
    }
    assert offenders == {}


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def test_the_remote_scripts_have_one_protocol_module() -> None:
    """Loading a script, its argv and the parse of its answer live in remote/protocol.py only:
    no second loader or parser to drift from the first."""
    protocol = PACKAGE / "remote" / "protocol.py"
    names = {"script_text", "script_argv", "parse_reply", "without_comments", "stderr_line"}
    elsewhere = [
        f"{path.relative_to(PACKAGE)}:{fn.name}"
        for path in PACKAGE.rglob("*.py")
        if path != protocol
        for fn in _functions(path)
        if fn.name in names
    ]
    assert elsewhere == []
    # protocol.script_text tells a runtime script from a file-protocol one by the file found
    remote = {p.name for p in (PACKAGE / "remote" / "scripts").glob("*.sh")}
    runtime = {p.name for p in (PACKAGE / "server" / "scripts").glob("*.sh")}
    assert remote & runtime == set()


def _numeric_defaults(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    with_default = positional[len(positional) - len(args.defaults) :]
    pairs = list(zip(with_default, args.defaults, strict=True))
    keywords = zip(args.kwonlyargs, args.kw_defaults, strict=True)
    pairs += [(a, d) for a, d in keywords if d is not None]
    return [
        a.arg for a, d in pairs if isinstance(d, ast.Constant) and type(d.value) in (int, float)
    ]


def test_no_remote_command_has_a_timeout_of_its_own() -> None:
    """A remote command's limit is the transport's --command-timeout unless a caller asks for
    another: no ``command_timeout`` parameter anywhere, and no timeout in remote/, defaults to
    a number of seconds."""
    offenders = [
        f"{path.relative_to(PACKAGE)}:{fn.name}({name})"
        for path in PACKAGE.rglob("*.py")
        for fn in _functions(path)
        for name in _numeric_defaults(fn)
        if name == "command_timeout" or ("timeout" in name and "remote" in path.parts)
    ]
    assert offenders == []
