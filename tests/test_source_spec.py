"""The one authoritative-source model (dflash_provision.source.authority): SourceSpec -> Authority.

Unit tests for the rules that live only there (one source, the default lock, repo@revision, the
revision override of inventories and fleet options, the lazily parsed document), plus one test
on the real huggingface_hub client against the local Hub stand-in: an inventory's pinned
revision is the one fetched, whatever ``@rev`` its repo id carries.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dflash_provision.errors import ConfigInvalid, UsageError
from dflash_provision.inventory import Overrides, load_inventory
from dflash_provision.source.authority import (
    Authority,
    RepoRef,
    SourceConflict,
    SourceSpec,
)
from testbed import samples
from testbed.hub_standin import (
    REFERENCE_MAIN_SHA,
    REFERENCE_OLD_SHA,
    older_reference_layout,
)

SHA = "5f7c2b9e0d4a1c3b8e6f9a2d7c4b1e0f3a5d8c6b"
REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()


# -- exactly one source ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"repo": "a/b", "from_file": "x.json"}, "--repo and --from"),
        ({"repo": "a/b", "lock": "l.lock"}, "--repo and --lock"),
        ({"from_file": "x.json", "lock": "l.lock"}, "--from and --lock"),
        ({"repo": "a/b", "from_file": "x.json", "lock": "l.lock"}, "--repo and --from and --lock"),
    ],
)
def test_two_sources_on_the_command_line_are_refused(options, named):
    with pytest.raises(UsageError, match=f"^give one authoritative source, not {named}$"):
        SourceSpec.from_options(**options)


def test_the_model_itself_refuses_two_sources_whoever_builds_it():
    with pytest.raises(SourceConflict) as raised:
        SourceSpec(repo=RepoRef("a/b", SHA), lock="/tmp/l.lock")
    assert raised.value.given == ("repo", "lock")
    assert raised.value.exit_code == UsageError.exit_code


def test_two_sources_are_refused_before_a_malformed_repo_is_judged():
    with pytest.raises(UsageError, match="one authoritative source"):
        SourceSpec.from_options(repo="not a repo", lock="l.lock")


def test_revision_without_repo_is_refused():
    with pytest.raises(UsageError, match=r"^--revision needs --repo$"):
        SourceSpec.from_options(from_file="x.json", revision=SHA)


@pytest.mark.parametrize(
    "inventory",
    [
        f"""
        defaults:
          path: /root/models/X
          drafter: {{repo: z/r, revision: {SHA}, lock: a.lock}}
        hosts: [h1]
        """,
        f"""
        all:
          hosts:
            h1: {{dflash_path: /root/models/X, dflash_repo: z/r, dflash_revision: {SHA},
                 dflash_lock: a.lock}}
        """,
    ],
    ids=["ours", "ansible"],
)
def test_inventories_refuse_two_sources_with_their_own_words(tmp_path, inventory):
    path = tmp_path / "fleet.yaml"
    path.write_text(textwrap.dedent(inventory))
    with pytest.raises(UsageError) as raised:
        load_inventory(path)
    message = raised.value.message
    assert message.startswith(f"{path}:")
    assert "exactly one" in message
    assert "repo" in message and "lock" in message
    assert "--repo" not in message  # an inventory's fields, not the command line's flags


# -- the default lock --------------------------------------------------------------------------


def test_nothing_named_means_the_default_lock(tmp_path):
    lock = tmp_path / "dflash.lock"
    lock.write_text("{}")
    assert SourceSpec().or_default_lock(lock) == SourceSpec(lock=str(lock))


def test_nothing_named_and_no_default_lock_says_how_to_name_one(tmp_path):
    missing = tmp_path / "dflash.lock"
    with pytest.raises(UsageError) as raised:
        SourceSpec().load(default_lock=missing)
    assert "--repo OWNER/NAME[@REV], --from FILE or --lock FILE" in raised.value.message
    assert str(missing) in raised.value.message


def test_a_named_source_never_looks_at_the_default_lock(tmp_path):
    spec = SourceSpec(from_file=str(samples.REFERENCE_DRAFTER))
    assert spec.or_default_lock(tmp_path / "absent.lock") is spec
    assert spec.load(default_lock=tmp_path / "absent.lock").data == REFERENCE


# -- repo@revision -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("z-lab/Qwen3.6-27B-DFlash", RepoRef("z-lab/Qwen3.6-27B-DFlash", None)),
        (f"z-lab/Qwen3.6-27B-DFlash@{SHA}", RepoRef("z-lab/Qwen3.6-27B-DFlash", SHA)),
        ("z/r@v1.0", RepoRef("z/r", "v1.0")),
    ],
)
def test_repo_ids_parse_to_repo_and_revision_and_print_back_the_same(text, ref):
    assert RepoRef.parse(text) == ref
    assert str(ref) == text


@pytest.mark.parametrize("text", ["noslash", "a/b@", "a/b@x@y", "/abs/path", "a/b c"])
def test_what_is_not_a_repo_id_is_refused(text):
    assert RepoRef.parse(text) is None
    with pytest.raises(UsageError, match="expected OWNER/NAME or OWNER/NAME@REVISION"):
        SourceSpec.from_options(repo=text)


def test_fleet_revision_option_beats_the_at_revision_of_repo():
    spec = SourceSpec.from_options(repo="z/r@main", revision=SHA)
    assert spec.repo == RepoRef("z/r", SHA)
    assert spec.push_options() == ["--repo", f"z/r@{SHA}"]


def test_push_options_name_the_same_source_again():
    spec = SourceSpec.from_options(lock="my.lock", lock_repo="z/r")
    assert spec.push_options() == ["--lock", "my.lock", "--lock-repo", "z/r"]
    assert SourceSpec().push_options() == []  # push falls back to the same default lock


# -- inventory revision override ---------------------------------------------------------------


def test_an_inventory_revision_pins_the_repo_even_when_the_id_carries_one(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            defaults:
              path: /root/models/X
              drafter: {{repo: "z/r@main", revision: {SHA}}}
            hosts: [h1]
            """
        )
    )
    (member,) = load_inventory(path)
    assert member.source == SourceSpec(RepoRef("z/r", SHA))


def test_a_command_line_source_overrides_the_inventory_one(tmp_path):
    path = tmp_path / "hosts.ini"
    path.write_text(f"h1 dflash_path=/root/models/X dflash_repo=z/r dflash_revision={SHA}\n")
    override = SourceSpec.from_options(from_file="x.json").absolute()
    (member,) = load_inventory(path, Overrides(source=override))
    assert member.source == SourceSpec(from_file=str(Path("x.json").resolve()))


def test_a_malformed_repo_in_an_inventory_names_the_file_and_field(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            defaults:
              path: /root/models/X
              drafter: {{repo: "not a repo", revision: {SHA}}}
            hosts: [h1]
            """
        )
    )
    with pytest.raises(
        UsageError, match=r"fleet.yaml:4: defaults.drafter.repo: expected OWNER/NAME"
    ):
        load_inventory(path)


# -- Authority ---------------------------------------------------------------------------------


def test_authority_keeps_the_bytes_and_hashes_them():
    authority = Authority("ref", REFERENCE)
    assert authority.data == REFERENCE
    assert authority.sha256 == hashlib.sha256(REFERENCE).hexdigest()


def test_the_document_is_parsed_only_when_asked_for():
    broken = Authority("broken.json", b"{not json")
    assert broken.sha256  # building and hashing never parse
    with pytest.raises(ConfigInvalid, match=r"^broken\.json: the authoritative config is not"):
        _ = broken.document
    assert Authority("ok", REFERENCE).document == json.loads(REFERENCE)


def test_the_document_is_read_strictly_like_every_config_the_tool_reads():
    with pytest.raises(ConfigInvalid, match="NaN"):
        _ = Authority("nan", b'{"a": NaN}').document


# -- on the real client and the Hub stand-in ---------------------------------------------------

_LOAD_MEMBER_SOURCE = """
import json, sys
from pathlib import Path
from dflash_provision.inventory import load_inventory
(member,) = load_inventory(Path(sys.argv[1]))
authority = member.source.load()
print(json.dumps({"commit": authority.commit_sha, "label": authority.label,
                  "sha256": authority.sha256}))
"""


@pytest.mark.integration
def test_an_inventory_revision_is_the_commit_fetched_from_the_hub(tmp_path, hub_env):
    path = tmp_path / "fleet.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            defaults:
              path: /root/models/X
              drafter: {{repo: "{samples.REFERENCE_REPO}@main", revision: v1}}
            hosts: [h1]
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD_MEMBER_SOURCE, str(path)],
        env=hub_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    assert loaded["commit"] == REFERENCE_OLD_SHA != REFERENCE_MAIN_SHA
    assert loaded["label"] == f"{samples.REFERENCE_REPO}@{REFERENCE_OLD_SHA[:12]} (v1)"
    assert loaded["sha256"] == hashlib.sha256(older_reference_layout()).hexdigest()
