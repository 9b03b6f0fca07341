"""The demo's rollout step: a config change caught at the canary and rolled back, proved.

Three of the demo's hosts serve the drafter through the vLLM STAND-IN (a test double, said so in
the transcript): its acceptance follows from the config it LOADED, through a control file that
maps the incident's ``mask_token_id`` 248064 to ~1 % and every other id to the stand-in's 60 %.
The new config passes every file check (schema, invariants, what transformers loads): only
acceptance can tell, which is what the rollout's gate measures. The step launches the servers,
shows the plan (``--dry-run``), runs the rollout (the canary fails the gate: exit 27, its old
bytes restored and its server serving the baseline again, the other hosts untouched), then
``--status``, a clean audit, and stops the servers, so pasting the transcript again does the
same.

Set-up that is not a ``$`` line (the stand-in is the test bed's, not the user's): the stand-in
installed on each host, the target model's config.json and the stand-in's control file there.
"""

from __future__ import annotations

import json
import socket
from typing import TYPE_CHECKING

from dflash_provision.errors import ExitCode
from testbed import samples

if TYPE_CHECKING:
    from testbed.demo_state import Demo, DemoMember

STANDIN_DIR = "/root/standin"
CONTROL = f"{STANDIN_DIR}/control.json"
TARGET_DIR = "/root/models/Qwen3.6-27B"
INCIDENT_MASK = 248064
#: What the stand-in serves per loaded mask_token_id; every other id serves its default 60 %.
CONTROL_RULES = {"by_mask_token": {str(INCIDENT_MASK): {"acceptance": 0.01}}}
SERVERS = 3  # a canary and a second batch of two
#: The stand-in imports transformers at start: seconds, more on a loaded machine.
STEP_TIMEOUT_S = 900.0


def rollout_step(d: Demo) -> None:
    d.t.heading("A rollout: a config change caught at the canary, rolled back, proved")
    members = d.hosts.members[:SERVERS]
    if len(members) < SERVERS or not _prepare(d, members):
        d.t.say("skipped: the servers' hosts need root (namespaces) and the vLLM stand-in")
        return
    from testbed.vllm_standin_install import CONTROL_ENV

    reference = json.loads((d.workdir / "config.json").read_bytes())
    reference["dflash_config"] = {**reference["dflash_config"], "mask_token_id": INCIDENT_MASK}
    (d.workdir / "retrained-config.json").write_text(json.dumps(reference, indent=2) + "\n")
    _write_inventory(d, members)
    names = ", ".join(m.name for m in members)
    d.t.say(
        f"{names} serve the drafter through the vLLM STAND-IN, a test double installed on "
        f"each host (in {STANDIN_DIR}), beside {TARGET_DIR}/config.json. Its acceptance "
        f"follows the config it loaded: its control file maps mask_token_id {INCIDENT_MASK} "
        "(the incident's) to 1 %, every other id to 60 %."
    )
    env = f"{CONTROL_ENV}={CONTROL}"
    serve = (*("--vllm", f"{STANDIN_DIR}/vllm", "--python", f"{STANDIN_DIR}/python3"),)
    d.t.set([_ports_line(len(members))])
    for i, member in enumerate(members, 1):
        d.t.run(
            cli(
                "launch",
                member.target,
                "--model",
                TARGET_DIR,
                *serve,
                "--port",
                f"$P{i}",
                "--env",
                env,
                "--no-check",
            ),
            timeout=STEP_TIMEOUT_S,
            in_order=True,
        )
    d.t.say(
        f"retrained-config.json: config.json with mask_token_id {INCIDENT_MASK}. Every file "
        "check passes it; only acceptance tells. Values of --env are never stored: give them "
        "again."
    )
    d.t.run(["cat", "serving.yaml"])
    rollout = ("rollout", "-i", "serving.yaml", "--from", "retrained-config.json")
    gate = ("--batches", "1,100%", "--env", env)
    d.t.run(cli(*rollout, *gate, "--dry-run"), timeout=STEP_TIMEOUT_S)
    d.t.run(
        cli(*rollout, *gate),
        expect=ExitCode.ROLLED_BACK,
        timeout=STEP_TIMEOUT_S,
        in_order=True,
    )
    d.t.say("The rollout is a record in the history: the canary rolled back, the rest pending.")
    d.t.run(cli("rollout", "--status"))
    d.t.say("Every host holds the old bytes again:")
    d.t.run(cli("audit", "-i", "serving.yaml"))
    d.t.say("Stop the servers (so the transcript can be pasted again):")
    for member in members:
        d.t.run(cli("stop", member.target), timeout=STEP_TIMEOUT_S)


def cli(*words: str) -> list[str]:
    return ["dflash-provision", *words]


def _prepare(d: Demo, members: list[DemoMember]) -> bool:
    """The stand-in, the target's config and the control file on each member's host; False
    where the hosts are not namespaced sshd hosts (the demo as a normal user)."""
    import contextlib
    import io
    import os

    from testbed.hosts import Host

    # The stand-in's module imports transformers, whose "PyTorch was not found" advice would
    # land in the middle of the transcript: it is about this process, not the demo.
    with contextlib.redirect_stderr(io.StringIO()):
        from testbed.vllm_standin_install import install_standin, write_control

    hosts = [d.hosts.host_of.get(m.name) for m in members]
    if os.geteuid() != 0 or not all(isinstance(h, Host) for h in hosts):
        return False
    target = samples.REFERENCE_TARGET.read_bytes()
    for host in hosts:
        assert isinstance(host, Host)
        install_standin(host, STANDIN_DIR)
        script = 'mkdir -p "${1%/*}" && cat > "$1"'
        host.exec(["sh", "-c", script, "sh", f"{TARGET_DIR}/config.json"], target, check=True)
        write_control(host, CONTROL, CONTROL_RULES)
    return True


def _ports_line(count: int) -> str:
    """``P1=... P2=...``: a free loopback port per server (the hosts share one network)."""
    ports = []
    sockets = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
        ports.append(int(s.getsockname()[1]))
    for s in sockets:
        s.close()
    return " ".join(f"P{i}={port}" for i, port in enumerate(ports, 1))


def _write_inventory(d: Demo, members: list[DemoMember]) -> None:
    lines = [
        "# The serving hosts: the drafter pinned in dflash.lock, the server launch started.",
        "defaults:",
        "  drafter:",
        "    lock: dflash.lock",
        "groups:",
        "  serving:",
        "    hosts:",
    ]
    for member in members:
        lines += [
            f"      - name: {member.name}",
            f"        address: {member.alias}",
            f"        path: {member.model_dir}",
        ]
    (d.workdir / "serving.yaml").write_text("\n".join(lines) + "\n")
