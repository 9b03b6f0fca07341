"""Hostile JSON never ends in a traceback, never validates, and is never pushed.

Deep nesting (any depth) is a parse error with its line and column; numbers that overflow to
infinity or exceed any realistic size fail the parse layer with their JSON path; ``diff --json``
prints JSON only; ``diff`` on a duplicate key says so instead of "identical"; and any exception
nobody expected is one line that says how to see the traceback (exit 1).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from dflash_provision.formats import strict_json
from dflash_provision.validation.diff import config_diff
from dflash_provision.validation.validate import parse_config, validate_config
from testbed import samples
from testbed.hosts import Host
from tests.fixtures.cli import Cli, run_cli, the_error_line
from tests.fixtures.ssh import host_args

REFERENCE_TEXT = samples.REFERENCE_DRAFTER.read_text()
REFERENCE = REFERENCE_TEXT.encode()
MODEL = "/root/models/Qwen3.6-27B-DFlash"


def reference_with(field: str, literal: str) -> bytes:
    """The reference drafter with one top-level field's value replaced by ``literal`` as is."""
    doc = json.loads(REFERENCE_TEXT)
    marker = f'"{field}": {json.dumps(doc[field])}'
    assert marker in REFERENCE_TEXT
    return REFERENCE_TEXT.replace(marker, f'"{field}": {literal}').encode()


def nested(depth: int) -> bytes:
    return ('{"a": ' + "[" * depth + "]" * depth + "}").encode()


# ---------------------------------------------------------------------------------------------
# the parse layer


@pytest.mark.parametrize("depth", [64, 5_000, 1_000_000])
def test_deep_nesting_is_a_parse_error_at_the_line_and_column_where_it_gets_too_deep(
    depth: int,
) -> None:
    parsed = parse_config(nested(depth))
    assert parsed.doc is None
    (finding,) = parsed.findings
    # '{' (column 1) is level 1; after '"a": ', the 64th '[' (column 70) is level 65.
    assert finding.message == "invalid JSON at line 1, column 70: nested more than 64 levels deep"


def test_nesting_at_the_limit_still_parses() -> None:
    assert parse_config(nested(63)).findings == []


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = json.dumps({"note": "[" * 500, "esc": '\\"[[[' * 100}).encode()
    assert parse_config(text).findings == []


@pytest.mark.parametrize(
    ("literal", "words"),
    [
        ("1e999999", "number 1e999999 overflows to infinity"),
        ("-1e999999", "number -1e999999 overflows to infinity"),
        (str(2**4000), "(1205 digits) is beyond any realistic value (limit: a 64-bit integer)"),
        ("9" * 5000, "(5000 digits) is beyond any realistic value"),
        (str(2**63), "number 9223372036854775808 is beyond any realistic value"),
    ],
)
def test_absurd_numbers_fail_the_parse_layer_with_their_path(literal: str, words: str) -> None:
    report = validate_config(reference_with("rope_theta", literal), label="x", effective=False)
    assert not report.ok
    assert report.layers["parse"] == "failed"
    (finding,) = report.findings_for("parse")
    assert finding.path == "rope_theta"
    assert words in finding.message


def test_the_largest_64_bit_integer_is_still_a_number() -> None:
    assert strict_json.loads(f"[{2**63 - 1}, {-(2**63 - 1)}, 1e308]") == [
        2**63 - 1,
        -(2**63 - 1),
        1e308,
    ]


def test_nested_bad_numbers_are_named_by_path_and_counted() -> None:
    with pytest.raises(strict_json.StrictJsonError) as caught:
        strict_json.loads('{"b": [1, 1e400], "a": {"x": -1e400}}')
    assert caught.value.path == "a.x"
    assert str(caught.value) == "a.x: number -1e400 overflows to infinity (+1 more)"


def test_push_diff_of_a_hostile_current_file_is_a_note_not_a_crash() -> None:
    for hostile in (nested(100_000), reference_with("rope_theta", "1e999999")):
        diff = config_diff(hostile, REFERENCE)
        assert diff.note is not None and "current file is not valid JSON" in diff.note


# ---------------------------------------------------------------------------------------------
# the real CLI (in-process; the planted bug needs a real process: sitecustomize)


def test_validate_cli_refuses_an_infinite_rope_theta_that_used_to_pass(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_bytes(reference_with("rope_theta", "1e999999"))
    done = Cli(tmp_path, in_process=True).run("validate", str(bad), "--json")
    assert done.returncode == ExitCode.INVALID, done.stderr
    report = json.loads(done.stdout)
    assert report["layers"]["parse"] == "failed"
    assert report["findings"][0]["path"] == "rope_theta"


def test_validate_cli_on_a_document_nested_to_the_size_limit_is_a_parse_error_not_a_traceback(
    tmp_path: Path,
) -> None:
    # As deep as the 1 MiB read limit allows (deeper files are refused by size first).
    bad = tmp_path / "deep.json"
    bad.write_bytes(nested(500_000))
    done = Cli(tmp_path, in_process=True).run("validate", str(bad))
    assert done.returncode == ExitCode.INVALID
    assert "Traceback" not in done.stderr
    assert "line 1, column 70: nested more than 64 levels deep" in done.stdout


def test_diff_json_prints_only_json_and_refuses_an_infinite_number(tmp_path: Path) -> None:
    bad = tmp_path / "a.json"
    bad.write_bytes(reference_with("rope_theta", "1e999999"))
    done = Cli(tmp_path, in_process=True).run(
        "diff", "--json", str(bad), str(samples.REFERENCE_DRAFTER)
    )
    line = the_error_line(done, ExitCode.INVALID, "rope_theta", "overflows to infinity")
    # Never "Infinity", which is not JSON: the one document is the refusal's (strict JSON).
    doc = json.loads(done.stdout, parse_constant=lambda c: pytest.fail(f"{c} in --json"))
    assert (doc["status"], doc["exit_code"]) == ("invalid", ExitCode.INVALID)
    assert doc["error"] == line.removeprefix("error: ")


def test_diff_json_output_always_parses_as_strict_json(tmp_path: Path) -> None:
    other = tmp_path / "b.json"
    other.write_bytes(reference_with("rms_norm_eps", "1e-300"))
    done = Cli(tmp_path, in_process=True).run(
        "diff", "--json", str(samples.REFERENCE_DRAFTER), str(other)
    )
    assert done.returncode == ExitCode.DRIFT, done.stderr
    payload = strict_json.loads(done.stdout)
    assert payload["changes"] == [
        {"path": "rms_norm_eps", "kind": "changed", "old": 1e-06, "new": 1e-300}
    ]


def test_diff_on_a_duplicate_key_says_so_instead_of_identical(tmp_path: Path) -> None:
    doubled = tmp_path / "doubled.json"
    doubled.write_text('{"sliding_window": null, "sliding_window": 2048}')
    single = tmp_path / "single.json"
    single.write_text('{"sliding_window": 2048}')
    for args in ((str(doubled), str(single)), (str(single), str(doubled))):
        done = Cli(tmp_path, in_process=True).run("diff", *args)
        assert "identical" not in done.stdout
        the_error_line(done, ExitCode.INVALID, "sliding_window appears twice (null, then 2048)")


def test_unexpected_exception_is_one_line_that_says_how_to_get_the_traceback(
    tmp_path: Path,
) -> None:
    # A bug is planted in a real CLI process (the installed entry point, unmodified) by a
    # sitecustomize module that breaks the validator: nothing in the product knows about it.
    (tmp_path / "sitecustomize.py").write_text(
        "import dflash_provision.validation.validate as v\n"
        "def broken(*args, **kwargs):\n"
        "    raise KeyError('planted bug\\nsecond line')\n"
        "v.validate_config = broken\n"
    )
    env = {"PYTHONPATH": str(tmp_path)}
    args = ["validate", "--no-effective", str(samples.REFERENCE_DRAFTER)]
    done = run_cli(*args, env=env, entry_point=True)
    line = the_error_line(done, ExitCode.ERROR, "unexpected KeyError", "'planted bug")
    assert line.endswith("; run with --debug (or DFLASH_PROVISION_DEBUG=1) for the traceback")
    debug = run_cli("--debug", *args, env=env, entry_point=True)
    assert debug.returncode == ExitCode.ERROR
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.rstrip().splitlines()[-1].startswith("error: unexpected KeyError")


# ---------------------------------------------------------------------------------------------
# real hosts: never pushed, and a hostile file already on a host is just "invalid"


def _model_dir(host: Host) -> Path:
    return host.root_dir / MODEL[len("/root/") :]


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.parametrize("literal", ["1e999999", str(2**4000)])
def test_push_of_an_absurd_number_is_refused_and_the_host_file_is_untouched(
    ssh_host: Host, tmp_path: Path, literal: str
) -> None:
    directory = _model_dir(ssh_host)
    directory.mkdir(parents=True)
    (directory / "config.json").write_bytes(REFERENCE)
    bad = tmp_path / "config.json"
    bad.write_bytes(reference_with("max_position_embeddings", literal))
    spec = f"{ssh_host.alias}:{MODEL}"
    done = Cli(tmp_path, in_process=True).run(
        "push", spec, "--from", str(bad), *host_args(ssh_host)
    )
    the_error_line(done, ExitCode.INVALID, "refusing to push", "max_position_embeddings")
    assert sorted(p.name for p in directory.iterdir()) == ["config.json"]
    assert (directory / "config.json").read_bytes() == REFERENCE


@pytest.mark.parametrize("literal", ["1e999999", str(2**4000)])
def test_force_does_not_push_a_number_that_does_not_parse_as_a_config(
    tmp_path: Path, literal: str
) -> None:
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_bytes(REFERENCE)
    bad = tmp_path / "bad.json"
    bad.write_bytes(reference_with("rope_theta", literal))
    done = Cli(tmp_path, in_process=True).run("push", str(directory), "--from", str(bad), "--force")
    the_error_line(done, ExitCode.INVALID, "even with --force", "rope_theta")
    assert sorted(p.name for p in directory.iterdir()) == ["config.json"]
    assert (directory / "config.json").read_bytes() == REFERENCE


@pytest.mark.integration
@pytest.mark.root
def test_push_over_a_hostile_deep_file_writes_and_audit_calls_it_invalid(
    ssh_host: Host, tmp_path: Path
) -> None:
    directory = _model_dir(ssh_host)
    directory.mkdir(parents=True)
    (directory / "config.json").write_bytes(nested(200_000))
    spec = f"{ssh_host.alias}:{MODEL}"
    ref = str(samples.REFERENCE_DRAFTER)
    audit = Cli(tmp_path, in_process=True).run(
        "audit", spec, "--from", ref, "--json", *host_args(ssh_host)
    )
    assert audit.returncode == ExitCode.DRIFT, audit.stderr
    (host,) = json.loads(audit.stdout)["hosts"]
    assert host["status"] == "invalid"
    assert "nested more than 64 levels deep" in host["detail"]
    pushed = Cli(tmp_path, in_process=True).run(
        "push", spec, "--from", ref, "--json", *host_args(ssh_host)
    )
    assert pushed.returncode == 0, pushed.stderr
    result = json.loads(pushed.stdout)
    assert result["status"] == "written"
    assert (directory / "config.json").read_bytes() == REFERENCE
