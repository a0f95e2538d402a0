"""Which launch each call gets, per device family: one :class:`Table` of launches by token count.

Two families. On SM70 ``tl.dot`` runs on the FMA units (docs/kernels.md#sm70-facts), so decode
tiles are modest and one to four tokens take the plain-FMA GEMV rather than a dot padded to 16
rows; above 32 tokens the weights are dequantized once and the product goes to cuBLAS, which
still has the V100's tensor cores (125 TFLOP/s against Triton's 15.7). On SM80 and newer (the
H100 the kernels are measured on) ``tl.dot`` uses tensor cores, so decode tiles are wider.

On a V100 with NVRTC, 8 to 256 tokens take the CUDA GEMM on the tensor cores instead
(:data:`SM70_MMA`, :func:`choose_mma`) wherever the SM70 model (:mod:`volta_ct_wna16.sm70_model`)
puts it ahead of the table's Triton launch; without NVRTC the table's launch runs.
Torch- and triton-free; the history of every choice is docs/perf/ct_wna16/PERFORMANCE_HISTORY.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from volta_ct_wna16 import sm70_model
from volta_ct_wna16.launch import (
    DEQUANT_MATMUL,
    GEMM,
    MMA,
    MOE,
    SPLITK,
    Launch,
    MoEFused,
)
from volta_ct_wna16.limits import MAX_ROUTED_EXPERTS, MMA_CAPABILITY

#: The most tokens a table's decode (split-K) tile takes unless the table says otherwise.
DECODE_MAX_M = 16

#: The most tokens the fused-MoE decode kernels take (more take the routed blocks' kernel).
MOE_DECODE_MAX_M = 16


@dataclass(frozen=True)
class MoEDecode:
    """The fused-MoE decode kernels' launches (:mod:`volta_ct_wna16.kernels.moe_decode`): one
    row a program on the GEMV sub-tile, the input split as :func:`volta_ct_wna16.launch.split_count`
    says and the splits summed by a tree of fan-in ``reduce_unroll``."""

    gate_up: Launch
    down: Launch

    def __post_init__(self) -> None:
        for launch in (self.gate_up, self.down):
            if launch.path != MOE or launch.block_m != 1 or launch.use_dot or launch.block_k % 32:
                raise ValueError(
                    f"a decode launch is a fused-MoE one of one row, no dot, on whole 32-input "
                    f"sub-tiles: {launch}"
                )


@dataclass(frozen=True)
class Table:
    """The launches of one device family, by number of tokens."""

    gemv: Launch
    """1 token (below the ``wide_gemv`` threshold, if any)."""
    small: Launch
    """2 to 4 tokens."""
    decode: Launch
    """5 to ``decode_max_m`` tokens."""
    gemm: Launch
    """From ``decode_max_m + 1`` up to ``dequant_from`` tokens: the GEMM kernel, or a split-K
    tile of many rows."""
    dequant_from: int | None
    """From this many tokens on, dequantize and call cuBLAS (None: never)."""
    dequant: Launch
    moe: Launch
    """Fused MoE while experts get few routed rows each."""
    moe_large: Launch
    """Fused MoE once the routed rows average more than ``moe.block_m`` per expert."""
    wide_gemv: tuple[int, Launch] | None = None
    """1 token from this many outputs on: ``(outputs, launch)``."""
    short_gemv: tuple[int, Launch] | None = None
    """1 token below ``wide_gemv``'s outputs, with at most this many inputs: ``(inputs,
    launch)``."""
    decode_max_m: int = DECODE_MAX_M
    """The most tokens the decode tile takes (a tile of 16 rows runs one program per 16)."""
    moe_decode: tuple[tuple[int, MoEDecode | MoEFused], ...] = ()
    """Fused MoE at few tokens, read straight from the router's ids: ``(most tokens,
    launches)`` rows in token order (:func:`choose_moe_decode`), two launches or one."""


SM70 = Table(
    # uint8 zero points because the GEMV is bandwidth-bound, more so on a V100 than on the H100
    # where they gained (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#run15; not measured on SM70).
    gemv=Launch(
        SPLITK,
        block_m=1,
        block_n=256,
        block_k=32,
        programs_per_sm=4,
        reduce_unroll=4,
        byte_zeros=True,
    ),
    # 8 warps because on 4 the 8-bit tile spills at sm_70 once the JIT specializes model shapes
    # (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#sm70_small_warps).
    small=Launch(SPLITK, block_m=4, block_n=64, block_k=32, num_warps=8, programs_per_sm=4),
    decode=Launch(SPLITK, block_m=16, block_n=32, block_k=64, use_dot=True, programs_per_sm=4),
    gemm=Launch(GEMM, block_m=32, block_n=64, block_k=32, num_warps=4),
    dequant_from=33,
    dequant=Launch(DEQUANT_MATMUL, block_n=256, block_k=32),
    moe=Launch(MOE, block_m=16, block_n=64, block_k=32, use_dot=True),
    moe_large=Launch(MOE, block_m=32, block_n=64, block_k=32, use_dot=True),
    # Decode MoE: this table's 1-token GEMV tile, split and summed by the tree; estimated,
    # not measured (no V100). Two launches at every size: the one launch walks the whole input
    # per program, and Triton does not pipeline loops on SM70.
    moe_decode=(
        (
            MOE_DECODE_MAX_M,
            MoEDecode(
                Launch(MOE, block_n=256, block_k=32, reduce_unroll=4),
                Launch(MOE, block_n=256, block_k=32, reduce_unroll=4),
            ),
        ),
    ),
)

#: The SM90 tile of 2 to 32 tokens (the table's ``small`` and ``decode``).
_SM90_DOT = Launch(
    SPLITK,
    block_m=16,
    block_n=256,
    block_k=128,
    use_dot=True,
    programs_per_sm=2,
    num_stages=3,
    atomic=True,
    unmasked=True,
    split_cost=1.5,
)

#: The SM90 1-token GEMV (the table's ``gemv``); its wide and short tiles differ from it in
#: warps, programs per SM, fan-in and zero-point form only.
_SM90_GEMV = Launch(
    SPLITK,
    block_m=1,
    block_n=512,
    block_k=32,
    num_warps=2,
    programs_per_sm=4,
    num_stages=3,
    reduce_unroll=8,
    byte_zeros=True,
    atomic=True,
    unmasked=True,
)

#: The SM90 decode MoE's launch: the 1-token GEMV's warps, pipeline and fan-in
#: (:data:`_SM90_GEMV`) on 512 outputs; at one token on 256.
_SM90_ROW = Launch(MOE, block_n=512, block_k=32, num_warps=2, num_stages=3, reduce_unroll=8)

SM90 = Table(
    # 1 token: 512 outputs on 2 warps at 4 programs per SM, the best or within 1.1 us of the best
    # on every layer swept (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#sm90_gemv).
    gemv=_SM90_GEMV,
    # From 8192 outputs: 4 warps at 5 programs per SM and a fan-in of 16, with fp16 zero points
    # (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#sm90_gemv).
    wide_gemv=(
        8192,
        replace(_SM90_GEMV, num_warps=4, programs_per_sm=5, reduce_unroll=16, byte_zeros=False),
    ),
    # Up to 8192 inputs: 4 warps at 6 programs per SM, faster than the narrow tile on the layers
    # of 5120 inputs (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#sm90_gemv).
    short_gemv=(8192, replace(_SM90_GEMV, num_warps=4, programs_per_sm=6)),
    # 2-32 tokens: 256 outputs at 2 programs per SM with atomic splits, the best tile overall in
    # the sweeps at 4 and 16 tokens (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#sm90_dot).
    small=_SM90_DOT,
    decode=_SM90_DOT,
    # Up to 32 tokens on the decode tile: at 32 it beat the GEMM on every layer timed
    # (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#run9).
    decode_max_m=32,
    # 33-191 tokens: a 64x64x64 dequantized tile with split-K, because the GEMM kernel has no
    # split-K and ran a layer with few output tiles on few SMs
    # (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#sm90_gemm).
    gemm=Launch(
        SPLITK,
        block_m=64,
        block_n=64,
        block_k=64,
        use_dot=True,
        num_warps=4,
        programs_per_sm=3,
        num_stages=3,
        unmasked=True,
        split_cost=3.0,
    ),
    # From 192 tokens dequantize-then-cuBLAS, which won everywhere at 256
    # (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#sm90_gemm).
    dequant_from=192,
    dequant=Launch(DEQUANT_MATMUL, block_n=256, block_k=32),
    # Fused MoE: 16x128x128 while the routed rows per expert are few, 64x128x64 from 16 rows per
    # expert on average (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#sm90_moe).
    moe=Launch(MOE, block_m=16, block_n=128, block_k=128, use_dot=True, num_stages=3),
    # The large tile swapped (weights as the dot's first operand, scales per word row): on the
    # H100 the prefill kernels at 2048 tokens took 596.6 us against 688.2 unswapped on the
    # Qwen3.5 layer and 725.3 against 836.2 on Qwen3-30B's, the least total over both of the
    # tiles swept (128x128x64 on 8 warps swapped: 642.7 and 694.6, and 456.4 against 285.4 on
    # Qwen3-30B's at 256 tokens, 16 rows per expert). The small tile stays: at 256 tokens
    # (8 and 16 rows per expert, both on it) it took 247.2 and 266.3 us, swapped 258.9 and
    # 265.6 (docs/perf/ct_wna16/moe_prefill/call1).
    moe_large=Launch(
        MOE, block_m=64, block_n=128, block_k=64, use_dot=True, num_stages=3, swap=True
    ),
    # Decode MoE (docs/perf/ct_wna16/moe_decode/README.md): 1-4 tokens in one launch, 32
    # intermediate rows a program on 4 warps (one token 14.6-15.0 us against the two launches'
    # 17.3-17.4 on the Qwen3.5 layer, four 31.3-32.8 against 33.2-33.4; on 8 warps 24.7 and
    # 54.4, 64 rows 27.7 and 33.4); 5-16 tokens the 1-token GEMV's tile, 512 outputs a program,
    # split and summed by the tree (86.0 us at 16 tokens; one launch there took 109-188).
    moe_decode=(
        (4, MoEFused(block_j=32, block_k=256, block_n=1024, num_warps=4, num_stages=3)),
        (MOE_DECODE_MAX_M, MoEDecode(_SM90_ROW, _SM90_ROW)),
    ),
)


def table_for(capability: tuple[int, int]) -> Table:
    """SM70 tiles on Volta (and Turing), SM90 tiles on anything with tensor-core ``tl.dot``."""
    return SM70 if capability < (8, 0) else SM90


def choose(
    m: int,
    n: int,
    capability: tuple[int, int],
    bits: int,
    table: Table | None = None,
    k: int | None = None,
) -> Launch:
    """The launch for ``m`` tokens, ``n`` outputs and ``k`` inputs on ``capability`` with
    ``bits``-bit weights.

    One token: the wide tile from ``wide_gemv``'s outputs on, else the short one up to
    ``short_gemv``'s inputs (``k`` None: not known, so not short), else the narrow one. The
    input length also acts through :func:`volta_ct_wna16.launch.split_count` (a long input is
    cut into more splits).
    """
    t = table or table_for(capability)
    if m <= 1:
        launch = t.gemv
        if t.wide_gemv is not None and n >= t.wide_gemv[0]:
            launch = t.wide_gemv[1]
        elif t.short_gemv is not None and k is not None and k <= t.short_gemv[0]:
            launch = t.short_gemv[1]
    elif m <= 4:
        launch = t.small
    elif m <= t.decode_max_m:
        launch = t.decode
    elif t.dequant_from is not None and m >= t.dequant_from:
        launch = t.dequant
    else:
        launch = t.gemm
    return launch.scaled_for_bits(bits)


#: The fewest and the most tokens the tensor-core GEMM takes: from 8, one ``m8n8k4`` product's
#: rows (fewer tokens stay on the FMA GEMV and decode tiles, which are bound by the weights'
#: bytes there); up to 256, beyond which the dequantize-then-cuBLAS path serves.
MMA_MIN_M = 8
MMA_MAX_M = 256


def _mma(block_m: int, programs_per_sm: int) -> Launch:
    return Launch(
        MMA,
        block_m=block_m,
        block_n=256,
        block_k=32,
        num_warps=4,
        programs_per_sm=programs_per_sm,
        split_cost=2.0,
    )


#: The tensor-core GEMM on a V100, one row per token class: ``(most tokens, launch)``. Four
#: warps of 64 outputs (two words a lane per word row, so each activation fragment serves two
#: products); 16, 32 or 64 tokens a block (more tokens take several row blocks, which read the
#: same weights from L2). ``programs_per_sm`` is what the sm_70 build's registers let an SM hold
#: (4, 3 and 2 blocks of 128 threads at up to 111, 154 and 238 registers); the split count
#: balances them with a fixed cost of 2 k-tiles per block (its start and its atomic sums).
#: Estimated, not measured (no V100; docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#mma_sm70).
SM70_MMA: tuple[tuple[int, Launch], ...] = (
    (16, _mma(16, 4)),
    (32, _mma(32, 3)),
    (MMA_MAX_M, _mma(64, 2)),
)


def choose_mma(
    m: int, n: int, k: int, capability: tuple[int, int], bits: int, weight_bytes: int
) -> Launch | None:
    """The tensor-core launch for ``m`` tokens on an ``n x k`` layer of ``bits``-bit weights
    (``weight_bytes`` read), or None where the table's Triton launch (:func:`choose`) serves:
    another device, a token count outside :data:`MMA_MIN_M`-:data:`MMA_MAX_M`, or a model time
    (:func:`volta_ct_wna16.sm70_model.seconds`) longer than the Triton launch's. A tie (both
    bound by the same bytes, 8-bit weights at 8 tokens) goes to the tensor cores, whose
    arithmetic is further from binding."""
    if capability != MMA_CAPABILITY or not MMA_MIN_M <= m <= MMA_MAX_M:
        return None
    launch = next(row for most, row in SM70_MMA if m <= most)
    triton = choose(m, n, capability, bits, k=k)
    mma = sm70_model.seconds(m, n, k, launch, bits, weight_bytes)
    return launch if mma <= sm70_model.seconds(m, n, k, triton, bits, weight_bytes) else None


def choose_moe(pairs: int, experts: int, capability: tuple[int, int]) -> Launch:
    """The fused-MoE launch for ``pairs`` routed (token, expert) rows over ``experts`` local
    experts: the larger tile once the rows average more than the small tile holds per expert.
    Depends on the batch only (not on the routing), so a captured CUDA graph keeps its tile."""
    t = table_for(capability)
    return t.moe_large if pairs > t.moe.block_m * experts else t.moe


def choose_moe_decode(tokens: int, capability: tuple[int, int]) -> MoEDecode | MoEFused | None:
    """The decode kernels' launches for ``tokens`` tokens on ``capability``, or None where the
    routed blocks' kernel serves (:func:`choose_moe`): more tokens than the table's last row.
    Depends on the batch only, so a captured CUDA graph keeps its launches."""
    return next(
        (row for most, row in table_for(capability).moe_decode if 1 <= tokens <= most), None
    )


def pow2_at_least(n: int, least: int) -> int:
    """The smallest power of two that is at least ``n`` and ``least`` (a vector length)."""
    return max(least, 1 << (n - 1).bit_length())


#: The most experts per token :func:`volta_ct_wna16.routing.select_experts` picks (its
#: kernel's vector of them, ``TOPK_POW2``).
MAX_SELECT_TOP_K = 32


#: Pairs per program of the routing's first launch.
ROUTE_COUNT_BLOCK = 256

#: Count-by-pair elements one program of the routing's second launch compares at once.
_ROUTE_PLACE_ELEMENTS = 8192


def route_place_tile(experts: int) -> tuple[int, int]:
    """``(E_POW2, BLOCK)`` of the routing's second launch for ``experts`` local experts: the
    counts padded to a power of two (at least 16), and as many pairs per program as keep the
    pairs-by-experts comparisons at ``_ROUTE_PLACE_ELEMENTS`` (16 to 128)."""
    if not 1 <= experts <= MAX_ROUTED_EXPERTS:
        raise ValueError(
            f"{experts} local experts: the fused routing takes 1 to {MAX_ROUTED_EXPERTS}"
        )
    e_pow2 = max(16, 1 << (experts - 1).bit_length())
    return e_pow2, max(16, min(128, _ROUTE_PLACE_ELEMENTS // e_pow2))


#: Columns per program of the SiLU product between the fused-MoE launches.
SILU_BLOCK = 512
