"""The launch record: what ``launch`` started on a port, and where its files live on the target.

Per port, on the machine (or in the container) that runs vLLM::

    ${XDG_STATE_HOME:-$HOME/.local/state}/dflash-provision/vllm/<port>/     (mode 0700)
        pid           "PID START_TIME MARKER": the server's pid (= its process group and
                      session: it is started with setsid), its start time (/proc/PID/stat
                      field 22), so a pid reused after a reboot is never taken for ours, and
                      the random marker the server and all it starts carry in their
                      environment (DFLASH_PROVISION_SERVER), by which stop finds processes
                      that left its session. A pidfile without a start time, with a pid <= 1,
                      or whose process has another start time or command line than the record
                      is never signalled (process.PortState.untrusted_pid).
        server.log    vLLM's stdout and stderr, appended across launches (past 64 MiB a
                      launch moves it to server.log.1)
        launch.json   this record (one JSON object)

Without HOME (``lxc-attach --clear-env`` sets only PATH) root uses /root and others
/tmp/dflash-provision-<uid>. The directory is deliberately NOT inside the model directory: its
owner may be hostile and could plant a pidfile that makes ``stop`` kill something else. For the
same reason the directory must be the login user's own (runtime.sh ``trust_state_dir``: no
symlink, owned by the login user, mode 0700), else every runtime command refuses (exit 7).

The record keeps env var NAMES only: values may be tokens, and the file outlives the launch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from dflash_provision.errors import RemoteStepFailed

LOGFILE = "server.log"
RECORD_VERSION = 1
#: A record is a few KiB; anything bigger was not written by us.
MAX_RECORD_BYTES = 256 * 1024


@dataclass(frozen=True)
class LaunchRecord:
    """What one ``launch`` started. ``argv`` is the exact vLLM command line (no env values)."""

    port: int
    pid: int | None
    argv: list[str]
    env_names: list[str]
    drafter_dir: str
    drafter_sha256: str
    model: str
    num_speculative_tokens: int
    vllm_cmd: list[str]
    python: str | None
    vllm_version: str
    started_at: str  # ISO 8601 UTC
    log_path: str
    host: str = ""  # the target's description, for messages
    record_version: int = RECORD_VERSION
    extra: dict[str, Any] = field(default_factory=dict)
    #: The sha256 of the drafter file the server was started on, as read on the host (what it
    #: loaded); "" in records from before it (then ``drafter_sha256`` is the evidence).
    file_sha256: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        """One line (the remote side stores it as it comes)."""
        return json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchRecord:
        """A record from its JSON form; RemoteStepFailed when it is not one of ours."""
        try:
            return cls(
                port=_int(data["port"]),
                pid=None if data.get("pid") is None else _int(data["pid"]),
                argv=_strs(data["argv"]),
                env_names=_strs(data.get("env_names", [])),
                drafter_dir=str(data["drafter_dir"]),
                drafter_sha256=str(data["drafter_sha256"]),
                model=str(data["model"]),
                num_speculative_tokens=_int(data["num_speculative_tokens"]),
                vllm_cmd=_strs(data.get("vllm_cmd", [])),
                python=None if data.get("python") is None else str(data["python"]),
                vllm_version=str(data.get("vllm_version", "")),
                started_at=str(data.get("started_at", "")),
                log_path=str(data.get("log_path", "")),
                host=str(data.get("host", "")),
                record_version=_int(data.get("record_version", RECORD_VERSION)),
                extra=dict(data.get("extra") or {}),
                file_sha256=str(data.get("file_sha256") or ""),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RemoteStepFailed(f"launch record is malformed: {exc}", step="record") from None

    @classmethod
    def from_json(cls, text: bytes | str) -> LaunchRecord:
        if len(text) > MAX_RECORD_BYTES:
            raise RemoteStepFailed("launch record is larger than 256 KiB", step="record")
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RemoteStepFailed(f"launch record is not JSON: {exc}", step="record") from None
        if not isinstance(data, dict):
            raise RemoteStepFailed("launch record is not a JSON object", step="record")
        return cls.from_dict(data)

    def with_pid(self, pid: int) -> LaunchRecord:
        return LaunchRecord(**{**self.to_dict(), "pid": pid})

    def same_launch(self, other: LaunchRecord) -> bool:
        """True when ``other`` asks for the same server: same command line, same env names and
        the same drafter bytes (a re-pushed drafter needs a restart to be read again)."""
        return (
            self.argv == other.argv
            and sorted(self.env_names) == sorted(other.env_names)
            and self.drafter_sha256 == other.drafter_sha256
        )


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _strs(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"expected a list of strings, got {type(value).__name__}")
    return list(value)
