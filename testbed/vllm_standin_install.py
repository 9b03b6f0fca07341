"""Install the vLLM STAND-IN (``vllm_standin.py``) as a ``vllm`` command for tests: on this
machine, on a fake SSH host, or inside an LXC busybox container (in a fake host or here).

``install_standin(place, dest_dir)`` writes three files into ``dest_dir`` at that place:

- ``vllm_standin.py``: the stand-in's source;
- ``python3``: a ``#!/bin/sh`` wrapper that runs a python able to import transformers there;
- ``vllm``: a ``#!/bin/sh`` shim, ``exec DEST/python3 DEST/vllm_standin.py "$@"``.

and returns a ``StandinInstall`` whose ``vllm`` is the path to pass as ``--vllm`` and whose
``python`` is the wrapper (for in-container HTTP requests and the target-side probe).

Where the python comes from (WHY it is not simply the project's ``.venv/bin/python``: that links
into ``/root/.pyenv``, and ``/root`` is private inside a fake host):

- local: ``sys.executable`` (this process's interpreter, which has transformers);
- fake host: the machine's ``/usr/bin/python3`` (same minor version as the venv) with
  ``PYTHONPATH`` = this venv's site-packages (under /work, visible inside the host);
- busybox container (no python at all): read-only bind mounts, set in the container's LXC config,
  of the machine's ``/usr`` at ``/opt/dflash-standin/usr`` and of the site-packages at
  ``/opt/dflash-standin/site-packages``; the wrapper runs that python with ``PYTHONHOME`` set
  (through the mounted dynamic loader, ``ld-linux-x86-64.so.2 --library-path ...``, when the
  container's own libraries can't run it), so nothing in the container's /lib or /usr is
  touched and its PATH still has no python. A container created
  without those mounts (e.g. the ``lxc_container_on_host`` fixture) gets them added to its config
  and is restarted once (``StandinInstall.restarted``); ``standin_container()`` creates one with
  the mounts from the start. The container's loopback is brought up too (now and in its
  ``/etc/init.d/rcS``): busybox's init leaves ``lo`` down, and a server on 127.0.0.1 there would
  be unreachable even from inside the container.

``write_control(place, path, control)`` writes the stand-in's test-control JSON (see
``vllm_standin``'s docstring for the keys) atomically at ``path`` in that place; point the server
at it with the environment variable ``VLLM_STANDIN_CONTROL=path``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed import vllm_standin
from testbed.hosts import Host
from testbed.lxc import Container, busybox_container

STANDIN_SOURCE = Path(vllm_standin.__file__)
CONTROL_ENV = vllm_standin.CONTROL_ENV
#: Where the container sees the machine's /usr and the venv's site-packages (read-only binds).
CONTAINER_ROOT = "/opt/dflash-standin"
HOST_PYTHON = "/usr/bin/python3"
LOOPBACK_UP = "/bin/ifconfig lo 127.0.0.1 up"
VERIFY_TIMEOUT_S = 120.0  # importing transformers on a loaded 2-core machine takes seconds

Place = Host | Container | None


class StandinInstallError(RuntimeError):
    """The stand-in could not be installed or its python cannot import transformers there."""


@dataclass(frozen=True)
class StandinInstall:
    """Paths valid INSIDE the place where the stand-in was installed."""

    vllm: str  # pass as --vllm
    python: str  # a python with transformers, e.g. for the target-side probe
    dest_dir: str
    where: str  # "local", "host h01", "container c-1a2b3c on h01"
    restarted: bool = False  # the container was restarted to add the python mounts


def site_packages() -> Path:
    """The site-packages holding this process's transformers."""
    import transformers

    return Path(transformers.__file__).resolve().parents[1]


def _loader_and_python() -> tuple[str, str]:
    """Real paths (under /usr) of the machine's dynamic loader and python3 binary."""
    loader = os.path.realpath("/lib64/ld-linux-x86-64.so.2")
    python = os.path.realpath(HOST_PYTHON)
    for path in (loader, python):
        if not path.startswith("/usr/") or not os.path.exists(path):
            raise StandinInstallError(f"cannot use {path} inside a container (not under /usr)")
    return loader, python


def standin_mount_entries() -> list[str]:
    """``lxc.mount.entry`` values that give a busybox container a python with transformers."""
    root = CONTAINER_ROOT.lstrip("/")
    if any(c.isspace() for c in str(site_packages())):
        raise StandinInstallError(f"{site_packages()}: a space can't go into lxc.mount.entry")
    return [
        f"/usr {root}/usr none ro,bind,create=dir 0 0",
        f"{site_packages()} {root}/site-packages none ro,bind,create=dir 0 0",
    ]


# --------------------------------------------------------------------------------------------
# the files


def _shim(python: str, dest_dir: str) -> str:
    return (
        "#!/bin/sh\n"
        "# vllm: the dflash-provision vLLM STAND-IN (a test double, not vLLM)\n"
        f'exec {shlex.quote(python)} {shlex.quote(dest_dir + "/vllm_standin.py")} "$@"\n'
    )


def _host_python_wrapper() -> str:
    packages = shlex.quote(str(site_packages()))
    return (
        "#!/bin/sh\n"
        "# python for the vLLM stand-in on a test host: the machine's python3 with the\n"
        "# project venv's site-packages (the venv's own python lives in the private /root)\n"
        f"PYTHONPATH={packages}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        "PYTHONNOUSERSITE=1\n"
        "export PYTHONPATH PYTHONNOUSERSITE\n"
        f'exec {HOST_PYTHON} "$@"\n'
    )


def _container_python_wrapper(direct: bool) -> str:
    """``direct``: the container's own dynamic loader and libraries run the mounted python (the
    busybox template binds the machine's /lib*, /usr/lib*), so the server's command line reads
    ``python3.11 vllm_standin.py serve ...`` as with a real vllm. Otherwise the mounted loader
    runs it with the mounted libraries (``ld-linux ... --library-path ...`` leads the command
    line then)."""
    loader, python = _loader_and_python()
    root = CONTAINER_ROOT
    run = f"{root}{python}"
    if not direct:
        run = f"{root}{loader} --library-path {root}{os.path.dirname(loader)} {run}"
    return (
        "#!/bin/sh\n"
        "# python for the vLLM stand-in in a busybox container: the machine's python3 from a\n"
        f"# read-only bind mount at {root}\n"
        f"PYTHONHOME={root}/usr\n"
        f"PYTHONPATH={root}/site-packages\n"
        "PYTHONNOUSERSITE=1\n"
        "export PYTHONHOME PYTHONPATH PYTHONNOUSERSITE\n"
        f'exec {run} "$@"\n'
    )


def _container_runs_python_directly(container: Container) -> bool:
    _, python = _loader_and_python()
    probe = f"PYTHONHOME={CONTAINER_ROOT}/usr {CONTAINER_ROOT}{python} -c pass"
    return container.attach(["sh", "-c", probe], timeout=VERIFY_TIMEOUT_S).returncode == 0


# --------------------------------------------------------------------------------------------
# writing into a place


def _run_in(
    place: Place, argv: Sequence[str], stdin: bytes | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[Any]:
    """Run ``argv`` at the place (test set-up, not the product's transports)."""
    if isinstance(place, Host):
        return place.exec(argv, stdin, timeout)
    if isinstance(place, Container):
        return place.attach(argv, stdin, timeout)
    proc = subprocess.run(list(argv), input=stdin, capture_output=True, timeout=timeout)
    return subprocess.CompletedProcess(
        proc.args,
        proc.returncode,
        proc.stdout.decode(errors="replace"),
        proc.stderr.decode(errors="replace"),
    )


def _put(place: Place, path: str, data: bytes, mode: str = "644") -> None:
    """Write ``data`` at ``path`` in the place, atomically (temp file + rename)."""
    script = (
        'set -e; d=$(dirname "$1"); mkdir -p "$d"; t="$1.tmp.$3"; '
        'cat > "$t"; chmod "$2" "$t"; mv -f "$t" "$1"'
    )
    proc = _run_in(place, ["sh", "-c", script, "sh", path, mode, uuid.uuid4().hex[:8]], data)
    if proc.returncode != 0:
        raise StandinInstallError(f"cannot write {path} ({_where(place)}): {proc.stderr.strip()}")


def _where(place: Place) -> str:
    if isinstance(place, Host):
        return f"host {place.name}"
    if isinstance(place, Container):
        on = place.host.name if place.host is not None else "this machine"
        return f"container {place.name} on {on}"
    return "local"


def write_control(place: Place, path: str, control: Mapping[str, Any]) -> None:
    """Write the stand-in's control file at ``path`` in the place (atomic; re-read per request).

    Keys: acceptance (0..1), fail_completions (bool), startup_delay_s (float), die_at_start
    (str), extra_traffic (int). Checked here with the stand-in's own parser, so a typo fails the
    test at once instead of being ignored by the server.
    """
    vllm_standin.parse_control(dict(control))
    _put(place, path, json.dumps(dict(control)).encode())


# --------------------------------------------------------------------------------------------
# containers


def _config_path(container: Container) -> Path:
    return container.rootfs.parent / "config"


def _ensure_loopback_at_boot(container: Container) -> None:
    """Make the container's init bring ``lo`` up: busybox's rcS never does, so 127.0.0.1 is
    "Network is unreachable" inside it and nothing could reach a server listening there."""
    rcs = container.rootfs / "etc" / "init.d" / "rcS"
    text = rcs.read_text() if rcs.exists() else "#!/bin/sh\n"
    if LOOPBACK_UP in text:
        return
    first, _, rest = text.partition("\n")
    # Before udhcpc, which never returns in a container without a network.
    rcs.write_text(f"{first}\n{LOOPBACK_UP}\n{rest}")
    rcs.chmod(0o744)


def _ensure_mounts(container: Container) -> bool:
    """Add the python mounts to the container's config and lo to its boot; restart it if it
    ran without them. True: restarted."""
    _ensure_loopback_at_boot(container)
    config = _config_path(container)
    text = config.read_text()
    missing = [e for e in standin_mount_entries() if f"lxc.mount.entry = {e}" not in text]
    if missing:
        lines = "".join(f"lxc.mount.entry = {e}\n" for e in missing)
        note = "\n# dflash-provision vLLM stand-in: a python with transformers\n"
        config.write_text(text.rstrip("\n") + note + lines)
    if container.state() != "RUNNING":
        return False
    if missing:
        container.stop()
        container.start()
        return True
    proc = container.attach(["sh", "-c", LOOPBACK_UP])  # started before rcS had the line
    if proc.returncode != 0:
        raise StandinInstallError(f"cannot bring lo up in {container.name}: {proc.stderr}")
    return False


def standin_container(host: Host | None = None, *, lxcpath: str | Path | None = None) -> Container:
    """A running busybox container that already has the stand-in's python mounts."""
    container = busybox_container(host=host, lxcpath=lxcpath, start=False)
    try:
        _ensure_mounts(container)
        container.start()
    except BaseException:
        container.destroy()
        raise
    return container


# --------------------------------------------------------------------------------------------
# installing


def install_standin(place: Place, dest_dir: str, *, verify: bool = True) -> StandinInstall:
    """Install the stand-in as ``DEST_DIR/vllm`` at the place (None = this machine).

    ``verify`` (default) runs the installed python once to prove it imports transformers there
    (a few seconds); a failure raises StandinInstallError with what the python said.
    """
    dest_dir = dest_dir.rstrip("/") or "/"
    restarted = False
    if isinstance(place, Container):
        restarted = _ensure_mounts(place)
        wrapper: str | None = _container_python_wrapper(_container_runs_python_directly(place))
    elif isinstance(place, Host):
        if site_packages().is_relative_to("/root"):
            raise StandinInstallError(f"{site_packages()} is under /root, invisible in a host")
        wrapper = _host_python_wrapper()
    else:
        wrapper = None
    python = f"{dest_dir}/python3" if wrapper is not None else sys.executable
    if wrapper is not None:
        _put(place, python, wrapper.encode(), "755")
    _put(place, f"{dest_dir}/vllm_standin.py", STANDIN_SOURCE.read_bytes())
    vllm = f"{dest_dir}/vllm"
    _put(place, vllm, _shim(python, dest_dir).encode(), "755")
    result = StandinInstall(vllm, python, dest_dir, _where(place), restarted)
    if verify:
        _verify(place, result)
    return result


def _verify(place: Place, installed: StandinInstall) -> None:
    check = "import transformers, sys; print(transformers.__version__)"
    proc = _run_in(place, [installed.python, "-c", check], timeout=VERIFY_TIMEOUT_S)
    if proc.returncode != 0:
        raise StandinInstallError(
            f"{installed.python} ({installed.where}) cannot import transformers: "
            f"{proc.stderr.strip()[-800:]}"
        )
    proc = _run_in(place, [installed.vllm, "--version"], timeout=VERIFY_TIMEOUT_S)
    if proc.returncode != 0 or not proc.stdout.startswith(vllm_standin.VERSION):
        raise StandinInstallError(
            f"{installed.vllm} --version ({installed.where}) said {proc.stdout!r} "
            f"{proc.stderr.strip()[-400:]!r}"
        )
