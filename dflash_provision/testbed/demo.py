"""The README's first command (`make demo`): the main job end to end on built-in defaults.

Everything runs on this machine: a local Hub stand-in plays the Hub, and every step is the real
`dflash-provision` CLI in a subprocess, printed as a shell transcript so a new user sees exactly
what to type on their own fleet.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from dflash_provision.testbed import samples
from dflash_provision.testbed.hub_standin import HubStandin

WORKDIR = Path(".demo")


class Transcript:
    """Runs CLI steps and prints them like a terminal session; remembers failed expectations."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env = env
        self.cwd = cwd
        self.surprises: list[str] = []

    def heading(self, text: str) -> None:
        print(f"\n## {text}", flush=True)

    def cli(self, args: Sequence[str], *, expect: int = 0) -> subprocess.CompletedProcess[str]:
        shown = shlex.join(["dflash-provision", *args])
        print(f"$ {shown}", flush=True)
        done = subprocess.run(
            [sys.executable, "-m", "dflash_provision", *args],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        for line in (done.stdout + done.stderr).rstrip("\n").splitlines():
            print(f"  {line}")
        print(f"  [exit {done.returncode}]", flush=True)
        if done.returncode != expect:
            self.surprises.append(f"{shown}: exit {done.returncode}, expected {expect}")
        return done


def run_demo(workdir: Path = WORKDIR) -> int:
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    incident = workdir / "incident-config.json"
    shutil.copyfile(samples.INCIDENT_DRAFTER, incident)

    with HubStandin() as hub:
        env = dict(os.environ)
        env.update(
            HF_ENDPOINT=hub.url,
            HF_HOME=str((workdir / "hf-home").resolve()),
            HF_HUB_DISABLE_TELEMETRY="1",
            DFLASH_PROVISION_HOME=str((workdir / "state").resolve()),
        )
        env.pop("HF_TOKEN", None)
        t = Transcript(env, workdir)
        print(f"Local Hub stand-in at {hub.url} (plays huggingface.co for this demo)")

        t.heading("1. Fetch the authoritative drafter config, pinned to a commit sha")
        t.cli(["fetch", samples.REFERENCE_REPO, "-o", "config.json"])
        print("  dflash.lock:")
        for line in (workdir / "dflash.lock").read_text().splitlines():
            print(f"    {line}")

        t.heading("2. Validate it: schema, DFlash invariants, what transformers will load")
        t.cli(["validate", "config.json", "--target-config", samples.REFERENCE_TARGET_REPO])

        t.heading("3. The incident's hand-written file, checked against the authoritative one")
        t.cli(["validate", incident.name, "--against", "config.json"], expect=3)
        t.cli(["diff", incident.name, "config.json"], expect=4)
        normalised = workdir / "normalised-config.json"
        config = json.loads((workdir / "config.json").read_bytes())
        config["use_sliding_window"] = False
        normalised.write_text(json.dumps(config, indent=2) + "\n")
        t.heading("4. A file that looks right but that transformers would normalise at load time")
        t.cli(["validate", normalised.name, "--no-effective"], expect=3)
        t.cli(["validate", normalised.name], expect=3)

        with throwaway_hosts(workdir / "fleet") as hosts:
            run_push_steps(t, hosts)

    if t.surprises:
        print("\nDEMO FAILED: " + "; ".join(t.surprises), file=sys.stderr)
        return 1
    print("\nDemo finished: every step behaved as documented.")
    return 0


class DemoHosts:
    """The throwaway SSH hosts the demo pushes to, with how to reach and tamper with them."""

    def __init__(
        self,
        ssh_config: Path,
        names: list[str],
        model_dir: str,
        tamper: Callable[[str, str, bytes], None],
        note: str,
    ) -> None:
        self.ssh_config = ssh_config
        self.names = names
        self.model_dir = model_dir
        self.tamper = tamper  # (host name, path, bytes): write a file behind the tool's back
        self.note = note

    def target(self, name: str) -> str:
        return f"{name}:{self.model_dir}"


@contextlib.contextmanager
def throwaway_hosts(base_dir: Path, count: int = 6) -> Iterator[DemoHosts]:
    """Real sshd hosts: a fleet in namespaces as root, else one sshd on a high port as you."""
    from dflash_provision.testbed import hosts

    if os.geteuid() == 0 and hosts.missing_prerequisites(need_root=True) is None:
        with hosts.Fleet(base_dir, count, address_prefix=None) as fleet:

            def tamper(name: str, path: str, data: bytes) -> None:
                fleet.host(name).exec(
                    ["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", path],
                    stdin=data,
                    text=False,
                    check=True,
                )

            yield DemoHosts(
                fleet.client.ssh_config,
                [h.name for h in fleet.hosts],
                "/root/models/Qwen3.6-27B-DFlash",
                tamper,
                f"{count} real sshd hosts, each in its own namespaces with a private /root, "
                f"on {fleet.hosts[0].address}..{fleet.hosts[-1].address}",
            )
        return
    with hosts.single_user_sshd(base_dir) as sshd:
        model_dir = str((base_dir / "models" / "Qwen3.6-27B-DFlash").resolve())

        def tamper_local(name: str, path: str, data: bytes) -> None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_bytes(data)

        assert sshd.client is not None
        yield DemoHosts(
            sshd.client.ssh_config,
            [sshd.alias],
            model_dir,
            tamper_local,
            f"one sshd as {sshd.user} on 127.0.0.1:{sshd.port} (not root: no namespaces)",
        )


def run_push_steps(t: Transcript, hosts: DemoHosts) -> None:
    ssh = ["--ssh-config", str(hosts.ssh_config)]
    first = hosts.names[0]
    target = hosts.target(first)
    print(f"\nThrowaway hosts: {hosts.note}")
    print(f"(~/.ssh/config-style aliases in {hosts.ssh_config})")

    t.heading("5. Push it (from dflash.lock) to a host and prove it landed")
    t.cli(["push", target, "--mkdir", *ssh])
    t.cli(["verify", target, *ssh])
    t.cli(["push", target, *ssh])

    t.heading("6. The incident: someone overwrites the file by hand; verify catches it")
    hosts.tamper(first, f"{hosts.model_dir}/config.json", samples.INCIDENT_DRAFTER.read_bytes())
    t.cli(["verify", target, *ssh], expect=4)
    t.cli(["push", target, "--dry-run", *ssh])
    t.cli(["push", target, *ssh])
    t.cli(["rollback", target, "--list", *ssh])


if __name__ == "__main__":
    sys.exit(run_demo())
