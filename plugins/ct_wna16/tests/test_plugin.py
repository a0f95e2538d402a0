"""The hooks: what the plugin claims, declines and leaves alone, through the real host."""

from __future__ import annotations

import copy
import subprocess
import sys
from importlib import metadata

import pytest
from ct_wna16_checkpoints import fresh_checkpoint, quantization_config

from volta_core.device import Device
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.records import ENTRY_POINT_GROUP
from volta_core.host.types import (
    KernelPath,
    LayerKind,
    QuantClaim,
    QuantConfig,
    QuantDecline,
    QuantLayer,
)
from volta_core.kernel_api import StageCost, Unit, Workload
from volta_ct_wna16 import plugin
from volta_ct_wna16.dispatch import (
    KERNEL_NAMES,
    MOE_BLOCKS,
    MOE_DECODE,
    MOE_DECODE_ONE,
    linear_choice,
    moe_decode_choice,
    packed_bytes,
    table_launch,
)
from volta_ct_wna16.gate_configs import cuda_builds, moe_cuda_builds
from volta_ct_wna16.plugin import METHOD
from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.tables import MMA, MoEFused

V100 = Device((7, 0))
T4 = Device((7, 5))
H100 = Device((9, 0))
A100 = Device((8, 0))
FMA, TENSOR_CORES = Unit.FMA.value, Unit.TENSOR_CORES.value


@pytest.fixture(scope="module")
def manager() -> VoltaPluginManager:
    pm = VoltaPluginManager(strict=True)
    pm.register(plugin, "ct_wna16", distribution="vllm-volta-ct-wna16", version="0.1.0")
    return pm


W4_G128 = WeightScheme(4, True, 128)


def config(scheme: WeightScheme = W4_G128, **changes) -> QuantConfig:
    raw = quantization_config(scheme, ignore=changes.pop("ignore", None))
    raw["config_groups"]["group_0"]["weights"].update(changes.pop("weights", {}))
    raw["config_groups"]["group_0"].update(changes)
    return QuantConfig("compressed-tensors", raw)


def linear(prefix: str = "model.layers.0.mlp.down_proj") -> QuantLayer:
    return QuantLayer(LayerKind.LINEAR, prefix, 5120, 5120)


def test_entry_point_is_installed() -> None:
    eps = {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    assert eps["ct_wna16"].value == "volta_ct_wna16.plugin"
    assert eps["ct_wna16"].dist.metadata["Name"] == "vllm-volta-ct-wna16"


def test_loading_the_plugin_imports_no_torch_triton_or_vllm() -> None:
    code = (
        "import sys, volta_ct_wna16.plugin as p; from volta_core.device import V100;"
        "list(p.volta_kernel_configs(V100));"
        "print(sorted(m for m in ('torch','triton','vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group", [32, 64, 128, None])
@pytest.mark.parametrize("device", [V100, T4, H100])
def test_claims_supported_schemes(manager, bits, symmetric, group, device) -> None:
    resolution = manager.resolve_quant(
        config(WeightScheme(bits, symmetric, group)), linear(), device
    )
    assert isinstance(resolution.claim, QuantClaim)
    assert resolution.source == "ct_wna16"
    assert resolution.claim.impl == "volta_ct_wna16.linear:make_linear_method"
    assert resolution.claim.detail == WeightScheme(bits, symmetric, group).label


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"weights": {"num_bits": 2}}, "2-bit"),
        ({"weights": {"actorder": "group"}}, "g_idx"),
        ({"weights": {"type": "float", "num_bits": 8}}, "not int"),
        ({"weights": {"group_size": 16}}, "group size 16"),
        ({"weights": {"strategy": "tensor"}}, "strategy 'tensor'"),
        ({"weights": {"dynamic": True}}, "dynamic"),
        ({"input_activations": {"num_bits": 8, "type": "int"}}, "activations"),
        ({"format": "int-quantized"}, "format 'int-quantized'"),
    ],
)
def test_declines_what_it_does_not_run_with_a_reason(manager, changes, reason) -> None:
    resolution = manager.resolve_quant(config(**copy.deepcopy(changes)), linear(), V100)
    assert resolution.claim is None
    [(source, decline)] = resolution.declines
    assert source == "ct_wna16"
    assert isinstance(decline, QuantDecline)
    assert reason in decline.reason


EXPERTS = "model.layers.0.mlp.experts"


def experts(prefix: str = EXPERTS) -> QuantLayer:
    return QuantLayer(LayerKind.FUSED_MOE, prefix, 2048, 768)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group", [32, 128, None])
@pytest.mark.parametrize("device", [V100, H100])
def test_claims_fused_moe_experts_and_names_their_kernels(
    manager, bits, symmetric, group, device
) -> None:
    """The claim names the scheme; the kernel paths name the decode step's kernels up to the
    table's last decode row (16 tokens: on the H100 one launch up to 4, two launches above)
    and the routed blocks above, as the launcher chooses them."""
    scheme = WeightScheme(bits, symmetric, group)
    resolution = manager.resolve_quant(config(scheme), experts(), device)
    assert isinstance(resolution.claim, QuantClaim)
    assert resolution.claim.impl == "volta_ct_wna16.moe:make_moe_method"
    assert resolution.claim.detail == f"{scheme.label} fused MoE experts"
    paths = manager.kernel_paths("ct_wna16", experts(), METHOD, device, config(scheme))
    decode = (
        (
            KernelPath("1-4 tokens", MOE_DECODE_ONE, unit=FMA),
            KernelPath("5-16 tokens", MOE_DECODE, unit=FMA),
        )
        if device == H100
        else (KernelPath("1-16 tokens", MOE_DECODE, unit=FMA),)
    )
    blocks = TENSOR_CORES if device == H100 else FMA  # tl.dot: tensor cores from SM80 only
    assert paths == (*decode, KernelPath("17+ tokens", MOE_BLOCKS, unit=blocks))
    for tokens in (1, 4, 5, 16):
        choice = moe_decode_choice(tokens, device.capability)
        assert choice is not None
        assert isinstance(choice.launch, MoEFused) == (device == H100 and tokens <= 4)
    assert moe_decode_choice(17, device.capability) is None


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"weights": {"actorder": "group"}}, "g_idx"),
        ({"weights": {"num_bits": 2}}, "2-bit"),
        ({"input_activations": {"num_bits": 8, "type": "int"}}, "activations"),
    ],
)
def test_declines_fused_moe_experts_it_does_not_run(manager, changes, reason) -> None:
    resolution = manager.resolve_quant(config(**copy.deepcopy(changes)), experts(), V100)
    assert resolution.claim is None
    [(_, decline)] = resolution.declines
    assert reason in decline.reason
    [(_, decline)] = manager.resolve_quant(config(), experts(), A100).declines
    assert "sm_80" in decline.reason


def test_fused_moe_experts_are_read_from_expert_zeros_projections(manager) -> None:
    # vLLM asks for the fused module; the checkpoint names each expert's projections.
    ignored = config(ignore=["re:.*mlp\\.experts\\..*"])
    assert manager.resolve_quant(ignored, experts(), V100).declines == ()
    partly = config(ignore=[f"{EXPERTS}.0.down_proj"])
    [(_, decline)] = manager.resolve_quant(partly, experts(), V100).declines
    assert "quantized differently" in decline.reason
    assert "down_proj: unquantized" in decline.reason
    targeted = config(targets=["re:.*experts.*_proj$"])
    assert manager.resolve_quant(targeted, experts(), V100).claim is not None
    assert manager.resolve_quant(targeted, linear(), V100).claim is None


def test_declines_untested_devices(manager) -> None:
    resolution = manager.resolve_quant(config(), linear(), A100)
    assert resolution.claim is None
    assert "sm_80" in resolution.declines[0][1].reason


@pytest.mark.parametrize(
    ("ignore", "prefix"),
    [
        (["lm_head"], "lm_head"),
        (["model.layers.0.mlp.gate"], "model.layers.0.mlp.gate"),
        (["re:.*mlp.gate$"], "model.layers.3.mlp.gate"),
        (["re:.*linear_attn.*"], "model.layers.1.linear_attn.in_proj_qkvz"),
        (["re:.*self_attn.[qkv]_proj$"], "model.layers.2.self_attn.qkv_proj"),
    ],
)
def test_ignored_modules_stay_unquantized(manager, ignore, prefix) -> None:
    resolution = manager.resolve_quant(config(ignore=ignore), linear(prefix), V100)
    assert resolution.claim is None
    assert resolution.declines == ()


def test_regex_ignore_uses_re_match_like_compressed_tensors(manager) -> None:
    # re.match anchors at the start: "mlp.gate" alone does not match a dotted path.
    cfg = config(ignore=["re:mlp.gate"])
    assert manager.resolve_quant(cfg, linear("model.layers.0.mlp.gate"), V100).claim is not None


def test_fused_module_with_partly_ignored_shards_is_declined(manager) -> None:
    cfg = config(ignore=["model.layers.0.self_attn.q_proj"])
    resolution = manager.resolve_quant(cfg, linear("model.layers.0.self_attn.qkv_proj"), V100)
    assert resolution.claim is None
    assert "disagree" in resolution.declines[0][1].reason


def test_attention_and_embedding_layers_get_no_claim(manager) -> None:
    for kind in (LayerKind.ATTENTION, LayerKind.EMBEDDING):
        layer = QuantLayer(kind, "model.layers.0.self_attn.attn")
        resolution = manager.resolve_quant(config(), layer, V100)
        assert resolution.claim is None
        assert resolution.declines == ()


def test_other_methods_and_untargeted_layers_are_not_its_business(manager) -> None:
    assert manager.resolve_quant(QuantConfig("awq", {}), linear(), V100).declines == ()
    cfg = config(targets=["re:.*mlp.*"])
    resolution = manager.resolve_quant(cfg, linear("model.layers.0.self_attn.o_proj"), V100)
    assert resolution.claim is None
    assert resolution.declines == ()
    resolution = manager.resolve_quant(cfg, linear("model.layers.0.mlp.down_proj"), V100)
    assert resolution.claim is not None


def test_declares_its_method(manager) -> None:
    [(source, spec)] = manager.quant_methods()
    assert (source, spec.name, spec.impl) == ("ct_wna16", plugin.METHOD, plugin.FACTORY)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group", [32, 128, None])
def test_packed_bytes_counts_what_the_kernels_read(bits, symmetric, group) -> None:
    """The plan's weight bytes (which decide the SM70 model's choice) are the prepared
    layer's own (an input of three 128-groups: not a power of two)."""
    scheme = WeightScheme(bits, symmetric, group)
    layer = fresh_checkpoint(40, 384, scheme, seed=bits).packed()
    assert packed_bytes(40, 384, scheme) == layer.nbytes()


@pytest.mark.parametrize("device", [V100, H100])
@pytest.mark.parametrize(("n", "k"), [(27648, 5120), (5120, 5120), (5120, 27648), (600, 1152)])
def test_the_plan_shows_the_launchers_kernel_at_every_token_count(manager, device, n, k) -> None:
    """``volta_kernel_paths`` covers every token count once, in order, and names at each the
    kernel the launcher's rules pick (the tensor cores on sm_70 with the Triton launch as the
    fallback without NVRTC)."""
    scheme = W4_G128
    layer = QuantLayer(LayerKind.LINEAR, "model.layers.0.mlp.up_proj", k, n)
    paths = manager.kernel_paths("ct_wna16", layer, METHOD, device, config(scheme))
    bounds = [p.stage.removesuffix(" tokens").removesuffix(" token") for p in paths]
    assert bounds[-1].endswith("+")
    covered: list[int] = []
    for bound, path in zip(bounds, paths, strict=True):
        lo, _, hi = bound.rstrip("+").partition("-")
        last = int(hi or lo) if not bound.endswith("+") else 400
        for m in range(int(lo), last + 1):
            covered.append(m)
            triton = KERNEL_NAMES[table_launch(m, n, k, 4, device.capability).path]
            choice = linear_choice(m, n, k, 4, packed_bytes(n, k, scheme), device.capability)
            mma = choice.launch.path == MMA
            assert path.needs_nvrtc == mma, (m, path)
            assert path.kernel == (KERNEL_NAMES[MMA] if mma else triton), (m, path)
            assert path.fallback == (triton if mma else ""), (m, path)
            assert path.unit == choice.unit.value, (m, path)
    assert covered == list(range(1, 401))
    assert any(p.needs_nvrtc for p in paths) == (device == V100)


def test_no_paths_for_what_it_does_not_serve(manager) -> None:
    quant = config()
    assert manager.kernel_paths("ct_wna16", linear(), "other", V100, quant) == ()
    assert manager.kernel_paths("ct_wna16", linear(), METHOD, V100, None) == ()
    attention = QuantLayer(LayerKind.ATTENTION, "model.layers.0.self_attn.attn")
    assert manager.kernel_paths("ct_wna16", attention, METHOD, V100, quant) == ()


@pytest.mark.parametrize("device", [V100, H100])
def test_the_estimate_prices_the_stage_the_plan_prints(manager, device) -> None:
    """``volta_kernel_cost`` answers, through the host's checks, with the stage of
    ``volta_kernel_paths`` the workload falls in, and a fallback's cost exactly where that
    stage needs NVRTC; fused experts with their sizes get their stage too."""
    quant = config()
    layer = linear()
    paths = {p.stage: p for p in manager.kernel_paths("ct_wna16", layer, METHOD, device, quant)}
    for tokens in (1, 3, 8, 16, 40, 256, 257, 4096):
        work = Workload(tokens)
        cost = manager.kernel_cost("ct_wna16", layer, METHOD, device, quant, work)
        assert isinstance(cost, StageCost)
        path = paths[cost.stage]
        assert cost.cost.kernel == path.kernel
        assert cost.cost.unit.value == path.unit
        assert (cost.fallback is not None) == path.needs_nvrtc
        if cost.fallback is not None:
            assert cost.fallback.kernel == path.fallback
    moe = QuantLayer(LayerKind.FUSED_MOE, "model.layers.0.mlp.experts", 2048, 768, 128, 8)
    expert_stages = [p.stage for p in manager.kernel_paths("ct_wna16", moe, METHOD, device, quant)]
    for tokens in (1, 5, 17):
        cost = manager.kernel_cost("ct_wna16", moe, METHOD, device, quant, Workload(tokens))
        assert isinstance(cost, StageCost)
        assert cost.stage in expert_stages


def test_no_cost_for_what_it_does_not_serve(manager) -> None:
    quant, work = config(), Workload(4)
    assert manager.kernel_cost("ct_wna16", linear(), "other", V100, quant, work) is None
    assert manager.kernel_cost("ct_wna16", linear(), METHOD, V100, None, work) is None
    attention = QuantLayer(LayerKind.ATTENTION, "model.layers.0.self_attn.attn")
    assert manager.kernel_cost("ct_wna16", attention, METHOD, V100, quant, work) is None
    # Experts whose count or top-k the host does not know: the host's own model serves.
    experts_unknown = QuantLayer(LayerKind.FUSED_MOE, "model.layers.0.mlp.experts", 2048, 768)
    assert manager.kernel_cost("ct_wna16", experts_unknown, METHOD, V100, quant, work) is None


def test_the_cuda_builds_are_declared_through_the_host(manager) -> None:
    declared = manager.cuda_kernel_configs(V100)
    assert declared
    assert [cfg for _, cfg in declared] == [*cuda_builds(V100), *moe_cuda_builds(V100)]
    assert {plugin for plugin, _ in declared} == {"ct_wna16"}
    assert manager.cuda_kernel_configs(H100) == []
