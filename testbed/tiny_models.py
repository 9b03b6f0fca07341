"""Tiny synthetic models for real-vLLM tests: a Qwen3 target and DFlash drafters (no Hub).

Everything is generated here, deterministically (fixed seeds), with numpy and safetensors, so
the project's own venv can build them without torch. Sizes are the smallest real vLLM's CPU
build serves: hidden 128, 4 heads of head_dim 32 (CPU attention rejects head_dim 16), 2 KV heads,
vocabulary 512, and a byte-level BPE tokenizer saved as ``PreTrainedTokenizerFast``.

Why the agreeing drafter is accepted ~100%: the target's final ``norm.weight`` is all zeros, so
every logit is 0 and greedy decoding always picks token 0. The agreeing drafter also has a zero
final norm and shares the target's ``lm_head`` (vLLM's DFlash drafter has no head of its own),
so it always drafts token 0 too. The random drafter's norm is ones: its drafts are random tokens,
so (almost) none are accepted. Only ``norm.weight`` and the config differ between drafters.

The drafter weight names follow vLLM's ``qwen3_dflash.py`` loader: ``layers.{i}...``, ``fc``
(target hidden x number of target layers captured), ``hidden_norm`` and ``norm``.

Typical use::

    models = build_tiny_models(Path("/var/cache/dflash-provision/tiny-models"))
    models.target, models.agreeing, models.random, models.sliding, models.mixed, ...
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: Bump when the generated files change, so an old build under the same directory is redone.
BUILD_VERSION = "2"
MARKER = ".tiny-models-built"

HIDDEN = 128
LAYERS = 4
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 32
INTERMEDIATE = 256
VOCAB = 512
MAX_POSITIONS = 512
BLOCK_SIZE = 8
MASK_TOKEN_ID = VOCAB - 1
EOS_TOKEN = "<|endoftext|>"  # noqa: S105 (a token, not a secret); id 0: the token greedy decoding picks with a zero final norm
SLIDING_WINDOW = 64
#: Captured target layers for the good drafters; vLLM uses hidden states ids + 1 = (2, 4).
TARGET_LAYER_IDS = (1, 3)

TARGET_SEED = 1000
DRAFTER_SEED = 2000


@dataclass(frozen=True)
class DrafterSpec:
    """How one drafter differs from the agreeing one."""

    name: str
    layer_types: tuple[str, ...] = ("full_attention",)
    target_layer_ids: tuple[int, ...] = TARGET_LAYER_IDS
    zero_norm: bool = True
    use_sliding_window: bool = False
    sliding_window: int | None = None
    #: What the drafter claims its target has (the wrong-ids drafter was made for a deeper one).
    num_target_layers: int = LAYERS


DRAFTERS: tuple[DrafterSpec, ...] = (
    # ~100% accepted: drafts token 0, which the target always picks.
    DrafterSpec("agreeing"),
    # ~0% accepted: a random-weight drafter with a real final norm.
    DrafterSpec("random", zero_norm=False),
    # vLLM refuses to start: sliding layers, and transformers nulls the window because
    # use_sliding_window is false.
    DrafterSpec(
        "sliding-no-window",
        layer_types=("sliding_attention",),
        use_sliding_window=False,
        sliding_window=SLIDING_WINDOW,
    ),
    # Healthy server, first completion fails: made for an 8-layer target, so hidden state 6
    # (id 5 + 1) does not exist in the 4-layer tiny target; vLLM captures one aux state where
    # fc expects two ("expects 256 concatenated aux hidden features but received 128").
    DrafterSpec("wrong-ids", target_layer_ids=(1, 5), num_target_layers=8),
    # ~100% accepted like the agreeing one, but its one layer is sliding (window 64): the
    # layout vLLM's CPU build serves with a window (mixed needs the V2 runner, i.e. Triton), so
    # stage e's long prompt past the window runs on real vLLM.
    DrafterSpec(
        "sliding",
        layer_types=("sliding_attention",),
        use_sliding_window=True,
        sliding_window=SLIDING_WINDOW,
    ),
    # The real Qwen3.6-27B-DFlash layout (4 sliding + 1 full). It resolves in vLLM without
    # serving; the CPU build cannot serve it (the V2 model runner needs Triton).
    DrafterSpec(
        "mixed",
        layer_types=("sliding_attention",) * 4 + ("full_attention",),
        target_layer_ids=(0, 1, 2, 3),
        use_sliding_window=True,
        sliding_window=SLIDING_WINDOW,
    ),
)


@dataclass(frozen=True)
class TinyModels:
    """Directories of one build: the target and one directory per drafter in DRAFTERS."""

    root: Path

    @property
    def target(self) -> Path:
        return self.root / "target"

    def drafter(self, name: str) -> Path:
        if name not in {d.name for d in DRAFTERS}:
            raise KeyError(f"no tiny drafter named {name!r}")
        return self.root / f"drafter-{name}"

    @property
    def agreeing(self) -> Path:
        return self.drafter("agreeing")

    @property
    def random(self) -> Path:
        return self.drafter("random")

    @property
    def sliding_no_window(self) -> Path:
        return self.drafter("sliding-no-window")

    @property
    def wrong_ids(self) -> Path:
        return self.drafter("wrong-ids")

    @property
    def sliding(self) -> Path:
        return self.drafter("sliding")

    @property
    def mixed(self) -> Path:
        return self.drafter("mixed")


def build_tiny_models(root: Path) -> TinyModels:
    """Generate the target and every drafter under ``root`` (reused when already built).

    The build goes to a sibling temporary directory first and is renamed into place, so a
    crash never leaves a half-built tree that looks finished.
    """
    models = TinyModels(root)
    if (root / MARKER).is_file() and (root / MARKER).read_text() == BUILD_VERSION:
        return models
    staging = root.with_name(root.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        write_target(staging / "target")
        for spec in DRAFTERS:
            write_drafter(staging / f"drafter-{spec.name}", spec)
        (staging / MARKER).write_text(BUILD_VERSION)
        shutil.rmtree(root, ignore_errors=True)
        staging.rename(root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return models


# --------------------------------------------------------------------------------------------
# configs


def target_config() -> dict[str, Any]:
    """The tiny Qwen3 target's config.json."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "torch_dtype": "float32",
    }


def drafter_config(spec: DrafterSpec) -> dict[str, Any]:
    """A DFlash drafter config.json in the published drafters' shape."""
    layers = len(spec.layer_types)
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": BLOCK_SIZE,
        "dflash_config": {
            "mask_token_id": MASK_TOKEN_ID,
            "target_layer_ids": list(spec.target_layer_ids),
        },
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POSITIONS,
        "num_target_layers": spec.num_target_layers,
        "layer_types": list(spec.layer_types),
        "use_sliding_window": spec.use_sliding_window,
        "sliding_window": spec.sliding_window,
        "max_window_layers": layers,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


# --------------------------------------------------------------------------------------------
# weights


def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) * 0.02).astype(np.float32)


def _layer_weights(rng: np.random.Generator, prefix: str) -> dict[str, np.ndarray]:
    """One Qwen3 decoder layer (attention with q/k norms, SwiGLU MLP, two RMSNorms)."""
    ones = np.ones(HIDDEN, dtype=np.float32)
    return {
        f"{prefix}.self_attn.q_proj.weight": _normal(rng, HEADS * HEAD_DIM, HIDDEN),
        f"{prefix}.self_attn.k_proj.weight": _normal(rng, KV_HEADS * HEAD_DIM, HIDDEN),
        f"{prefix}.self_attn.v_proj.weight": _normal(rng, KV_HEADS * HEAD_DIM, HIDDEN),
        f"{prefix}.self_attn.o_proj.weight": _normal(rng, HIDDEN, HEADS * HEAD_DIM),
        f"{prefix}.self_attn.q_norm.weight": np.ones(HEAD_DIM, dtype=np.float32),
        f"{prefix}.self_attn.k_norm.weight": np.ones(HEAD_DIM, dtype=np.float32),
        f"{prefix}.mlp.gate_proj.weight": _normal(rng, INTERMEDIATE, HIDDEN),
        f"{prefix}.mlp.up_proj.weight": _normal(rng, INTERMEDIATE, HIDDEN),
        f"{prefix}.mlp.down_proj.weight": _normal(rng, HIDDEN, INTERMEDIATE),
        f"{prefix}.input_layernorm.weight": ones.copy(),
        f"{prefix}.post_attention_layernorm.weight": ones.copy(),
    }


def _save(weights: dict[str, np.ndarray], path: Path) -> None:
    from safetensors.numpy import save_file

    save_file(weights, str(path), metadata={"format": "pt"})
    path.chmod(0o644)  # safetensors creates 0600; the server may run as another user


def write_target(out: Path) -> None:
    """The tiny Qwen3 target: config, weights (final norm zeros) and tokenizer."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(TARGET_SEED)
    weights = {"model.embed_tokens.weight": _normal(rng, VOCAB, HIDDEN)}
    for i in range(LAYERS):
        weights.update(_layer_weights(rng, f"model.layers.{i}"))
    weights["model.norm.weight"] = np.zeros(HIDDEN, dtype=np.float32)
    weights["lm_head.weight"] = _normal(rng, VOCAB, HIDDEN)
    _save(weights, out / "model.safetensors")
    _write_json(out / "config.json", target_config())
    _write_json(out / "generation_config.json", {"bos_token_id": 0, "eos_token_id": 0})
    write_tokenizer(out)


def write_drafter(out: Path, spec: DrafterSpec) -> None:
    """One drafter directory: config.json and model.safetensors (no tokenizer: vLLM uses the
    target's)."""
    out.mkdir(parents=True, exist_ok=True)
    # Every drafter gets its own stream (seeded by name), so adding one never changes another.
    seed = DRAFTER_SEED + sum(spec.name.encode())
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for i in range(len(spec.layer_types)):
        weights.update(_layer_weights(rng, f"layers.{i}"))
    weights["fc.weight"] = _normal(rng, HIDDEN, HIDDEN * len(spec.target_layer_ids))
    weights["hidden_norm.weight"] = np.ones(HIDDEN, dtype=np.float32)
    norm = np.zeros if spec.zero_norm else np.ones
    weights["norm.weight"] = norm(HIDDEN, dtype=np.float32)
    _save(weights, out / "model.safetensors")
    _write_json(out / "config.json", drafter_config(spec))


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------------------
# tokenizer


def _corpus(lines: int = 400) -> Sequence[str]:
    """A fixed English-ish text for BPE training (deterministic: no randomness involved)."""
    text = (
        "the config of every drafter must match the target model and its layers speculative "
        "decoding accepts draft tokens when the target agrees sliding window attention full "
        "hidden state layer ids mask token vocabulary server completion metrics acceptance"
    )
    words = text.split(" ")
    return [" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) for i in range(lines)]


def write_tokenizer(out: Path) -> None:
    """A byte-level BPE tokenizer (id 0 is end-of-text), saved as PreTrainedTokenizerFast."""
    # transformers announces at import that torch is absent (true, and not needed here).
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 1,  # keep the last id free: it is the drafters' mask token
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    # transformers' tokenizer classes carry no annotations on __init__.
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, pad_token=EOS_TOKEN
    )
    fast.model_max_length = MAX_POSITIONS
    fast.save_pretrained(str(out))
