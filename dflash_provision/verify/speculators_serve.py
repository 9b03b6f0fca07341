"""Stage c for a speculators-layout drafter served as ``vllm serve <drafter dir>``.

vLLM reads such a directory's ``speculators_config`` itself (``maybe_override_with_speculators``):
the command line then has no ``--speculative-config`` (or one that only overrides N), its model
positional is the drafter directory, the method comes from ``speculators_model_type`` and N from
``proposal_methods[0].speculative_tokens``, and the verifier is served as the target. This module
rebuilds the speculative config in force from what the server read (the file on disk, else the
authoritative one) plus any override on the command line, so stage c's checks apply to it as to
``--speculative-config``, and says where an N that disagrees with the authoritative one comes from.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from dflash_provision.validation import speculators_layout as layout
from dflash_provision.verify.stages import CheckContext


def model_positional(server: Any) -> str | None:
    """``serve MODEL``'s MODEL in the server's argv (``--model X`` as a fallback)."""
    argv = [str(arg) for arg in getattr(server, "argv", None) or []]
    for index, arg in enumerate(argv[:-1]):
        if arg == "serve" and not argv[index + 1].startswith("-"):
            return argv[index + 1]
    for index, arg in enumerate(argv):
        if arg.startswith("--model="):
            return arg.split("=", 1)[1]
        if arg == "--model" and index + 1 < len(argv):
            return argv[index + 1]
    return None


def _read_doc(ctx: CheckContext) -> tuple[dict[str, Any], str]:
    """The config the server read at start-up as far as we can tell: the file on disk now
    (stage a read it), else the authoritative one."""
    if ctx.disk is not None and ctx.disk.data is not None:
        try:
            doc = json.loads(ctx.disk.data)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            return doc, f"{ctx.target.config_path} on disk"
    return ctx.auth_doc, "the authoritative config"


def served_spec(
    ctx: CheckContext, server: Any, argv_spec: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """(the speculative config in force, problems). Unchanged (no problems) unless the
    authoritative drafter is in the speculators layout and the server serves its directory."""
    positional = model_positional(server)
    if not layout.is_speculators(ctx.auth_doc) or positional is None:
        return argv_spec, []
    if posixpath.normpath(positional) != posixpath.normpath(ctx.target.model_dir):
        return argv_spec, []
    doc, source = _read_doc(ctx)
    file_n = layout.speculative_tokens(doc)
    spec: dict[str, Any] = {
        "method": layout.method(doc) or doc.get("speculators_model_type"),
        "num_speculative_tokens": file_n,
    }
    spec.update(argv_spec)  # vLLM: --speculative-config overrides what the file says ...
    spec["method"] = layout.method(doc) or doc.get("speculators_model_type")  # ... but not these
    spec["model"] = positional
    spec["source"] = f"speculators_config of {source}"
    problems = []
    want = layout.speculative_tokens(ctx.auth_doc)
    if "num_speculative_tokens" not in argv_spec and file_n != want:
        problems.append(
            f"the server takes N = {file_n} from {layout.SPEC_TOKENS_PATH} of {source}; the "
            f"authoritative config says {want}"
        )
    return spec, problems
