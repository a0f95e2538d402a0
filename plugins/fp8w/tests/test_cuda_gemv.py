"""The one-token CUDA GEMV (``fp8_gemv.cu``): its sm_70 builds, its choice and fallback, its
loading and refusals, and, on a GPU, its results against float64.

On CPU (CI): every build :func:`~volta_fp8w.dispatch.cuda_gemv_builds` ships on a V100 compiled
by NVRTC for sm_70 and judged by the devkit's CUDA gate (no spills, no stack, fp32 products: one
FFMA a weight and one a 16-byte load for its scale, no fp16 arithmetic on the products); the
gate's build is the launcher's; dispatch's one-token choice and its Triton fallback where the
kernel cannot run (inputs not whole 16-byte loads, CPU tensors); the loading seam and the
refusals before any launch. The ``gpu`` tests run the tables' launches and others (rows a
warp, warps, loads in flight) on odd outputs, inputs from 16 to 4112, three scale-block shapes
and channel-wise scales, with and without bias, into poisoned outputs, against float64 of
:meth:`~volta_fp8w.layout.Fp8Weights.dequantize`, as the device's cubin and as the compute_70
PTX a V100 build starts from; then through ``fp8_linear`` and a CUDA graph.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from fp8w_weights import random_layer

from volta_core.kernel_api import (
    CudaBuilds,
    arrival_counters,
    device_facts,
    with_prelude,
    zeroed_accumulators,
)
from volta_devkit.cuda_gate import check_cuda_config
from volta_devkit.gate import assert_gate_passes
from volta_devkit.testing import assert_rel_close, poison_
from volta_fp8w import ops
from volta_fp8w.cuda import GEMV_KERNEL, GEMV_SOURCE, gemv
from volta_fp8w.cuda.launch_args import gemv_config, gemv_options, gemv_rows
from volta_fp8w.dispatch import cuda_gemv_builds, linear_choice
from volta_fp8w.launch import GEMV_WARP_INPUTS, gemv_splits
from volta_fp8w.layout import Fp8Weights
from volta_fp8w.tables import CUDA_GEMV, SM70, SM90, SPLITK, Launch, table_for

CUDA0 = torch.device("cuda", 0)

#: The builds a V100 takes (what the sm_70 gate compiles), and an H200.
SM70_BUILDS = cuda_gemv_builds((7, 0))
SM90_BUILDS = cuda_gemv_builds((9, 0))

#: One rounding of the fp16 output (the decoded weights are exact, the sums fp32).
TOLERANCE = 2e-3

#: Launches beyond the tables' (one row a warp, eight warps, one load in flight; four rows of
#: two warps), so the kernel's options are each exercised away from the shipped values.
OTHER_LAUNCHES = (
    Launch(CUDA_GEMV, block_n=8, num_warps=8, loads=1),
    Launch(CUDA_GEMV, block_n=8, num_warps=2, loads=2),
)


# -- the sm_70 builds ----------------------------------------------------------------------


@pytest.mark.parametrize("launch", SM70_BUILDS, ids=str)
def test_sm70_gate(launch: Launch) -> None:
    """The V100's build compiles for sm_70 with no spills and no stack; its products are fp32:
    one FFMA a weight (16 a load, ``ROWS * LOADS`` loads a step) and one a load for the scale,
    plus one a row for the epilogue's fold and bias; no fp16 multiply or fused multiply-add,
    and no tensor-core instruction."""
    report = check_cuda_config(gemv_config(launch), capability=70)
    assert_gate_passes(report)
    assert report.n_spills == 0, report.describe()
    assert report.stack_bytes == 0, report.describe()
    hist = report.sass_histogram
    rows = gemv_rows(launch)
    assert hist.get("FFMA", 0) == rows * (17 * launch.loads + 1), hist
    for fp16_math in ("HFMA2", "HMUL2", "HMMA"):
        assert fp16_math not in hist, hist


def test_the_gate_builds_what_the_launcher_loads() -> None:
    assert [launch for _, launch in SM70.cuda_gemv] == SM70_BUILDS
    for launch in SM70_BUILDS:
        config = gemv_config(launch)
        assert config.source == gemv.BUILDS.source == with_prelude(GEMV_SOURCE)
        assert config.kernel == gemv.BUILDS.kernel == GEMV_KERNEL
        assert config.options == gemv_options(launch)
        assert config.block_threads == launch.num_warps * 32
        assert not config.claims_tensor_cores
    # The decode is the shared header's, used and not defined again.
    assert GEMV_SOURCE.count("void e4m3x4(") == 1
    assert "e4m3x4(words[i], lo, hi)" in GEMV_SOURCE


def test_options_name_rows_warps_and_loads() -> None:
    launch = Launch(CUDA_GEMV, block_n=12, num_warps=4, loads=3)
    assert gemv_options(launch) == ("-DWARPS=4", "-DROWS=3", "-DLOADS=3")
    with pytest.raises(ValueError, match="whole rows a warp"):
        Launch(CUDA_GEMV, block_n=6, num_warps=4)
    with pytest.raises(ValueError, match="one token"):
        Launch(CUDA_GEMV, block_m=2, block_n=8, num_warps=4)
    with pytest.raises(ValueError, match="loads in flight"):
        Launch(SPLITK, loads=2)
    with pytest.raises(ValueError, match="at most 1024 threads"):
        gemv_rows(Launch(CUDA_GEMV, block_n=64, num_warps=64))
    with pytest.raises(ValueError, match="not a CUDA GEMV"):
        gemv_rows(SM70.gemv)


@pytest.mark.parametrize(
    ("n", "k"), [(27648, 5120), (5120, 27648), (1024, 8192), (512, 4096), (2048, 768), (8, 16)]
)
def test_splits_fill_the_sms_in_whole_warp_steps(n: int, k: int) -> None:
    """The splits cover the input in multiples of 16 inputs, give the grid the launch's blocks
    an SM where the rows alone do not, and never cut below one warp step of the launch's
    loads."""
    launch = replace(SM90_BUILDS[0], programs_per_sm=8)
    for sms in (80, 132):
        splits, per_split = gemv_splits(n, k, launch, sms)
        assert per_split % 16 == 0 or splits == 1
        assert splits == -(-k // per_split)
        blocks = -(-n // launch.block_n)
        steps = -(-k // (GEMV_WARP_INPUTS * launch.loads))
        assert splits <= steps
        if blocks >= sms * launch.programs_per_sm:
            assert splits == 1
        else:
            assert blocks * splits >= sms * launch.programs_per_sm or splits == steps


def test_the_tables_rows_rise_by_input_length_to_an_open_last() -> None:
    short, long = SM90.cuda_gemv[0][1], SM90.cuda_gemv[-1][1]
    for bad in (
        ((None, short), (8192, long)),  # the open row first
        ((8192, short),),  # no row for longer inputs
        ((8192, short), (4096, short), (None, long)),  # not rising
        ((8192, SM90.gemv), (None, long)),  # a Triton launch
    ):
        with pytest.raises(ValueError, match="rising input length"):
            replace(SM90, cuda_gemv=bad)


# -- dispatch's choice and the fallback --------------------------------------------------------


@pytest.mark.parametrize("capability", [(7, 0), (9, 0)], ids=["sm70", "sm90"])
def test_one_token_takes_the_cuda_gemv_with_the_triton_gemv_behind(
    capability: tuple[int, int],
) -> None:
    table = SM70 if capability == (7, 0) else SM90
    choice = linear_choice(1, 5120, 5120, capability)
    assert choice.launch == table.cuda_gemv[0][1]
    assert linear_choice(1, 5120, 27648, capability).launch == table.cuda_gemv[-1][1]
    assert choice.fallback is not None
    assert choice.fallback.launch == table.gemv
    # Inputs that are not whole 16-byte loads: the Triton GEMV alone.
    odd = linear_choice(1, 5120, 5128, capability)
    assert odd.launch == table.gemv
    assert odd.fallback is None
    # Fewer outputs than the table's floor: the Triton split-K GEMV, which splits the input.
    few = linear_choice(1, table.cuda_gemv_min_n - 1, 8192, capability)
    assert few.launch == table.gemv
    assert few.fallback is None
    # More tokens: never the GEMV.
    assert linear_choice(2, 5120, 5120, capability).launch.path != CUDA_GEMV


def test_cpu_tensors_take_the_triton_gemv() -> None:
    """Off CUDA the kernel cannot run: the choice's fallback serves (here under the reference
    path), and ``runs`` says no."""
    w = random_layer(40, 64, (32, 32))
    assert not gemv.runs(w)
    x = torch.randn(1, 64).half()
    assert ops._select(None, 1, w, x) == SM70.gemv


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """Replace the builds' loader with one that records what it is asked for."""
    calls: list[tuple[str, ...]] = []

    def load(source, name, *, options, device, ptx_arch=None):
        assert source == with_prelude(GEMV_SOURCE)
        assert name == GEMV_KERNEL
        assert device == CUDA0
        assert ptx_arch is None
        calls.append(tuple(options))
        return object()

    builds = CudaBuilds(gemv.BUILDS.what, gemv.BUILDS.source, GEMV_KERNEL, load)
    monkeypatch.setattr(gemv, "BUILDS", builds)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.delenv("VLLM_VOLTA_STRICT", raising=False)
    return calls


def test_ready_loads_each_build_once(loads) -> None:
    launch = SM70_BUILDS[0]
    assert gemv.ready(CUDA0, launch)
    gemv.warm_up(CUDA0, launch)
    assert loads == [gemv_options(launch)]


def test_refusals_before_any_launch(loads) -> None:
    w = random_layer(300, 640, (128, 128))
    x = torch.randn(1, 640).half()
    out = poison_(torch.empty(1, 300, dtype=torch.float16))
    with pytest.raises(ValueError, match="reads 16 bytes at a time"):
        gemv.gemv_linear(x, w, None, SM70_BUILDS[0], out)
    with pytest.raises(ValueError, match="not a CUDA GEMV"):
        gemv.gemv_linear(x, w, None, SM70.gemv, out)
    assert out.isnan().all()
    assert loads == []


# -- on the GPU: against float64 -------------------------------------------------------------

#: Scale blocks: Qwen's FP8 (128 x 128), a block of 96 inputs (not a power of two: a lane's
#: loads fall in different blocks along the row), an odd block height, and channel-wise.
BLOCKS = {"128x128": (128, 128), "64x96": (64, 96), "24x32": (24, 32), "channel": None}

#: Odd output counts (a last block of rows past the layer), inputs of one load, of less than
#: a warp's step, and of several steps with a partial last one.
SHAPES = ((1, 16), (7, 48), (301, 640), (1001, 1040), (4097, 4112))


def _check(
    w,
    x,
    bias,
    launch: Launch,
    what: str,
    out: torch.Tensor | None = None,
    ptx_arch: str | None = None,
) -> None:
    ref = x.double() @ w.dequantize().double().t()
    if bias is not None:
        ref += bias.double()
    if out is None:
        out = torch.empty(1, w.n, dtype=torch.float16, device=x.device)
    poison_(out)
    gemv.gemv_linear(x, w, bias, launch, out, ptx_arch=ptx_arch)
    torch.cuda.synchronize()
    assert_rel_close(out, ref, TOLERANCE, what)


#: How the input is split: not at all, the device's count, a split every 16 inputs at most
#: 32 (every lane's first load starts a split).
SPLITS = ("one", "device", "many")


def _many(k: int) -> tuple[int, int]:
    """About 32 splits of a multiple of 16 inputs each (16 at least)."""
    per_split = max(16, k // 32 // 16 * 16)
    return -(-k // per_split), per_split


def _forced_splits(monkeypatch: pytest.MonkeyPatch, split: str) -> None:
    if split == "one":
        monkeypatch.setattr(gemv, "gemv_splits", lambda n, k, launch, sms: (1, k))
    elif split == "many":
        monkeypatch.setattr(gemv, "gemv_splits", lambda n, k, launch, sms: _many(k))


@pytest.mark.gpu
@pytest.mark.parametrize("ptx_arch", [None, "compute_70"], ids=["cubin", "ptx70"])
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize(("n", "k"), SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
@pytest.mark.parametrize("block", BLOCKS.values(), ids=BLOCKS.keys())
def test_gpu_against_float64(
    monkeypatch: pytest.MonkeyPatch,
    block: tuple[int, int] | None,
    n: int,
    k: int,
    split: str,
    ptx_arch: str | None,
) -> None:
    """Each table's launch and :data:`OTHER_LAUNCHES`, with and without bias, into poisoned
    outputs, split as :data:`SPLITS` says; the split buffers are all zero again after each.
    ``ptx70``: the compute_70 PTX a V100 build starts from, JIT-compiled by the driver (needs a
    CUDA 12 NVRTC: ``scripts/ptx70_bundle.sh``)."""
    _forced_splits(monkeypatch, split)
    seed = n + k + (0 if block is None else block[0] * block[1])
    w = random_layer(n, k, block, seed=seed, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(1, k, generator=gen, device="cuda").half()
    b = torch.randn(n, generator=gen, device="cuda").half()
    for launch in dict.fromkeys((*SM70_BUILDS, *SM90_BUILDS, *OTHER_LAUNCHES)):
        for bias in (b, None):
            what = f"{launch} bias={bias is not None} {split} {ptx_arch or 'cubin'}"
            _check(w, x, bias, launch, what, ptx_arch=ptx_arch)
    assert not arrival_counters(x.device).any()
    assert not zeroed_accumulators(x.device).any()


@pytest.mark.gpu
def test_gpu_views() -> None:
    """Activations whose row is not 16-byte aligned (copied), an output that is a view of a
    wider tensor (the rest left alone)."""
    w = random_layer(640, 1024, (128, 128), seed=5, device="cuda")
    wide = torch.randn(1, 1025, device="cuda").half()
    x = wide[:, 1:]
    assert x.data_ptr() % 16
    b = torch.randn(640, device="cuda").half()
    launch = SM90_BUILDS[0]
    _check(w, x, b, launch, "unaligned x")
    base = poison_(torch.empty(1, 700, dtype=torch.float16, device="cuda"))
    _check(w, x, None, launch, "view out", out=base[:, :640])
    assert base[:, 640:].isnan().all()


@pytest.mark.gpu
@pytest.mark.parametrize("split", SPLITS)
def test_gpu_fp8_linear_runs_it_and_replays_it_from_a_cuda_graph(
    monkeypatch: pytest.MonkeyPatch, split: str
) -> None:
    """``fp8_linear`` at one token takes the device's CUDA GEMV once the layer is warmed up,
    and replays it from a CUDA graph into poisoned outputs (split: each replay needs the
    buffers its predecessor put back to zero); a layer whose codes are not 16-byte aligned (a
    column view of rows 5128 bytes apart) takes the Triton GEMV."""
    _forced_splits(monkeypatch, split)
    w = random_layer(5120, 5120, (128, 128), seed=1, device="cuda")
    ops.warm_up(w)
    x = torch.randn(1, 5120, device="cuda").half()
    b = torch.randn(5120, device="cuda").half()
    ref = x.double() @ w.dequantize().double().t() + b.double()
    out = torch.empty(1, 5120, dtype=torch.float16, device="cuda")
    ops.fp8_linear(x, w, b, out=poison_(out))
    torch.cuda.synchronize()
    assert_rel_close(out, ref, TOLERANCE, "fp8_linear eager")
    assert ops.plan_for(w).chosen(1, x, b).launch.path == CUDA_GEMV
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            ops.fp8_linear(x, w, b, out=out)
        for replay in range(3):
            poison_(out)
            graph.replay()
            torch.cuda.synchronize()
            assert_rel_close(out, ref, TOLERANCE, f"replay {replay}")
        assert not arrival_counters(out.device).any()
        assert not zeroed_accumulators(out.device).any()
    big = random_layer(300, 5128, (128, 128), seed=2, device="cuda")
    view = Fp8Weights(big.weight[:, :5120], big.scales[:, :40], 300, 5120, 128, 128)
    assert not gemv.runs(view)  # rows 5128 bytes apart
    assert ops._select(None, 1, view, x) == table_for(device_facts(CUDA0).capability).gemv
    ref = x.double() @ view.dequantize().double().t()
    out = poison_(torch.empty(1, 300, dtype=torch.float16, device="cuda"))
    ops.fp8_linear(x, view, out=out)
    torch.cuda.synchronize()
    assert_rel_close(out, ref, TOLERANCE, "unaligned codes, Triton GEMV")


@pytest.mark.gpu
def test_gpu_small_for_sanitizer() -> None:
    """Small launches of every launch, with a partial last row block, each split mode twice
    (the second finds what the first reset), for compute-sanitizer memcheck and racecheck."""
    w = random_layer(301, 640, (64, 96), seed=3, device="cuda")
    x = torch.randn(1, 640, device="cuda").half()
    for split in SPLITS:
        with pytest.MonkeyPatch.context() as patch:
            _forced_splits(patch, split)
            for launch in dict.fromkeys((*SM70_BUILDS, *SM90_BUILDS, *OTHER_LAUNCHES)):
                for _ in range(2):
                    _check(w, x, None, launch, f"sanitizer {launch} {split}")
    assert not arrival_counters(CUDA0).any()
