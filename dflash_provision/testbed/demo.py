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
from dataclasses import dataclass
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

        with throwaway_hosts((workdir / "fleet").resolve()) as hosts:
            run_push_steps(t, hosts)
            run_fleet_steps(t, hosts, workdir)

    if t.surprises:
        print("\nDEMO FAILED: " + "; ".join(t.surprises), file=sys.stderr)
        return 1
    print("\nDemo finished: every step behaved as documented.")
    return 0


@dataclass(frozen=True)
class DemoMember:
    """One place the demo keeps a drafter config: a host alias and a model directory on it."""

    name: str  # inventory name
    alias: str  # ssh_config alias
    model_dir: str

    @property
    def target(self) -> str:
        return f"{self.alias}:{self.model_dir}"

    @property
    def config_path(self) -> str:
        return f"{self.model_dir}/config.json"


@dataclass(frozen=True)
class DemoHosts:
    """The throwaway SSH hosts the demo works on, and a way to tamper behind the tool's back."""

    ssh_config: Path
    members: list[DemoMember]
    tamper: Callable[[DemoMember, bytes | None], None]  # write bytes, or delete with None
    note: str


@contextlib.contextmanager
def throwaway_hosts(base_dir: Path, count: int = 6) -> Iterator[DemoHosts]:
    """Real sshd hosts: a fleet in namespaces as root, else one sshd on a high port as you."""
    from dflash_provision.testbed import hosts

    model = "Qwen3.6-27B-DFlash"
    if os.geteuid() == 0 and hosts.missing_prerequisites(need_root=True) is None:
        with hosts.Fleet(base_dir, count, address_prefix=None) as fleet:

            def tamper(member: DemoMember, data: bytes | None) -> None:
                script = (
                    'mkdir -p "$(dirname "$1")" && cat > "$1"'
                    if data
                    else 'rm -rf "$(dirname "$1")"'
                )
                fleet.host(member.alias).exec(
                    ["sh", "-c", script, "sh", member.config_path],
                    stdin=data or b"",
                    text=False,
                    check=True,
                )

            yield DemoHosts(
                fleet.client.ssh_config,
                [DemoMember(h.name, h.alias, f"/root/models/{model}") for h in fleet.hosts],
                tamper,
                f"{count} real sshd hosts, each in its own namespaces with a private /root, "
                f"on {fleet.hosts[0].address}..{fleet.hosts[-1].address}",
            )
        return
    # Not root: no namespaces, so one sshd as you and one model directory per "host".
    with hosts.single_user_sshd(base_dir / "sshd") as sshd:
        models = (base_dir / "models").resolve()

        def tamper_local(member: DemoMember, data: bytes | None) -> None:
            path = Path(member.config_path)
            if data is None:
                shutil.rmtree(path.parent, ignore_errors=True)
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

        assert sshd.client is not None
        yield DemoHosts(
            sshd.client.ssh_config,
            [
                DemoMember(f"m{i}", sshd.alias, f"{models}/m{i}/{model}")
                for i in range(1, count + 1)
            ],
            tamper_local,
            f"one sshd as {sshd.user} on 127.0.0.1:{sshd.port} (not root: no namespaces, "
            f"so the fleet is {count} model directories behind it)",
        )


def run_push_steps(t: Transcript, hosts: DemoHosts) -> None:
    ssh = ["--ssh-config", str(hosts.ssh_config)]
    first = hosts.members[0]
    print(f"\nThrowaway hosts: {hosts.note}")
    print(f"(~/.ssh/config-style aliases in {hosts.ssh_config})")

    t.heading("5. Push it (from dflash.lock) to a host and prove it landed")
    t.cli(["push", first.target, "--mkdir", *ssh])
    t.cli(["verify", first.target, *ssh])
    t.cli(["push", first.target, *ssh])

    t.heading("6. The incident: someone overwrites the file by hand; verify catches it")
    hosts.tamper(first, samples.INCIDENT_DRAFTER.read_bytes())
    t.cli(["verify", first.target, *ssh], expect=4)
    t.cli(["push", first.target, "--dry-run", *ssh])
    t.cli(["push", first.target, *ssh])
    t.cli(["rollback", first.target, "--list", *ssh])


def write_inventory(path: Path, hosts: DemoHosts) -> None:
    """A dflash-provision YAML inventory for the demo fleet (see dflash_provision/inventory.py)."""
    lines = [
        "# Demo fleet: every host holds the drafter pinned in dflash.lock.",
        "defaults:",
        "  drafter:",
        "    lock: dflash.lock",
        "groups:",
        "  demo:",
        "    hosts:",
    ]
    for member in hosts.members:
        lines += [
            f"      - name: {member.name}",
            f"        address: {member.alias}",
            f"        path: {member.model_dir}",
        ]
    path.write_text("\n".join(lines) + "\n")


def run_fleet_steps(t: Transcript, hosts: DemoHosts, workdir: Path) -> None:
    ssh = ["--ssh-config", str(hosts.ssh_config)]
    members = hosts.members
    reference = (workdir / "config.json").read_bytes()
    normalised = (workdir / "normalised-config.json").read_bytes()
    # What a fleet looks like after a bad week (skipping the first member, pushed above).
    damage: list[tuple[str, bytes | None]] = [
        ("the incident's guessed file", samples.INCIDENT_DRAFTER.read_bytes()),
        ("no model directory at all (never provisioned)", None),
        ("a half-written file (the heredoc died)", reference[: len(reference) // 2]),
        ("use_sliding_window: false (transformers drops the window)", normalised),
        ("the right file", reference),
    ]
    for member, (_, data) in zip(members[1:], damage, strict=False):
        hosts.tamper(member, data)
    write_inventory(workdir / "fleet.yaml", hosts)

    t.heading("7. A fleet after a bad week: audit it in parallel (one SSH exec per host)")
    for member, (what, _) in zip(members[1:], damage, strict=False):
        print(f"  {member.name}: {what}")
    print("  fleet.yaml:")
    for line in (workdir / "fleet.yaml").read_text().splitlines():
        print(f"    {line}")
    t.cli(["audit", "-i", "fleet.yaml", *ssh], expect=4)

    t.heading("8. Repair: push to exactly the hosts that are wrong, then audit them again")
    t.cli(["repair", "-i", "fleet.yaml", "--mkdir", *ssh])

    t.heading("9. A clean audit, a Prometheus textfile for alerting, and the history")
    t.cli(["audit", "-i", "fleet.yaml", "--prometheus", "dflash.prom", *ssh])
    prom = (workdir / "dflash.prom").read_text().splitlines()
    print("  dflash.prom (first lines):")
    for line in prom[:8]:
        print(f"    {line}")
    t.cli(["history", "--op", "repair"])


if __name__ == "__main__":
    sys.exit(run_demo())
