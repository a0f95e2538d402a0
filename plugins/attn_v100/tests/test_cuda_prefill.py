"""The tensor-core prefill (CUDA, ``mma.m8n8k4``): when it is chosen, that every build passes the
sm_70 gate with both products on HMMA, what happens without NVRTC, and, on a GPU, its results
against float64.

On CPU (CI): the selection rule (:func:`volta_attn_v100.dispatch.takes_cuda_prefill`), the sm_70
gate over every shipped build, the SM70 estimate against issue 34's target, the loader's
fallback, strict mode and capture rule through the plugin's own loading seam
(``volta_attn_v100.cuda.prefill.BUILDS.loader``, replaced to succeed or to raise as a
machine without NVRTC or with a broken compile does), and bad input refused before any load. The
``gpu`` tests route ``paged_attention`` as on a V100 (the launcher's device facts say SM70) so
the CUDA kernel runs on the H100, as the device's own cubin and as the compute_70 PTX a V100
build starts from (JIT-compiled by the driver), over every feature, against the float64
reference of the Triton tests, with poisoned outputs; and replayed from a CUDA graph.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from pathlib import Path

import pytest
import torch
from attn_v100_cases import make_case, reference

from volta_attn_v100 import ops
from volta_attn_v100.cuda import prefill
from volta_attn_v100.dispatch import cuda_kernel_configs, takes_cuda_prefill
from volta_attn_v100.inputs import AttentionInputError
from volta_attn_v100.launch import (
    PREFILL_KERNEL,
    cuda_prefill_launch,
    cuda_source,
    prefill_options,
    prefill_shared_bytes,
)
from volta_attn_v100.limits import HEAD_SIZES
from volta_attn_v100.ops import paged_attention
from volta_attn_v100.tables import SM70_CUDA_PREFILL, CudaPrefillTile
from volta_core import V100, CudaKernelConfig, Device
from volta_core.kernel_api import (
    CudaBuilds,
    CudaCompileError,
    CudaToolkitUnavailable,
    DeviceFacts,
    load_cuda_kernel,
)
from volta_devkit.cuda_gate import REGISTERS_PER_BLOCK, block_registers, check_cuda_config
from volta_devkit.gate import MAX_SHARED_BYTES, assert_gate_passes
from volta_devkit.testing import assert_rel_close, poison_

V100_FACTS = DeviceFacts((7, 0), 80)
PREFILL_SOURCE = cuda_source(PREFILL_KERNEL)
CUDA0 = torch.device("cuda", 0)
BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"
#: fp16 output and fp16 probabilities in P.V, as the Triton kernel (tests/test_kernels.py).
TOL = 4e-3


def prefill_builds(device: Device) -> list[CudaKernelConfig]:
    """The tensor-core prefill's builds the plugin lists for ``device``."""
    return [b for b in cuda_kernel_configs(device.capability) if b.kernel == PREFILL_KERNEL]


def _bench():
    if not BENCH.is_file():
        pytest.skip(f"{BENCH} is not here (the sdist holds no benchmarks)")
    spec = importlib.util.spec_from_file_location("attn_v100_bench_cuda", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the selection rule --------------------------------------------------------------------------


def test_a_v100_takes_the_tensor_cores_for_the_tables_head_sizes() -> None:
    """SM70 only, every head size of the table with fp16 or e5m2 KV; e4m3 (no V100 has it), head
    size 512 (its tiles pass 96 KB) and every other device keep Triton."""
    assert set(SM70_CUDA_PREFILL) == set(HEAD_SIZES) - {512}
    for head_size in HEAD_SIZES:
        for kv in ("float16", "fp8_e5m2", "fp8_e4m3"):
            expected = head_size != 512 and kv != "fp8_e4m3"
            assert takes_cuda_prefill((7, 0), head_size, kv) is expected, (head_size, kv)
            for other in ((6, 0), (7, 5), (8, 0), (8, 9), (9, 0)):
                assert not takes_cuda_prefill(other, head_size, kv)


def test_the_builds_are_the_tables() -> None:
    """One build per head size and KV dtype on a V100, made from the table; none elsewhere."""
    builds = prefill_builds(V100)
    assert {b.options for b in builds} == {
        prefill_options(h, fp8, tile) for h, tile in SM70_CUDA_PREFILL.items() for fp8 in (0, 1)
    }
    assert len(builds) == 2 * len(SM70_CUDA_PREFILL)
    for device in (Device((7, 5)), Device((8, 0)), Device((9, 0))):
        assert prefill_builds(device) == []


# -- the sm_70 gate ------------------------------------------------------------------------------

#: At most this many FFMA per HMMA step in a build's SASS: the softmax's few per tile. A dot on
#: the FMA units would take at least head_size * block_n * 8 / 32 of them per warp and tile
#: (256 per HMMA step at head size 128).
FFMA_PER_HMMA = 0.25


@pytest.fixture(scope="module")
def gate_reports() -> dict:
    """The gate's report of every shipped build, by name (one compile each)."""
    return {b.name: check_cuda_config(b, capability=70) for b in prefill_builds(V100)}


@pytest.mark.parametrize("build", prefill_builds(V100), ids=lambda b: b.name)
def test_sm70_gate(gate_reports, build) -> None:
    """Compiles for sm_70 with no spill, at most 96 KB of shared memory and a block the register
    file holds; both products on HMMA: exactly the steps of Q.K^T and P.V of one key tile (the
    loop body, unrolled, is the only place with HMMA) and almost no FFMA."""
    report = gate_reports[build.name]
    assert_gate_passes(report)
    assert report.n_spills == 0
    assert report.shared_bytes <= MAX_SHARED_BYTES
    assert block_registers(report.n_regs, build.block_threads) <= REGISTERS_PER_BLOCK
    head_size = int(build.options[0].split("=")[1])
    bench = _bench()
    hmma = report.sass_histogram.get("HMMA", 0)
    assert hmma == bench.cuda_prefill_hmma_per_tile(head_size), report.sass_histogram
    assert report.sass_histogram.get("FFMA", 0) <= FFMA_PER_HMMA * hmma, report.sass_histogram


def test_the_gate_sees_an_fma_dot() -> None:
    """The FFMA rule can fail: the same source with the score product written as an FMA loop
    (no mma for Q.K^T) has too few HMMA steps and too many FFMA."""
    tile = SM70_CUDA_PREFILL[128]
    fma_dot = PREFILL_SOURCE.replace(
        "mma_m8n8k4(s[b], a.x, a.y, bk.x, bk.y);", "fma_dot(s[b], a, bk);"
    ).replace(
        'extern "C" __global__',
        "__device__ __forceinline__ float low(u32 v) {\n"
        "  float f;\n"
        '  asm("{.reg .b16 l, h; mov.b32 {l, h}, %1; cvt.f32.f16 %0, l;}" : "=f"(f) : "r"(v));\n'
        "  return f;\n"
        "}\n"
        "__device__ __forceinline__ void fma_dot(float (&d)[8], uint2 a, uint2 b) {\n"
        "#pragma unroll\n"
        "  for (int i = 0; i < 8; ++i)\n"
        "    d[i] = fmaf(low(a.x), low(b.x) + i, fmaf(low(a.y), low(b.y), d[i]));\n"
        "}\n"
        'extern "C" __global__',
        1,
    )
    assert fma_dot != PREFILL_SOURCE
    report = check_cuda_config(
        CudaKernelConfig(
            name="fma_dot",
            source=fma_dot,
            kernel="volta_prefill_mma",
            block_threads=tile.num_warps * 32,
            options=prefill_options(128, False, tile),
            dynamic_shared_bytes=prefill_shared_bytes(128, tile),
            claims_tensor_cores=True,
        ),
        capability=70,
    )
    hmma = report.sass_histogram.get("HMMA", 0)
    assert hmma < _bench().cuda_prefill_hmma_per_tile(128)
    assert report.sass_histogram.get("FFMA", 0) > FFMA_PER_HMMA * hmma


def test_shared_memory_as_the_kernel_counts_it() -> None:
    """The launcher's figure for a tile: Q, K, V^T and each warp's P, rows padded by 8 halves
    (the kernel traps when it gets less than its own SMEM_BYTES: the GPU tests run every
    build)."""
    tile = CudaPrefillTile(64, 8)
    assert prefill_shared_bytes(128, tile) == 2 * (64 * 136 + 64 * 136 + 128 * 72 + 64 * 72)
    assert prefill_shared_bytes(80, tile) == 2 * (64 * 88 + 64 * 88 + 96 * 72 + 64 * 72)


# -- the SM70 estimate ---------------------------------------------------------------------------


@pytest.mark.parametrize("seq_len", [2048, 4096, 16384])
def test_sm70_estimate_meets_the_target(seq_len: int) -> None:
    """Issue 34: prefill 8 x 2048, 4 x 4096 and 1 x 16384, causal, head size 128, 32/8 heads:
    the tensor-core prefill's SM70 estimate at most 0.3x the Triton path's (FMA units)."""
    bench = _bench()
    batch = bench.PREFILL_TOKENS // seq_len
    cuda = bench.cuda_prefill_estimate(batch, seq_len, 0, 32, 8, 128)["sm70_estimate_ms"]
    fmas = bench.triton_sm70_fmas(batch, seq_len, 0, 32, 8, 128)
    triton = 2 * fmas / bench.V100_FP32_FLOPS * 1e3
    assert cuda <= 0.3 * triton, (cuda, triton)


def test_the_estimate_counts_padding_and_groups() -> None:
    """A group of 6 fills 60 of 64 rows (10 tokens a program); 16 tokens of a group of 4 are
    one program of one key tile; a group of 80 heads takes two programs a KV head."""
    bench = _bench()
    per_tile = bench.cuda_prefill_hmma_per_tile(128) * bench.HMMA_STEP_FLOPS * 8
    assert bench.cuda_prefill_estimate(1, 16, 0, 4, 1, 128)["sm70_hmma_flops"] == per_tile
    assert bench.cuda_prefill_estimate(1, 20, 0, 6, 1, 128)["sm70_hmma_flops"] == 2 * per_tile
    assert bench.cuda_prefill_estimate(1, 1, 0, 80, 1, 128)["sm70_hmma_flops"] == 2 * per_tile


# -- the launcher's choice, through the plugin's loading seam ------------------------------------


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """Nothing loaded yet, no capture, no strict mode: the list collects the NVRTC options of
    every build the launcher asks to load."""
    monkeypatch.setattr(
        prefill, "BUILDS", CudaBuilds(prefill.BUILDS.what, PREFILL_SOURCE, PREFILL_KERNEL)
    )
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.delenv("VLLM_VOLTA_STRICT", raising=False)
    return []


def _loader(calls: list[tuple[str, ...]], outcome: Exception | None = None):
    def load(source, name, *, options=(), device=None, ptx_arch=None):
        calls.append(tuple(options))
        assert name == "volta_prefill_mma"
        assert "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32" in source
        assert device == CUDA0
        if outcome is not None:
            raise outcome
        return object()

    return load


def test_each_build_loads_once(loads, monkeypatch) -> None:
    monkeypatch.setattr(prefill.BUILDS, "loader", _loader(loads))
    for _ in range(3):
        assert prefill.ready(CUDA0, 128, "float16")
        assert prefill.ready(CUDA0, 128, "fp8_e5m2")
    assert loads == [
        prefill_options(128, False, SM70_CUDA_PREFILL[128]),
        prefill_options(128, True, SM70_CUDA_PREFILL[128]),
    ]


FAILURES = [
    CudaToolkitUnavailable("cuda-bindings is not installed"),
    CudaCompileError("volta_prefill_mma", "sm_70", "prefill.cu(3): error: something"),
]


@pytest.mark.parametrize("failure", FAILURES, ids=["no-nvrtc", "compile-error"])
def test_without_a_build_triton_serves_logged_once(loads, monkeypatch, caplog, failure) -> None:
    monkeypatch.setattr(prefill.BUILDS, "loader", _loader(loads, failure))
    with caplog.at_level(logging.WARNING, logger="volta_core.kernel_api"):
        for head_size in (64, 64, 128, 128):
            assert not prefill.ready(CUDA0, head_size, "float16")
    assert len(loads) == 2  # one try per build, not per call
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert str(failure).split(":")[0] in warnings[0].getMessage()
    assert "Triton serves" in warnings[0].getMessage()


@pytest.mark.parametrize("failure", FAILURES, ids=["no-nvrtc", "compile-error"])
def test_strict_mode_raises_instead(loads, monkeypatch, failure) -> None:
    monkeypatch.setattr(prefill.BUILDS, "loader", _loader(loads, failure))
    monkeypatch.setenv("VLLM_VOLTA_STRICT", "1")
    with pytest.raises(type(failure), match=str(failure).split(":")[0]):
        prefill.ready(CUDA0, 128, "float16")


def test_nothing_compiles_during_capture(loads, monkeypatch) -> None:
    """A build first asked for during CUDA-graph capture is not compiled there: Triton serves
    (strict mode: an error). Warmed up before, it serves during capture."""
    monkeypatch.setattr(prefill.BUILDS, "loader", _loader(loads))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not prefill.ready(CUDA0, 96, "float16")
    monkeypatch.setenv("VLLM_VOLTA_STRICT", "1")
    with pytest.raises(RuntimeError, match="during CUDA-graph capture"):
        prefill.ready(CUDA0, 96, "fp8_e5m2")
    assert loads == []
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    prefill.warm_up(CUDA0, 96, "fp8_e5m2")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert prefill.ready(CUDA0, 96, "fp8_e5m2")
    assert len(loads) == 1


def test_cpu_tensors_and_bad_input_never_load(loads, monkeypatch) -> None:
    """The interpreter (CPU tensors, planned as a V100) runs the Triton kernel, and input the
    Triton path refuses is refused with the same error before anything loads."""
    monkeypatch.setattr(prefill.BUILDS, "loader", _loader(loads))
    case = make_case([(20, 37), (3, 3)], head_size=64, seed=1)
    out = poison_(torch.empty_like(case.query))
    paged_attention(*case.tensors(), out, **case.kwargs())
    assert_rel_close(out, reference(case), TOL, "interpreted prefill")
    bad = poison_(torch.empty_like(case.query))
    with pytest.raises(AttentionInputError, match="block size"):
        paged_attention(
            case.query, case.kv_cache[:, :, :8], *case.tensors()[2:], bad, **case.kwargs()
        )
    with pytest.raises(AttentionInputError, match="sliding window"):
        paged_attention(*case.tensors(), bad, **{**case.kwargs(), "sliding_window": -1})
    assert bad.isnan().all()
    assert loads == []


def test_vector_loads_need_aligned_caches() -> None:
    kv = torch.zeros(4, 2, 16, 128, dtype=torch.float16)
    assert prefill.vector_aligned(kv)
    assert prefill.vector_aligned(kv.permute(1, 0, 2, 3).contiguous().permute(1, 0, 2, 3))
    assert not prefill.vector_aligned(torch.zeros(4 * 2 * 16 * 128 + 1).half()[1:].view(kv.shape))
    wide = torch.zeros(4, 2, 16, 136, dtype=torch.float16)[..., 4:132]
    assert not prefill.vector_aligned(wide)


@pytest.mark.parametrize(("group", "hpp", "chunks"), [(1, 1, 1), (4, 4, 1), (6, 6, 1), (80, 64, 2)])
def test_programs_hold_whole_head_groups(group: int, hpp: int, chunks: int) -> None:
    tile = SM70_CUDA_PREFILL[128]
    launch = cuda_prefill_launch(
        kv_dtype="float16", head_size=128, num_heads=2 * group, num_kv_heads=2, num_seqs=3,
        num_tokens=100,
    )  # fmt: skip
    assert (launch.heads_per_prog, launch.head_chunks, launch.group) == (hpp, chunks, group)
    assert launch.grid == (100 // (tile.block_m // hpp) + 3, 2 * chunks)


# -- on the GPU: the CUDA kernel against float64, routed as on a V100 ----------------------------


@pytest.fixture
def as_v100(monkeypatch: pytest.MonkeyPatch, request) -> list[int]:
    """``paged_attention`` plans as on a V100 (its prefill goes to the CUDA kernel), each build
    loaded fresh as the device's cubin or, with ``request.param`` ``"compute_70"``, as the
    compute_70 PTX the driver JIT-compiles; the list counts the CUDA launches."""
    monkeypatch.setattr(ops, "device_facts", lambda device: V100_FACTS)
    monkeypatch.setenv("VLLM_VOLTA_STRICT", "1")
    ptx_arch = getattr(request, "param", None)
    loader = functools.partial(load_cuda_kernel, ptx_arch=ptx_arch)
    monkeypatch.setattr(
        prefill, "BUILDS", CudaBuilds(prefill.BUILDS.what, PREFILL_SOURCE, PREFILL_KERNEL, loader)
    )
    launches: list[int] = []
    real = prefill.launch

    def counted(*args, **kwargs):
        launches.append(1)
        real(*args, **kwargs)

    monkeypatch.setattr(prefill, "launch", counted)
    return launches


def _check(case, launches: list[int], what: str) -> None:
    out = poison_(torch.empty_like(case.query))
    before = len(launches)
    paged_attention(*case.tensors(), out, **case.kwargs())
    torch.cuda.synchronize()
    assert len(launches) == before + 1, f"{what}: the CUDA kernel did not run"
    assert_rel_close(out, reference(case), TOL, what)


#: Ragged prefill batches: chunks over a cached prefix, a 1-token and an empty sequence, whole
#: sequences, prefixes longer than a tile, a query block's ragged end.
GPU_LENS = [(20, 37), (1, 1), (0, 9), (33, 33), (3, 50), (100, 300), (70, 70)]
GROUPS = [(2, 2), (8, 2), (12, 2), (16, 2)]  # query / KV heads: groups 1, 4, 6, 8
PTX = [None, "compute_70"]


@pytest.mark.gpu
@pytest.mark.parametrize("as_v100", PTX, indirect=True, ids=["cubin", "ptx70"])
@pytest.mark.parametrize("head_size", sorted(SM70_CUDA_PREFILL))
@pytest.mark.parametrize(
    ("kv_dtype", "scales"), [("float16", "none"), ("fp8_e5m2", "tensor"), ("fp8_e5m2", "head")]
)
def test_gpu_head_sizes_and_kv_dtypes(as_v100, head_size, kv_dtype, scales) -> None:
    for i, (num_heads, num_kv_heads) in enumerate(GROUPS):
        case = make_case(
            GPU_LENS, head_size=head_size, num_heads=num_heads, num_kv_heads=num_kv_heads,
            kv_cache_dtype=kv_dtype, scales=scales, block_size=(16, 32)[i % 2], device="cuda",
            seed=head_size + i,
        )  # fmt: skip
        _check(case, as_v100, f"d{head_size} {kv_dtype} {scales} {num_heads}/{num_kv_heads}")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "feature",
    [
        {"sliding_window": 1},
        {"sliding_window": 7},
        {"sliding_window": 100},
        {"logits_soft_cap": 2.5},
        {"sinks": True},
        {"sliding_window": 50, "logits_soft_cap": 10.0, "sinks": True},
    ],
    ids=["window1", "window7", "window100", "softcap", "sinks", "all"],
)
@pytest.mark.parametrize("kv_dtype", ["float16", "fp8_e5m2"])
def test_gpu_features(as_v100, feature, kv_dtype) -> None:
    for head_size, (num_heads, num_kv_heads) in ((64, (12, 2)), (128, (8, 2)), (256, (4, 1))):
        case = make_case(
            GPU_LENS, head_size=head_size, num_heads=num_heads, num_kv_heads=num_kv_heads,
            kv_cache_dtype=kv_dtype, scales="head" if kv_dtype != "float16" else "none",
            device="cuda", seed=head_size, **feature,
        )  # fmt: skip
        _check(case, as_v100, f"d{head_size} {kv_dtype} {feature}")


@pytest.mark.gpu
def test_gpu_long_sequence_and_cache_layouts(as_v100) -> None:
    """A 2000-token chunk over a 1500-token prefix (many query blocks and key tiles), and
    caches laid out in other physical orders (vLLM's KVCacheLayout)."""
    case = make_case([(2000, 3500), (5, 900)], head_size=128, num_heads=32, num_kv_heads=8,
                     device="cuda", seed=7)  # fmt: skip
    _check(case, as_v100, "long")
    for order in ((1, 0, 2, 3), (0, 2, 1, 3)):
        case = make_case(GPU_LENS, head_size=96, device="cuda", physical_order=order, seed=9)
        _check(case, as_v100, f"layout {order}")


@pytest.mark.gpu
def test_gpu_cuda_graph_capture_and_replay(as_v100) -> None:
    """Warmed up eagerly, then captured and replayed three times into poisoned outputs."""
    case = make_case(GPU_LENS, head_size=128, num_heads=8, num_kv_heads=2,
                     kv_cache_dtype="fp8_e5m2", scales="head", device="cuda", seed=3)  # fmt: skip
    ref = reference(case)
    out = torch.empty_like(case.query)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    kwargs = {**case.kwargs(), "check_bounds": False}
    with torch.cuda.stream(stream):
        paged_attention(*case.tensors(), poison_(out), **kwargs)
        torch.cuda.synchronize()
        assert_rel_close(out, ref, TOL, "eager")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        paged_attention(*case.tensors(), out, **kwargs)
    for replay in range(3):
        poison_(out)
        graph.replay()
        torch.cuda.synchronize()
        assert_rel_close(out, ref, TOL, f"replay {replay}")
    assert len(as_v100) == 2


@pytest.mark.gpu
def test_gpu_small_for_sanitizer(as_v100) -> None:
    """Small launches of both KV dtypes, a ragged batch with a prefix, window and sinks, for
    compute-sanitizer memcheck and racecheck runs."""
    for kv_dtype in ("float16", "fp8_e5m2"):
        case = make_case([(20, 37), (0, 5), (9, 9)], head_size=64, num_heads=8, num_kv_heads=2,
                         kv_cache_dtype=kv_dtype, sliding_window=20, sinks=True, device="cuda",
                         seed=5)  # fmt: skip
        _check(case, as_v100, f"small {kv_dtype}")
