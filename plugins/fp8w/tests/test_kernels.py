"""The kernels against ``x @ W.T`` in float64, ``W`` dequantized from fresh random codes and
scales, outputs poisoned before each launch.

On CPU they run in the Triton interpreter with small layers (odd ``n``, ``k`` not a multiple of
the scale block); the ``gpu`` tests run the same checks on CUDA with larger layers for ``M``
from 1 to 300, and the SM70 table's launches there too.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from volta_core.kernel_api import (
    arrival_counters,
    device_facts,
    zeroed_accumulators,
)
from volta_devkit.testing import assert_rel_close, poison_
from volta_fp8w.dispatch import table_launch
from volta_fp8w.launch import fitted, split_count, splitk_constexprs
from volta_fp8w.layout import Fp8Weights, block_weights, channel_weights
from volta_fp8w.ops import dequantize, fp8_linear
from volta_fp8w.tables import SM70, SM70_MMA, SM90, SPLITK, Launch

#: fp16 outputs of fp32 sums: one rounding of the output (2**-11 relative), and on the dot and
#: cuBLAS paths one of each activation-weight product's operands (the weight, on cuBLAS's).
TOLERANCE = 2e-3

#: Scale blocks ``(block_n, block_k)``; None: channel-wise (one scale per output row).
BLOCKS = {
    "128x128": (128, 128),
    "64x128": (64, 128),
    "128x32": (128, 32),
    "1x64": (1, 64),
    "channel": None,
}


def fresh_weights(
    n: int, k: int, block: tuple[int, int] | None, seed: int = 0, device: str = "cpu"
) -> Fp8Weights:
    """Random e4m3 codes over the format's range (subnormals to 448, no NaN) and random
    positive scales, through the load-time layout (:mod:`volta_fp8w.layout`)."""
    gen = torch.Generator().manual_seed(seed)
    spread = torch.exp2(torch.randint(-8, 7, (n, k), generator=gen).float())
    codes = (torch.randn(n, k, generator=gen) * spread).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert not ((codes.view(torch.uint8) & 0x7F) == 0x7F).any()
    shape = (n, 1) if block is None else (-(-n // block[0]), -(-k // block[1]))
    scale = (torch.rand(shape, generator=gen) * 0.75 + 0.25) * 2**-5
    codes, scale = codes.to(device), scale.to(device)
    if block is None:
        return channel_weights("test", codes, scale, n, k)
    return block_weights("test", codes, scale, n, k, block)


def check(
    w: Fp8Weights,
    m: int,
    bias: bool,
    launch: Launch | None = None,
    seed: int = 0,
    x: torch.Tensor | None = None,
) -> None:
    """``fp8_linear`` into a poisoned output against float64."""
    device = w.weight.device
    gen = torch.Generator().manual_seed(seed)
    if x is None:
        x = torch.randn(m, w.k, generator=gen).to(torch.float16).to(device)
    b = torch.randn(w.n, generator=gen).to(torch.float16).to(device) if bias else None
    ref = x.double() @ w.dequantize().double().t()
    if b is not None:
        ref += b.double()
    out = poison_(torch.empty(*x.shape[:-1], w.n, dtype=torch.float16, device=device))
    result = fp8_linear(x, w, b, launch, out=out)
    assert result is out
    assert_rel_close(out, ref, TOLERANCE, f"m={m} bias={bias} {launch or 'table launch'}")


@pytest.mark.parametrize("block", BLOCKS.values(), ids=BLOCKS.keys())
def test_every_sm70_path_in_the_interpreter(block: tuple[int, int] | None) -> None:
    """Each SM70 path by its token count (GEMV, small GEMV, GEMM, dequantize + matmul) on an
    odd number of outputs and inputs that end inside a scale block and a tile."""
    w = fresh_weights(137, 208, block, seed=1)
    ms = (1, 3, 8, 20, 33)
    assert {table_launch(m, w.n, w.k, (7, 0)) for m in ms} == {
        SM70.gemv,
        SM70.small,
        SM70.gemm,
        SM70.dequant,
    }
    for m in ms:
        check(w, m, bias=m % 2 == 1, seed=m)


@pytest.mark.parametrize("block", [(128, 128), (128, 32)], ids=["128x128", "128x32"])
def test_every_sm90_launch_in_the_interpreter(block: tuple[int, int]) -> None:
    w = fresh_weights(137, 208, block, seed=2)
    for launch, m in ((SM90.gemv, 1), (SM90.small, 5), (SM90.gemm, 20), (SM90.dequant, 40)):
        check(w, m, bias=True, launch=launch, seed=m)


def test_odd_inputs_take_narrow_gemv_tiles() -> None:
    """Rows whose stride is not a multiple of 16 bytes (an odd ``k``): the 1-token GEMV takes
    32-input tiles, the other launches their own; every path still matches float64."""
    w = fresh_weights(75, 203, (128, 128), seed=3)
    assert fitted(SM70.gemv, w.block_k, w.weight.stride(0)).block_k == 32
    assert fitted(SM70.small, w.block_k, w.weight.stride(0)).block_k == 128
    for m in (1, 4, 17, 40):
        check(w, m, bias=True, seed=m)


@pytest.mark.parametrize("launch", [SM70.gemv, SM70.small], ids=["gemv", "small"])
def test_split_k_sums_in_the_launch(launch: Launch) -> None:
    """Many splits, added atomically: right twice in a row (the second launch finds what the
    first left), accumulators and counters zero after each; one split agrees."""
    w = fresh_weights(72, 640, (128, 128), seed=4)
    m = launch.block_m
    many = replace(launch, programs_per_sm=64)
    sm_count = device_facts(w.weight.device).sm_count
    assert split_count(w.n, w.k, many, sm_count, m)[0] == 5
    for seed in (0, 1):
        check(w, m, bias=True, launch=many, seed=seed)
        assert not arrival_counters(w.weight.device).any()
        assert not zeroed_accumulators(w.weight.device).any()
    one = replace(launch, programs_per_sm=0)
    assert split_count(w.n, w.k, one, sm_count, m)[0] == 1
    check(w, m, bias=False, launch=one)


@pytest.mark.parametrize("block", BLOCKS.values(), ids=BLOCKS.keys())
def test_dequantize_rounds_once_from_fp32(block: tuple[int, int] | None) -> None:
    """The dequantize kernel's fp16 ``W`` is the fp32 ``e4m3 * scale`` rounded once, bit for
    bit, whichever the block and the tile."""
    w = fresh_weights(137, 208, block, seed=5)
    assert torch.equal(dequantize(w), w.dequantize().to(torch.float16))


def code_weights(device: str = "cpu", stride: int = 256) -> tuple[Fp8Weights, torch.Tensor]:
    """Every finite code in 16 rows of 256 inputs (NaN codes replaced by 0) times a
    power-of-two scale, rows ``stride`` bytes apart (a stride not a multiple of 4 keeps the
    codes bytes, :func:`volta_fp8w.ops.fp8_linear`'s words rule), and their exact values."""
    k = 256
    codes = (torch.arange(16)[:, None] * 7 + torch.arange(k)[None, :]) % 256
    codes[(codes & 0x7F) == 0x7F] = 0
    codes = codes.to(torch.uint8)
    want = codes.view(torch.float8_e4m3fn).double() * 2.0**-3
    scale = torch.full((1, 2), 2.0**-3, device=device)
    w = block_weights("codes", codes.to(device), scale, 16, k, (16, 128))
    rows = torch.zeros(16, stride, dtype=torch.uint8, device=device)
    rows[:, :k] = w.weight
    return replace(w, weight=rows[:, :k]), want


def one_hot_rows(m: int, k: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``m`` one-hot activation rows and the input each reads: each output is then one
    product, exact in fp16, so it equals the code's value."""
    cols = torch.arange(m) * 37 % k
    return torch.nn.functional.one_hot(cols, k).to(torch.float16).to(device), cols


@pytest.mark.parametrize("stride", [256, 257], ids=["words", "bytes"])
def test_every_code_is_exact_on_every_path(stride: int) -> None:
    """Every finite code read back through each path, its codes as int32 words and as bytes."""
    w, want = code_weights(stride=stride)
    assert w.weight.stride(0) == stride
    for m in (1, 5, 20, 40):
        x, cols = one_hot_rows(m, w.k)
        out = poison_(torch.empty(m, 16, dtype=torch.float16))
        fp8_linear(x, w, out=out)
        assert torch.equal(out.double(), want[:, cols].t()), m


def test_dot_tile_variants_in_the_interpreter() -> None:
    """The split-K dot tile's forms the table does not launch yet (one 128-input dot, the
    weights as the dot's first operand), as the 16-token sweep runs them, against float64."""
    import fp8w_m16_sweep as sweep

    w = fresh_weights(137, 208, (128, 128), seed=12)
    gen = torch.Generator().manual_seed(13)
    for v in sweep.check_variants():
        if v.launch.block_m == 1 or not v.words or v.dot_k == 32:
            continue
        for m in (5, 16):
            x = torch.randn(m, w.k, generator=gen).to(torch.float16)
            out = poison_(torch.empty(m, w.n, dtype=torch.float16))
            sweep.launch_variant(x, w, v, out)
            ref = x.double() @ w.dequantize().double().t()
            assert_rel_close(out, ref, TOLERANCE, f"{v.name()} m={m}")


def test_dot_options_refuse_what_the_kernel_cannot_take() -> None:
    """A dot width the tiles do not take, and swapped operands on fewer than 16 rows (tl.dot's
    least side): one ValueError each, before any launch."""
    with pytest.raises(ValueError, match="a dot of 32, 64 or 128 inputs, got 48"):
        splitk_constexprs(SM90.small, False, True, dot_k=48)
    with pytest.raises(ValueError, match="tiles of 16 tokens or more"):
        splitk_constexprs(SM70.small, False, True, swap_ab=True)
    assert splitk_constexprs(replace(SM90.small, block_k=64), False, True, dot_k=128)["DOT_K"] == 64


def test_zero_tokens() -> None:
    w = fresh_weights(40, 64, (128, 128))
    assert fp8_linear(torch.empty(0, 64, dtype=torch.float16), w).shape == (0, 40)
    x = torch.empty(2, 0, 64, dtype=torch.float16)
    out = torch.empty(2, 0, 40, dtype=torch.float16)
    assert fp8_linear(x, w, out=out) is out


def test_leading_dimensions_and_strided_activations() -> None:
    """``[..., k]`` activations, rows read in place at any row stride and start (a view of a
    wider tensor), and rows whose elements are not contiguous (copied)."""
    w = fresh_weights(75, 200, (64, 128), seed=6)
    gen = torch.Generator().manual_seed(7)
    check(w, 6, bias=True, x=torch.randn(2, 3, 200, generator=gen).to(torch.float16))
    wide = torch.randn(20, 211, generator=gen).to(torch.float16)
    for m in (1, 5, 20):
        view = wide[:m, 3:203]
        assert view.stride(0) == 211
        check(w, m, bias=False, x=view)
    spaced = torch.randn(5, 400, generator=gen).to(torch.float16)[:, ::2]
    assert spaced.stride(1) == 2
    check(w, 5, bias=True, x=spaced)


def test_cpu_outside_the_interpreter_runs_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    w = fresh_weights(75, 200, (128, 32), seed=8)
    for m in (1, 20):
        check(w, m, bias=True)
    assert torch.equal(dequantize(w), w.dequantize().to(torch.float16))


def _meta_weights(n: int, k: int, block: tuple[int, int]) -> Fp8Weights:
    weight = torch.empty(n, k, dtype=torch.uint8, device="meta")
    scales = torch.empty(-(-n // block[0]), -(-k // block[1]), device="meta")
    return Fp8Weights(weight, scales, n, k, *block)


def _bad_inputs() -> dict[str, tuple[dict, str]]:
    """Each case: what replaces a good argument, and what the error must name."""
    w = fresh_weights(40, 64, (32, 32), seed=9)
    x = torch.randn(3, 64).to(torch.float16)
    return {
        "x dtype": ({"x": x.float()}, "x must be float16"),
        "x features": ({"x": x[:, :32]}, r"x has shape \(3, 32\)"),
        "x device": ({"x": x.to("meta")}, "x is on meta"),
        "bias shape": ({"bias": torch.zeros(41, dtype=torch.float16)}, r"bias must be.*\(41,\)"),
        "bias dtype": ({"bias": torch.zeros(40)}, "bias must be.*torch.float32"),
        "out shape": ({"out": torch.empty(3, 41, dtype=torch.float16)}, r"out must be.*\(3, 41\)"),
        "out dtype": ({"out": torch.empty(3, 40)}, "out must be.*torch.float32"),
        "out strides": (
            {"out": torch.empty(40, 3, dtype=torch.float16).t()},
            r"out must be.*strides \(1, 3\)",
        ),
        "weight dtype": ({"w": replace(w, weight=w.weight.to(torch.int8))}, "w.weight must be"),
        "weight shape": ({"w": replace(w, weight=w.weight[:, :32])}, r"w.weight.*\(40, 32\)"),
        "weight rows": (
            {"w": replace(w, weight=w.weight.t().contiguous().t())},
            "w.weight's rows must be contiguous",
        ),
        "scales dtype": ({"w": replace(w, scales=w.scales.half())}, "w.scales must be float32"),
        "scales shape": ({"w": replace(w, scales=w.scales[:1])}, r"w.scales.*\(1, 2\)"),
        "block": ({"w": replace(w, block_k=48)}, "block 32x48"),
        "no outputs": ({"w": replace(w, n=0)}, "w has 0 outputs"),
        "tensor-core launch": (
            {"launch": SM70_MMA[0][1]},
            "the tensor-core GEMM runs on CUDA devices",
        ),
        "launch tile": ({"launch": Launch(SPLITK, block_n=48)}, "powers of two"),
        "32-bit weights": (
            {
                "x": torch.empty(1, 40000, dtype=torch.float16, device="meta"),
                "w": _meta_weights(60000, 40000, (128, 128)),
            },
            "w.weight spans 2400000000 elements",
        ),
        "32-bit activations": (
            {
                "x": torch.empty(70000, 40000, dtype=torch.float16, device="meta"),
                "w": _meta_weights(128, 40000, (128, 128)),
            },
            "32-bit offsets",
        ),
        "grid": (
            {
                "x": torch.empty(1, 32, dtype=torch.float16, device="meta"),
                "w": _meta_weights(70000, 32, (1, 32)),
                "launch": Launch(SPLITK, block_n=1, block_k=32),
            },
            "more than 65535 programs",
        ),
    }


BAD = _bad_inputs()


@pytest.mark.parametrize("case", BAD.keys())
def test_refuses_bad_inputs_before_any_launch(case: str) -> None:
    """One ValueError naming what is wrong; the poisoned output is left as it was."""
    change, message = BAD[case]
    args = {
        "x": torch.randn(3, 64).to(torch.float16),
        "w": fresh_weights(40, 64, (32, 32), seed=9),
        "bias": None,
        "launch": None,
        "out": torch.empty(3, 40, dtype=torch.float16),
    }
    args.update(change)
    if args["x"].device.type == "meta":
        args["out"] = None
    else:
        poison_(args["out"])
    with pytest.raises(ValueError, match=message):
        fp8_linear(args["x"], args["w"], args["bias"], args["launch"], args["out"])
    if args["out"] is not None:
        assert args["out"].isnan().all()


def test_dequantize_refuses_bad_weights() -> None:
    w = fresh_weights(40, 64, (32, 32))
    with pytest.raises(ValueError, match=r"w\.scales must be float32"):
        dequantize(replace(w, scales=w.scales.double()))


# -- CUDA ---------------------------------------------------------------------------------------

GPU_MS = (1, 2, 3, 5, 8, 9, 16, 31, 32, 33, 64, 127, 300)


@pytest.mark.gpu
@pytest.mark.parametrize("block", BLOCKS.values(), ids=BLOCKS.keys())
def test_gpu_every_m(block: tuple[int, int] | None) -> None:
    """The device's table launch for every M, on a layer whose dimensions are no multiple of
    the blocks or tiles (2880 inputs: 16-byte rows, a partial last tile)."""
    w = fresh_weights(1531, 2880, block, seed=10, device="cuda")
    for i, m in enumerate(GPU_MS):
        check(w, m, bias=i % 2 == 0, seed=i)
    assert torch.equal(dequantize(w), w.dequantize().to(torch.float16))


@pytest.mark.gpu
@pytest.mark.parametrize("block", [(128, 128), (128, 32), None], ids=["128x128", "128x32", "ch"])
def test_gpu_sm70_launches(block: tuple[int, int] | None) -> None:
    """The SM70 table's launches (what a V100 runs) on this GPU, aligned rows and odd ones."""
    for k in (2880, 2883):
        w = fresh_weights(1531, k, block, seed=11, device="cuda")
        for launch, ms in (
            (SM70.gemv, (1,)),
            (SM70.small, (2, 5, 8)),
            (SM70.gemm, (9, 32)),
            (SM70.dequant, (33, 300)),
        ):
            for m in ms:
                check(w, m, bias=m % 2 == 1, launch=launch, seed=m)


@pytest.mark.gpu
@pytest.mark.parametrize("stride", [256, 257], ids=["words", "bytes"])
def test_gpu_every_code_is_exact(stride: int) -> None:
    """Every finite code through each table's launches and each form of the 16-token sweep
    (:func:`fp8w_m16_sweep.check_variants`), codes read as int32 words (the inline-PTX
    decode) and as bytes."""
    import fp8w_m16_sweep as sweep

    w, want = code_weights("cuda", stride)
    tables = (SM70.gemv, SM70.small, SM70.gemm, SM70.dequant, SM90.gemv, SM90.small, SM90.gemm)
    for launch in tables:
        for m in (1, 8, 16, 40):
            x, cols = one_hot_rows(m, w.k, "cuda")
            out = fp8_linear(x, w, launch=launch)
            assert torch.equal(out.double().cpu(), want[:, cols].t()), (launch, m)
    for v in sweep.check_variants():
        v = replace(v, words=v.words and stride % 4 == 0)
        for m in (1,) if v.launch.block_m == 1 else (3, 16, 40):
            x, cols = one_hot_rows(m, w.k, "cuda")
            out = poison_(torch.empty(m, w.n, dtype=torch.float16, device="cuda"))
            sweep.launch_variant(x, w, v, out)
            assert torch.equal(out.double().cpu(), want[:, cols].t()), (v.name(), m)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [2880, 2883], ids=["words", "bytes"])
def test_gpu_every_m_to_300(k: int) -> None:
    """The device's table launch at every M from 1 to 300 (the dot tiles to 16 tokens, the
    GEMM above) against float64, on codes read as words and, at an odd input count, bytes."""
    w = fresh_weights(1531, k, (128, 128), seed=14, device="cuda")
    gen = torch.Generator().manual_seed(15)
    w64 = w.dequantize().double()
    for m in range(1, 301):
        x = torch.randn(m, k, generator=gen).to(torch.float16).cuda()
        out = fp8_linear(x, w, out=poison_(torch.empty(m, w.n, dtype=torch.float16, device="cuda")))
        assert_rel_close(out, x.double() @ w64.t(), TOLERANCE, f"k={k} m={m}")


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(4096, 4096), (1536, 8960)])
def test_gpu_split_k_in_a_cuda_graph(n: int, k: int) -> None:
    """Decode at model sizes replayed from one CUDA graph: every replay finds the accumulators
    and counters its previous replay left at zero."""
    w = fresh_weights(n, k, (128, 128), seed=n, device="cuda")
    sm_count = device_facts(w.weight.device).sm_count
    for m in (1, 8):
        launch = table_launch(m, n, k, device_facts(w.weight.device).capability)
        assert launch.path == SPLITK
        assert split_count(n, k, fitted(launch, w.block_k, k), sm_count, m)[0] > 1
        x = torch.randn(m, k, device="cuda").half()
        b = torch.randn(n, device="cuda").half()
        ref = x.double() @ w.dequantize().double().t() + b.double()
        out = torch.empty(m, n, dtype=torch.float16, device="cuda")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fp8_linear(x, w, b, out=poison_(out))
            torch.cuda.synchronize()
            assert_rel_close(out, ref, TOLERANCE, f"{n}x{k} m={m} eager")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fp8_linear(x, w, b, out=out)
        for replay in range(3):
            poison_(out)
            graph.replay()
            torch.cuda.synchronize()
            assert_rel_close(out, ref, TOLERANCE, f"{n}x{k} m={m} replay {replay}")
        with torch.cuda.stream(stream):
            assert not arrival_counters(out.device).any()
            assert not zeroed_accumulators(out.device).any()
