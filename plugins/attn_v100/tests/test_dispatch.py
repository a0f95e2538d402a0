"""What a launch costs, and the plan's stages priced as the plan prints them
(:func:`volta_attn_v100.dispatch.stage_cost`, the ``volta_kernel_cost`` hook): bytes and FLOPs
against hand-computed values, the unit and the fallback as the kernel paths name them."""

from __future__ import annotations

import pytest

from volta_attn_v100 import dispatch
from volta_attn_v100.dispatch import TENSOR_CORES, TRITON, attention_paths, stage_cost
from volta_attn_v100.limits import MAX_DECODE_QUERY_LEN
from volta_attn_v100.plugin import BACKEND_NAME
from volta_core import V100, AttentionLayer, Device, VoltaPluginManager
from volta_core.kernel_api import Unit, Workload

H100 = Device((9, 0))


def layer(head: int, heads: int, kv_heads: int, kv: str = "auto") -> AttentionLayer:
    return AttentionLayer("model.layers.0.self_attn.attn", head, heads, kv_heads, "float16", kv)


def test_a_v100_decode_by_hand() -> None:
    """4 sequences of 1 token at 1024 keys, 32/8 heads of 128, fp16 KV on a V100: the CUDA
    decode, one chunk of 8 rows per KV head, 5 partitions (2 programs a SM on 80 SMs: 32
    programs x 5 fill 160 slots); its fallback the Triton decode of 16-row tiles."""
    cost = stage_cost(layer(128, 32, 8), (7, 0), 80, Workload(4, 1, 1024))
    assert cost.stage == "decode, 1-4 query tokens"
    kv = 4 * 1024 * 2 * 128 * 8 * 2
    io = 4 * 32 * 128 * 2
    partials = 4 * 32 * 5 * (128 * 4 + 8)
    ((cuda,),) = [cost.cost.launches]
    assert cost.cost.kernel == TENSOR_CORES
    assert (cuda.bytes_read, cuda.bytes_written) == (kv + io + partials, io + partials)
    assert cuda.flops == 4 * 4 * (8 * 8) * 128 * 1024
    assert cuda.unit is Unit.TENSOR_CORES
    assert cost.fallback is not None
    ((triton,),) = [cost.fallback.launches]
    assert cost.fallback.kernel == TRITON
    assert (triton.bytes_read, triton.bytes_written) == (kv + io + partials, io + partials)
    assert triton.flops == 4 * 4 * (8 * 16) * 128 * 1024
    assert triton.unit is Unit.FMA


def test_an_fp8_cache_reads_half_the_kv_bytes() -> None:
    work = Workload(8, 1, 4096)
    fp16 = stage_cost(layer(128, 32, 8), (7, 0), 80, work).cost
    fp8 = stage_cost(layer(128, 32, 8, "fp8_e5m2"), (7, 0), 80, work).cost
    assert fp16.bytes - fp8.bytes == 8 * 4096 * 2 * 128 * 8
    assert fp16.flops == fp8.flops


def test_a_v100_prefill_by_hand() -> None:
    """One sequence of 128 new tokens, 8/8 heads of 64, fp16 KV: the CUDA prefill's 64-row
    blocks (one head a program, 64 tokens) walk 64 and 128 keys; the Triton SM70 tile's 32-row
    blocks walk 32, 64, 96 and 128 keys in tiles of 16."""
    cost = stage_cost(layer(64, 8, 8), (7, 0), 80, Workload(1, 128, 128))
    assert cost.stage == "prefill"
    kv = 128 * 2 * 64 * 8 * 2
    io = 128 * 8 * 64 * 2
    ((cuda,),) = [cost.cost.launches]
    assert (cuda.bytes_read, cuda.bytes_written, cuda.unit) == (kv + io, io, Unit.TENSOR_CORES)
    assert cuda.flops == 4 * (8 * 64) * 64 * (64 + 128)
    assert cost.fallback is not None
    ((triton,),) = [cost.fallback.launches]
    assert (triton.bytes_read, triton.bytes_written, triton.unit) == (kv + io, io, Unit.FMA)
    assert triton.flops == 4 * (8 * 32) * 64 * (32 + 64 + 96 + 128)


def test_an_h100_decode_is_triton_on_the_tensor_cores() -> None:
    cost = stage_cost(layer(128, 32, 8), (9, 0), 132, Workload(4, 1, 1024))
    assert (cost.cost.kernel, cost.cost.unit, cost.fallback) == (TRITON, Unit.TENSOR_CORES, None)


LAYERS = [
    layer(128, 32, 8),
    layer(128, 32, 8, "fp8_e5m2"),
    layer(256, 24, 4),
    layer(128, 8, 8, "fp8_e5m2"),
    layer(64, 16, 2),
    layer(512, 16, 2),
    layer(80, 64, 8, "fp8_e4m3"),
]


@pytest.mark.parametrize("device", [V100, Device((8, 0)), Device((8, 9)), H100], ids=str)
@pytest.mark.parametrize(
    "attn", LAYERS, ids=lambda a: f"{a.head_size}_{a.num_heads}_{a.kv_cache_dtype}"
)
def test_each_stage_is_priced_as_the_plan_prints_it(device, attn) -> None:
    """For every decode query length and a prefill: the stage is one the plan prints, the cost
    is its kernel's on its unit (tensor cores exactly where the path is CUDA or the device is
    SM80+), and a fallback's cost exactly where the path needs NVRTC."""
    if attn.kv_cache_dtype == "fp8_e4m3" and device.capability < (8, 9):
        pytest.skip("e4m3 is declared from SM89")
    paths = {p.stage: p for p in attention_paths(attn, device.capability)}
    sms = dispatch.plan_sm_count(device.capability)
    seen = set()
    for query_len in [*range(1, MAX_DECODE_QUERY_LEN + 1), MAX_DECODE_QUERY_LEN + 1, 2048]:
        cost = stage_cost(attn, device.capability, sms, Workload(3, query_len, 4096))
        path = paths[cost.stage]
        seen.add(cost.stage)
        assert (cost.stage == "prefill") == (query_len > MAX_DECODE_QUERY_LEN)
        assert (cost.cost.kernel, cost.cost.unit.value) == (path.kernel, path.unit)
        tensor_cores = path.kernel == TENSOR_CORES or device.capability >= (8, 0)
        assert (cost.cost.unit is Unit.TENSOR_CORES) == tensor_cores
        assert (cost.fallback is not None) == path.needs_nvrtc
        if cost.fallback is not None:
            assert (cost.fallback.kernel, cost.fallback.unit.value) == (
                path.fallback,
                path.fallback_unit,
            )
        assert cost.cost.flops > 0
        assert cost.cost.bytes > 0
    assert seen == set(paths)


def test_the_host_asks_the_plugin_for_its_layers_only() -> None:
    """Through the host (``volta_kernel_cost``): this backend's attention layers are priced by
    dispatch at a V100's 80 SMs; another backend's layer is not priced here."""
    manager = VoltaPluginManager()
    manager.load_entrypoints(["attn_v100", "fp8kv"])
    attn, work = layer(128, 32, 8), Workload(16, 1, 8192)
    answer = manager.kernel_cost("attn_v100", attn, BACKEND_NAME, V100, None, work)
    assert answer == stage_cost(attn, (7, 0), 80, work)
    assert manager.kernel_cost("attn_v100", attn, "TRITON_ATTN", V100, None, work) is None
