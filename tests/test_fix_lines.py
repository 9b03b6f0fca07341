"""The fix-line parser the tests prove every printed fix with (tests/fixtures/fix_lines.py): a
container's restart (``docker restart -- NAME``, what doctor and runtime-check print with
``--container``) parses by its strict shape; what a user could not paste does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.fix_lines import parse

SOCKET = "unix:///run/user/1000/docker.sock"


@pytest.mark.parametrize(
    "line",
    [
        "docker restart -- vllm",
        f"docker -H {SOCKET} restart -- vllm",
        "podman restart -- vllm-0",
        "docker stop --time 30 -- vllm",
        "dflash-provision push /srv/models/X --from ./c.json && docker restart -- vllm",
        "dflash-provision push /srv/models/X --from ./c.json  # first save it as ./c.json",
    ],
)
def test_a_pasteable_container_or_cli_line_parses(
    line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "c.json").write_text("{}")  # click checks that --from's file exists
    monkeypatch.chdir(tmp_path)
    assert parse(line)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("docker restart vllm", "no `--` before the name"),
        ("docker rm -- vllm", "not a known docker subcommand"),
        ("docker restart --force -- vllm", "unknown option '--force'"),
        ("docker restart --time -- vllm", "--time needs seconds"),
        ("docker restart -- vllm other", "takes one container name"),
        ("docker restart -- NAME", "placeholder"),
        (f"podman -H {SOCKET} restart -- vllm", "podman has no -H"),
        ("dflash-provision push TARGET --from ./c.json", "placeholder"),
        ("dflash-provision push /srv/models/X --from", "requires an argument"),
        ("dflash-provision push /srv/models/X --from ./other.json", "does not exist"),
    ],
)
def test_a_line_a_user_could_not_paste_is_refused(
    line: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "c.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AssertionError, match=said):
        parse(line)
