"""The tensor-core GEMM (CUDA, ``mma.m8n8k4``): when it is chosen, what happens without NVRTC,
and, on a GPU, its results against float64.

On CPU (CI): the selection rule on a V100 (:func:`volta_ct_wna16.dispatch.linear_choice`), the
launcher's choice through the plugin's own loading seam (``volta_ct_wna16.cuda.mma.BUILDS.loader``,
replaced to succeed or to raise as a machine without NVRTC or with a
broken compile does), the fallback, strict mode and the refusals before any launch. The
``gpu`` tests run every token class, group size, symmetry and width on CUDA against float64,
both as the device's own cubin and as the compute_70 PTX a V100 build starts from (JIT-compiled
by the driver), and replayed from a CUDA graph.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch
from ct_wna16_checkpoints import fresh_checkpoint

from volta_core.kernel_api import (
    CudaBuilds,
    CudaCompileError,
    CudaToolkitUnavailable,
    DeviceFacts,
    arrival_counters,
    device_facts,
    zeroed_accumulators,
)
from volta_ct_wna16 import ops
from volta_ct_wna16.cuda import KERNEL, SOURCE, mma
from volta_ct_wna16.dispatch import linear_choice, linear_cost, mma_flops, table_launch
from volta_ct_wna16.launch import mma_options, split_count
from volta_ct_wna16.layout import PackedWeights, dequantize
from volta_ct_wna16.ops import wna16_linear
from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.tables import MMA, MMA_MAX_M, MMA_MIN_M, SM70, SM70_MMA, Launch
from volta_devkit.testing import assert_rel_close, poison_

V100 = DeviceFacts((7, 0), 80)
CUDA0 = torch.device("cuda", 0)
SCHEMES = [
    WeightScheme(b, s, g) for b in (4, 8) for s in (True, False) for g in (32, 64, 128, None)
]
#: As the Triton dot paths: one rounding of each dequantized weight and of the output.
TOLERANCE = 2e-3


def row_for(m: int) -> Launch:
    """The table's tensor-core launch for ``m`` tokens, whatever the model says."""
    return next(launch for most, launch in SM70_MMA if m <= most)


def weight_bytes(n: int, k: int, bits: int, group: int | None, symmetric: bool) -> int:
    groups = k // group if group else 1
    return -(-k // (32 // bits)) * n * 4 + groups * n * 2 * (1 if symmetric else 2)


# -- the selection rule ----------------------------------------------------------------------


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(("n", "k"), [(5120, 5120), (27648, 5120), (5120, 27648), (7168, 5120)])
def test_v100_takes_tensor_cores_for_8_to_256_tokens(bits: int, n: int, k: int) -> None:
    """On every layer of the benchmark the model puts the tensor cores ahead of the Triton
    launch at 8-256 tokens, with the row of the token class; never outside it, nor on another
    device (m8n8k4 is Volta's shape: Turing and Hopper keep their tables)."""
    wb = weight_bytes(n, k, bits, 128, True)
    for m in range(1, 300):
        choice = linear_choice(m, n, k, bits, wb, (7, 0))
        triton = table_launch(m, n, k, bits, (7, 0))
        if MMA_MIN_M <= m <= MMA_MAX_M:
            assert choice.launch == row_for(m), m
            assert choice.fallback is not None, m
            assert choice.fallback.launch == triton, m
        else:
            assert choice.launch == triton, m
            assert choice.fallback is None, m
        for other in ((7, 5), (8, 0), (9, 0)):
            chosen = linear_choice(m, n, k, bits, wb, other)
            assert chosen.launch == table_launch(m, n, k, bits, other), (m, other)
            assert chosen.fallback is None


def test_the_triton_launch_stays_where_the_model_favours_it() -> None:
    """A layer of 8 outputs fills 8 of a block's 256 columns: its padded tensor-core product
    takes longer than the activations' bytes, which bound the Triton launch."""
    n, k = 8, 8192
    wb = weight_bytes(n, k, 4, 128, True)
    launch = row_for(16)
    triton = table_launch(16, n, k, 4, (7, 0))
    tensor_cores = linear_cost(16, n, k, launch, 4, wb, (7, 0)).seconds()
    assert tensor_cores > linear_cost(16, n, k, triton, 4, wb, (7, 0)).seconds()
    assert linear_choice(16, n, k, 4, wb, (7, 0)).launch == triton


def test_the_sm70_estimate_meets_the_target_at_16_and_64_tokens() -> None:
    """Issue 34's target: W4A16 27648 x 5120 at M=16 and 64, the tensor-core GEMM's SM70
    estimate at most 0.5x of the Triton dot path's (the FMA units)."""
    n, k = 27648, 5120
    wb = weight_bytes(n, k, 4, 128, True)
    dot = SM70.decode  # the Triton dot tile, on the FMA units of a V100
    for m in (16, 64):
        mma_seconds = linear_cost(m, n, k, row_for(m), 4, wb, (7, 0)).seconds()
        ratio = mma_seconds / linear_cost(m, n, k, dot, 4, wb, (7, 0)).seconds()
        assert ratio <= 0.5, (m, ratio)


def test_padding_counts_in_the_tensor_core_estimate() -> None:
    """33 tokens run a 64-row block: the model counts the padded rows, and a layer whose
    outputs are not whole blocks its padded columns."""
    launch = row_for(33)
    assert launch.block_m == 64
    assert mma_flops(33, 256, 1024, launch, 4) == 2 * 64 * 256 * 1024
    assert mma_flops(64, 300, 1000, launch, 4) == 2 * 64 * 512 * 1024
    assert mma_flops(64, 256, 1000, launch, 8) == 2 * 64 * 256 * 1008


def test_tensor_core_launches_are_checked() -> None:
    good = row_for(16)
    for change in ({"block_m": 12}, {"block_k": 64}, {"block_n": 200}, {"split_cost": None}):
        with pytest.raises(ValueError, match="tensor-core launch"):
            replace(good, **change)


# -- the launcher's choice on a V100, through the plugin's loading seam ---------------------


@pytest.fixture
def v100(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """A V100 behind ``cuda:0`` for the launcher's choice, nothing loaded yet, no capture: the
    list collects the NVRTC options of every build the launcher loads."""
    monkeypatch.setattr(ops, "device_facts", lambda device: V100)
    monkeypatch.setattr(mma, "BUILDS", CudaBuilds(mma.BUILDS.what, SOURCE, KERNEL))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.delenv("VLLM_VOLTA_STRICT", raising=False)
    return []


def _loads(calls: list[tuple[str, ...]], outcome: Exception | None = None):
    def load(source, name, *, options=(), device=None, ptx_arch=None):
        calls.append(tuple(options))
        assert name == "wna16_mma"
        assert "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32" in source
        assert device == CUDA0
        if outcome is not None:
            raise outcome
        return object()

    return load


def _layer(bits: int = 4, symmetric: bool = False) -> PackedWeights:
    return fresh_checkpoint(512, 1024, WeightScheme(bits, symmetric, 128), seed=1).packed()


def test_a_v100_with_nvrtc_takes_the_tensor_cores(v100, monkeypatch) -> None:
    monkeypatch.setattr(mma.BUILDS, "loader", _loads(v100))
    pw = _layer()
    for m in (8, 16, 17, 33, 256):
        launch = ops.select_launch(m, pw, CUDA0)
        assert launch == row_for(m)
        assert launch.path == MMA
    # One load per build (three rows), each with its own options; asked again, none.
    assert v100 == [mma_options(row_for(m), 4, True) for m in (8, 17, 33)]
    ops.select_launch(16, pw, CUDA0)
    assert len(v100) == 3
    # Outside 8-256 tokens the table's Triton launches, and nothing is loaded for them.
    for m in (1, 4, 7, 257, 2048):
        assert ops.select_launch(m, pw, CUDA0) == table_launch(m, pw.n, pw.k, 4, (7, 0))
    assert len(v100) == 3


@pytest.mark.parametrize(
    "failure",
    [
        CudaToolkitUnavailable("cuda-bindings is not installed"),
        CudaCompileError("wna16_mma", "sm_70", "wna16_mma.cu(3): error: something"),
    ],
    ids=["no-nvrtc", "compile-error"],
)
def test_without_a_build_the_triton_kernels_serve_logged_once(
    v100, monkeypatch, caplog, failure
) -> None:
    monkeypatch.setattr(mma.BUILDS, "loader", _loads(v100, failure))
    pw = _layer(8, symmetric=True)
    with caplog.at_level(logging.WARNING, logger="volta_core.kernel_api"):
        for m in (16, 16, 40, 100):
            assert ops.select_launch(m, pw, CUDA0) == table_launch(m, pw.n, pw.k, 8, (7, 0))
    assert len(v100) == 2  # one try per build, not per call
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert str(failure).split(":")[0] in warnings[0].getMessage()
    assert "Triton serves" in warnings[0].getMessage()


@pytest.mark.parametrize(
    "failure",
    [
        CudaToolkitUnavailable("cuda-bindings is not installed"),
        CudaCompileError("wna16_mma", "sm_70", "wna16_mma.cu(3): error: something"),
    ],
    ids=["no-nvrtc", "compile-error"],
)
def test_strict_mode_raises_instead(v100, monkeypatch, failure) -> None:
    monkeypatch.setattr(mma.BUILDS, "loader", _loads(v100, failure))
    monkeypatch.setenv("VLLM_VOLTA_STRICT", "1")
    with pytest.raises(type(failure), match=str(failure).split(":")[0]):
        ops.select_launch(16, _layer(), CUDA0)


def test_nothing_compiles_during_capture(v100, monkeypatch) -> None:
    """A build first asked for while a CUDA graph is being captured is not compiled there:
    Triton serves (strict mode: an error). Loaded before capture, it serves during it."""
    monkeypatch.setattr(mma.BUILDS, "loader", _loads(v100))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    pw = _layer()
    assert ops.select_launch(16, pw, CUDA0) == table_launch(16, pw.n, pw.k, 4, (7, 0))
    assert v100 == []
    monkeypatch.setenv("VLLM_VOLTA_STRICT", "1")
    with pytest.raises(RuntimeError, match="during CUDA-graph capture"):
        ops.select_launch(16, pw, CUDA0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    mma.warm_up(CUDA0, [launch for _, launch in SM70_MMA], 4, True)
    assert len(v100) == len(SM70_MMA)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert ops.select_launch(16, pw, CUDA0) == row_for(16)


def test_warm_up_skips_devices_the_gemm_is_not_for(v100, monkeypatch) -> None:
    monkeypatch.setattr(mma.BUILDS, "loader", _loads(v100))
    ops.warm_up(_layer())  # a CPU layer: nothing to load
    assert v100 == []


def test_the_same_bad_input_errors_before_any_launch(v100, monkeypatch) -> None:
    """The tensor-core launch goes through the Triton path's checks first, then refuses a
    device it cannot run on; no output is written."""
    monkeypatch.setattr(mma.BUILDS, "loader", _loads(v100))
    pw = _layer()
    launch = row_for(16)
    out = poison_(torch.empty(16, pw.n, dtype=torch.float16))
    with pytest.raises(TypeError, match="float16"):
        wna16_linear(torch.randn(16, pw.k), pw, launch=launch)
    with pytest.raises(ValueError, match=f"{pw.k}"):
        wna16_linear(torch.randn(16, 100).half(), pw, launch=launch)
    with pytest.raises(ValueError, match="bias"):
        wna16_linear(torch.randn(16, pw.k).half(), pw, torch.zeros(3).half(), launch=launch)
    with pytest.raises(ValueError, match="out must be"):
        wna16_linear(torch.randn(16, pw.k).half(), pw, launch=launch, out=out[:8])
    with pytest.raises(ValueError, match="runs on CUDA devices"):
        wna16_linear(torch.randn(16, pw.k).half(), pw, launch=launch, out=out)
    triton = table_launch(16, pw.n, None, 4, (7, 0))
    with pytest.raises(ValueError, match="not a tensor-core launch"):
        mma.mma_linear(torch.randn(16, pw.k).half(), pw, None, triton, out)
    assert out.isnan().all()
    assert v100 == []


def test_activations_are_read_as_aligned_vectors_of_8() -> None:
    x = torch.randn(5, 64).half()
    assert mma._vector_rows(x) is x
    for odd in (torch.randn(5, 61).half(), torch.randn(5, 65).half()[:, 1:]):
        padded = mma._vector_rows(odd)
        assert padded.shape == (5, -(-odd.shape[1] // 8) * 8)
        assert torch.equal(padded[:, : odd.shape[1]], odd)
        assert not padded[:, odd.shape[1] :].any()


# -- on the GPU: the sm_90 build and the compute_70 PTX against float64 -----------------------

GPU_MS = (8, 13, 17, 32, 33, 100, 256)


def _check(pw: PackedWeights, m: int, bias: bool, ptx_arch: str | None, seed: int = 0) -> None:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, pw.k, generator=gen, device="cuda").half()
    b = torch.randn(pw.n, generator=gen, device="cuda").half() if bias else None
    ref = x.double() @ dequantize(pw).t()
    if b is not None:
        ref += b.double()
    out = poison_(torch.empty(m, pw.n, dtype=torch.float16, device="cuda"))
    if ptx_arch is None:  # the device's own build, as the layer runs it
        wna16_linear(x, pw, b, launch=row_for(m), out=out)
    else:
        mma.mma_linear(x, pw, b, row_for(m), out, ptx_arch=ptx_arch)
    assert_rel_close(out, ref, TOLERANCE, f"m={m} {ptx_arch or 'cubin'}")


@pytest.mark.gpu
@pytest.mark.parametrize("ptx_arch", [None, "compute_70"], ids=["cubin", "ptx70"])
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.label.replace(" ", "-"))
def test_gpu_every_token_class(scheme: WeightScheme, ptx_arch: str | None) -> None:
    """16 schemes x tokens 8-256 (each row, partial row blocks), split and not: N=1500 is
    not whole blocks of 256."""
    pw = fresh_checkpoint(1500, 2816, scheme, seed=3, device="cuda").packed("t", "cuda")
    for i, m in enumerate(GPU_MS):
        _check(pw, m, bias=i % 2 == 0, ptx_arch=ptx_arch, seed=i)


@pytest.mark.gpu
@pytest.mark.parametrize("ptx_arch", [None, "compute_70"], ids=["cubin", "ptx70"])
def test_gpu_odd_shapes_and_views(ptx_arch: str | None) -> None:
    """Channel-wise layers of odd sizes (inputs not whole words or tiles, outputs odd), an
    input too short to split, and activations that are a strided view (the launcher pads a
    copy), through ``wna16_linear``."""
    for bits, symmetric in ((4, False), (8, True), (4, True), (8, False)):
        pw = fresh_checkpoint(999, 1001, WeightScheme(bits, symmetric, None), seed=bits)
        pw = pw.packed("t", "cuda")
        for m in (8, 31, 65):
            _check(pw, m, bias=True, ptx_arch=ptx_arch, seed=m)
    short = fresh_checkpoint(72, 32, WeightScheme(4, False, 32), seed=4).packed("t", "cuda")
    assert split_count(72, 32, row_for(16), device_facts(short.qweight.device).sm_count)[0] == 1
    _check(short, 16, bias=True, ptx_arch=ptx_arch)
    pw = fresh_checkpoint(640, 1024, WeightScheme(4, False, 128), seed=5).packed("t", "cuda")
    wide = torch.randn(24, 1025, device="cuda").half()
    x = wide[:, 1:]
    out = poison_(torch.empty(24, pw.n, dtype=torch.float16, device="cuda"))
    if ptx_arch is None:
        wna16_linear(x, pw, launch=row_for(24), out=out)
    else:
        mma.mma_linear(x, pw, None, row_for(24), out, ptx_arch=ptx_arch)
    assert_rel_close(out, x.double() @ dequantize(pw).t(), TOLERANCE, "strided view")


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(5120, 5120), (27648, 5120)])
def test_gpu_cuda_graph_capture_and_replay(n: int, k: int) -> None:
    """Loaded eagerly, then captured and replayed three times into poisoned outputs: each
    replay needs the accumulators and counters its predecessor put back to zero."""
    pw = fresh_checkpoint(n, k, WeightScheme(4, False, 128), seed=n, device="cuda")
    pw = pw.packed("t", "cuda")
    sm_count = device_facts(torch.device("cuda")).sm_count
    assert split_count(n, k, row_for(16), sm_count, 16)[0] > 1
    for m in (16, 64, 256):
        launch = row_for(m)
        x = torch.randn(m, k, device="cuda").half()
        b = torch.randn(n, device="cuda").half()
        ref = x.double() @ dequantize(pw).t() + b.double()
        out = torch.empty(m, n, dtype=torch.float16, device="cuda")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            wna16_linear(x, pw, b, launch=launch, out=poison_(out))
            torch.cuda.synchronize()
            assert_rel_close(out, ref, TOLERANCE, f"{n}x{k} m={m} eager")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            wna16_linear(x, pw, b, launch=launch, out=out)
        for replay in range(3):
            poison_(out)
            graph.replay()
            torch.cuda.synchronize()
            assert_rel_close(out, ref, TOLERANCE, f"{n}x{k} m={m} replay {replay}")
        with torch.cuda.stream(stream):
            assert not arrival_counters(out.device).any()
            assert not zeroed_accumulators(out.device).any()


@pytest.mark.gpu
def test_gpu_small_for_sanitizer() -> None:
    """Small launches of every width and symmetry, split and not, each twice (the second
    finds what the first reset), for compute-sanitizer memcheck and racecheck runs."""
    for bits, symmetric in ((4, True), (4, False), (8, True), (8, False)):
        pw = fresh_checkpoint(300, 640, WeightScheme(bits, symmetric, 64), seed=bits)
        pw = pw.packed("t", "cuda")
        for m in (9, 40):
            for seed in (0, 1):
                _check(pw, m, bias=True, ptx_arch=None, seed=seed)
    assert not arrival_counters(torch.device("cuda")).any()
