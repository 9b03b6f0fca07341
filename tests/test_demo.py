"""The README's first command (`make demo`) runs the main job end to end as a tutorial: keep it
working, keep its commands pasteable, and keep it readable on an 80-column terminal."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_provision.testbed.demo import CANNOT_RUN, KEEP_MESSAGE

pytestmark = pytest.mark.integration

DEMO = (
    "import sys; from pathlib import Path; from dflash_provision.testbed.demo import run_demo; "
    "sys.exit(run_demo(Path(sys.argv[1]), keep=True, runtime=False))"
)


def shell_lines(transcript: str) -> list[tuple[str, int | None]]:
    """Every ``$`` line of the transcript (continuations joined as the shell joins them) with
    the exit code shown after it; None for set-up lines, which show none."""
    found: list[tuple[str, int | None]] = []
    lines = transcript.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if not line.startswith("$ "):
            continue
        text = line[2:]
        while text.endswith(" \\"):
            text = text[:-2] + " " + lines[index].strip()
            index += 1
        code = None
        for later in lines[index:]:
            if later.startswith(("$ ", "#", "## ")):
                break
            shown = re.fullmatch(r"  \[exit (\d+)\]", later)
            if shown:
                code = int(shown.group(1))
                break
        found.append((text, code))
    return found


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The demo, run once with its Hub stand-in and hosts kept up: (transcript, directory)."""
    root = tmp_path_factory.mktemp("demo-root")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "DFLASH_"))}
    proc = subprocess.Popen(
        [sys.executable, "-c", DEMO, str(root / "demo")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=root,
    )
    assert proc.stdout is not None and proc.stdin is not None
    transcript: list[str] = []
    for line in proc.stdout:  # up to the "stay up" line (or the end, when a step failed)
        transcript.append(line)
        if KEEP_MESSAGE in line:
            break
    try:
        yield "".join(transcript), root, env
    finally:
        rest, errors = proc.communicate("\n", timeout=120)  # Enter: stop the stand-ins
        assert proc.returncode == 0, "".join(transcript)[-3000:] + rest + errors


def test_demo_runs_every_step_as_documented(demo) -> None:  # type: ignore[no-untyped-def]
    out, _, _ = demo
    assert KEEP_MESSAGE in out, out[-3000:]
    # What a new user should see happen, in order.
    steps = [
        "revision  main -> d1f1a5b0c0ffee00000000000000000000000001",
        "dflash_config.mask_token_id: 248064 → 248070",
        "dflash_config.mask_token_id: 248064, authoritative 248070",
        "set use_sliding_window: true",
        "read back and matched",
        "drifted:",
        "6 hosts: 2 in sync, 1 drifted, 1 missing, 1 invalid",
        "6 in sync now",
        "dflash_config_in_sync{",
    ]
    position = 0
    for text in steps:
        found = out.find(text, position)
        assert found >= 0, f"{text!r} missing (or out of order) in the demo output"
        position = found


def test_demo_reads_on_an_80_column_terminal(demo) -> None:  # type: ignore[no-untyped-def]
    out, _, _ = demo
    wide = [line for line in out.splitlines() if len(line) > 80]
    assert wide == []


def test_demo_commands_are_typed_as_a_user_types_them(demo) -> None:  # type: ignore[no-untyped-def]
    out, _, _ = demo
    commands = [text for text, _ in shell_lines(out)]
    programs = {text.split()[0].split("=")[0] for text in commands}
    assert programs <= {"export", "cd", "M", "dflash-provision", "ssh", "cat", "head"}
    # The ssh_config is given once, through the environment, not on every line.
    assert not any("--ssh-config" in text for text in commands)
    assert sum(text.startswith("export DFLASH_PROVISION_SSH_CONFIG=") for text in commands) == 1
    # The hand overwrite is a command too, right before verify catches it. As root the first
    # host is h01; as another user one sshd ("testbed") holds a directory per member (m1...).
    overwrite = next(
        i for i, text in enumerate(commands) if re.match(r"ssh .* (h01|testbed) ", text)
    )
    assert re.search(r'"cat > \$M/(m1/)?config\.json"', commands[overwrite]), commands[overwrite]
    assert commands[overwrite + 1].startswith("dflash-provision verify")


def test_demo_shows_a_long_diff_once_then_summarises_it(demo) -> None:  # type: ignore[no-untyped-def]
    out, _, _ = demo
    assert out.count('layer_types[3]: "full_attention"') == 1
    assert out.count("the same as in step 3") >= 4  # validate --against, verify, push x2, audit


def test_the_transcript_pasted_into_a_shell_does_the_same(demo) -> None:  # type: ignore[no-untyped-def]
    out, root, env = demo
    lines = shell_lines(out)
    script = []
    for text, code in lines:
        script.append(text)
        if code is not None:
            script.append('echo "EXIT $?"')
    done = subprocess.run(
        ["sh", "-c", "\n".join(script)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    pasted = [int(code) for code in re.findall(r"^EXIT (\d+)$", done.stdout, re.MULTILINE)]
    assert pasted == [code for _, code in lines if code is not None], done.stderr[-2000:]


def test_demo_without_openssh_server_says_what_to_install_in_one_line(tmp_path: Path) -> None:
    # DFLASH_TESTBED_SSHD is the testbed's one seam for "where is sshd": a path that does not
    # exist is a machine without openssh-server.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "DFLASH_"))}
    env["DFLASH_TESTBED_SSHD"] = str(tmp_path / "no-such-sshd")
    done = subprocess.run(
        [sys.executable, "-m", "dflash_provision.testbed.demo", "--no-runtime"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == CANNOT_RUN, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout == ""
    assert done.stderr == (
        f"demo: cannot run here: {tmp_path}/no-such-sshd not installed "
        "(apt-get install openssh-server)\n"
    )
    assert not (tmp_path / ".demo").exists()  # nothing started, nothing left
