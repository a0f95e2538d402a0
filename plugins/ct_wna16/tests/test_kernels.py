"""The kernels against ``x @ dequant(W).T`` in float64, on library-made checkpoints.

On CPU they run in the Triton interpreter with small shapes; the ``gpu`` tests run the same
checks on CUDA for M from 1 to 4096 with larger N and K (none of them powers of two).
"""

from __future__ import annotations

from dataclasses import replace

import ct_wna16_bench as bench
import pytest
import torch
import triton
import triton.language as tl
from ct_wna16_checkpoints import (
    LIBRARY_FIXTURES,
    Checkpoint,
    fresh_checkpoint,
    library_checkpoint,
)

from volta_core.kernel_api import MIN_COUNTERS, arrival_counters, device_facts, zeroed_accumulators
from volta_ct_wna16.dispatch import table_launch
from volta_ct_wna16.kernels.dequant import slot_q16
from volta_ct_wna16.launch import slot_dots, split_count, whole_tiles
from volta_ct_wna16.layout import PackedWeights, dequantize
from volta_ct_wna16.ops import wna16_linear
from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.tables import SM70, SM90, SPLITK, Launch
from volta_devkit.testing import assert_rel_close, poison_, rel_error

SCHEMES = [
    WeightScheme(b, s, g) for b in (4, 8) for s in (True, False) for g in (32, 64, 128, None)
]
#: fp16 outputs of fp32-accumulated sums: one rounding of the output (2**-11 relative) and, on
#: the dot paths, of each dequantized weight.
TOLERANCE = 2e-3


def packed(ckpt: Checkpoint, device: str = "cpu") -> PackedWeights:
    return ckpt.packed("test", device)


def check(pw: PackedWeights, m: int, bias: bool, launch=None, seed: int = 0) -> None:
    device = pw.qweight.device
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, pw.k, generator=gen, device=device).to(torch.float16)
    b = torch.randn(pw.n, generator=gen, device=device).to(torch.float16) if bias else None
    ref = x.double() @ dequantize(pw).t()
    if b is not None:
        ref += b.double()
    out = poison_(torch.empty(m, pw.n, dtype=torch.float16, device=device))
    wna16_linear(x, pw, b, launch, out=out)
    assert out.dtype == torch.float16
    assert_rel_close(out, ref, TOLERANCE, f"m={m} {launch or 'table launch'}")


def test_dequantize_matches_the_library_decompressor() -> None:
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    for scheme in SCHEMES:
        ckpt = library_checkpoint(24, 256, scheme, seed=5)
        args = QuantizationArgs(
            num_bits=scheme.num_bits,
            symmetric=scheme.symmetric,
            strategy="group" if scheme.group_size else "channel",
            group_size=scheme.group_size,
        )
        state = PackedQuantizationCompressor.decompress(
            dict(ckpt.tensors), QuantizationScheme(targets=["Linear"], weights=args)
        )
        ours = dequantize(packed(ckpt), torch.float16)
        assert torch.equal(ours, state["weight"].to(torch.float16)), scheme.label


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.label.replace(" ", "-"))
def test_every_sm70_path_in_the_interpreter(scheme) -> None:
    pw = packed(library_checkpoint(40, 384, scheme, seed=1))
    # Each SM70 path by its token count: GEMV, 4-token FMA, dot, GEMM, dequantize + matmul.
    for m in (1, 3, 9, 20, 33):
        check(pw, m, bias=m % 2 == 1)


#: Both widths, both symmetries, every grouping once.
SM90_SCHEMES = [
    WeightScheme(4, True, 128),
    WeightScheme(4, False, 32),
    WeightScheme(8, False, None),
    WeightScheme(8, True, 64),
]


@pytest.mark.parametrize("scheme", SM90_SCHEMES, ids=lambda s: s.label.replace(" ", "-"))
def test_every_sm90_tile_in_the_interpreter(scheme) -> None:
    pw = packed(library_checkpoint(40, 384, scheme, seed=2))
    table = SM90
    assert table.wide_gemv is not None
    assert table.short_gemv is not None
    for launch, m in (
        (table.gemv, 1),
        (table.wide_gemv[1], 1),
        (table.short_gemv[1], 1),
        (table.decode, 5),
        (table.decode, table.decode_max_m),
        (table.gemm, table.decode_max_m + 1),
        (table.dequant, 40),
    ):
        check(pw, m, bias=True, launch=launch.scaled_for_bits(scheme.num_bits))


def test_sweep_candidates_run_correctly_in_the_interpreter() -> None:
    """Every compile-distinct launch the benchmark's sweep times (it checks them on the GPU
    too, against fp16), on a small layer against float64."""
    for scheme, m in (
        (WeightScheme(4, True, 128), 1),
        (WeightScheme(4, False, 128), 16),
        (WeightScheme(4, True, 64), 64),
    ):
        pw = packed(library_checkpoint(72, 1024, scheme, seed=9))
        seen = set()
        for launch in bench.sweep_candidates(m):
            key = replace(launch, programs_per_sm=0)
            if key not in seen:
                seen.add(key)
                check(pw, m, bias=False, launch=launch)


def test_gemv_fields_lie_below_the_fp32_exponent() -> None:
    """The GEMV reads field ``j`` of a word as the fp32 ``2**(23 - o) + q`` at bit offset ``o``
    of the copy shifted by ``field_shift``: exact only if the whole field lies in bits 0..22 of
    that copy, and for every field of both widths."""
    from volta_ct_wna16.kernels.gemv import field_shift

    for bits in (4, 8):
        for j in range(32 // bits):
            o = bits * j - field_shift(bits, j)
            assert o >= 0, (bits, j, o)
            assert o + bits <= 23, (bits, j, o)


def test_dot_slots_lie_in_the_fp16_mantissa_of_their_half() -> None:
    """The dot paths read value ``j`` of a word, shifted by ``slot_shift``, as the fp16
    ``2**(10 - o) + q`` at offset ``o`` of one 16-bit half: exact only if the field lies in bits
    0..9 of that half, for every value of both widths, in place or not (then at bit 0)."""
    from volta_ct_wna16.kernels.dequant import slot_shift

    for bits in (4, 8):
        half = 16 // bits
        for j in range(32 // bits):
            for in_place in (True, False):
                o = bits * (j % half) - slot_shift(bits, j, in_place)
                assert o >= 0, (bits, j, in_place, o)
                assert o + bits <= 10, (bits, j, in_place, o)
                assert in_place or o == 0, (bits, j, o)


@triton.jit
def _slots(
    w_ptr,
    z_ptr,
    out_ptr,
    BITS: tl.constexpr,
    IN_PLACE: tl.constexpr,
    TINY: tl.constexpr,
    R: tl.constexpr,
):
    """Every value of ``R`` words through ``slot_q16``: ``[R, 32 // BITS]``."""
    r = tl.arange(0, R)
    t = tl.load(w_ptr + r).to(tl.uint32, bitcast=True)
    z = tl.load(z_ptr + r).to(tl.float32)
    for j in tl.static_range(32 // BITS):
        tl.store(out_ptr + r * (32 // BITS) + j, slot_q16(t, z, j, BITS, IN_PLACE, TINY))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("tiny", [False, True])
def test_dot_slots_dequantize_every_value_exactly(bits: int, in_place: bool, tiny: bool) -> None:
    """``slot_q16`` against ``q - z`` computed in integers (times ``2**-24`` for the subnormal
    form): every field value at every slot, against every zero point, bit for bit."""
    pack, levels = 32 // bits, 1 << bits
    rows = 1024
    gen = torch.Generator().manual_seed(3)
    q = torch.randint(0, levels, (rows, pack), generator=gen)
    q[:levels] = torch.arange(levels)[:, None]  # every value at every slot
    z = torch.randint(0, levels, (rows,), generator=gen, dtype=torch.uint8)
    words = (q << (bits * torch.arange(pack))).sum(1)
    words = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    out = poison_(torch.empty(rows, pack, dtype=torch.float16))
    _slots[(1,)](words, z, out, BITS=bits, IN_PLACE=in_place, TINY=tiny, R=rows)
    want = (q - z[:, None].long()).double() * (2.0**-24 if tiny else 1.0)
    assert torch.equal(want.to(torch.float16).double(), want)  # representable: exact
    assert torch.equal(out, want.to(torch.float16))


def test_split_k_and_unsplit_agree_with_odd_shapes() -> None:
    pw = packed(library_checkpoint(24, 2304, WeightScheme(4, False, 128), seed=2))
    one_split = Launch(SPLITK, block_m=1, block_n=16, block_k=256, programs_per_sm=0)
    assert split_count(pw.n, pw.k, one_split, 80)[0] == 1
    assert split_count(pw.n, pw.k, SM70.gemv, 80)[0] > 1
    check(pw, 1, bias=True, launch=one_split)
    check(pw, 1, bias=True)


@pytest.mark.parametrize("bits", [4, 8])
def test_pair_read_activations_with_odd_rows(bits: int) -> None:
    """The dot tile reads activations two slots at a time as 32-bit words: an odd input
    length (channel-wise, so the last word is padded), and rows of a view whose stride and
    start are odd, take the launcher's zero-padded copy and still match float64."""
    launch = SM90.decode
    assert slot_dots(launch, bits)
    pw = packed(library_checkpoint(40, 383, WeightScheme(bits, False, None), seed=7))
    check(pw, 16, bias=True, launch=launch)
    pw = packed(library_checkpoint(40, 384, WeightScheme(bits, True, 128), seed=8))
    wide = torch.randn(16, 385, generator=torch.Generator().manual_seed(3)).to(torch.float16)
    x = wide[:, 1:]
    assert x.stride(0) % 2 == 1
    assert x.data_ptr() % 4 != 0
    out = poison_(torch.empty(16, pw.n, dtype=torch.float16))
    wna16_linear(x, pw, launch=launch, out=out)
    assert_rel_close(out, x.double() @ dequantize(pw).t(), TOLERANCE, "strided view")


@pytest.mark.parametrize("bits", [4, 8])
def test_each_path_reads_its_own_zero_points(bits: int) -> None:
    """The 1-token GEMV reads the uint8 zero points (``zeros8``), the dot tiles the fp16 ones:
    with the other form poisoned each still matches float64, and the GEMV gives the same bits
    from either form (the byte path converts exactly)."""
    pw = packed(library_checkpoint(40, 384, WeightScheme(bits, False, 128), seed=11))
    assert pw.zeros is not None
    assert pw.zeros8 is not None
    assert pw.zeros8.dtype == torch.uint8
    assert torch.equal(pw.zeros8.to(pw.zeros.dtype), pw.zeros)
    assert pw.nbytes(True) == pw.nbytes() - pw.zeros8.numel()
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(16, pw.k, generator=gen).to(torch.float16)
    ref = x.double() @ dequantize(pw).t()
    no_fp16 = replace(pw, zeros=torch.full_like(pw.zeros, float("nan")))
    assert SM90.short_gemv is not None
    for gemv in (SM70.gemv, SM90.gemv, SM90.short_gemv[1]):
        assert gemv.byte_zeros
        out = poison_(torch.empty(1, pw.n, dtype=torch.float16))
        wna16_linear(x[:1], no_fp16, launch=gemv, out=out)
        assert_rel_close(out, ref[:1], TOLERANCE, f"GEMV on zeros8 {gemv}")
        fp16_only = wna16_linear(x[:1], replace(pw, zeros8=None), launch=gemv)
        assert torch.equal(out, fp16_only)
    # The wide GEMV (fp16 zero points measured faster there) and the dot tiles read fp16.
    assert SM90.wide_gemv is not None
    wrong_bytes = replace(pw, zeros8=torch.full_like(pw.zeros8, 200))
    for launch, m in ((SM90.wide_gemv[1], 1), (SM90.decode, 16)):
        launch = launch.scaled_for_bits(bits)
        assert not launch.byte_zeros
        out = poison_(torch.empty(m, pw.n, dtype=torch.float16))
        wna16_linear(x[:m], wrong_bytes, launch=launch, out=out)
        assert_rel_close(out, ref[:m], TOLERANCE, f"fp16 zero points {launch}")


def test_refuses_byte_zero_points_that_are_not_a_copy_of_the_zero_points() -> None:
    pw = packed(library_checkpoint(40, 384, WeightScheme(4, False, 128), seed=11))
    sym = packed(library_checkpoint(40, 384, WeightScheme(4, True, 128), seed=11))
    assert pw.zeros8 is not None
    x = torch.randn(1, pw.k).half()
    out = poison_(torch.empty(1, pw.n, dtype=torch.float16))
    for bad, what in (
        (replace(pw, zeros8=pw.zeros8.half()), "torch.float16"),
        (replace(pw, zeros8=pw.zeros8[:1]), r"\(1, 40\)"),
        (replace(sym, zeros8=pw.zeros8), r"zero points none"),
    ):
        with pytest.raises(ValueError, match=f"zeros8 must be the uint8 copy.*{what}"):
            wna16_linear(x, bad, out=out)
    assert out.isnan().all()


def test_only_a_gemv_reads_byte_zero_points() -> None:
    with pytest.raises(ValueError, match="only a 1-token GEMV"):
        replace(SM90.decode, byte_zeros=True)


@pytest.mark.parametrize("m", [1, 3, 16, 20])
def test_atomic_split_reduction(m: int) -> None:
    """The splits add their partials into the zeroed fp32 accumulators: right against
    float64 with a partial column and row block, twice (the second launch finds what the
    first left), the accumulators and counters zero afterwards; the same launch with the tree
    agrees. One token runs the table's GEMV (on uint8 zero points), more the dot tile."""
    pw = packed(library_checkpoint(72, 640, WeightScheme(4, False, 128), seed=12))
    device = pw.qweight.device
    table = SM90.gemv if m == 1 else SM90.decode
    launch = replace(table, block_n=32, programs_per_sm=64)
    assert launch.atomic
    assert split_count(pw.n, pw.k, launch, device_facts(pw.qweight.device).sm_count, m)[0] > 1
    for seed in (0, 1):
        check(pw, m, bias=True, launch=launch, seed=seed)
        assert not arrival_counters(device).any()
        assert not zeroed_accumulators(device).any()
    check(pw, m, bias=True, launch=replace(launch, atomic=False))


@pytest.mark.parametrize("scheme", SM90_SCHEMES, ids=lambda s: s.label.replace(" ", "-"))
def test_whole_tiles_run_unmasked_and_match_float64(scheme) -> None:
    """A layer whose outputs and inputs are multiples of every tile: each launch with an
    unmasked build takes it (``WHOLE``), split and not, and matches float64; one output
    fewer and every launch is masked again."""
    bits = scheme.num_bits
    pw = packed(library_checkpoint(512, 1024, scheme, seed=21))
    assert SM90.short_gemv is not None
    assert SM90.wide_gemv is not None
    launches = [
        (SM90.gemv, 1),
        (SM90.short_gemv[1], 1),
        (SM90.wide_gemv[1], 1),
        (SM90.decode, 16),
    ]
    for launch, m in launches:
        launch = launch.scaled_for_bits(bits)
        assert whole_tiles(pw.n, pw.k, launch, bits), launch
        for split in (launch, replace(launch, programs_per_sm=1, split_cost=None)):
            check(pw, m, bias=True, launch=split, seed=m)
        assert not whole_tiles(pw.n - 1, pw.k, launch, bits)
        assert not whole_tiles(pw.n, pw.k - 8, launch, bits)
    # The interleaved dot tile (4-bit 64-input steps: 8 words a slot) has no unmasked build,
    # nor has any SM70 launch.
    assert not slot_dots(SM90.gemm, 4)
    assert not whole_tiles(pw.n, pw.k, SM90.gemm, 4)
    for launch in (SM70.gemv, SM70.small, SM70.decode):
        assert not whole_tiles(pw.n, pw.k, launch.scaled_for_bits(bits), bits)


def test_only_split_k_launches_add_atomically() -> None:
    with pytest.raises(ValueError, match="only a split-K launch"):
        replace(SM90.dequant, atomic=True)


def splits_of(pw: PackedWeights, m: int) -> int:
    """How many input splits the table's launch for ``m`` tokens makes on this device."""
    probe = torch.empty(0, device=pw.qweight.device)
    capability, sm_count = device_facts(probe.device)
    launch = table_launch(m, pw.n, None, pw.bits, capability)
    return split_count(pw.n, pw.k, launch, sm_count, m)[0]


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.label.replace(" ", "-"))
def test_fused_split_k_reduction(scheme) -> None:
    # 72 outputs: a partial column block on every tile width; 640 inputs: 10 to 40 splits.
    pw = packed(library_checkpoint(72, 640, scheme, seed=6))
    for m, bias in ((1, True), (3, False), (16, True)):
        assert splits_of(pw, m) > 1, m
        check(pw, m, bias=bias, seed=m)


@pytest.mark.parametrize("splits", [2, 3, 5, 9])
@pytest.mark.parametrize("m", [1, 3])
def test_reduction_tree_shapes(splits: int, m: int) -> None:
    """The two-level reduction with a fan-in of 2: one group (2), a short last group (3, 5),
    and more groups than the fan-in, so the tile's last arriver loops (5, 9)."""
    pw = packed(library_checkpoint(24, 32 * splits, WeightScheme(4, False, 32), seed=splits))
    launch = Launch(
        SPLITK,
        block_m=1 if m == 1 else 16,
        block_n=32,
        block_k=32,
        use_dot=m > 1,
        programs_per_sm=64,
        reduce_unroll=2,
    )
    assert split_count(pw.n, pw.k, launch, device_facts(pw.qweight.device).sm_count)[0] == splits
    check(pw, m, bias=True, launch=launch, seed=splits)
    assert not arrival_counters(pw.qweight.device).any()


def test_arrival_counters_reset_themselves() -> None:
    pw = packed(library_checkpoint(72, 640, WeightScheme(4, False, 32), seed=8))
    device = pw.qweight.device
    counters = arrival_counters(device)
    for seed in (0, 1):  # the same layer twice in a row: the second call needs zeroed counters
        check(pw, 1, bias=True, seed=seed)
        assert arrival_counters(device) is counters
        assert not counters.any(), counters.nonzero()[:4]
    grown = arrival_counters(device, counters.numel() + 1)
    assert grown.numel() >= 2 * MIN_COUNTERS
    assert not grown.any()
    assert arrival_counters(device) is grown
    check(pw, 16, bias=False, seed=2)
    assert not grown.any()
    assert not counters.any()


def test_gemv_tiles_must_cover_whole_sub_tiles() -> None:
    pw = packed(library_checkpoint(40, 256, WeightScheme(4, True, 128), seed=4))
    bad = Launch(SPLITK, block_m=1, block_n=64, block_k=16)
    with pytest.raises(ValueError, match="32-input sub-tiles"):
        wna16_linear(torch.randn(1, 256).half(), pw, launch=bad)


def test_batch_dimensions_are_flattened() -> None:
    pw = packed(library_checkpoint(40, 256, WeightScheme(8, True, 64), seed=3))
    x = torch.randn(2, 3, 256).to(torch.float16)
    out = wna16_linear(x, pw)
    ref = x.double() @ dequantize(pw).t()
    assert out.shape == (2, 3, 40)
    assert rel_error(out, ref) < TOLERANCE


def test_refuses_other_activation_dtypes_before_launch() -> None:
    pw = packed(library_checkpoint(40, 256, WeightScheme(4, True, 128)))
    with pytest.raises(TypeError, match="float16"):
        wna16_linear(torch.randn(1, 256), pw)
    with pytest.raises(ValueError, match="256"):
        wna16_linear(torch.randn(1, 128).half(), pw)


GPU_MS = (1, 2, 3, 4, 7, 16, 17, 33, 64, 127, 256, 1000, 2048, 4096)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.label.replace(" ", "-"))
def test_gpu_every_m(scheme) -> None:
    pw = packed(fresh_checkpoint(1500, 2816, scheme, seed=7, device="cuda"), "cuda")
    for i, m in enumerate(GPU_MS):
        check(pw, m, bias=i % 2 == 0, seed=i)


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(5120, 5120), (27648, 5120), (4000, 13824)])
def test_gpu_fused_split_k_in_a_cuda_graph(n: int, k: int) -> None:
    """Decode at model sizes, replayed from one CUDA graph: every replay must find the
    counters (and, where the splits add atomically, the 16-token tile, the fp32
    accumulators) its previous replay left at zero."""
    for scheme in (WeightScheme(4, True, 128), WeightScheme(4, False, 128)):
        pw = packed(fresh_checkpoint(n, k, scheme, seed=n, device="cuda"), "cuda")
        for m in (1, 16):
            assert splits_of(pw, m) > 1, (n, k, m)
            x = torch.randn(m, k, device="cuda").half()
            b = torch.randn(n, device="cuda").half()
            ref = x.double() @ dequantize(pw).t() + b.double()
            out = torch.empty(m, n, dtype=torch.float16, device="cuda")
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # eager first: compiles, and grows the counters
                wna16_linear(x, pw, b, out=poison_(out))
                torch.cuda.synchronize()
                assert_rel_close(out, ref, TOLERANCE, f"{n}x{k} m={m} eager")
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                wna16_linear(x, pw, b, out=out)
            eager = out.clone()
            capability, sm_count = device_facts(x.device)
            launch = table_launch(m, n, None, pw.bits, capability)
            atomic = launch.atomic and split_count(n, k, launch, sm_count, m)[0] > 1
            for replay in range(3):
                poison_(out)
                graph.replay()
                torch.cuda.synchronize()
                assert_rel_close(out, ref, TOLERANCE, f"{n}x{k} m={m} replay {replay}")
                if not atomic:
                    # The tree sums in a fixed order, whichever program arrives last.
                    assert torch.equal(out, eager), f"{n}x{k} m={m} replay {replay}"
            with torch.cuda.stream(stream):
                assert not arrival_counters(out.device).any()
                assert not zeroed_accumulators(out.device).any()


@pytest.mark.gpu
def test_gpu_library_made_checkpoints() -> None:
    from safetensors.torch import load_file

    if not LIBRARY_FIXTURES.exists():
        pytest.skip(f"{LIBRARY_FIXTURES} not carried to this machine")
    tensors = load_file(str(LIBRARY_FIXTURES))
    for scheme in SCHEMES:
        tag = scheme.label.replace(" ", "-")
        ckpt = Checkpoint(
            {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith(tag + "/")},
            {},
            scheme,
        )
        pw = packed(ckpt, "cuda")
        for m in (1, 5, 16, 300):
            check(pw, m, bias=True)


@pytest.mark.gpu
def test_gpu_small_for_sanitizer() -> None:
    """Small launches of each decode reduction on CUDA, for compute-sanitizer memcheck and
    racecheck runs: the 1-token GEMV on uint8 zero points and the 16-token dot tile, each
    with atomic splits and with the tree, each twice (the second finds what the first
    reset)."""
    ckpt = fresh_checkpoint(600, 1280, WeightScheme(4, False, 128), seed=3, device="cuda")
    pw = packed(ckpt, "cuda")
    decode = replace(SM90.decode, block_n=64, programs_per_sm=8)
    assert split_count(pw.n, pw.k, decode, device_facts(pw.qweight.device).sm_count, 16)[0] > 1
    assert decode.atomic
    assert SM90.gemv.atomic
    for launch, m in (
        (SM90.gemv, 1),
        (replace(SM90.gemv, atomic=False), 1),
        (decode, 16),
        (replace(decode, atomic=False), 16),
    ):
        for seed in (0, 1):
            check(pw, m, bias=True, launch=launch, seed=seed)
    # Whole tiles (the unmasked builds), split: a 512 x 1280 layer.
    whole = packed(
        fresh_checkpoint(512, 1280, WeightScheme(4, False, 128), seed=4, device="cuda"), "cuda"
    )
    assert SM90.short_gemv is not None
    sm_count = device_facts(whole.qweight.device).sm_count
    for launch, m in ((SM90.short_gemv[1], 1), (decode, 16)):
        assert whole_tiles(whole.n, whole.k, launch, whole.bits)
        assert split_count(whole.n, whole.k, launch, sm_count, m)[0] > 1
        check(whole, m, bias=True, launch=launch)
    assert not arrival_counters(pw.qweight.device).any()
    assert not zeroed_accumulators(pw.qweight.device).any()
