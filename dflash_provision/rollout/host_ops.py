"""What a rollout does to one host, each step on an open connection: pre-flight, measure,
write, restart with the recorded launch, restore what the server ran. Nothing here saves the record
(engine.py journals each step before calling these)."""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import DflashProvisionError, ExitCode
from dflash_provision.history.store import default_store
from dflash_provision.host_state.file_status import Command
from dflash_provision.host_state.weights_check import check_remote, target_hidden_of
from dflash_provision.place.push import list_backups, push_config, rollback_config
from dflash_provision.remote.ops import read_remote_config
from dflash_provision.remote.proof import WriteOptions
from dflash_provision.rollout import what_ran
from dflash_provision.rollout.record import Figures, Gate, HostState
from dflash_provision.rollout.what_ran import Lookup
from dflash_provision.server.container_restart import restart_container, served_by, served_model
from dflash_provision.server.container_server import open_container_server, parse_container_option
from dflash_provision.server.drafter_files import check_drafter_files, wrong_files
from dflash_provision.server.locate import for_drafter, launched
from dflash_provision.server.preflight import V2_RUNNER_ENV, target_config
from dflash_provision.server.process import probe_port
from dflash_provision.server.restart import (
    RestartFailed,
    old_server,
    restart_recorded,
    server_down,
    server_env,
)
from dflash_provision.source.authority import Authority
from dflash_provision.validation.diff import render_changes, semantic_diff
from dflash_provision.validation.validate import validate_config
from dflash_provision.verify.acceptance_gate import judge_check
from dflash_provision.verify.reference import from_figures, reference_key
from dflash_provision.verify.runtime_check import push_fix_command, run_check, smoke_prompts

if TYPE_CHECKING:
    from dflash_provision.history.store import Recording
    from dflash_provision.inventory import FleetMember
    from dflash_provision.place.push import PushResult
    from dflash_provision.server.container_server import ContainerOption, ContainerServer
    from dflash_provision.server.restart import RestartDone
    from dflash_provision.source.authority import Authority
    from dflash_provision.target import Target
    from dflash_provision.transport.base import Transport
    from dflash_provision.verify.runtime_check import CheckReport, CheckSettings


class StepFailed(DflashProvisionError):
    """One host's step failed; the message says what (the host is judged failed)."""


@dataclass(frozen=True)
class Verdict:
    outcome: str  # "passed" | "failed" | "inconclusive"
    figures: Figures
    detail: str


def inspect(
    transport: Transport,
    member: FleetMember,
    new: Authority,
    env: dict[str, str],
    timeout: float,
    lookup: Lookup,
    *,
    rehash_files: bool = False,
    container: ContainerOption | None = None,
    docker_host: str | None = None,
) -> tuple[HostState, bytes | None]:
    """Pre-flight of one host: its file read, the new config's diff against it, the new config
    validated with the target model's config there and its weights, the files the lock pins
    beside it (``fetch --all-files``: each the pinned one where it lies), the server launch
    started for this drafter dir (or, with ``container``, the server in that container:
    served_in), and what a rollback returns to (what_ran.decide; ``lookup`` finds bytes kept
    on the controller). StepFailed says why the host cannot take part."""
    target = member.target
    host = HostState(member.name, target.display(), target.config_path)
    current = read_remote_config(transport, target.config_path, timeout=timeout)
    if not current.present or current.data is None:
        raise StepFailed(f"cannot read {target.config_path}: {current.describe()}")
    host.old_sha256, host.new_sha256 = current.sha256, new.sha256
    try:
        host.diff = render_changes(semantic_diff(json.loads(current.data), new.document))
    except ValueError:
        host.diff = ["the file on the host does not parse: replaced whole"]
    if container is not None:
        found, served = served_in(transport, host, container, target, docker_host, timeout)
        ran = what_ran.decide(transport, target, None, current.data, lookup, timeout)
        host.return_sha256, host.return_config = ran.sha256, _text(ran.data)
        _validate_there(transport, member, new, served, timeout, model_reader=found.transport)
        _pinned_files_there(transport, member, new, rehash_files, timeout)
        return host, current.data
    mine = for_drafter(launched(transport, timeout=timeout), target.model_dir)
    live = [s for s in mine if s.alive]
    dead = [s for s in mine if s.dead]
    if dead and not live:  # crashed: writing "file only" would leave it ungated
        raise StepFailed(
            f"the server launched for {target.model_dir} on port {dead[0].port} is dead (its "
            "pidfile names a process that is gone: crashed, killed or a reboot): start it "
            "again with launch, or, if it is meant to stay down, `dflash-provision stop "
            f"{shlex.quote(target.display())} --port {dead[0].port}`"
        )
    if len(live) > 1:
        raise StepFailed(f"{target.model_dir} is served on several ports: {[s.port for s in live]}")
    model: str | None = None
    if live:
        host.restart, host.port = True, live[0].port
        host.launch = live[0].record.to_dict()
        model = live[0].record.model
        restart_checks(transport, live[0].record.env_names, live[0].port, env, timeout)
    ran = what_ran.decide(transport, target, host.launch, current.data, lookup, timeout)
    host.return_sha256, host.return_config = ran.sha256, _text(ran.data)
    if ran.differs:
        host.detail = what_ran.note(ran, current.sha256)
    _validate_there(transport, member, new, model, timeout)
    _pinned_files_there(transport, member, new, rehash_files, timeout)
    return host, current.data


def served_in(
    transport: Transport,
    host: HostState,
    option: ContainerOption,
    target: Target,
    docker_host: str | None,
    timeout: float,
) -> tuple[ContainerServer, str | None]:
    """The server in the container (``rollout --container``): running, on its port, the
    container's main process, given the provisioned directory through its mounts (see
    server/container_restart.py); kept in ``host.server_container``. Returns the container
    and the target model its command names. StepFailed saying why not."""
    found = open_container_server(transport, option, target, docker_host=docker_host)
    try:
        served = served_by(found, timeout=timeout)
    except RestartFailed as exc:
        raise StepFailed(exc.reason) from None
    host.restart, host.port = True, served.port
    host.server_container = served.to_dict()
    return found, served_model(found.record.command)


def _pinned_files_there(
    transport: Transport, member: FleetMember, new: Authority, rehash: bool, timeout: float
) -> None:
    """The new config's pinned files on the host (server/drafter_files.py, judged by launch's
    row of files_status.EXIT_CODE, as the restart would be): StepFailed naming each wrong one."""
    files = check_drafter_files(transport, member.target, new, rehash=rehash, timeout=timeout)
    if files is None or files.exit_code(Command.LAUNCH) is ExitCode.OK:
        return
    raise StepFailed(
        f"the drafter's files in {member.target.model_dir} are not the pinned commit's "
        f"(files {files.status.value}): {wrong_files(files)}; place them first "
        "(`dflash-provision repair --all-files`, or push TARGET --all-files)"
    )


def restart_checks(
    transport: Transport, env_names: list[str], port: int, env: dict[str, str], timeout: float
) -> None:
    """What a restart refuses on, checked before anything is written or stopped: the port's
    server is the launch's (its stop would not be refused), and the values of its env names
    can be read from it or were given with --env (read and dropped: never kept)."""
    try:
        state = probe_port(transport, port, timeout=timeout)
        old_server(transport, state)
        server_env(
            transport, state, env_names, env, skip=frozenset({V2_RUNNER_ENV}), timeout=timeout
        )
    except RestartFailed as exc:
        raise StepFailed(exc.reason) from None


def restart_possible(
    transport: Transport,
    host: HostState,
    env: dict[str, str],
    remembered: dict[str, str] | None,
    *,
    may_be_down: bool = False,
) -> None:
    """:func:`restart_checks` for a host of a rollout, run before its file is touched (a
    resumed batch's write, a rollback's restore), so a restart that would be refused never
    follows a change of the file. ``may_be_down``: a rollback, whose server may have died on
    the new config: then its env values must be in ``remembered`` (this run) or ``env``."""
    if not host.restart or host.launch is None or host.port is None:
        return
    names = [str(n) for n in host.launch.get("env_names", [])]
    timeout = transport.command_timeout
    if may_be_down:
        state = probe_port(transport, host.port, timeout=timeout)
        if server_down(state):
            known = {**(remembered or {}), **env}
            missing = [n for n in names if n not in known and n != V2_RUNNER_ENV]
            if missing:
                raise StepFailed(
                    f"the server on port {host.port} has exited: its env values cannot be "
                    "read again; give them with " + " ".join(f"--env {n}=..." for n in missing)
                )
            return
    restart_checks(transport, names, host.port, {**(remembered or {}), **env}, timeout)


def _validate_there(
    transport: Transport,
    member: FleetMember,
    new: Authority,
    model: str | None,
    timeout: float,
    *,
    model_reader: Transport | None = None,
) -> None:
    # A server in a container names its model by the path inside: read it there.
    reader = model_reader or transport
    target_bytes = target_config(reader, model, timeout)[0] if model else None
    report = validate_config(new.data, label=new.label, target=target_bytes)
    if not report.ok:
        first = report.errors[0]
        raise StepFailed(f"the new config fails validation there: {first.layer}: {first.message}")
    weights = check_remote(
        transport,
        member.target.model_dir,
        new.document,
        target_hidden=target_hidden_of(target_bytes),
        timeout=timeout,
    )
    if weights.failed:
        raise StepFailed("the weights there do not fit the new config: " + weights.mismatches[0])


def recorded_reference(
    member: FleetMember, host: HostState, authority: Authority, settings: CheckSettings
) -> Figures | None:
    """The host's acceptance reference in the history store (runtime-check --max-regression's:
    same host, port, drafter bytes and smoke prompts), or None."""
    prompts = smoke_prompts(settings.prompts)
    port = host.port or settings.port
    key = reference_key(member.target, port, authority, prompts, settings.max_tokens)
    try:
        found = default_store().latest_reference(key)
    except DflashProvisionError:
        return None
    reference = from_figures(*found) if found is not None else None
    if reference is None:
        return None
    return Figures(reference.acceptance_rate, reference.mean_acceptance_length, "reference")


def settings_for(host: HostState, base: CheckSettings) -> CheckSettings:
    return replace(base, port=host.port or base.port, find_port=False)


def measure(
    transport: Transport,
    member: FleetMember,
    authority: Authority,
    settings: CheckSettings,
    gate: Gate,
    baseline: Figures | None,
    *,
    container: ContainerOption | None = None,
    docker_host: str | None = None,
) -> tuple[Verdict, CheckReport]:
    """Every runtime-check stage, judged by the rollout's gate (``container``: as
    runtime-check --container, the container's record read again: a restart changed it)."""
    found = None
    if container is not None:
        found = open_container_server(transport, container, member.target, docker_host=docker_host)
    fix = push_fix_command(member.target, shlex.join(member.source.push_options()))
    report = run_check(transport, member.target, authority, settings, push_fix=fix, container=found)
    return judge(report, gate, baseline), report


def judge(report: CheckReport, gate: Gate, baseline: Figures | None) -> Verdict:
    """The rollout's gate on a host's check: the one acceptance gate
    (runtime/acceptance_gate.judge_check) with the rollout's minimum, and its baseline's mean
    acceptance length for --max-regression."""
    judged = judge_check(
        report,
        min_acceptance=gate.min_acceptance,
        max_regression=gate.max_regression,
        baseline_mean_length=baseline.mean_length if baseline else None,
    )
    if judged.outcome == "inconclusive":
        return Verdict("inconclusive", Figures(), judged.detail)
    figures = Figures(judged.rate, judged.mean_length, "measured")
    return Verdict(judged.outcome, figures, judged.detail)


def write(
    transport: Transport,
    member: FleetMember,
    new: Authority,
    keep: int,
    recording: Recording | None = None,
) -> str | None:
    """Write and prove the new config (push); returns the name of the backup of the old bytes.
    ``recording`` (the step's history row) keeps push's own outcome, as push's row would."""
    result = push_config(transport, member.target, new, write=WriteOptions(keep), validate=False)
    journal_outcome(result, recording)
    if not result.ok:
        raise StepFailed(f"write failed: {result.message or result.status.value}")
    return result.write.backup if result.write else None


def journal_outcome(result: PushResult, recording: Recording | None) -> None:
    """The write's outcome into the step's row through push's own path (status, sha256 before
    and after, message), keeping the row's label (``rollout ID: write``) in front."""
    if recording is None:
        return
    label = recording.message
    result.journal_into(recording)
    recording.message = f"{label}: {recording.message}" if recording.message else label


def current_sha(transport: Transport, member: FleetMember, timeout: float) -> str | None:
    read = read_remote_config(transport, member.target.config_path, timeout=timeout)
    if not read.present:
        raise StepFailed(f"cannot read {member.target.config_path}: {read.describe()}")
    return read.sha256


def return_sha(host: HostState) -> str | None:
    """The bytes a rollback returns the host to: what its server loaded at baseline (decided
    in pre-flight by what_ran.decide), else the bytes found before the write (a host without a
    launched server, or a record from before return_sha256)."""
    if host.return_sha256:
        return host.return_sha256
    ran = what_ran.ran_sha(host.launch) if host.restart else None
    return ran or host.old_sha256


class NotRecoverable(StepFailed):
    """What the server ran is nowhere to be found: no rollback can return to it."""


def _text(data: bytes | None) -> str | None:
    """Config bytes as the record keeps them (JSON text); None when they are not UTF-8."""
    try:
        return data.decode("utf-8") if data is not None else None
    except UnicodeDecodeError:
        return None


def restore(
    transport: Transport,
    member: FleetMember,
    host: HostState,
    keep: int,
    lookup: Lookup,
    recording: Recording | None = None,
) -> None:
    """Put back what the host ran (:func:`return_sha`): the bytes pre-flight found (kept in
    the record), else a backup push kept with those bytes, else the controller's store
    (``lookup``), through the write protocol and its read-back; nothing to do when the file
    holds them already. NotRecoverable when they are nowhere, StepFailed when not proved."""
    timeout = transport.command_timeout
    want = return_sha(host)
    if current_sha(transport, member, timeout) == want:
        return
    data = host.return_config.encode() if host.return_config is not None else None
    if want and (data is None or hashlib.sha256(data).hexdigest() != want):
        data = lookup(want)
    if data is not None:
        label = f"what the server ran (sha256 {str(want)[:12]})"
        result = push_config(
            transport, member.target, Authority(label=label, data=data),
            write=WriteOptions(keep), validate=False, verb="restore",
        )  # fmt: skip
        what = label
    else:
        backups = list_backups(transport, member.target, timeout=timeout)
        chosen = next((b for b in reversed(backups) if b.sha256 == want), None)
        if chosen is None:
            raise NotRecoverable(
                f"what its server ran (sha256 {str(want)[:12]}) is in no backup in "
                f"{member.target.model_dir}/.dflash-backups and not in this controller's "
                "rollout store"
            )
        result = rollback_config(
            transport, member.target, to=chosen.name, write=WriteOptions(keep), force=True
        )
        what = chosen.name
    journal_outcome(result, recording)
    proved = result.readback.sha256 if result.readback else None
    if not result.ok or proved != want:
        raise StepFailed(f"restore of {what} not proved: {result.message or result.status}")


def restart(
    transport: Transport,
    host: HostState,
    doc: dict[str, Any],
    env: dict[str, str],
    ready_s: float,
    *,
    sha256: str | None,
    may_be_down: bool = False,
    remembered: dict[str, str] | None = None,
) -> RestartDone:
    """Stop the host's server and start it again with its recorded launch, proved (see
    server/restart.py's restart_recorded); StepFailed saying what was found when it is
    refused or not proved."""
    assert host.launch is not None and host.port is not None
    try:
        return restart_recorded(
            transport, host.launch, host.port, doc, env, ready_s, sha256=sha256,
            may_be_down=may_be_down, remembered=remembered,
        )  # fmt: skip
    except RestartFailed as exc:
        raise StepFailed(exc.message) from None


def restart_in_container(
    transport: Transport,
    member: FleetMember,
    host: HostState,
    ready_s: float,
    *,
    docker_host: str | None,
    python: str | None,
    may_be_down: bool = False,
) -> RestartDone:
    """``docker restart`` of the host's server container, proved
    (server/container_restart.py); StepFailed saying what was found otherwise."""
    option = container_of(host)
    assert option is not None
    try:
        return restart_container(
            transport, option, member.target, ready_s=ready_s, docker_host=docker_host,
            python=python, may_be_down=may_be_down,
        )  # fmt: skip
    except RestartFailed as exc:
        raise StepFailed(exc.message) from None


def container_of(host: HostState) -> ContainerOption | None:
    """The container the record says the host's server runs in (``rollout --container``)."""
    if not host.server_container:
        return None
    return parse_container_option(str(host.server_container["container"]))


def timed(host: HostState, key: str, started: float) -> None:
    host.add_time(key, time.monotonic() - started)
