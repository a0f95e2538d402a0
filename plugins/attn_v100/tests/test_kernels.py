"""Decode and prefill kernels against the float64 reference (interpreter on CPU, CUDA with -m gpu).

Outputs are poisoned (NaN) before every launch and every element is checked, so a row the
kernel forgot to write fails. Every declared head size, KV dtype and feature is run through both
kernels (the declaration test); the rest pins ragged batches, empty and single-token sequences,
shuffled blocks, sliding windows shorter and longer than the context, speculative-verification
queries, head groups split over programs, cache memory layouts and the fp8 scale algebra.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from attn_v100_cases import (
    EVERY_LAUNCH_ONE_STAGE_TAIL,
    EVERY_LAUNCH_WIDE,
    PagedCase,
    dequantized_cache,
    forced,
    make_case,
    paired,
    reference,
)

from volta_attn_v100.dispatch import table_for
from volta_attn_v100.inputs import cache_span
from volta_attn_v100.kernels.prefill import SEQ_CHUNK
from volta_attn_v100.launch import cache_offsets_32
from volta_attn_v100.limits import E4M3_MIN_CAPABILITY
from volta_attn_v100.ops import default_num_splits, paged_attention
from volta_attn_v100.plugin import SPEC
from volta_attn_v100.tables import SM70, SM80, LaunchTable
from volta_core.kernel_api import arrival_counters

#: The SM80 prefill tile's query length from which it takes 128 keys (head size 128).
LONG_PREFILL_QUERY = SM80.prefill_tiles[128].long_query

#: Largest cache span the kernels address with 32-bit row offsets.
OFFSETS_32_SPAN = SM80.offsets_32_max_span

#: fp16 output and fp16 probabilities in P.V: relative error well under 1e-3 in practice.
TOL = 4e-3

#: Every KV dtype the declaration admits, and its fp8 ones.
KV_DTYPES = sorted(SPEC.kv_cache_dtypes)
FP8_DTYPES = [kv for kv in KV_DTYPES if kv != "float16"]

DECODE_LENS = [(1, 1), (1, 37), (0, 5), (1, 70), (1, 16)]
PREFILL_LENS = [(20, 37), (1, 1), (0, 9), (33, 33), (3, 50)]
FEATURE_KWARGS = {
    None: {},
    "sliding_window": {"sliding_window": 7},
    "logits_soft_cap": {"logits_soft_cap": 2.5},
    "sinks": {"sinks": True},
}


def run(case: PagedCase, **kwargs) -> torch.Tensor:
    out = torch.full_like(case.query, float("nan"))
    paged_attention(*case.tensors(), out, **case.kwargs(), **kwargs)
    return out


def gpu_table() -> LaunchTable:
    """The launch table of the GPU the tests run on."""
    return table_for(torch.cuda.get_device_capability())


def check(out: torch.Tensor, case: PagedCase, what: str, tol: float = TOL) -> None:
    ref = reference(case)
    got = out.detach().cpu().double()
    bad = ~torch.isfinite(got)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} elements unwritten/NaN, first {bad.nonzero()[0]}"
    )
    err = float((got - ref).norm() / ref.norm())
    assert err <= tol, f"{what}: relative error {err:.2e} > {tol:.0e}"


def declared_combinations() -> list:
    """Every (head size, KV dtype, feature) the declaration admits, with both kernels."""
    features = [None, *sorted(f.value for f in SPEC.features)]
    return [
        pytest.param(
            head_size, kv_dtype, feature, path, id=f"{path}-d{head_size}-{kv_dtype}-{feature}"
        )
        for head_size, kv_dtype, feature, path in itertools.product(
            sorted(SPEC.head_sizes), sorted(SPEC.kv_cache_dtypes), features, ("decode", "prefill")
        )
    ]


def test_declared_features_are_the_tested_ones() -> None:
    assert set(FEATURE_KWARGS) - {None} == {f.value for f in SPEC.features}
    assert SPEC.dtypes == {"float16"}
    assert SPEC.kv_cache_dtypes == {"float16", "fp8_e5m2", "fp8_e4m3"}
    assert dict(SPEC.kv_dtype_min_capability) == {"fp8_e4m3": (8, 9)}


@pytest.mark.parametrize(("head_size", "kv_dtype", "feature", "path"), declared_combinations())
def test_every_declared_combination(head_size, kv_dtype, feature, path) -> None:
    lens = DECODE_LENS if path == "decode" else PREFILL_LENS
    case = make_case(
        lens,
        head_size=head_size,
        kv_cache_dtype=kv_dtype,
        scales="head" if kv_dtype != "float16" else "none",
        seed=head_size,
        **FEATURE_KWARGS[feature],
    )
    out = run(case, path=path, num_splits=3 if path == "decode" else None)
    check(out, case, f"{path} d{head_size} {kv_dtype} {feature}")


@pytest.mark.parametrize("kv_dtype", ["float16", "fp8_e5m2"])
@pytest.mark.parametrize("path", ["decode", "prefill"])
@pytest.mark.parametrize("window", [1, 5, 16, 40, 1000])
def test_sliding_window_shorter_and_longer_than_context(path, kv_dtype, window) -> None:
    lens = [(1, 45), (2, 30), (1, 3)] if path == "decode" else [(30, 45), (17, 17), (1, 3)]
    case = make_case(
        lens, head_size=64, kv_cache_dtype=kv_dtype, sliding_window=window, seed=window
    )
    check(
        run(case, path=path, num_splits=4 if path == "decode" else None), case, f"window {window}"
    )


@pytest.mark.parametrize(("tail", "halves"), [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_window_with_speculative_queries(num_splits, tail, halves) -> None:
    """Decode where a window's start cuts a tile, speculative queries' diagonal cuts the last
    ones and whole tiles lie between (one partition, or three), with either form of the masked
    tiles' loop, and the one-stage form also on the head-halves loop (both forced: the
    launcher picks by partition length and device, and the interpreter runs SM70 tiles). The
    one-stage loop takes the masked tiles on both sides of the whole ones; when it skipped the
    gap wrongly, the other window tests passed and this one failed
    (``docs/perf/attn_v100/masked_one_stage/``)."""
    table = forced(halves=halves)
    table = dataclasses.replace(table, one_stage_tail=EVERY_LAUNCH_ONE_STAGE_TAIL if tail else None)
    lens = [(5, 200), (3, 77), (1, 64)]
    case = make_case(lens, head_size=64, sliding_window=50, sinks=True, seed=11)
    check(
        run(case, path="decode", num_splits=num_splits, table=table),
        case,
        f"window, {num_splits} splits, one-stage tail {tail}, halves {halves}",
    )


@pytest.mark.parametrize("q_len", [2, 5, 8])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 2), (8, 1), (16, 1)])
def test_speculative_verification_queries(q_len, num_heads, num_kv_heads) -> None:
    """2..8 query tokens per sequence on the decode path, causal among themselves; groups of
    8 and 16 heads do not fit one program with 8 tokens and are split over programs."""
    lens = [(q_len, q_len + 29), (q_len, q_len), (1, 9)]
    case = make_case(
        lens, head_size=128, num_heads=num_heads, num_kv_heads=num_kv_heads, seed=q_len
    )
    check(run(case, path="decode", num_splits=2), case, f"spec q_len={q_len} group={num_heads}")


@pytest.mark.parametrize("head_size", [256, 512])
def test_speculative_queries_at_large_head_sizes(head_size) -> None:
    """8 tokens x a group of 8 at head sizes 256 and 512: 16 rows per program on SM70 (2 heads
    x 8 tokens), the group split over 4 programs, each over 3 partitions."""
    lens = [(8, 60), (3, 3), (1, 40)]
    case = make_case(lens, head_size=head_size, num_heads=8, num_kv_heads=1, sinks=True, seed=8)
    check(run(case, path="decode", num_splits=3), case, f"spec d{head_size}")


@pytest.mark.parametrize("num_splits", [1, 7, 64])
def test_split_counts_agree(num_splits) -> None:
    """Any number of partitions, more than a sequence has tiles included, gives one answer."""
    case = make_case([(1, 70), (1, 2), (1, 300)], head_size=96, sinks=True, seed=3)
    check(run(case, path="decode", num_splits=num_splits), case, f"{num_splits} splits")


@pytest.mark.parametrize("kv_dtype", ["float16", "fp8_e5m2"])
@pytest.mark.parametrize("num_splits", [32, 33])
def test_wide_combine_agrees(num_splits, kv_dtype) -> None:
    """The wide combine (SM80+ small grids: fp16, and fp8 at 32 partitions) loads 32
    partitions of 4 rows per step: forced here, since the interpreter runs SM70 tiles; 33
    partitions take a second step of one, and the short sequences leave most partitions
    without a key."""
    case = make_case(
        [(1, 70), (1, 2), (1, 600)],
        head_size=128,
        kv_cache_dtype=kv_dtype,
        scales="head" if kv_dtype != "float16" else "none",
        sinks=True,
        seed=5,
    )
    table = forced(wide_combine=EVERY_LAUNCH_WIDE)
    out = run(case, path="decode", num_splits=num_splits, table=table)
    check(out, case, f"wide, {num_splits} splits")


@pytest.mark.parametrize("kv_dtype", ["float16", "fp8_e5m2"])
@pytest.mark.parametrize(("wide", "num_splits"), [(False, 1), (False, 5), (True, 33)])
@pytest.mark.parametrize(("num_heads", "q_len"), [(16, 1), (8, 2), (4, 1)])
def test_fp16_partials(num_heads, q_len, wide, num_splits, kv_dtype) -> None:
    """Partials stored normalised in fp16 (SM80+ combines of 8 rows or more), forced here for
    8- and 4-row combines, narrow and wide: a window and short sequences leave partitions
    that see no key of a row, which must weigh nothing; sinks join the combine. One partition
    (the same build, an empty fp16 partials buffer) writes its output directly."""
    table = forced(wide_combine=EVERY_LAUNCH_WIDE if wide else None)
    table = dataclasses.replace(table, fp16_partials_min_rows=1)
    case = make_case(
        [(q_len, 70), (q_len, 2), (q_len, 600)],
        head_size=128,
        num_heads=num_heads,
        num_kv_heads=2,
        kv_cache_dtype=kv_dtype,
        scales="head" if kv_dtype != "float16" else "none",
        sliding_window=100,
        sinks=True,
        seed=41,
    )
    out = run(case, path="decode", num_splits=num_splits, table=table)
    check(out, case, f"fp16 partials {num_splits}")


@pytest.mark.parametrize("sinks", [False, True])
def test_split_decode_leaves_its_counters_zero(sinks) -> None:
    """The last partition of each (sequence, KV program) combines and resets its counter, so
    the next launch on the stream (a CUDA-graph replay) starts from zero: a counter left at any
    other value makes no partition of a later call see itself last, its rows stay NaN."""
    counters = arrival_counters(torch.device("cpu"))
    lens = [(1, 70), (2, 33), (0, 5), (1, 200), (8, 9)]
    for seed, num_splits in ((1, 5), (2, 1), (3, 5), (4, 64)):
        case = make_case(lens, head_size=64, num_heads=8, num_kv_heads=2, sinks=sinks, seed=seed)
        check(run(case, path="decode", num_splits=num_splits), case, f"{num_splits} splits")
        assert not counters.any(), f"counters left non-zero: {counters.nonzero().flatten()}"


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("path", ["decode", "prefill"])
@pytest.mark.parametrize("head_size", [80, 128])
def test_head_dimension_in_halves(head_size, path, kv_dtype) -> None:
    """The ``HALVES`` loop (Q.K as two dots into one score tile, P.V into two output halves; the
    SM80+ fp8 path) on both dtypes, a head size whose upper half is mostly padding, masked and
    whole tiles, sinks and a soft cap: forced here, since the interpreter runs SM70 tiles."""
    lens = DECODE_LENS if path == "decode" else PREFILL_LENS
    case = make_case(
        lens,
        head_size=head_size,
        kv_cache_dtype=kv_dtype,
        sinks=True,
        logits_soft_cap=2.5,
        seed=11,
    )
    check(
        run(case, path=path, num_splits=3 if path == "decode" else None, table=forced(halves=True)),
        case,
        f"halves {path} d{head_size} {kv_dtype}",
    )


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("num_splits", [1, 4])
def test_scores_one_tile_ahead(num_splits, kv_dtype) -> None:
    """The whole tiles' loop with each tile's scores taken one iteration ahead (``AHEAD``, in
    halves): sequences of no whole tile, one, and several (16-key tiles under the interpreter),
    partitions left empty, sinks and a soft cap; forced here, since the interpreter runs SM70
    tiles."""
    table = forced(halves=True, ahead_min_keys=0)
    case = make_case(
        [(1, 1), (1, 17), (1, 33), (1, 130), (0, 5)],
        head_size=128,
        kv_cache_dtype=kv_dtype,
        sinks=True,
        logits_soft_cap=2.5,
        seed=13,
    )
    check(
        run(case, path="decode", num_splits=num_splits, table=table),
        case,
        f"ahead {num_splits} {kv_dtype}",
    )


@pytest.mark.parametrize(
    ("kv_per_prog", "num_splits", "ahead", "kv_dtype"),
    [
        (2, 1, False, "float16"),
        (2, 3, True, "float16"),
        (2, 1, True, "fp8_e5m2"),
        (2, 3, False, "fp8_e5m2"),
        (4, 3, False, "float16"),
        (4, 1, True, "float16"),
        (4, 1, False, "fp8_e5m2"),
        (4, 3, True, "fp8_e5m2"),
    ],
)
def test_kv_heads_paired_in_one_program(kv_per_prog, num_splits, ahead, kv_dtype) -> None:
    """Two and four KV heads per program (``KV_PER_PROG``), their tiles walked as one stream
    with each row masked to its own head: per-head scales, sinks and a soft cap, one and two
    query tokens (8 KV heads, 4 query heads each for two a program, 2 for four: 16 rows),
    sequences of no whole tile, one and several, split and not, with and without scores
    ahead, and a sliding window (masked tiles only); forced here, since the interpreter runs
    SM70 tiles."""
    table = forced(halves=True, ahead_min_keys=0 if ahead else None, pairing=paired(kv_per_prog))
    lens = [(1, 1), (1, 17), (2, 33), (1, 130), (0, 5)]
    for feature in ({"sinks": True, "logits_soft_cap": 2.5}, {"sliding_window": 20}):
        case = make_case(
            lens,
            head_size=64,
            num_heads=64 // kv_per_prog,
            num_kv_heads=8,
            kv_cache_dtype=kv_dtype,
            scales="head",
            seed=17,
            **feature,
        )
        check(
            run(case, path="decode", num_splits=num_splits, table=table),
            case,
            f"{kv_per_prog} heads {num_splits} {ahead} {kv_dtype} {sorted(feature)}",
        )


def test_one_partition_writes_the_output_without_partials(monkeypatch) -> None:
    """With one partition the program normalises its own rows: the launch gets empty partial
    and counter tensors (a kernel that read or wrote them would fault or read nothing), and the
    output is right, sinks included."""
    import volta_attn_v100.kernels as kernels

    real = kernels.paged_decode_kernel
    launched: list[tuple] = []

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append(args)
                return real[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(kernels, "paged_decode_kernel", Spy())
    case = make_case([(1, 70), (3, 40), (1, 1)], head_size=128, sinks=True, seed=5)
    check(run(case, path="decode", num_splits=1), case, "one partition")
    (args,) = launched
    part_acc, part_ml, counters = args[9:12]
    assert part_acc.numel() == part_ml.numel() == counters.numel() == 0


@pytest.mark.parametrize("path", ["decode", "prefill"])
@pytest.mark.parametrize("order", [(0, 2, 1, 3), (1, 0, 2, 3), (2, 1, 0, 3)])
def test_physical_cache_layouts(path, order) -> None:
    """The logical [blocks, kv_heads, slots, K|V] view over other memory orders (strides)."""
    lens = [(1, 40), (1, 5)] if path == "decode" else [(24, 40), (5, 5)]
    case = make_case(lens, head_size=80, physical_order=order, kv_cache_dtype="fp8_e5m2")
    check(run(case, path=path), case, f"layout {order}")


def test_caches_of_2_31_elements_or_more_take_64_bit_offsets() -> None:
    """The rule and the span it is given: a cache's elements from first to last through its
    strides, so a view of vLLM's layout spans its buffer and a slice only what it addresses."""
    for table in (SM70, SM80):
        assert cache_offsets_32(table, OFFSETS_32_SPAN)
        assert not cache_offsets_32(table, OFFSETS_32_SPAN + 1)
    raw = torch.empty(10, 16, 2, 256, dtype=torch.float16, device="meta")
    assert cache_span(raw.transpose(1, 2)) == raw.numel()
    assert cache_span(raw.transpose(1, 2)[:4]) == 4 * 16 * 2 * 256
    assert cache_span(raw[:0]) == 0
    past = torch.empty(_BLOCKS_PAST_32_BIT + 1, 1, 16, 128, dtype=torch.uint8, device="meta")
    assert cache_span(past) > OFFSETS_32_SPAN
    assert cache_span(past[:-2]) <= OFFSETS_32_SPAN


@pytest.mark.parametrize("kv_dtype", ["float16", "fp8_e5m2"])
@pytest.mark.parametrize(("path", "num_splits"), [("decode", 1), ("decode", 3), ("prefill", None)])
def test_64_bit_cache_offsets(path, num_splits, kv_dtype) -> None:
    """The kernels' 64-bit row-offset build (a cache of 2^31 elements or more), forced here on
    a small cache: split and unsplit decode, prefill, a window and soft-cap, shuffled pages."""
    table = dataclasses.replace(SM70, offsets_32_max_span=0)
    lens = [(1, 70), (2, 33), (1, 5)] if path == "decode" else [(30, 70), (2, 33), (5, 5)]
    case = make_case(
        lens,
        head_size=64,
        kv_cache_dtype=kv_dtype,
        scales="head" if kv_dtype != "float16" else "none",
        sliding_window=40,
        logits_soft_cap=20.0,
        seed=23,
    )
    check(run(case, path=path, num_splits=num_splits, table=table), case, f"64-bit offsets {path}")


#: Blocks of one KV head x 16 slots x 2 x 64 e5m2 values (2048 bytes) whose offsets reach 2^31.
_BLOCKS_PAST_32_BIT = OFFSETS_32_SPAN // 2048


def cache_past_32_bit_offsets(case: PagedCase) -> PagedCase:
    """The case with its pages moved to the end of an e5m2 cache of 2^31 + 2048 x (its block
    count) bytes (one KV head, head size 64, block 16): every page it reads lies past 2^31, so
    32-bit row offsets would wrap below the buffer (the interpreter then crashes the test's
    process, a GPU faults)."""
    small = case.kv_cache
    if small.shape[1:] != (1, 16, 128) or small.dtype != torch.uint8:
        raise ValueError("the case must be e5m2, one KV head, head size 64, block 16")
    big = torch.empty(
        (_BLOCKS_PAST_32_BIT + small.shape[0], *small.shape[1:]),
        dtype=torch.uint8,
        device=small.device,
    )
    big[_BLOCKS_PAST_32_BIT:] = small
    return dataclasses.replace(
        case, kv_cache=big, block_table=case.block_table + _BLOCKS_PAST_32_BIT
    )


@pytest.mark.parametrize("path", ["decode", "prefill"])
def test_cache_past_32_bit_offsets(path) -> None:
    """A real cache of more than 2^31 elements (2 GiB of e5m2) whose pages all lie past 2^31:
    the launcher takes the 64-bit build and reads them, split and not."""
    lens = [(1, 50), (1, 20)] if path == "decode" else [(20, 50), (3, 20)]
    case = make_case(
        lens, head_size=64, num_heads=2, num_kv_heads=1, kv_cache_dtype="fp8_e5m2", seed=29
    )
    big = cache_past_32_bit_offsets(case)
    for num_splits in (1, 2) if path == "decode" else (None,):
        out = run(big, path=path, num_splits=num_splits)
        check(out, case, f"{path} past 2^31, {num_splits} partitions")


@pytest.mark.parametrize("block_size", [32, 64])
def test_larger_blocks(block_size) -> None:
    case = make_case([(8, 70), (1, 33)], head_size=64, block_size=block_size, seed=block_size)
    check(run(case, path="prefill"), case, f"prefill block {block_size}")
    check(run(case, path="decode"), case, f"decode block {block_size}")


@pytest.mark.parametrize("kv_dtype", FP8_DTYPES)
@pytest.mark.parametrize("scales", ["tensor", "head"])
@pytest.mark.parametrize("path", ["decode", "prefill"])
def test_fp8_scale_algebra(scales, path, kv_dtype) -> None:
    """fp8 with scales equals fp16 attention over the dequantized cache (stored x scale).

    Pins the folding documented by the fp8kv plugin: K scale after Q.K, V scale on the
    probabilities before P.V. Swapping the two scales, or dropping one, fails this test since
    the drawn K and V scales differ.
    """
    lens = [(1, 50), (4, 20)] if path == "decode" else [(20, 50), (4, 20)]
    case = make_case(lens, head_size=128, kv_cache_dtype=kv_dtype, scales=scales, seed=11)
    assert not torch.equal(case.k_scale, case.v_scale)
    out = run(case, path=path)
    check(out, case, f"fp8 {scales} scales")
    fp16 = dataclasses.replace(
        case,
        kv_cache=dequantized_cache(case).to(device=case.query.device, dtype=torch.float16),
        kv_cache_dtype="float16",
        k_scale=None,
        v_scale=None,
    )
    out16 = run(fp16, path=path)
    err = float((out.double() - out16.double()).norm() / out16.double().norm())
    assert err < 2e-3, f"fp8 path differs from fp16 over dequantized values by {err:.2e}"


def test_padding_tokens_untouched() -> None:
    """Tokens after the last sequence (CUDA-graph padding) are neither read nor written."""
    case = make_case([(1, 20), (1, 7)], head_size=64)
    padded = torch.randn(5, *case.query.shape[1:]).to(torch.float16)
    case.query = torch.cat([case.query, padded])
    out = torch.full_like(case.query, float("nan"))
    paged_attention(*case.tensors(), out, **case.kwargs())
    assert torch.isnan(out[2:]).all()
    case.query = case.query[:2]
    check(out[:2], case, "padded batch")


def test_prefill_finds_sequences_past_one_load_of_starts() -> None:
    """More sequences than the prefill kernel loads starts of at once: programs of the later
    sequences (and of empty ones among them) find theirs in a second load."""
    lens = [(i % 3, i % 3 + i % 4) for i in range(SEQ_CHUNK + 19)]
    case = make_case(lens, head_size=64, num_heads=2, num_kv_heads=1)
    check(run(case, path="prefill"), case, f"{len(lens)} sequences")


def test_decode_and_prefill_kernels_agree() -> None:
    case = make_case([(1, 60), (3, 9), (2, 2)], head_size=256, kv_cache_dtype="fp8_e5m2")
    a = run(case, path="decode")
    b = run(case, path="prefill")
    check(a, case, "decode")
    check(b, case, "prefill")


# -- GPU: the same checks at serving sizes ---------------------------------------------------


def skip_e4m3_below_sm89(kv_dtype: str) -> None:
    if kv_dtype == "fp8_e4m3" and torch.cuda.get_device_capability() < E4M3_MIN_CAPABILITY:
        pytest.skip("fp8_e4m3 caches need compute capability 8.9 (not declared below it)")


def gpu_case(
    lens: list[tuple[int, int]],
    kv_dtype: str,
    seed: int,
    head_size: int = 128,
    scales: str = "head",
    feature: str | None = None,
    heads: tuple[int, int] = (8, 2),
) -> PagedCase:
    """A case with ``heads`` (query, KV; 8/2) on CUDA, ``scales`` for an fp8 cache, and
    ``feature`` at serving size (a 300-token sliding window). An e4m3 case skips on a GPU
    below SM89, where the declaration does not admit it."""
    skip_e4m3_below_sm89(kv_dtype)
    kwargs = dict(FEATURE_KWARGS[feature])
    if feature == "sliding_window":
        kwargs["sliding_window"] = 300
    return make_case(
        lens,
        head_size=head_size,
        num_heads=heads[0],
        num_kv_heads=heads[1],
        kv_cache_dtype=kv_dtype,
        scales=scales if kv_dtype != "float16" else "none",
        device="cuda",
        seed=seed,
        **kwargs,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("head_size", sorted(SPEC.head_sizes))
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("feature", [None, "sliding_window", "logits_soft_cap", "sinks"])
def test_gpu_decode_and_prefill(head_size, kv_dtype, feature) -> None:
    decode = gpu_case(
        [(1, 1), (1, 777), (0, 4), (1, 2048), (4, 1500), (1, 4096)],
        kv_dtype, head_size, head_size, "head", feature,
    )  # fmt: skip
    check(run(decode), decode, f"gpu decode d{head_size} {kv_dtype} {feature}")
    prefill = gpu_case(
        [(300, 1000), (1, 1), (512, 512), (77, 2000), (0, 5)],
        kv_dtype, head_size + 1, head_size, "tensor", feature,
    )  # fmt: skip
    check(run(prefill), prefill, f"gpu prefill d{head_size} {kv_dtype} {feature}")


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", ["float16", "fp8_e5m2"])
@pytest.mark.parametrize("head_size", [128, 512])
def test_gpu_64_bit_cache_offsets(head_size, kv_dtype) -> None:
    """The 64-bit row-offset build, forced, at serving sizes: decode split and not, prefill."""
    table = dataclasses.replace(gpu_table(), offsets_32_max_span=0)
    decode = gpu_case([(1, 777), (2, 2048), (1, 4096)], kv_dtype, 31, head_size, "head")
    for num_splits in (None, 1):
        out = run(decode, num_splits=num_splits, table=table)
        check(out, decode, f"gpu 64-bit decode {num_splits}")
    prefill = gpu_case([(300, 1000), (77, 2000)], kv_dtype, 32, head_size, "tensor")
    check(run(prefill, table=table), prefill, "gpu 64-bit prefill")


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["decode", "prefill"])
def test_gpu_cache_past_32_bit_offsets(path) -> None:
    """A 2 GiB e5m2 cache whose pages all lie past 2^31 elements, on the GPU."""
    lens = [(1, 1500), (1, 20)] if path == "decode" else [(200, 1500), (3, 20)]
    case = make_case(
        lens,
        head_size=64,
        num_heads=2,
        num_kv_heads=1,
        kv_cache_dtype="fp8_e5m2",
        device="cuda",
        seed=37,
    )
    big = cache_past_32_bit_offsets(case)
    for num_splits in (None, 1) if path == "decode" else (None,):
        check(run(big, path=path, num_splits=num_splits), case, f"gpu {path} past 2^31")


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("head_size", [128, 512])
def test_gpu_speculative_decode_on_32_rows(head_size, kv_dtype) -> None:
    """8 query tokens x a group of 4 heads: the 32-row decode tile on SM80+ (at head size 512
    a tile of its own), ragged, split into partitions, with sinks."""
    lens = [(8, 1500), (8, 8), (3, 700), (1, 2048)]
    case = gpu_case(lens, kv_dtype, seed=head_size, head_size=head_size, feature="sinks")
    check(run(case, path="decode"), case, f"gpu spec 32 rows d{head_size} {kv_dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_gpu_long_prefill_takes_the_wide_tile(kv_dtype) -> None:
    """A step whose longest query reaches LONG_PREFILL_QUERY runs the 128-key prefill tile on
    SM80+ (shorter steps the 64-key one, above), ragged and after a cached prefix."""
    lens = [(LONG_PREFILL_QUERY, LONG_PREFILL_QUERY), (5, 9), (700, 1900), (0, 3), (1, 1)]
    for feature in (None, "sliding_window", "sinks"):
        case = gpu_case(lens, kv_dtype, seed=11, feature=feature)
        check(run(case, path="prefill"), case, f"long prefill {kv_dtype} {feature}")


@pytest.mark.gpu
@pytest.mark.parametrize("head_size", sorted(SPEC.head_sizes))
@pytest.mark.parametrize("feature", [None, "sliding_window", "logits_soft_cap", "sinks"])
@pytest.mark.parametrize("kv_dtype", FP8_DTYPES)
def test_gpu_fp8_decode_with_scores_ahead(head_size, feature, kv_dtype) -> None:
    """fp8 decode with the whole tiles' scores one iteration ahead (SM80+, taken only where a
    partition holds thousands of keys): forced here for short partitions too, with 16 and 32
    rows (8 query tokens), partitions that hold no whole tile, and each feature."""
    table = forced(gpu_table(), ahead_min_keys=0)
    lens = [(1, 1), (1, 777), (0, 4), (8, 1500), (4, 1500), (1, 4096)]
    case = gpu_case(lens, kv_dtype, head_size, head_size, "head", feature)
    what = f"gpu ahead d{head_size} {kv_dtype} {feature}"
    check(run(case, path="decode", table=table), case, what)
    check(run(case, path="decode", num_splits=1, table=table), case, f"{what} unsplit")


@pytest.mark.gpu
def test_gpu_scores_ahead_for_sanitizer() -> None:
    """A small fp8 decode with scores ahead (forced), split and not, for compute-sanitizer."""
    table = forced(gpu_table(), ahead_min_keys=0)
    case = make_case(
        [(1, 300), (2, 33)], head_size=128, kv_cache_dtype="fp8_e5m2", sinks=True, device="cuda"
    )
    for num_splits in (1, 3):
        check(
            run(case, path="decode", num_splits=num_splits, table=table),
            case,
            f"sanitizer ahead {num_splits}",
        )


@pytest.mark.gpu
@pytest.mark.parametrize("head_size", [64, 80, 96, 128])
@pytest.mark.parametrize("feature", [None, "sliding_window", "logits_soft_cap", "sinks"])
@pytest.mark.parametrize("ahead", [False, True])
@pytest.mark.parametrize("kv_per_prog", [2, 4])
def test_gpu_fp8_decode_with_kv_heads_paired(head_size, feature, ahead, kv_per_prog) -> None:
    """fp8 decode with two and four KV heads per program (taken on SM80+ for large batches of
    1-4K keys, heads up to 128): forced here for any length, with and without scores ahead,
    split and not, one and two query tokens, partitions that hold no whole tile, and each
    feature, in both fp8 formats."""
    table = forced(gpu_table(), ahead_min_keys=0 if ahead else None, pairing=paired(kv_per_prog))
    lens = [(1, 1), (1, 777), (0, 4), (2, 1500), (1, 1500), (1, 4096)]
    for kv_dtype in FP8_DTYPES:
        case = gpu_case(lens, kv_dtype, head_size, head_size, "head", feature, heads=(8, 4))
        for num_splits in (None, 1, 3):
            check(
                run(case, path="decode", num_splits=num_splits, table=table),
                case,
                f"gpu {kv_per_prog} heads d{head_size} {kv_dtype} {feature} ahead {ahead} "
                f"splits {num_splits}",
            )


@pytest.mark.gpu
def test_gpu_kv_heads_paired_for_sanitizer() -> None:
    """A small fp8 decode with four KV heads per program (forced), with scores ahead, split and
    not, for compute-sanitizer: 16 rows a program, so the split launch's combine covers 16
    rows (racecheck found replicas of a row's normaliser one bit apart there, see
    ``combine_splits``)."""
    table = forced(gpu_table(), ahead_min_keys=0, pairing=paired(4))
    case = make_case(
        [(1, 300), (2, 33)],
        head_size=128,
        num_heads=8,
        num_kv_heads=4,
        kv_cache_dtype="fp8_e5m2",
        scales="head",
        sinks=True,
        device="cuda",
    )
    for num_splits in (1, 3):
        check(
            run(case, path="decode", num_splits=num_splits, table=table),
            case,
            f"sanitizer 4 heads {num_splits}",
        )


@pytest.mark.gpu
@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("feature", [None, "sliding_window", "sinks"])
def test_gpu_decode_with_8_row_combines(head_size, kv_dtype, feature) -> None:
    """16/2 heads: each program combines 8 rows, which SM80+ stores as fp16 partials; split
    (the policy's count, with a short sequence and a window leaving partitions empty), with
    3 partitions, and unsplit (the same build's one-partition path)."""
    from volta_attn_v100.launch import fp16_partials

    assert fp16_partials(gpu_table(), 8) == (torch.cuda.get_device_capability() >= (8, 0))
    lens = [(1, 1), (1, 777), (1, 2048), (1, 4096)]
    case = gpu_case(lens, kv_dtype, 43, head_size, "head", feature, heads=(16, 2))
    for num_splits in (None, 3, 1):
        check(run(case, path="decode", num_splits=num_splits), case, f"8 rows {num_splits}")


@pytest.mark.gpu
@pytest.mark.parametrize("head_size", [64, 80, 128])
@pytest.mark.parametrize("feature", [None, "sliding_window", "sinks"])
@pytest.mark.parametrize("heads", [(8, 2), (16, 2)])
@pytest.mark.parametrize("kv_dtype", FP8_DTYPES)
def test_gpu_fp8_decode_with_the_wide_combine(head_size, feature, heads, kv_dtype) -> None:
    """fp8 decode of one sequence: the policy cuts it into 32 partitions, which SM80+ combines
    in the wide step (4 and 8 rows a program; 8 stored as fp16 partials); the second batch
    adds a short sequence whose later partitions hold no key."""
    from volta_attn_v100.launch import takes_wide_combine

    table = gpu_table()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    skip_e4m3_below_sm89(kv_dtype)
    splits = default_num_splits(1, heads[1], 4096, "cuda", kv_dtype)
    assert splits == SM80.fp8.wide_combine.min_splits == 32
    wide = takes_wide_combine(table.fp8, head_size, heads[1] * splits, sms, splits)
    assert wide == (torch.cuda.get_device_capability() >= (8, 0))
    for lens in ([(1, 4096)], [(1, 4096), (1, 300)]):
        case = gpu_case(lens, kv_dtype, 47, head_size, "head", feature, heads=heads)
        check(run(case, path="decode"), case, f"{kv_dtype} wide d{head_size} {feature} {lens}")


@pytest.mark.gpu
def test_gpu_fp16_partials_for_sanitizer() -> None:
    """A small split decode whose programs combine 8 rows (fp16 partials on SM80+), wide
    combine and narrow, for compute-sanitizer."""
    for kv_dtype in ("float16", "fp8_e5m2"):
        case = make_case(
            [(1, 300), (1, 33)],
            head_size=128,
            num_heads=16,
            num_kv_heads=2,
            kv_cache_dtype=kv_dtype,
            sinks=True,
            device="cuda",
        )
        for num_splits in (None, 3):
            check(run(case, path="decode", num_splits=num_splits), case, "sanitizer 8 rows")


@pytest.mark.gpu
def test_gpu_small_for_sanitizer() -> None:
    """A small launch of each kernel, for compute-sanitizer memcheck/racecheck runs: the fp16
    decode's grid is small enough for the wide combine on SM80+, and the second fp8 decode's
    32 partitions take it too; head size 512 has tiles of its own; from SM89 an e4m3 decode
    and prefill."""
    cases = [
        ("decode", [(1, 70), (2, 33)], "fp8_e5m2", 128),
        ("decode", [(1, 2100)], "fp8_e5m2", 128),
        ("decode", [(1, 700), (1, 33)], "float16", 128),
        ("prefill", [(40, 70), (1, 1)], "fp8_e5m2", 128),
        ("decode", [(1, 300), (3, 33)], "fp8_e5m2", 512),
        ("prefill", [(40, 70), (1, 1)], "float16", 512),
    ]
    if torch.cuda.get_device_capability() >= E4M3_MIN_CAPABILITY:
        cases += [
            ("decode", [(1, 2100), (2, 33)], "fp8_e4m3", 128),
            ("prefill", [(40, 70), (1, 1)], "fp8_e4m3", 128),
        ]
    for path, lens, kv_dtype, head_size in cases:
        case = make_case(
            lens, head_size=head_size, kv_cache_dtype=kv_dtype, sinks=True, device="cuda"
        )
        check(run(case, path=path), case, f"sanitizer {path} {kv_dtype} d{head_size}")


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_gpu_decode_replays_in_a_cuda_graph(kv_dtype) -> None:
    """Decode captured once in a CUDA graph, as vLLM's builder runs it, then replayed after the
    batch's lengths and queries changed in place: the launch reads them from device tensors,
    so every replay attends over the new lengths. The captured launch is split (32 partitions
    on an H100), so each replay also relies on the previous one having left its arrival
    counters at zero: a stale counter leaves rows NaN."""
    case = gpu_case([(1, 3000), (1, 40), (1, 7), (1, 2048)], kv_dtype, seed=7)
    out = torch.full_like(case.query, float("nan"))

    def step() -> None:
        paged_attention(*case.tensors(), out, **case.kwargs(), check_bounds=False)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for lens in ([3000, 40, 7, 2048], [2500, 33, 1, 1999], [17, 1, 5, 640]):
        case.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        case.query.copy_(torch.randn_like(case.query))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(out, case, f"graph replay {kv_dtype} lens {lens}")
