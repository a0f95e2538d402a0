"""``vllm-volta plan DIR`` sizes weights from the checkpoint's safetensors headers.

The checkpoints here are real safetensors files written by the ``safetensors`` package (W4A16
weights packed by compressed-tensors' own ``pack_to_int32``); the header reader is checked
against ``safetensors.safe_open``, and the per-rank bytes read from the headers against the
config-and-quant-scheme estimate of the same model.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from volta_core.cli import main
from volta_core.host.discovery import get_plugin_manager
from volta_core.planner.safetensors_header import read_header

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
safetensors = pytest.importorskip("safetensors")

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD, VOCAB = 256, 512, 2, 4, 2, 64, 1000
CONFIG: dict[str, Any] = {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": HIDDEN,
    "intermediate_size": INTER,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD,
    "vocab_size": VOCAB,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "max_position_embeddings": 4096,
    "mtp_num_hidden_layers": 1,
}
LINEARS = {  # name: (out, in)
    "self_attn.q_proj": (HEADS * HEAD, HIDDEN),
    "self_attn.k_proj": (KV_HEADS * HEAD, HIDDEN),
    "self_attn.v_proj": (KV_HEADS * HEAD, HIDDEN),
    "self_attn.o_proj": (HIDDEN, HEADS * HEAD),
    "mlp.gate_proj": (INTER, HIDDEN),
    "mlp.up_proj": (INTER, HIDDEN),
    "mlp.down_proj": (HIDDEN, INTER),
}


@pytest.fixture(autouse=True)
def fresh_plugin_manager() -> Iterator[None]:
    get_plugin_manager.cache_clear()
    yield
    get_plugin_manager.cache_clear()


def fp16(*shape: int) -> Any:
    return torch.zeros(shape, dtype=torch.float16)


def linear_tensors(prefix: str, out: int, inp: int, w4: dict[str, Any] | None) -> dict[str, Any]:
    if w4 is None:
        return {f"{prefix}.weight": fp16(out, inp)}
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    groups = inp // w4["group_size"]
    tensors = {
        f"{prefix}.weight_packed": pack_to_int32(torch.zeros(out, inp, dtype=torch.int8), 4),
        f"{prefix}.weight_scale": fp16(out, groups),
        f"{prefix}.weight_shape": torch.tensor([out, inp], dtype=torch.int32),
    }
    if not w4["symmetric"]:
        zeros = torch.zeros(out, groups, dtype=torch.int8)
        tensors[f"{prefix}.weight_zero_point"] = pack_to_int32(zeros, 4, packed_dim=0).contiguous()
    return tensors


def write_checkpoint(directory: Path, w4: dict[str, Any] | None = None) -> dict[str, Any]:
    """A two-shard checkpoint with an index, an MTP tensor, and its config; returns tensors."""
    tensors: dict[str, Any] = {
        "model.embed_tokens.weight": fp16(VOCAB, HIDDEN),
        "model.norm.weight": fp16(HIDDEN),
        "lm_head.weight": fp16(VOCAB, HIDDEN),
        "mtp.fc.weight": fp16(HIDDEN, 2 * HIDDEN),
    }
    for i in range(LAYERS):
        pre = f"model.layers.{i}"
        tensors[f"{pre}.input_layernorm.weight"] = fp16(HIDDEN)
        tensors[f"{pre}.post_attention_layernorm.weight"] = fp16(HIDDEN)
        tensors[f"{pre}.self_attn.q_norm.weight"] = fp16(HEAD)
        tensors[f"{pre}.self_attn.k_norm.weight"] = fp16(HEAD)
        for name, (out, inp) in LINEARS.items():
            tensors |= linear_tensors(f"{pre}.{name}", out, inp, w4)
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2]}
    shards["model-00002-of-00002.safetensors"] = names[1::2]
    weight_map = {}
    for file, keys in shards.items():
        safetensors_torch.save_file({k: tensors[k] for k in keys}, str(directory / file))
        weight_map |= dict.fromkeys(keys, file)
    index = {"metadata": {}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    config = dict(CONFIG)
    if w4 is not None:
        config["quantization_config"] = {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 4,
                        "type": "int",
                        "strategy": "group",
                        "group_size": w4["group_size"],
                        "symmetric": w4["symmetric"],
                    },
                }
            },
            "ignore": ["lm_head"],
        }
    (directory / "config.json").write_text(json.dumps(config))
    return tensors


def fit_of(capsys: pytest.CaptureFixture[str], target: str, *argv: str) -> dict[str, Any]:
    code = main(["plan", target, "--json", *argv])
    out, err = capsys.readouterr()
    assert (code, err) == (0, ""), err
    return dict(json.loads(out)["fit"])


def test_header_reader_agrees_with_safetensors(tmp_path: Path) -> None:
    tensors = {
        "a.f16": fp16(3, 5),
        "b.bf16": torch.zeros(7, dtype=torch.bfloat16),
        "c.i32": torch.zeros(2, 4, dtype=torch.int32),
        "d.f32": torch.zeros(1, dtype=torch.float32),
        "e.fp8": torch.zeros(4, 4, dtype=torch.float8_e4m3fn),
        "f.u8": torch.zeros(0, dtype=torch.uint8),
    }
    path = tmp_path / "x.safetensors"
    safetensors_torch.save_file(tensors, str(path), metadata={"format": "pt"})
    ours = {e.name: e for e in read_header(path)}
    assert set(ours) == set(tensors)
    with safetensors.safe_open(str(path), framework="pt") as handle:
        for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
            loaded = handle.get_tensor(name)
            assert ours[name].shape == tuple(loaded.shape)
            assert ours[name].nbytes == loaded.numel() * loaded.element_size()
    assert ours["e.fp8"].dtype == "F8_E4M3"
    assert ours["b.bf16"].dtype == "BF16"


def per_rank(tensors: dict[str, Any], tp: int, skip_mtp: bool = True) -> int:
    """Per-rank bytes by vLLM's sharding: norms replicated, K/V heads split while they last
    (each rank keeps at least one), everything else split across the ranks."""
    total = 0
    for name, t in tensors.items():
        if skip_mtp and name.startswith("mtp."):
            continue
        nbytes = t.numel() * t.element_size()
        if "norm" in name:
            total += nbytes
        elif ".k_proj." in name or ".v_proj." in name:
            total += math.ceil(nbytes * max(1, KV_HEADS // tp) / KV_HEADS)
        else:
            total += math.ceil(nbytes / tp)
    return total


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_sharded_fp16_checkpoint_bytes_per_rank(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tp: int
) -> None:
    """From the headers: each tensor's share; equal to the config estimate of the same
    model (both hold exactly these tensors). The MTP tensor counts only with MTP on."""
    tensors = write_checkpoint(tmp_path)
    fit = fit_of(capsys, str(tmp_path), "-tp", str(tp))
    assert (
        fit["weights_source"] == f"checkpoint safetensors headers ({len(tensors)} tensors, 2 files)"
    )
    assert fit["per_rank_bytes"]["weights"] == per_rank(tensors, tp)
    assert any("mtp.* draft-head tensors" in n for n in fit["notes"])
    estimate = fit_of(capsys, str(tmp_path / "config.json"), "-tp", str(tp))
    assert estimate["weights_source"].startswith("estimated from config.json")
    assert estimate["per_rank_bytes"]["weights"] == fit["per_rank_bytes"]["weights"]

    with_mtp = fit_of(capsys, str(tmp_path), "-tp", str(tp), "--speculative-tokens", "1")
    mtp_bytes = math.ceil(HIDDEN * 2 * HIDDEN * 2 / tp)
    assert with_mtp["per_rank_bytes"]["weights"] == per_rank(tensors, tp) + mtp_bytes


@pytest.mark.parametrize("symmetric", [True, False])
def test_w4a16_checkpoint_bytes_match_the_config_formula(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, symmetric: bool
) -> None:
    """Packed int32 weights, fp16 group scales and (asymmetric) packed zero points, as
    compressed-tensors writes them, against the formula of the config estimate; the headers
    also hold each linear layer's 8-byte ``weight_shape``, which the formula leaves out."""
    w4 = {"group_size": 128, "symmetric": symmetric}
    tensors = write_checkpoint(tmp_path, w4)
    fit = fit_of(capsys, str(tmp_path), "-tp", "2")
    estimate = fit_of(capsys, str(tmp_path / "config.json"), "-tp", "2")
    assert fit["per_rank_bytes"]["weights"] == per_rank(tensors, 2)
    shapes = LAYERS * len(LINEARS) * 8 // 2
    assert fit["per_rank_bytes"]["weights"] - estimate["per_rank_bytes"]["weights"] == shapes


def write_raw(path: Path, header: bytes, length: int | None = None, data: bytes = b"") -> None:
    size = len(header) if length is None else length
    path.write_bytes(struct.pack("<Q", size) + header + data)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x01\x02", "shorter than 8 bytes"),
        (None, "header length past the file"),
        (b"[]", "safetensors header is not a JSON object"),
        (b"\xff{", "safetensors header: not UTF-8 text"),
        (
            b'{"w": {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 6]}}',
            "6 bytes do not hold",
        ),
        (b'{"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 99]}}', "within the file"),
        (b'{"w": {"dtype": "F16", "shape": [-1], "data_offsets": [0, 0]}}', "non-negative"),
    ],
)
def test_malformed_headers_are_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes | None, message: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    path = tmp_path / "model.safetensors"
    if content is None:
        write_raw(path, b"{}", length=4096)
    elif content.startswith((b"{", b"[", b"\xff")):
        write_raw(path, content, data=bytes(8))
    else:
        path.write_bytes(content)
    code = main(["plan", str(tmp_path)])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.count("\n") == 1, err
    assert message in err
    assert str(path) in err


def test_an_index_naming_a_missing_shard_is_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    write_checkpoint(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    code = main(["plan", str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 2
    assert "names 'model-00002-of-00002.safetensors', which the directory does not hold" in err
