"""A local stand-in for the HuggingFace Hub, enough for the real ``huggingface_hub`` client.

It speaks the few routes ``hf_hub_download`` and ``HfApi.model_info`` use, with the headers the
client insists on (read from huggingface_hub 2.4's file_download.py and utils/_http.py):

- ``HEAD``/``GET /{repo}/resolve/{rev}/{file}``: 200 with ``X-Repo-Commit`` (the client refuses a
  response without it), ``ETag`` (likewise) and ``Content-Length`` (the size check). Small files
  are served directly, as the Hub does for non-LFS files, so no ``X-Linked-*`` headers and no
  redirect are needed; no ``X-Xet-*`` headers either, which keeps the client on plain HTTP.
- ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}``: model info.
- ``GET /api/models/{repo}/tree/{rev}[/{path}]``: the tree listing ``HfApi.list_repo_tree``
  reads (huggingface_hub 2.4 hf_api.py ``RepoFile``/``RepoFolder``): per entry ``type``
  ("file"/"directory"), ``oid`` (the git blob id; for an LFS file, the pointer's), ``size`` and,
  for an LFS file, ``lfs`` {``oid``: sha256 of the content, ``size``, ``pointerSize``}; with
  ``expand=true`` also ``lastCommit``. ``recursive`` lists subdirectories' files too; pages of
  ``tree_page_size`` entries follow each other through a ``Link: <...>; rel="next"`` header with
  a ``cursor`` parameter, as the Hub paginates.
- Files whose names match the Hub's default ``.gitattributes`` (``*.safetensors``, ``*.bin``,
  ``*.pt``, ...) are LFS files, served as the Hub serves them: ``resolve`` answers 302 to the
  "CDN" (another origin) with ``X-Linked-Etag`` (sha256) and ``X-Linked-Size``; the ETag is the
  pointer file's blob id.
- Errors carry ``X-Error-Code`` (+ ``X-Error-Message``), which is how the client picks the
  exception class: RepoNotFound (401), RevisionNotFound (404), EntryNotFound (404, with
  ``X-Repo-Commit`` so the client can cache the absence), GatedRepo (401 without a token, 403
  with a token that was not granted access).

Faults, per repo (``StandinRepo.fault``, see ``Fault``), for the client's checks: a body that is
not what the headers declare, LFS-style serving (302 to another origin with ``X-Linked-Etag``
= sha256 and ``X-Linked-Size``), a redirect loop, and a body sent one byte every N seconds.

Every request is counted per (method, path) so tests can prove that a cached pinned revision
makes no request at all. Run it in a thread (``HubStandin`` is a context manager) or from the
command line: ``python -m testbed.hub_standin --port 8080``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from testbed import samples

# Fixed fake commit shas so demos, docs and tests can name them.
REFERENCE_MAIN_SHA = "d1f1a5b0c0ffee00000000000000000000000001"
REFERENCE_OLD_SHA = "d1f1a5b0c0ffee00000000000000000000000000"
TARGET_MAIN_SHA = "7a26e7000000000000000000000000000000a001"
DFLASH2_MAIN_SHA = "df1a5b2000000000000000000000000000000b01"
GATED_MAIN_SHA = "9a7ed00000000000000000000000000000000c01"

GATED_REPO = "z-lab/Qwen3.6-27B-DFlash-Gated"
# The one token the gated repo accepts; a fake for the local stand-in, not a secret.
GATED_TOKEN = "hf_standin_granted_access"  # noqa: S105
DFLASH2_REPO = "z-lab/Qwen3.8-27B-DFlash2"

_COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
# The LFS patterns of the .gitattributes the Hub gives a new model repo (the ones for files a
# model directory holds).
LFS_SUFFIXES = (
    ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".npy",
)  # fmt: skip


def is_lfs(filename: str) -> bool:
    return filename.endswith(LFS_SUFFIXES)


def lfs_pointer(data: bytes) -> bytes:
    """The pointer file git stores for an LFS file (its blob id is the Hub's ``oid``)."""
    sha256 = hashlib.sha256(data).hexdigest()
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(data)}\n"
    ).encode()


@dataclass(frozen=True)
class Fault:
    """How a repo's files are served wrong. The headers always declare the true file."""

    body: bytes | None = None  # GET sends these bytes instead (a tampering proxy, a bad mirror)
    lfs: bool = False  # as the Hub serves LFS files: 302 to another origin (the "CDN")
    redirect_loop: bool = False  # resolve answers 302 to itself, forever
    drip_interval: float | None = None  # GET sends the body one byte every this many seconds
    drip_limit: float = 60.0  # ... and gives up after this long: a stand-in never hangs a run
    drip_headers: bool = False  # with drip_interval: the status line and headers drip too


@dataclass
class StandinRepo:
    """One repo: refs (branch or tag name -> commit sha) and commits (sha -> filename -> bytes)."""

    refs: dict[str, str]
    commits: dict[str, dict[str, bytes]]
    gated_token: str | None = None  # set => gated; only this bearer token gets in
    fault: Fault | None = None

    def resolve(self, revision: str) -> str | None:
        if revision in self.refs:
            return self.refs[revision]
        if _COMMIT_SHA.match(revision) and revision in self.commits:
            return revision
        return None


def git_blob_sha(data: bytes) -> str:
    """The id git gives a blob; the Hub uses it as the ETag of non-LFS files."""
    return hashlib.sha1(b"blob %d\x00" % len(data) + data, usedforsecurity=False).hexdigest()


def older_reference_layout() -> bytes:
    """An earlier revision of the reference drafter: all layers full attention, no window.

    Valid on its own, but different from main, so a test can tell which revision it got.
    """
    config = json.loads(samples.REFERENCE_DRAFTER.read_bytes())
    config["layer_types"] = ["full_attention"] * config["num_hidden_layers"]
    config["use_sliding_window"] = False
    config["sliding_window"] = None
    return (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()


def default_repos() -> dict[str, StandinRepo]:
    """The catalogue served by default (see the module docstring of testbed/samples.py)."""
    reference = samples.REFERENCE_DRAFTER.read_bytes()
    return {
        samples.REFERENCE_REPO: StandinRepo(
            refs={"main": REFERENCE_MAIN_SHA, "v1": REFERENCE_OLD_SHA},
            commits={
                REFERENCE_MAIN_SHA: {"config.json": reference},
                REFERENCE_OLD_SHA: {"config.json": older_reference_layout()},
            },
        ),
        samples.REFERENCE_TARGET_REPO: StandinRepo(
            refs={"main": TARGET_MAIN_SHA},
            commits={TARGET_MAIN_SHA: {"config.json": samples.REFERENCE_TARGET.read_bytes()}},
        ),
        DFLASH2_REPO: StandinRepo(
            refs={"main": DFLASH2_MAIN_SHA},
            commits={DFLASH2_MAIN_SHA: {"config.json": samples.DFLASH2_DRAFTER.read_bytes()}},
        ),
        GATED_REPO: StandinRepo(
            refs={"main": GATED_MAIN_SHA},
            commits={GATED_MAIN_SHA: {"config.json": reference}},
            gated_token=GATED_TOKEN,
        ),
    }


class _HubError(Exception):
    def __init__(self, status: int, code: str, message: str, commit: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


@dataclass
class HubStandin:
    """The server plus its catalogue and request counters. Use as a context manager."""

    repos: dict[str, StandinRepo] = field(default_factory=default_repos)
    host: str = "127.0.0.1"
    port: int = 0  # 0: the OS picks a free port
    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    tree_page_size: int = 1000  # the Hub's page size for a tree listing without expand
    _server: ThreadingHTTPServer | None = field(default=None, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    # Bytes of each dripped body the client took before it hung up (or the drip ended).
    dripped: list[int] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _stopping: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    # Drips still sending: stop() waits for them to record their count in ``dripped``.
    _drips: threading.Condition = field(default_factory=threading.Condition, init=False, repr=False)
    _drips_running: int = field(default=0, init=False, repr=False)

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("hub stand-in is not started")
        host, port = self._server.socket.getsockname()[:2]
        return f"http://{host}:{port}"

    # --- catalogue -------------------------------------------------------------------------
    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes],
        *,
        branch: str = "main",
        commit_sha: str | None = None,
        gated_token: str | None = None,
        fault: Fault | None = None,
    ) -> str:
        """Add a commit holding ``files`` to ``repo_id`` (created if new), point ``branch`` at
        it and return its sha (derived from the content unless given)."""
        if commit_sha is None:
            digest = hashlib.sha1(repo_id.encode(), usedforsecurity=False)
            for name in sorted(files):
                digest.update(name.encode() + b"\x00" + files[name])
            commit_sha = digest.hexdigest()
        with self._lock:
            repo = self.repos.setdefault(repo_id, StandinRepo(refs={}, commits={}))
            repo.commits[commit_sha] = dict(files)
            repo.refs[branch] = commit_sha
            if gated_token is not None:
                repo.gated_token = gated_token
            if fault is not None:
                repo.fault = fault
        return commit_sha

    # --- counters --------------------------------------------------------------------------
    def count(self, path_contains: str = "") -> int:
        """Requests so far whose path contains ``path_contains`` (all requests by default)."""
        with self._lock:
            return sum(n for (_, path), n in self.requests.items() if path_contains in path)

    def reset_counts(self) -> None:
        with self._lock:
            self.requests.clear()

    def _record(self, method: str, path: str) -> None:
        with self._lock:
            self.requests[(method, path)] += 1

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> HubStandin:
        self._server = ThreadingHTTPServer((self.host, self.port), _make_handler(self))
        self._server.daemon_threads = True
        # serve_forever checks for shutdown() every poll_interval (0.5 s by default): each stop,
        # one per Hub test, would wait that long (20 s of the fast tier).
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},
            name="hub-standin",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # ends any drip at once
        with self._drips:  # ... and its count is in ``dripped`` when stop() returns
            self._drips.wait_for(lambda: self._drips_running == 0, timeout=5)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> HubStandin:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- request logic (no HTTP here: returns values or raises _HubError) -------------------
    def _repo(self, repo_id: str, authorization: str | None) -> StandinRepo:
        repo = self.repos.get(repo_id)
        if repo is None:
            raise _HubError(401, "RepoNotFound", "Repository not found")
        if repo.gated_token is not None:
            token = (authorization or "").removeprefix("Bearer ").strip()
            if not token:
                raise _HubError(401, "GatedRepo", "Access to this repo is restricted: log in")
            if token != repo.gated_token:
                raise _HubError(403, "GatedRepo", "Your token has not been granted access")
        return repo

    def _commit(self, repo: StandinRepo, revision: str) -> str:
        sha = repo.resolve(revision)
        if sha is None:
            raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return sha

    def resolve_file(
        self, repo_id: str, revision: str, filename: str, authorization: str | None
    ) -> tuple[str, bytes, Fault | None]:
        repo = self._repo(repo_id, authorization)
        sha = self._commit(repo, revision)
        data = repo.commits[sha].get(filename)
        if data is None:
            raise _HubError(404, "EntryNotFound", f"{filename} does not exist", commit=sha)
        return sha, data, repo.fault

    def tree(
        self,
        repo_id: str,
        revision: str,
        path: str,
        *,
        recursive: bool,
        expand: bool,
        authorization: str | None,
    ) -> list[dict[str, object]]:
        """The tree listing of ``path`` ("" for the top) at ``revision``, as the Hub gives it."""
        repo = self._repo(repo_id, authorization)
        sha = self._commit(repo, revision)
        files = repo.commits[sha]
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        if prefix and not any(name.startswith(prefix) for name in files):
            raise _HubError(404, "EntryNotFound", f"{path} does not exist", commit=sha)
        entries: dict[str, dict[str, object]] = {}
        for name in sorted(files):
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix) :]
            if "/" in rest and not recursive:
                folder = prefix + rest.split("/", 1)[0]
                entries.setdefault(
                    folder, {"type": "directory", "oid": git_blob_sha(folder.encode()), "size": 0,
                             "path": folder},
                )  # fmt: skip
                continue
            entries[name] = _file_entry(name, files[name])
            if expand:
                entries[name]["lastCommit"] = {
                    "id": sha, "title": "standin commit", "date": "2026-01-01T00:00:00.000Z",
                }  # fmt: skip
        return list(entries.values())

    def lfs_object(self, repo_id: str, sha256: str) -> tuple[bytes, Fault | None]:
        """The file of ``repo_id`` whose sha256 is ``sha256`` (what the "CDN" serves), and the
        repo's fault."""
        with self._lock:
            repo = self.repos.get(repo_id)
            for files in repo.commits.values() if repo else ():
                for data in files.values():
                    if hashlib.sha256(data).hexdigest() == sha256:
                        return data, repo.fault if repo else None
        raise _HubError(404, "NotFound", f"no object {sha256}")

    def model_info(
        self, repo_id: str, revision: str, authorization: str | None
    ) -> dict[str, object]:
        repo = self._repo(repo_id, authorization)
        sha = self._commit(repo, revision)
        return {
            "_id": git_blob_sha(repo_id.encode()),
            "id": repo_id,
            "modelId": repo_id,
            "sha": sha,
            "private": False,
            "gated": "manual" if repo.gated_token else False,
            "disabled": False,
            "tags": [],
            "siblings": [{"rfilename": name} for name in sorted(repo.commits[sha])],
        }


def _file_entry(name: str, data: bytes) -> dict[str, object]:
    if not is_lfs(name):
        return {"type": "file", "oid": git_blob_sha(data), "size": len(data), "path": name}
    pointer = lfs_pointer(data)
    return {
        "type": "file",
        "oid": git_blob_sha(pointer),
        "size": len(data),
        "path": name,
        "lfs": {
            "oid": hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "pointerSize": len(pointer),
        },
    }


_TREE = re.compile(
    r"^/api/models/(?P<repo>[^/]+(?:/[^/]+)?)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$"
)
_LFS_CDN = re.compile(r"^/lfs-cdn/(?P<repo>[^/]+(?:/[^/]+)?)/(?P<sha256>[0-9a-f]{64})$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+(?:/[^/]+)?)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_MODEL_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+(?:/[^/]+)?)(?:/revision/(?P<rev>[^/]+))?$")


class _Handler(BaseHTTPRequestHandler):
    """Serves one request for ``hub`` (set on the subclass _make_handler builds per server)."""

    hub: HubStandin
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects

    def do_HEAD(self) -> None:
        self._serve()

    def do_GET(self) -> None:
        self._serve()

    def _serve(self) -> None:
        path = urlsplit(self.path).path
        self.hub._record(self.command, path)
        auth = self.headers.get("Authorization")
        try:
            if match := _RESOLVE.match(path):
                repo_id, rev = match["repo"], unquote(match["rev"])
                sha, data, fault = self.hub.resolve_file(repo_id, rev, unquote(match["file"]), auth)
                filename = unquote(match["file"])
                self._resolve(repo_id, sha, data, fault or Fault(), filename)
            elif match := _TREE.match(path):
                self._tree(match, auth)
            elif match := _LFS_CDN.match(path):
                data, fault = self.hub.lfs_object(match["repo"], match["sha256"])
                headers = {"ETag": f'"{match["sha256"]}"', "Accept-Ranges": "bytes"}
                self._send_file(data, headers, fault or Fault())
            elif match := _MODEL_INFO.match(path):
                info = self.hub.model_info(match["repo"], unquote(match["rev"] or "main"), auth)
                body = json.dumps(info).encode()
                self._send(200, body, {"Content-Type": "application/json"})
            else:
                raise _HubError(404, "NotFound", f"no route for {path}")
        except _HubError as err:
            headers = {"X-Error-Code": err.code, "X-Error-Message": err.message}
            if err.commit:
                headers["X-Repo-Commit"] = err.commit
            body = json.dumps({"error": err.message}).encode()
            self._send(err.status, body, {"Content-Type": "application/json", **headers})

    def _tree(self, match: re.Match[str], auth: str | None) -> None:
        query = parse_qs(urlsplit(self.path).query)
        entries = self.hub.tree(
            match["repo"],
            unquote(match["rev"]),
            unquote(match["path"] or ""),
            recursive=query.get("recursive", ["False"])[0].lower() == "true",
            expand=query.get("expand", ["False"])[0].lower() == "true",
            authorization=auth,
        )
        start = int(query.get("cursor", ["0"])[0] or 0)
        size = max(1, self.hub.tree_page_size)
        page = entries[start : start + size]
        headers = {"Content-Type": "application/json"}
        if start + size < len(entries):
            base = urlsplit(self.path)
            params = {k: v[0] for k, v in query.items() if k != "cursor"}
            params["cursor"] = str(start + size)
            next_url = f"{self.hub.url}{base.path}?{urlencode(params)}"
            headers["Link"] = f'<{next_url}>; rel="next"'
        self._send(200, json.dumps(page).encode(), headers)

    def _resolve(self, repo_id: str, sha: str, data: bytes, fault: Fault, filename: str) -> None:
        headers = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
        if fault.redirect_loop:
            self._send(302, b"", {**headers, "Location": self.path})
        elif fault.lfs or is_lfs(filename):
            # The real Hub: the pointer's blob id as ETag, the object's sha256 and size in
            # X-Linked-*, and a Location on another origin, so the client's HEAD stops here.
            sha256 = hashlib.sha256(data).hexdigest()
            pointer = lfs_pointer(data)
            port = self.connection.getsockname()[1]  # the local end: the port this server bound
            cdn = "localhost" if self.hub.host == "127.0.0.1" else "127.0.0.1"
            headers.update(
                {
                    "ETag": f'"{git_blob_sha(pointer)}"',
                    "X-Linked-Etag": f'"{sha256}"',
                    "X-Linked-Size": str(len(data)),
                    "Location": f"http://{cdn}:{port}/lfs-cdn/{repo_id}/{sha256}",
                }
            )
            self._send(302, b"", headers)
        else:
            headers["ETag"] = f'"{git_blob_sha(data)}"'
            self._send_file(data, headers, fault)

    def _send_file(self, data: bytes, headers: dict[str, str], fault: Fault) -> None:
        headers["Content-Type"] = "application/octet-stream"
        if fault.drip_headers and fault.drip_interval is not None:
            head = "HTTP/1.1 200 OK\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            self._drip_bytes((head + f"Content-Length: {len(data)}\r\n\r\n").encode(), fault)
        elif self.command == "HEAD":
            self._send(200, data, headers)  # HEAD declares the true file
        elif fault.drip_interval is not None:
            self._drip(data, headers, fault)
        else:
            self._send(200, data if fault.body is None else fault.body, headers)

    def _drip(self, data: bytes, headers: dict[str, str], fault: Fault) -> None:
        assert fault.drip_interval is not None
        self.send_response(200)
        for name, value in {**headers, "Content-Length": str(len(data))}.items():
            self.send_header(name, value)
        self.end_headers()
        self._drip_bytes(data, fault)

    def _drip_bytes(self, data: bytes, fault: Fault) -> None:
        assert fault.drip_interval is not None
        sent = 0
        deadline = time.monotonic() + fault.drip_limit
        with self.hub._drips:
            self.hub._drips_running += 1
        try:
            while sent < len(data) and time.monotonic() < deadline:
                self.wfile.write(data[sent : sent + 1])
                self.wfile.flush()
                sent += 1
                if self.hub._stopping.wait(fault.drip_interval):
                    break
        except OSError:
            pass  # the client hung up: what the test wants to see
        finally:
            with self.hub._lock:
                self.hub.dripped.append(sent)
            with self.hub._drips:
                self.hub._drips_running -= 1
                self.hub._drips.notify_all()
            self.close_connection = True

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":  # HEAD announces the length but sends no body
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # tests read counters, not logs


def _make_handler(hub: HubStandin) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"hub": hub})


def iter_catalogue(hub: HubStandin) -> Iterator[str]:
    """Lines describing what the stand-in serves (printed at start-up)."""
    for repo_id, repo in sorted(hub.repos.items()):
        gated = " (gated)" if repo.gated_token else ""
        for ref, sha in sorted(repo.refs.items()):
            files = ", ".join(sorted(repo.commits[sha]))
            yield f"  {repo_id}@{ref} -> {sha}: {files}{gated}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a local HuggingFace Hub stand-in.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args(argv)
    hub = HubStandin(host=args.host, port=args.port).start()
    print(f"hub stand-in at {hub.url} (export HF_ENDPOINT={hub.url})", flush=True)
    for line in iter_catalogue(hub):
        print(line, flush=True)
    print(f"  gated token: {GATED_TOKEN}", flush=True)
    try:
        assert hub._thread is not None
        hub._thread.join()
    except KeyboardInterrupt:
        hub.stop()


if __name__ == "__main__":
    main()
