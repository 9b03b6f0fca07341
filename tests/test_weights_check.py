"""The weights check from the safetensors headers: the header parser against hostile headers,
the shape checks against a config (each disagreeing field named), and the reads that bring the
headers here (local directory; the remote script under dash and busybox ash, run for real)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from dflash_provision.formats.safetensors_header import (
    HeaderError,
    check_length,
    header_length,
    parse_header,
)
from dflash_provision.host_state.weights_check import check_weights
from dflash_provision.remote.weights_read import read_local_weights, read_remote_weights
from dflash_provision.transport.base import Transport
from dflash_provision.transport.local import LocalTransport
from testbed import samples
from tests.fixtures.safetensors_files import header_file, reference_shapes, write_local
from tests.fixtures.transports import busybox_transport

REFERENCE: dict[str, Any] = json.loads(samples.REFERENCE_DRAFTER.read_bytes())


def _raw(header: dict[str, Any]) -> bytes:
    return json.dumps(header).encode()


def _one(dtype: str = "F32", shape: Any = (2,), offsets: Any = (0, 8)) -> dict[str, Any]:
    return {"t": {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}}


# -- the header parser -------------------------------------------------------------------------


def test_a_valid_header_gives_names_dtypes_and_shapes() -> None:
    prefix, size = header_file({"norm.weight": [5120], "fc.weight": [5120, 25600]})
    length = header_length(prefix[:8], size)
    header = parse_header("model.safetensors", prefix[8 : 8 + length], size)
    assert header.tensors["fc.weight"].shape == (5120, 25600)
    assert header.tensors["norm.weight"].dtype == "BF16"
    assert header.metadata == {"format": "pt"}


@pytest.mark.parametrize(
    ("length", "size", "words"),
    [
        (100, 50, "runs beyond the file (50 bytes)"),
        (2**40, 2**41, "over the 4194304-byte limit"),
        (0, 100, "cannot hold a JSON object"),
    ],
)
def test_a_header_length_beyond_the_file_or_the_limit_is_refused(
    length: int, size: int, words: str
) -> None:
    with pytest.raises(HeaderError, match=re.escape(words)):
        check_length(length, size)
    with pytest.raises(HeaderError, match=re.escape(words)):
        header_length(length.to_bytes(8, "little"), size)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"\xff\xfe{}", "not UTF-8"),
        (b"{not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"a": 1e999}', "invalid JSON"),
        (b"[" * 200 + b"]" * 200, "not JSON"),
        (_raw(_one(dtype="F128")), "dtype is not a safetensors dtype"),
        (_raw(_one(shape=["2"])), "shape is not a list of non-negative integers"),
        (_raw(_one(shape=[True])), "shape is not a list of non-negative integers"),
        (_raw(_one(shape=[-2])), "shape is not a list of non-negative integers"),
        (_raw(_one(offsets=[0])), "data_offsets is not"),
        (_raw(_one(offsets=[8, 0])), "end before they start"),
        (_raw(_one(offsets=[0, 4])), "needs 8 bytes, data_offsets give 4"),
        (_raw(_one(offsets=[4, 12])), "a gap or an overlap"),
        (_raw({"t": [1, 2]}), "not an object of dtype, shape and data_offsets"),
        (_raw({"t": {**_one()["t"], "extra": 1}}), "not an object of dtype"),
        (_raw({**_one(), "__metadata__": {"a": 1}}), "__metadata__ is not an object of strings"),
    ],
)
def test_a_hostile_header_is_refused_with_one_line(raw: bytes, words: str) -> None:
    with pytest.raises(HeaderError, match=re.escape(words)) as caught:
        parse_header("model.safetensors", raw)
    assert "\n" not in str(caught.value)


def test_a_duplicate_tensor_name_is_refused_not_resolved_to_either() -> None:
    t = '{"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}'
    raw = f'{{"t": {t}, "t": {t}}}'.encode()
    with pytest.raises(HeaderError, match='names "t" twice'):
        parse_header("model.safetensors", raw)


def test_data_that_ends_before_or_after_the_header_says_is_refused() -> None:
    raw = _raw(_one())
    parse_header("m", raw, 8 + len(raw) + 8)  # exactly the data described
    with pytest.raises(HeaderError, match="holds 4 \\(truncated\\)"):
        parse_header("m", raw, 8 + len(raw) + 4)
    with pytest.raises(HeaderError, match="holds 16 \\(extra bytes\\)"):
        parse_header("m", raw, 8 + len(raw) + 16)


# -- the shapes against the config -------------------------------------------------------------


def _dir(tmp_path: Path, shapes: dict[str, list[int]], name: str = "model.safetensors") -> Path:
    directory = tmp_path / "drafter"
    directory.mkdir(exist_ok=True)
    write_local(directory / name, shapes)
    return directory


def _check(directory: Path, doc: dict[str, Any] = REFERENCE, **kw: Any) -> Any:
    return check_weights(doc, read_local_weights(directory), **kw)


def test_the_reference_config_fits_weights_of_its_own_shapes(tmp_path: Path) -> None:
    result = _check(_dir(tmp_path, reference_shapes()), target_hidden=5120)
    assert (result.checked, result.ok, result.mismatches) == (True, True, [])
    assert "58 tensors in model.safetensors fit the config" in result.detail


def test_a_config_of_another_revision_names_the_layer_count_and_the_taps(tmp_path: Path) -> None:
    # The weights of a revision with 4 layers and 3 taps beside the 5-layer, 5-tap config.
    result = _check(_dir(tmp_path, reference_shapes(layers=4, taps=3)), target_hidden=5120)
    assert result.checked and result.ok is False
    assert result.mismatches == [
        "num_hidden_layers: config 5, weights 4 (layers.0-3)",
        "target_layer_ids: config 5 ids × hidden 5120 = 25600, weights fc.weight input width "
        "15360 = 3 × 5120 (fc.weight [5120, 15360])",
    ]
    assert result.to_dict()["mismatches"] == result.mismatches


def test_hidden_heads_and_intermediate_sizes_are_named_by_field(tmp_path: Path) -> None:
    doc = {**REFERENCE, "hidden_size": 4096, "intermediate_size": 12288, "num_key_value_heads": 4}
    result = _check(_dir(tmp_path, reference_shapes()), doc)
    fields = [line.split(":")[0] for line in result.mismatches]
    assert fields == [
        "hidden_size",
        "num_key_value_heads × head_dim",
        "intermediate_size",
        "target_layer_ids",
    ]
    hidden = result.mismatches[0]
    assert hidden.startswith("hidden_size: config 4096, weights 5120 (layers.0.self_attn.q_proj")
    assert "more tensor(s)" in hidden
    # fc checked with the drafter's own hidden size, and saying so.
    assert any("drafter's own hidden_size" in note for note in result.notes)


def test_vocabulary_rows_are_checked_when_the_drafter_ships_embeddings(tmp_path: Path) -> None:
    shapes = reference_shapes() | {"embed_tokens.weight": [151936, 5120]}
    result = _check(_dir(tmp_path, shapes))
    assert "vocab_size: config 248320, weights 151936 (embed_tokens.weight [151936, 5120])" in (
        result.mismatches
    )


def test_every_layer_must_hold_the_same_tensors(tmp_path: Path) -> None:
    shapes = reference_shapes()
    del shapes["layers.2.mlp.up_proj.weight"]
    result = _check(_dir(tmp_path, shapes))
    assert result.mismatches == ["layers.2: missing mlp.up_proj.weight (other layers have them)"]


def test_a_model_prefix_is_accepted_and_a_missing_fc_is_named(tmp_path: Path) -> None:
    shapes = {f"model.{k}": v for k, v in reference_shapes().items()}
    assert _check(_dir(tmp_path, shapes)).ok is True
    del shapes["model.fc.weight"]
    (tmp_path / "drafter" / "model.safetensors").unlink()
    result = _check(_dir(tmp_path, shapes))
    assert result.mismatches == ["fc.weight: absent, but the config's target_layer_ids need it"]


def test_the_target_hidden_size_sets_the_fc_width_when_known(tmp_path: Path) -> None:
    directory = _dir(tmp_path, reference_shapes())
    result = _check(directory, target_hidden=4096)
    assert result.mismatches == [
        "target_layer_ids: config 5 ids × hidden 4096 = 20480, weights fc.weight input width "
        "25600 (fc.weight [5120, 25600])"
    ]


def test_a_directory_without_safetensors_has_no_weights_to_check(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    result = _check(tmp_path)
    assert (result.checked, result.ok) == (False, None)
    assert result.detail.startswith("no weights to check")


def test_a_symlink_out_of_the_directory_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    write_local(outside / "other.safetensors", reference_shapes(layers=4))
    directory = _dir(tmp_path, reference_shapes())
    (directory / "linked.safetensors").symlink_to(outside / "other.safetensors")
    result = _check(directory)
    assert (result.checked, result.ok) == (False, None)
    assert "linked.safetensors: a symlink that points outside the directory: not followed" in (
        result.detail
    )
    # A link that stays inside the directory is followed.
    (directory / "linked.safetensors").unlink()
    (directory / "again.safetensors").symlink_to("model.safetensors")
    assert _check(directory).checked is True


def test_hostile_files_in_the_directory(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    directory.mkdir()
    path = directory / "model.safetensors"
    path.write_bytes((2**40).to_bytes(8, "little") + b"{}")
    result = _check(directory)
    assert not result.checked and "header length 1099511627776 bytes, over the 4 MiB" in (
        result.detail
    )
    path.write_bytes((1000).to_bytes(8, "little") + b"{}")
    result = _check(directory)
    assert result.ok is False
    assert result.mismatches == [
        "model.safetensors: header length 1000 bytes runs beyond the file (10 bytes)"
    ]
    path.write_bytes((9).to_bytes(8, "little") + b"not json!")
    assert _check(directory).mismatches == [
        "model.safetensors: header is not JSON (line 1, column 1)"
    ]


def test_an_index_naming_a_missing_shard_fails(tmp_path: Path) -> None:
    directory = _dir(tmp_path, reference_shapes(), "model-00001-of-00002.safetensors")
    index = {"weight_map": {"fc.weight": "model-00002-of-00002.safetensors"}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    result = _check(directory)
    assert result.mismatches == [
        "model.safetensors.index.json: names 'model-00002-of-00002.safetensors', which is not "
        "in the directory"
    ]
    # An index with none of its shards: the weights are missing, not "nothing to check".
    (directory / "model-00001-of-00002.safetensors").unlink()
    result = _check(directory)
    assert result.ok is False and len(result.mismatches) == 1


# -- the remote script, for real under dash and busybox ash -------------------------------------


@pytest.mark.parametrize("shell", ["dash", "busybox"])
def test_the_remote_read_gives_what_the_local_read_gives(tmp_path: Path, shell: str) -> None:
    # busybox: its ash with only its own applets on PATH (od, stat, dd, head, readlink), as in
    # a busybox container.
    transport: Transport = LocalTransport() if shell == "dash" else busybox_transport(tmp_path)
    outside = tmp_path / "elsewhere.safetensors"
    write_local(outside, reference_shapes(layers=4))
    directory = _dir(tmp_path, reference_shapes(layers=4, taps=3), "a b.safetensors")
    write_local(directory / "b.safetensors", {"extra.weight": [3]})
    (directory / "c.safetensors").write_bytes((500).to_bytes(8, "little") + b"{}")
    (directory / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    local = read_local_weights(directory)
    remote = read_remote_weights(transport, str(directory), timeout=20)
    assert [(f.name, f.size, f.length, f.raw) for f in remote.files] == [
        (f.name, f.size, f.length, f.raw) for f in local.files
    ]
    assert remote.index == local.index == b'{"weight_map": {}}'
    assert remote.unread == local.unread == []
    (directory / "out.safetensors").symlink_to(outside)
    remote = read_remote_weights(transport, str(directory), timeout=20)
    assert remote.unread == [
        "out.safetensors: a symlink that points outside the directory: not followed"
    ]
    result = check_weights(REFERENCE, read_remote_weights(transport, str(tmp_path / "none")))
    assert not result.checked and "the directory: missing" in result.detail


def test_the_remote_read_sends_only_headers_and_refuses_too_many_files(tmp_path: Path) -> None:
    directory = _dir(tmp_path, reference_shapes())
    size = os.stat(directory / "model.safetensors").st_size
    transport = LocalTransport()
    read = read_remote_weights(transport, str(directory), timeout=20)
    assert read.files[0].size == size > 10**9  # GBs of (sparse) weights...
    assert len(read.files[0].raw or b"") < 16 * 1024  # ...and only the header crossed
    for i in range(257):
        (directory / f"s{i}.safetensors").write_bytes(b"")
    read = read_remote_weights(transport, str(directory), timeout=20)
    assert read.problem == "258 *.safetensors files, more than the limit of 256"
    assert read.files == []
