"""AWQ and GPTQ checkpoints: their configs read as vLLM reads them, their tensors repacked into
the kernels' layout bit for bit, and vLLM's own layers loading them through the adapter.

The layers are made by vLLM's quantization test utilities (``ct_wna16_awq_gptq``), whose
dequantized reference the repacked weights must equal exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM's quant utilities make the layers: needs vLLM")

import _vllm_layers as vl
from ct_wna16_awq_gptq import Layer, make_layer, quantization_config

from volta_core import (
    Device,
    LayerKind,
    QuantClaim,
    QuantConfig,
    QuantDecline,
    QuantLayer,
    TensorSplit,
)
from volta_ct_wna16 import ops, plugin
from volta_ct_wna16.awq_gptq_linear import AWQGPTQLinearMethod
from volta_ct_wna16.dispatch import table_launch
from volta_ct_wna16.layout import WeightFormatError, dequantize
from volta_ct_wna16.linear import apply_packed, install_packed
from volta_ct_wna16.repack import gptq_weights
from volta_ct_wna16.scheme import Packing, Unsupported, WeightScheme, quant_layer_scheme
from volta_ct_wna16.tables import SM70
from volta_devkit.testing import assert_rel_close, rel_error

AWQ, GPTQ, GPTQ_V2 = Packing.AWQ, Packing.GPTQ, Packing.GPTQ_V2

#: Every bit width, group size and zero-point convention each format stores.
SCHEMES = [
    *(WeightScheme(b, False, g, AWQ) for b in (4, 8) for g in (32, 64, 128, None)),
    *(WeightScheme(b, s, g, GPTQ) for b in (4, 8) for s in (True, False) for g in (32, 128, None)),
    WeightScheme(4, False, 64, GPTQ_V2),
    WeightScheme(8, True, 64, GPTQ_V2),
    WeightScheme(4, True, 128, GPTQ, act_order=True),
    WeightScheme(8, False, 32, GPTQ, act_order=True),
]


def _id(scheme: WeightScheme) -> str:
    return scheme.label.replace(" ", "-").replace(",", "")


def _unpermuted(layer: Layer) -> torch.Tensor:
    """The repacked layer dequantized in fp16, its input rows back in the checkpoint's order."""
    repacked = layer.repacked()
    dense = dequantize(repacked.weights, torch.float16)
    return dense if repacked.perm is None else dense[:, torch.argsort(repacked.perm)]


@pytest.mark.parametrize("scheme", SCHEMES, ids=_id)
def test_repack_equals_the_producers_reference(scheme: WeightScheme) -> None:
    # N a multiple of 8 but of no tile; K three groups (or 200 inputs, channel-wise).
    k = 3 * scheme.group_size if scheme.group_size else 200
    layer = make_layer(56, k, scheme, seed=k + scheme.num_bits)
    assert torch.equal(_unpermuted(layer), layer.reference)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_vllms_own_awq_dequantizer_agrees(group: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's Triton AWQ dequantization kernel (``awq_triton.awq_dequantize_triton``, run by the
    interpreter) reads the checkpoint tensors to the same weights the repacked layout holds."""
    import ct_wna16_awq_bench
    import vllm.model_executor.layers.quantization as quantization

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    peer = ct_wna16_awq_bench.load_peer(Path(quantization.__file__).with_name("awq_triton.py"))
    layer = make_layer(64, 2 * group, WeightScheme(4, False, group, AWQ), seed=group)
    t = layer.tensors
    theirs = peer.awq_dequantize_triton(t["qweight"], t["scales"], t["qzeros"])
    assert torch.equal(theirs.t(), _unpermuted(layer))


def test_act_order_rows_are_sorted_into_whole_groups() -> None:
    layer = make_layer(24, 256, WeightScheme(4, True, 64, GPTQ, act_order=True), seed=4)
    repacked = layer.repacked()
    groups = layer.tensors["g_idx"][repacked.perm.long()]
    assert torch.equal(groups, torch.arange(256, dtype=torch.int32) // 64)


def _raw(method: str, **extra: object) -> dict[str, object]:
    base = quantization_config(WeightScheme(4, method != "awq", 128, Packing(method)))
    return {**base, **extra}


LINEAR = "model.layers.0.mlp.down_proj"


@pytest.mark.parametrize(
    ("raw", "prefix", "expected"),
    [
        (_raw("awq"), LINEAR, "W4A16 g128 asym (awq)"),
        (_raw("awq", quant_method="awq_marlin", group_size=-1), LINEAR, "W4A16 channel"),
        (_raw("awq", bits=8), LINEAR, "8-bit AWQ"),
        (_raw("awq", modules_to_not_convert=["mlp"]), LINEAR, None),
        (_raw("awq", zero_point=False), LINEAR, "without zero points"),
        (_raw("awq", version="gemv"), LINEAR, "GEMM packing"),
        (_raw("awq", bits=3), LINEAR, "3-bit"),
        (_raw("gptq"), LINEAR, "W4A16 g128 sym (gptq)"),
        (_raw("gptq", sym=False, checkpoint_format="gptq_v2"), LINEAR, "asym (gptq_v2)"),
        (_raw("gptq", desc_act=True), LINEAR, "(gptq, act-order)"),
        (_raw("gptq", desc_act=True, group_size=-1), LINEAR, "W4A16 channel sym (gptq)"),
        (_raw("gptq", group_size=96), LINEAR, "group size 96"),
        (_raw("gptq", checkpoint_format="marlin"), LINEAR, "format 'marlin'"),
        (_raw("gptq", dynamic={r"-:.*\.mlp\..*": {}}), LINEAR, None),
        (_raw("gptq", dynamic={r"+:.*down_proj": {"bits": 8}}), LINEAR, "W8A16 g128 sym"),
        (_raw("gptq", modules_in_block_to_quantize=[["self_attn.q_proj"]]), LINEAR, None),
        (_raw("gptq", modules_in_block_to_quantize=["mlp.down_proj"]), LINEAR, "W4A16"),
    ],
)
def test_config_reading(raw: dict[str, object], prefix: str, expected: str | None) -> None:
    scheme = quant_layer_scheme(raw, QuantLayer(LayerKind.LINEAR, prefix, 4096, 4096))
    if expected is None:
        assert scheme is None
    elif isinstance(scheme, Unsupported):
        assert expected in scheme.reason
    else:
        assert scheme is not None
        assert expected in scheme.label


def test_claims_and_declines_on_each_device() -> None:
    layer = QuantLayer(LayerKind.LINEAR, LINEAR, 4096, 4096)
    experts = QuantLayer(LayerKind.FUSED_MOE, "model.layers.0.mlp.experts", 2048, 768)
    for method in ("awq", "awq_marlin", "gptq", "gptq_marlin"):
        raw = {**_raw(method.split("_")[0]), "quant_method": method}
        claim = plugin.volta_quant_method(QuantConfig(method, raw), layer, Device((7, 0)))
        moe = plugin.volta_quant_method(QuantConfig(method, raw), experts, Device((7, 0)))
        assert getattr(claim, "impl", None) == plugin.AWQ_GPTQ_FACTORY, method
        assert getattr(moe, "impl", None) == plugin.AWQ_GPTQ_MOE_FACTORY, method
    declined = plugin.volta_quant_method(
        QuantConfig("gptq", _raw("gptq", bits=3)), layer, Device((7, 0))
    )
    assert declined is not None
    assert "3-bit" in declined.reason
    act_order = QuantConfig("gptq", _raw("gptq", desc_act=True))
    moe = plugin.volta_quant_method(act_order, experts, Device((7, 0)))
    assert moe is not None
    assert "act-order" in moe.reason
    ampere = plugin.volta_quant_method(QuantConfig("awq", _raw("awq")), layer, Device((8, 0)))
    assert ampere is not None
    assert "vLLM's own kernels" in ampere.reason


def _claim(raw: dict[str, object], layer: QuantLayer) -> object:
    return plugin.volta_quant_method(QuantConfig(str(raw["quant_method"]), raw), layer, SM70_DEVICE)


SM70_DEVICE = Device((7, 0))


def _linear(prefix: str, k: int, n: int, tp: int, split: TensorSplit) -> QuantLayer:
    return QuantLayer(LayerKind.LINEAR, prefix, k, n, tensor_parallel_size=tp, split=split)


#: A compressed-tensors W4A16 g128 config (the other format the plugin reads).
CT_G128 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128},
        }
    },
}


@pytest.mark.parametrize("raw", [_raw("awq"), _raw("gptq"), CT_G128], ids=["awq", "gptq", "ct"])
def test_a_rank_whose_inputs_are_not_whole_groups_is_declined(raw: dict[str, object]) -> None:
    """Qwen3-30B-A3B's experts (intermediate size 768) and a row-parallel layer of 768 inputs,
    in groups of 128: whole groups on each rank at 1 and 2 ranks (768, 384), not at 4 and 8
    (192, 96): declined with the loaders' own reason (``split_groups_reason``), which the plan
    shows. The same inputs split by output rows, or replicated, are whole on every rank."""
    for tp in (1, 2, 4, 8):
        experts = QuantLayer(
            LayerKind.FUSED_MOE, "model.layers.0.mlp.experts", 2048, 768, 128, 8, tp
        )
        row = _linear(LINEAR, 768, 2048, tp, TensorSplit.INPUT)
        for layer, what in ((experts, "intermediate"), (row, "input")):
            answer = _claim(raw, layer)
            if tp <= 2:
                assert isinstance(answer, QuantClaim), (tp, layer, answer)
                continue
            assert isinstance(answer, QuantDecline), (tp, layer, answer)
            assert (
                f"{what} size per TP rank {768 // tp} is not a multiple of the group size 128 "
                f"(768 over {tp} ranks)"
            ) in answer.reason
        for split in (TensorSplit.OUTPUT, TensorSplit.NONE):
            assert isinstance(_claim(raw, _linear(LINEAR, 768, 2048, tp, split)), QuantClaim)


def test_act_order_is_declined_where_ranks_divide_its_inputs() -> None:
    """GPTQ act-order: a row-parallel layer above one rank is declined, and the linear method
    refuses it when built with the same reason (one rule: ``act_order_split_reason``); a
    column-parallel one, whose ranks hold every input, is claimed."""
    raw = _raw("gptq", desc_act=True)
    for tp in (1, 2):
        column = _claim(
            raw, _linear("model.layers.0.mlp.up_proj", 4096, 12288, tp, TensorSplit.OUTPUT)
        )
        assert isinstance(column, QuantClaim)
    assert isinstance(_claim(raw, _linear(LINEAR, 12288, 4096, 1, TensorSplit.INPUT)), QuantClaim)
    declined = _claim(raw, _linear(LINEAR, 12288, 4096, 2, TensorSplit.INPUT))
    assert isinstance(declined, QuantDecline)
    assert "act-order (desc_act) inputs divided across tensor-parallel ranks" in declined.reason
    method = AWQGPTQLinearMethod(WeightScheme(4, True, 128, GPTQ, act_order=True), LINEAR)
    with pytest.raises(WeightFormatError) as refused:
        method.create_weights(
            torch.nn.Module(),
            input_size_per_partition=256,
            output_partition_sizes=[64],
            input_size=512,
            output_size=64,
            params_dtype=torch.float16,
            weight_loader=None,
        )
    assert str(refused.value) == f"layer {LINEAR}: {declined.reason}"


@pytest.fixture(autouse=True)
def plugin_serves_awq_gptq(monkeypatch: pytest.MonkeyPatch) -> None:
    """On 1Cat-vLLM its own SM70 kernels keep AWQ and GPTQ unless asked (the adapter's rule,
    tested in tests/vllm_families); these tests are of the plugin's layers, on every family."""
    monkeypatch.setenv("VLLM_VOLTA_AWQ_GPTQ_WEIGHTS", "plugin")


@pytest.fixture(scope="module")
def vllm_single_rank() -> Iterator[None]:
    with vl.vllm_process():
        yield


K = 256
SIZES = {"column": [48], "row": [40], "merged": [48, 48], "qkv": [64, 32, 32]}
LAYER_SCHEMES = [
    WeightScheme(4, False, 128, AWQ),
    WeightScheme(4, False, 32, AWQ),
    WeightScheme(4, True, 64, GPTQ),
    WeightScheme(4, False, None, GPTQ),
    WeightScheme(8, False, 64, GPTQ_V2),
    WeightScheme(4, True, 32, GPTQ, act_order=True),
]


@pytest.mark.usefixtures("vllm_single_rank")
@pytest.mark.parametrize("scheme", LAYER_SCHEMES, ids=_id)
@pytest.mark.parametrize("kind", ["column", "row", "merged", "qkv"])
def test_vllm_layer_matches_float64_reference(kind: str, scheme: WeightScheme) -> None:
    layer = vl.build(kind, SIZES[kind], K, quantization_config(scheme), bias=kind != "row")
    assert isinstance(layer.quant_method, AWQGPTQLinearMethod)
    shards = [make_layer(n, K, scheme, i + 7, order_seed=7) for i, n in enumerate(SIZES[kind])]
    biases = [torch.randn(n).half() for n in SIZES[kind]] if kind != "row" else None
    vl.load(layer, shards, biases)
    for gone in ("qweight", "qzeros", "scales", "g_idx"):
        assert not hasattr(layer, gone), f"{gone} was not released"
    assert (layer.ct_perm is not None) == scheme.act_order
    x = torch.randn(5, K).half()
    ref = x.double() @ torch.cat([s.reference for s in shards]).double().t()
    if biases is not None:
        ref += torch.cat(biases).double()
    out, _ = layer(x)
    assert rel_error(out, ref) < 2e-3
    one, _ = layer(x[:1])
    assert rel_error(one, ref[:1]) < 2e-3


def _load_bad(scheme: WeightScheme, mutate) -> None:
    layer = vl.build("column", [48], K, quantization_config(scheme), bias=False)
    shard = make_layer(48, K, scheme, seed=1)
    mutate(shard.tensors)
    vl.load(layer, [shard], None)


@pytest.mark.usefixtures("vllm_single_rank")
@pytest.mark.parametrize(
    ("scheme", "mutate", "message"),
    [
        (
            WeightScheme(4, False, 128, AWQ),
            lambda t: t.update(qweight=t["qweight"][:, :4]),
            "qweight of shape (256, 4)",
        ),
        (
            WeightScheme(4, False, 128, AWQ),
            lambda t: t.update(qzeros=t["qzeros"][:1]),
            "qzeros",
        ),
        (
            WeightScheme(4, True, 64, GPTQ),
            lambda t: t.update(scales=t["scales"].float().fill_(float("nan"))),
            "NaN",
        ),
        (
            WeightScheme(4, True, 64, GPTQ),
            lambda t: t.update(qweight=t["qweight"].to(torch.int64)),
            "qweight is torch.int64",
        ),
    ],
    ids=["awq-qweight-columns", "awq-qzeros-rows", "gptq-nan-scales", "gptq-int64-qweight"],
)
def test_malformed_checkpoints_fail_at_load_naming_the_tensor(scheme, mutate, message) -> None:
    with pytest.raises(WeightFormatError, match=r"model\.layers\.0\.mlp\.up") as caught:
        _load_bad(scheme, mutate)
    assert message in str(caught.value)


@pytest.mark.usefixtures("vllm_single_rank")
def test_fused_shards_of_two_row_orders_are_refused() -> None:
    scheme = WeightScheme(4, True, 32, GPTQ, act_order=True)
    layer = vl.build("merged", [48, 48], K, quantization_config(scheme), bias=False)
    shards = [make_layer(48, K, scheme, seed=i) for i in range(2)]
    with pytest.raises(WeightFormatError, match="g_idx differ"):
        vl.load(layer, shards, None)


def test_act_order_groups_split_across_ranks_are_refused() -> None:
    scheme = WeightScheme(4, True, 32, GPTQ, act_order=True)
    layer = make_layer(16, 128, scheme, seed=2)
    t = layer.tensors
    half = torch.cat([t["g_idx"][:64], t["g_idx"][:64]])  # one rank's rows of mixed groups
    with pytest.raises(WeightFormatError, match="tensor parallel size 1"):
        gptq_weights(
            "x",
            scheme,
            n=16,
            k=128,
            qweight=t["qweight"],
            qzeros=t["qzeros"],
            scales=t["scales"],
            g_idx=half,
            act_dtype=torch.float16,
        )


HIDDEN, INTER, EXPERTS, TOP_K = 128, 64, 6, 2
EXPERT_SHAPES = {
    "gate_proj": (INTER, HIDDEN),
    "up_proj": (INTER, HIDDEN),
    "down_proj": (HIDDEN, INTER),
}
#: Group-wise and channel-wise experts of both packings (channel-wise scales load through vLLM's
#: "channel" strategy: down's one row kept whole on each rank).
MOE_SCHEMES = [
    WeightScheme(4, False, 32, AWQ),
    WeightScheme(4, True, 64, GPTQ),
    WeightScheme(4, False, None, AWQ),
    WeightScheme(8, False, None, GPTQ),
]


@pytest.mark.usefixtures("vllm_single_rank")
@pytest.mark.parametrize("scheme", MOE_SCHEMES, ids=_id)
def test_vllm_moe_layer_matches_float64_reference(scheme: WeightScheme, monkeypatch) -> None:
    """A routed-experts layer of the installed family loads every expert through vLLM's
    loader with a model's checkpoint names, and the fused kernel (interpreter) and the CPU
    path both give ``sum_k w_k * down(silu(gate(x)) * up(x))`` in float64."""
    from volta_ct_wna16.awq_gptq_moe import AWQGPTQMoEMethod

    layer = vl.build_moe(
        vl.engine_config(quantization_config(scheme)),
        num_experts=EXPERTS,
        top_k=TOP_K,
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        params_dtype=torch.float16,
        prefix="model.layers.0.mlp.experts",
    )
    made = {
        (e, proj): make_layer(n, k, scheme, seed=10 * e + i)
        for e in range(EXPERTS)
        for i, (proj, (n, k)) in enumerate(EXPERT_SHAPES.items())
    }
    named = [
        (f"{e}.{proj}.{tensor}", value)
        for (e, proj), one in made.items()
        for tensor, value in one.tensors.items()
    ]
    list(layer.load_weights(named))
    experts = layer.experts
    assert isinstance(experts.quant_method, AWQGPTQMoEMethod)
    experts.quant_method.process_weights_after_loading(experts)
    assert not {n for n, _ in experts.named_parameters() if n.startswith(("w13_", "w2_"))}
    gen = torch.Generator().manual_seed(3)
    m = 17
    x = torch.randn(m, HIDDEN, generator=gen).half()
    ids = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(m)])
    weights = torch.rand(m, TOP_K, generator=gen)
    ref = torch.zeros(m, HIDDEN, dtype=torch.float64)
    for t in range(m):
        for w, e in zip(weights[t].tolist(), ids[t].tolist(), strict=True):
            dense = {p: made[(e, p)].reference.double() for p in EXPERT_SHAPES}
            h = torch.nn.functional.silu(dense["gate_proj"] @ x[t].double())
            ref[t] += w * (dense["down_proj"] @ (h * (dense["up_proj"] @ x[t].double())))
    for interpret in ("1", "0"):
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
        out = experts.quant_method.apply(experts, x, weights, ids.to(torch.int32), None, None)
        assert rel_error(out, ref) < 3e-3, interpret


#: Checkpoints GPTQModel 7.7.0 wrote, with its own dequantization of every quantized layer
#: (``data/gptqmodel/make_fixtures.py`` says how they were made).
GPTQMODEL = Path(__file__).with_name("data") / "gptqmodel"


@pytest.mark.parametrize("name", ["gptq_act_order", "awq_gemm"])
def test_gptqmodel_checkpoints_repack_to_gptqmodels_own_dequantization(name: str) -> None:
    """Every layer of a real GPTQModel checkpoint, read by the claim's scheme and repacked,
    dequantizes to exactly what GPTQModel's torch kernels compute from the same tensors in
    fp16 (AWQ's bf16 scales included: both read them into fp16)."""
    import json

    from safetensors.torch import load_file

    folder = GPTQMODEL / name
    raw = json.loads((folder / "config.json").read_text())["quantization_config"]
    tensors = load_file(folder / "model.safetensors")
    references = load_file(folder / "gptqmodel_dequantized.safetensors")
    assert len(references) == 14
    for prefix, reference in references.items():
        n, k = reference.shape
        scheme = quant_layer_scheme(raw, QuantLayer(LayerKind.LINEAR, prefix, k, n))
        assert isinstance(scheme, WeightScheme), (prefix, scheme)
        assert scheme.act_order == (name == "gptq_act_order")
        parts = {t: tensors[f"{prefix}.{t}"] for t in ("qweight", "qzeros", "scales")}
        g_idx = tensors.get(f"{prefix}.g_idx")
        layer = Layer({**parts, "g_idx": g_idx}, scheme, reference)
        assert torch.equal(_unpermuted(layer), reference), prefix


#: Both packings, both widths, both symmetries, group and channel-wise, and act-order (4- and
#: 8-bit), for the kernels' float64 check.
KERNEL_SCHEMES = [
    WeightScheme(4, False, 128, AWQ),
    WeightScheme(4, False, None, AWQ),
    WeightScheme(4, True, 32, GPTQ),
    WeightScheme(8, False, 64, GPTQ),
    WeightScheme(4, False, 64, GPTQ_V2),
    WeightScheme(4, True, 128, GPTQ, act_order=True),
    WeightScheme(8, False, 32, GPTQ, act_order=True),
]
#: Token counts reaching every SM70 stage of the table (the interpreter's device is sm_70):
#: the 1-token GEMV, the 2-4-token FMA tile, the dot tile, the GEMM, dequantize + matmul.
KERNEL_MS = (1, 3, 7, 20, 33, 300)
KERNEL_N = 72  # a multiple of AWQ's 8 columns a word, of no tile


@pytest.mark.parametrize("scheme", KERNEL_SCHEMES, ids=_id)
def test_kernels_on_repacked_weights_match_float64(
    scheme: WeightScheme, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Triton kernels (interpreter), through the layer's own call (act-order's gather
    included), on AWQ and GPTQ weights repacked from vLLM's quantizer's output, against
    ``x @ w_ref.T`` in float64, ``w_ref`` being the dequantized weight that quantizer computes;
    K is three groups (200 inputs channel-wise), no tile's multiple."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # The kernels, not the CPU path's dequantize-and-F.linear, compute every output here.
    monkeypatch.setattr(ops, "reference_linear", None)
    k = 3 * scheme.group_size if scheme.group_size else 200
    layer = make_layer(KERNEL_N, k, scheme, seed=k + scheme.num_bits)
    repacked = layer.repacked()
    module = torch.nn.Module()
    install_packed(module, repacked.weights, repacked.perm)
    stages = {table_launch(m, KERNEL_N, k, scheme.num_bits, (7, 0)) for m in KERNEL_MS}
    every = (SM70.gemv, SM70.small, SM70.decode, SM70.gemm, SM70.dequant)
    assert stages == {launch.scaled_for_bits(scheme.num_bits) for launch in every}
    gen = torch.Generator().manual_seed(11)
    bias = torch.randn(KERNEL_N, generator=gen).half()
    for m in KERNEL_MS:
        x = torch.randn(m, k, generator=gen).half()
        ref = x.double() @ layer.reference.double().t() + bias.double()
        out = apply_packed(module, x, bias)
        assert_rel_close(out, ref, 2e-3, f"m={m}")
