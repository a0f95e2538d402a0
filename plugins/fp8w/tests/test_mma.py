"""The W8A16 tensor-core GEMM (CUDA, ``mma.m8n8k4``, ``fp8_mma.cu``): its sm_70 builds, its
launch arguments, its loading and refusals, and, on a GPU, its results against float64.

On CPU (CI): every :data:`~volta_fp8w.tables.SM70_MMA` build compiled by NVRTC for sm_70 (cubin)
and judged by the devkit's CUDA gate: no spills, the registers its ``programs_per_sm`` needs,
and exactly the HMMA and FFMA counts its tile gives (the products on the tensor cores, one scale
multiply per output and block); the compute_70 PTX's ``mma`` count; the kernel's e4m3 decode
(its byte-permute selectors and masks, read from the source) on every code; the split counts;
the loading seam (``volta_fp8w.cuda.mma.BUILDS.loader``) and the refusals before any launch.
The ``gpu`` tests run every row on tokens 8-300, odd outputs and inputs, three scale-block
shapes and channel-wise scales, bias on and off, one split, the device's splits and a split per
k-tile, against float64 of :meth:`~volta_fp8w.layout.Fp8Weights.dequantize`, both as the
device's own cubin and as the compute_70 PTX a V100 build starts from (JIT-compiled by the
driver), and replayed from a CUDA graph.
"""

from __future__ import annotations

import re
import struct
from dataclasses import replace

import pytest
import torch
from fp8w_mma_gate import assert_tensor_core_build, tile_mmas
from fp8w_weights import random_layer

from volta_core.kernel_api import (
    CudaBuilds,
    arrival_counters,
    device_facts,
    nvrtc_build,
    with_prelude,
    zeroed_accumulators,
)
from volta_devkit.cuda_gate import check_cuda_config
from volta_devkit.testing import assert_rel_close, poison_
from volta_fp8w.cuda import KERNEL, SOURCE, mma
from volta_fp8w.cuda.launch_args import (
    balanced_splits,
    check_mma_launch,
    mma_config,
    mma_grid,
    mma_groups,
    mma_options,
    mma_splits,
)
from volta_fp8w.layout import Fp8Weights
from volta_fp8w.tables import MMA, SM70, SM70_MMA, SPLITK, Launch

CUDA0 = torch.device("cuda", 0)
ROWS = [launch for _, launch in SM70_MMA]
ROW_IDS = [f"m{ln.block_m}n{ln.block_n}" for ln in ROWS]

#: One rounding of the fp16 output (the decoded weights are exact, the sums fp32).
TOLERANCE = 2e-3


def row_for(m: int) -> Launch:
    """The table's row for ``m`` tokens (the last one past its most)."""
    return next((launch for most, launch in SM70_MMA if m <= most), ROWS[-1])


# -- the sm_70 builds ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def reports() -> dict[Launch, object]:
    """The gate's report of every row's build (one NVRTC compile each)."""
    return {launch: check_cuda_config(mma_config(launch), capability=70) for launch in ROWS}


@pytest.mark.parametrize("launch", ROWS, ids=ROW_IDS)
def test_sm70_gate(reports, launch: Launch) -> None:
    """Each row's build compiles for sm_70 with no spills and no stack, at most 96 KB of
    shared memory, registers that let an SM hold the ``programs_per_sm`` blocks the split count
    assumes, and its products on HMMA: the k-tile loop's body once (``#pragma unroll 1``), so
    exactly :func:`tile_mmas` products of four HMMA steps. The scales cost one FFMA per
    accumulator (the flush of a scale block's partial sums), so the SASS holds exactly that
    many, and no fp16 multiply (none per weight)."""
    assert_tensor_core_build(reports[launch], launch, mma_groups(launch))


@pytest.mark.parametrize("launch", ROWS, ids=ROW_IDS)
def test_compute_70_ptx_holds_the_tile_products(launch: Launch) -> None:
    """The PTX a V100 build starts from (what the ``ptx70`` GPU tests JIT) has the tile's
    products as ``mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32``, from the prelude."""
    ptx = nvrtc_build(with_prelude(SOURCE), KERNEL, "compute_70", mma_options(launch)).image
    text = ptx.decode()
    assert text.count("mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32") == tile_mmas(
        launch, mma_groups(launch)
    )


def test_the_gate_builds_what_the_launcher_loads() -> None:
    for launch in ROWS:
        config = mma_config(launch)
        assert config.source == mma.BUILDS.source == with_prelude(SOURCE)
        assert config.kernel == mma.BUILDS.kernel == KERNEL
        assert config.options == mma_options(launch)
        assert config.block_threads == launch.num_warps * 32
        assert config.claims_tensor_cores
    assert len({mma_options(launch) for launch in ROWS}) == len(ROWS)
    # The prelude's names are used, never defined again (one definition in every compile).
    assert "mma_m8n8k4(" in SOURCE
    assert "pack_half2(" in SOURCE
    for definition in ("typedef", "void mma_m8n8k4(", "u32 pack_half2(", '"mma.sync'):
        assert definition not in SOURCE, definition


# -- the e4m3 decode, as the kernel writes it ------------------------------------------------


def _byte_perm(x: int, y: int, selector: int) -> int:
    """CUDA's ``__byte_perm`` (default mode): result byte i is byte ``selector >> 4i & 7`` of
    the eight bytes of ``y:x``."""
    pool = x | (y << 32)
    return sum(((pool >> (8 * ((selector >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))


def _kernel_decode() -> tuple[int, int, int, int]:
    """The selectors of ``e4m3x4`` and the masks of ``e4m3_pair``, read from the source."""
    selectors = re.findall(r"__byte_perm\(w, 0u, (0x[0-9A-Fa-f]+)\)", SOURCE)
    pair = re.search(
        r"return \(\(a >> 1\) & (0x[0-9A-Fa-f]+)u\) \| \(a & (0x[0-9A-Fa-f]+)u\);", SOURCE
    )
    assert len(selectors) == 2
    assert pair is not None
    return int(selectors[0], 16), int(selectors[1], 16), int(pair[1], 16), int(pair[2], 16)


def test_the_kernel_decodes_every_code_in_every_byte_exactly() -> None:
    """Each of the 254 finite codes, in each byte of a word among random neighbours, decodes
    to the fp16 whose value is exactly ``2**-8`` times the code's; the two fp16 pairs hold
    codes (0, 1) and (2, 3) of the word, low half first (the inputs' order, as the activation
    fragments have them)."""
    lo_sel, hi_sel, keep, sign = _kernel_decode()
    codes = torch.arange(256, dtype=torch.uint8)
    values = codes.view(torch.float8_e4m3fn).double()
    gen = torch.Generator().manual_seed(0)
    for position in range(4):
        others = torch.randint(0, 256, (256, 4), generator=gen)
        for c in range(256):
            if c in (0x7F, 0xFF):
                continue
            word_bytes = [int(b) for b in others[c]]
            word_bytes[position] = c
            word = sum(b << (8 * i) for i, b in enumerate(word_bytes))
            halves = []
            for selector in (lo_sel, hi_sel):
                a = _byte_perm(word, 0, selector)
                pair = ((a >> 1) & keep) | (a & sign)
                halves += [pair & 0xFFFF, pair >> 16]
            (got,) = struct.unpack("<e", struct.pack("<H", halves[position]))
            assert got == float(values[c]) * 2.0**-8, (position, hex(c), hex(halves[position]))
            # every byte of the word lands in its own half, in order
            for i, b in enumerate(word_bytes):
                expected = ((b & 0x7F) << 7) | ((b & 0x80) << 8)
                assert halves[i] == expected, (position, i, hex(b))


# -- launch arguments ------------------------------------------------------------------------


def test_rows_in_token_order_and_checked() -> None:
    mosts = [most for most, _ in SM70_MMA]
    assert mosts == sorted(mosts)
    assert mosts[-1] == 256
    for launch in ROWS:
        check_mma_launch(launch)
        assert launch.path == MMA
        assert launch.block_k == 32  # divides every scale block a layer may have
    good = ROWS[0]
    with pytest.raises(ValueError, match="tensor-core launch"):
        replace(good, block_m=12)
    with pytest.raises(ValueError, match="split_cost"):
        replace(SM70.gemv, split_cost=2.0)
    with pytest.raises(ValueError, match="split_cost"):
        replace(good, split_cost=-1.0)
    for change in ({"block_n": 200}, {"split_cost": None}, {"path": SPLITK, "split_cost": None}):
        with pytest.raises(ValueError, match="tensor-core launch"):
            check_mma_launch(replace(good, **change))


def test_options_name_the_tile() -> None:
    assert mma_options(row_for(16)) == (
        "-DBM=16",
        "-DWARPS=4",
        "-DJ=2",
        "-DBK=32",
        "-DMIN_BLOCKS=3",
    )
    assert mma_groups(row_for(200)) == 1
    assert mma_grid(300, 1001, row_for(300), 5) == (5, 8, 5)


@pytest.mark.parametrize("launch", ROWS, ids=ROW_IDS)
def test_splits_cover_the_input_in_whole_tiles(launch: Launch) -> None:
    for n, k in ((5120, 5120), (27648, 5120), (5120, 27648), (1001, 1040), (999, 999), (8, 32)):
        for m in (8, 16, 33, 256):
            for sm_count in (1, 80, 132, 100_000):
                splits, per_split = mma_splits(n, k, launch, sm_count, m)
                assert per_split % launch.block_k == 0
                assert splits == -(-k // per_split) >= 1
                assert (splits - 1) * per_split < k
    # A grid that fills the SMs is not split; one far too small for them is split per tile.
    assert mma_splits(27648, 5120, row_for(256), 80, 256)[0] == 1
    assert mma_splits(1024, 4096, row_for(16), 100_000, 16) == (128, 32)
    assert mma_splits(5120, 5120, row_for(16), 80, 16)[0] > 1
    assert balanced_splits(1, 1, 1, 2.0, 80) == 1
    with pytest.raises(ValueError, match="at least one"):
        balanced_splits(0, 4, 2, 2.0, 80)


# -- loading, through the plugin's seam --------------------------------------------------------


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[str, ...], str | None]]:
    """A fresh set of builds whose loader records ``(options, ptx_arch)`` and succeeds, outside
    capture."""
    calls: list[tuple[tuple[str, ...], str | None]] = []

    def load(source, name, *, options=(), device=None, ptx_arch=None):
        assert name == KERNEL
        assert source == with_prelude(SOURCE)
        assert "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32" in source
        assert device == CUDA0
        calls.append((tuple(options), ptx_arch))
        return object()

    monkeypatch.setattr(mma, "BUILDS", CudaBuilds(mma.BUILDS.what, mma.BUILDS.source, KERNEL, load))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.delenv("VLLM_VOLTA_STRICT", raising=False)
    return calls


def test_ready_loads_each_build_once(loads) -> None:
    assert mma.ready(CUDA0, ROWS[0])
    assert mma.ready(CUDA0, ROWS[0])
    assert loads == [(mma_options(ROWS[0]), None)]
    mma.warm_up(CUDA0, ROWS)
    assert loads == [(mma_options(launch), None) for launch in ROWS]


def test_refusals_before_any_launch(loads) -> None:
    w = random_layer(300, 640, (128, 128))
    x = torch.randn(16, 640).half()
    out = poison_(torch.empty(16, 300, dtype=torch.float16))
    with pytest.raises(ValueError, match="not a tensor-core launch"):
        mma.mma_linear(x, w, None, SM70.gemm, out)
    with pytest.raises(ValueError, match="runs on CUDA devices"):
        mma.mma_linear(x, w, None, ROWS[0], out)
    odd = random_layer(300, 640, (128, 96))
    with pytest.raises(ValueError, match="does not divide"):
        mma.mma_linear(x, odd, None, replace(ROWS[0], block_k=64), out)
    with pytest.raises(ValueError, match="tensor-core launch"):
        mma.mma_linear(x, w, None, replace(ROWS[0], block_n=96), out)
    assert out.isnan().all()
    assert loads == []


def test_activations_are_read_as_aligned_vectors_of_8() -> None:
    x = torch.randn(5, 64).half()
    assert mma._vector_rows(x) is x
    for odd in (
        torch.randn(5, 61).half(),
        torch.randn(5, 65).half()[:, 1:],
        torch.randn(64, 5).half().t(),
    ):
        padded = mma._vector_rows(odd)
        assert padded.shape == (5, -(-odd.shape[1] // 8) * 8)
        assert padded.stride(1) == 1
        assert padded.stride(0) % 8 == 0
        assert torch.equal(padded[:, : odd.shape[1]], odd)
        assert not padded[:, odd.shape[1] :].any()


# -- on the GPU: the device's cubin and the compute_70 PTX against float64 --------------------

GPU_MS = (8, 9, 16, 33, 64, 100, 255, 256, 300)

#: Scale blocks: Qwen's FP8 (128 x 128), a half-height block, one whose sides are neither
#: powers of two nor multiples of 8 outputs, and channel-wise (one per output row).
BLOCKS = {"128x128": (128, 128), "64x128": (64, 128), "24x96": (24, 96), "channel": None}

#: Odd outputs with inputs a multiple of 16 but not of the 32-input tile or a scale block
#: (16-byte loads, the last tile half masked), and odd inputs (rows not 16-byte aligned: loaded
#: byte by byte, activations copied and padded).
SHAPES = ((1001, 1040), (999, 999))

#: How the input is split: not at all, the device's balanced count, a split per k-tile (every
#: split flushes mid-block and adds atomically).
SPLITS = ("one", "device", "every-tile")


def _forced_splits(monkeypatch: pytest.MonkeyPatch, split: str) -> None:
    if split == "one":
        monkeypatch.setattr(mma, "mma_splits", lambda n, k, launch, sms, m: (1, -(-k // 32) * 32))
    elif split == "every-tile":
        monkeypatch.setattr(
            mma,
            "mma_splits",
            lambda n, k, launch, sms, m: (-(-k // launch.block_k), launch.block_k),
        )


def _check(
    w: Fp8Weights,
    x: torch.Tensor,
    bias: torch.Tensor | None,
    launch: Launch,
    ptx_arch: str | None,
    what: str,
    out: torch.Tensor | None = None,
) -> None:
    m = x.shape[0]
    ref = x.double() @ w.dequantize().double().t()
    if bias is not None:
        ref += bias.double()
    if out is None:
        out = torch.empty(m, w.n, dtype=torch.float16, device=x.device)
    poison_(out)
    mma.mma_linear(x, w, bias, launch, out, ptx_arch=ptx_arch)
    torch.cuda.synchronize()
    assert_rel_close(out, ref, TOLERANCE, what)


@pytest.mark.gpu
@pytest.mark.parametrize("ptx_arch", [None, "compute_70"], ids=["cubin", "ptx70"])
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize(("n", "k"), SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
@pytest.mark.parametrize("block", BLOCKS.values(), ids=BLOCKS.keys())
def test_gpu_every_row_and_token_count(
    monkeypatch: pytest.MonkeyPatch,
    block: tuple[int, int] | None,
    n: int,
    k: int,
    split: str,
    ptx_arch: str | None,
) -> None:
    """Every row on 8 to 300 tokens (partial row blocks, several row blocks), bias on every
    other count, into poisoned outputs; the split buffers are all zero again after each."""
    _forced_splits(monkeypatch, split)
    seed = n + k + (0 if block is None else block[0] * block[1])
    w = random_layer(n, k, block, seed=seed, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    xs = torch.randn(max(GPU_MS), k, generator=gen, device="cuda").half()
    b = torch.randn(n, generator=gen, device="cuda").half()
    for launch in ROWS:
        for i, m in enumerate(GPU_MS):
            bias = b if i % 2 == 0 else None
            what = f"{launch.block_m}x{launch.block_n} m={m} bias={bias is not None}"
            _check(w, xs[:m], bias, launch, ptx_arch, f"{what} {ptx_arch or 'cubin'} {split}")
    assert not arrival_counters(xs.device).any()
    assert not zeroed_accumulators(xs.device).any()


@pytest.mark.gpu
@pytest.mark.parametrize("ptx_arch", [None, "compute_70"], ids=["cubin", "ptx70"])
def test_gpu_views_and_short_inputs(ptx_arch: str | None) -> None:
    """Activations that are a strided view (copied), an output that is a view of a wider
    tensor (its row stride), an input of one k-tile, and one shorter than a tile."""
    w = random_layer(640, 1024, (128, 128), seed=5, device="cuda")
    wide = torch.randn(24, 1025, device="cuda").half()
    x = wide[:, 1:]
    b = torch.randn(640, device="cuda").half()
    for launch in ROWS:
        _check(w, x, b, launch, ptx_arch, f"strided x {launch.block_m}")
        base = poison_(torch.empty(24, 700, dtype=torch.float16, device="cuda"))
        _check(w, x, None, launch, ptx_arch, f"strided out {launch.block_m}", out=base[:, :640])
        assert base[:, 640:].isnan().all()  # past the view: left alone
    for k in (32, 8, 3):
        short = random_layer(72, k, None, seed=k, device="cuda")
        xs = torch.randn(17, k, device="cuda").half()
        sm_count = device_facts(xs.device).sm_count
        assert mma_splits(72, k, row_for(17), sm_count, 17)[0] == 1
        for launch in ROWS:
            _check(short, xs, b[:72], launch, ptx_arch, f"k={k} {launch.block_m}")


@pytest.mark.gpu
def test_gpu_builds_load() -> None:
    """Each row's build compiles and loads on the device (its own cubin)."""
    mma.warm_up(CUDA0, ROWS)
    assert all(mma.ready(CUDA0, launch) for launch in ROWS)


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(4096, 4096), (11008, 4096)])
def test_gpu_cuda_graph_capture_and_replay(n: int, k: int) -> None:
    """Loaded eagerly, then captured and replayed three times into poisoned outputs: each
    replay needs the accumulators and counters its predecessor put back to zero."""
    w = random_layer(n, k, (128, 128), seed=n, device="cuda")
    sm_count = device_facts(CUDA0).sm_count
    assert mma_splits(n, k, row_for(16), sm_count, 16)[0] > 1
    for m in (16, 32, 256):
        launch = row_for(m)
        x = torch.randn(m, k, device="cuda").half()
        b = torch.randn(n, device="cuda").half()
        ref = x.double() @ w.dequantize().double().t() + b.double()
        out = torch.empty(m, n, dtype=torch.float16, device="cuda")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            mma.mma_linear(x, w, b, launch, poison_(out))
            torch.cuda.synchronize()
            assert_rel_close(out, ref, TOLERANCE, f"{n}x{k} m={m} eager")
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                mma.mma_linear(x, w, b, launch, out)
            for replay in range(3):
                poison_(out)
                graph.replay()
                torch.cuda.synchronize()
                assert_rel_close(out, ref, TOLERANCE, f"{n}x{k} m={m} replay {replay}")
            assert not arrival_counters(out.device).any()
            assert not zeroed_accumulators(out.device).any()


@pytest.mark.gpu
def test_gpu_small_for_sanitizer() -> None:
    """Small launches of every row, split and not, each twice (the second finds what the first
    reset), for compute-sanitizer memcheck and racecheck runs."""
    for k in (640, 999):
        w = random_layer(300, k, (64, 128), seed=k, device="cuda")
        for launch in ROWS:
            for m in (9, 40):
                x = torch.randn(m, k, device="cuda").half()
                for _ in range(2):
                    _check(w, x, None, launch, None, f"k={k} m={m} {launch.block_m}")
    assert not arrival_counters(CUDA0).any()
