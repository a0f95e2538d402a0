"""Which kernel and tile each call uses, per device, and the list the SM70 gate checks.

Kept free of torch and triton: the plugin's ``volta_kernel_configs`` hook returns
:func:`kernel_configs`, and the launcher (:mod:`volta_ct_wna16.ops`) asks :func:`choose` for the
launch of each call, so the gate checks exactly the configurations that run.

Two tables. On SM70 ``tl.dot`` runs on the FMA units (docs/kernels.md#sm70-facts), so decode
tiles are modest (no spills) and one to four tokens use the plain-FMA GEMV rather than a dot
padded to 16 rows; above 32 tokens the weights are dequantized once and the product goes to
cuBLAS, which still has the V100's tensor cores (125 TFLOP/s against Triton's 15.7). On SM80
and newer (the H100 the kernels are measured on) ``tl.dot`` uses tensor cores, so decode tiles
are wider.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace

from volta_core import Device, KernelConfig

SPLITK = "splitk"
GEMM = "gemm"
DEQUANT_MATMUL = "dequant_matmul"
MOE = "moe"

KERNELS = "volta_ct_wna16.kernels"

#: The most tokens a table's decode (split-K) tile takes unless the table says otherwise.
DECODE_MAX_M = 16


@dataclass(frozen=True)
class Launch:
    """One launch choice: the path, its tile, and how many programs split-K aims for per SM.

    ``block_k`` counts input elements (packed words times the pack factor). ``num_stages`` is
    the software pipeline depth of the input loop (Triton pipelines on SM80+ only, so the SM70
    tables keep 1); the split-K loop asks for it explicitly (``tl.range``), because Triton
    does not pipeline a loop without a dot on its own. ``reduce_unroll`` is how many split
    partials the fused split-K reduction loads per round trip to L2. ``byte_zeros``: a 1-token
    GEMV that reads asymmetric layers' zero points as uint8 (``PackedWeights.zeros8``) where
    the layer has them: the GEMV loads them where it uses them, one per output and group, so
    their bytes count as the weights' do; the dot tiles copy fp16 rows ahead instead (a 1-byte
    row is below what ``cp.async`` copies).
    ``atomic``: a split-K launch whose splits add their partials atomically into one fp32 tile
    (the kernel's ``ATOMIC``, :func:`volta_ct_wna16.kernels._accumulate_splits`) instead of
    summing them through the reduction tree.
    ``unmasked``: the launch also has a build without input and output masks, which it runs
    where every tile lies inside the layer (:func:`whole_tiles`).
    ``split_cost``: where set, the split count is the one the SMs finish soonest by
    :func:`balanced_splits`, which counts a program's fixed cost as this many input steps and
    takes ``programs_per_sm`` as the programs an SM runs at once; where None,
    :func:`split_count` aims at ``programs_per_sm`` programs per SM.
    """

    path: str
    block_m: int = 1
    block_n: int = 32
    block_k: int = 256
    use_dot: bool = False
    num_warps: int = 4
    programs_per_sm: int = 4
    group_m: int = 8
    num_stages: int = 1
    reduce_unroll: int = 2
    byte_zeros: bool = False
    atomic: bool = False
    unmasked: bool = False
    split_cost: float | None = None

    def __post_init__(self) -> None:
        if self.byte_zeros and not (self.path == SPLITK and self.block_m == 1 and not self.use_dot):
            raise ValueError(f"only a 1-token GEMV reads uint8 zero points: {self}")
        if self.atomic and self.path != SPLITK:
            raise ValueError(f"only a split-K launch adds its splits atomically: {self}")
        if self.unmasked and self.path != SPLITK:
            raise ValueError(f"only a split-K launch has an unmasked build: {self}")
        if self.split_cost is not None and (self.path != SPLITK or self.split_cost < 0):
            raise ValueError(f"split_cost is a split-K launch's cost in steps, >= 0: {self}")

    def scaled_for_bits(self, bits: int) -> Launch:
        """The multi-token FMA tiles in packed words: 8-bit weights get half the elements.

        The 1-token GEMV works in 32-element sub-tiles whatever the width, and dequantized-tile
        paths (``tl.dot``, GEMM, dequantize) keep their element tile.
        """
        if bits == 4 or self.path != SPLITK or self.use_dot or self.block_m == 1:
            return self
        return replace(self, block_k=self.block_k // 2)


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
    wide_gemv: tuple[int, Launch] | None = None
    """1 token from this many outputs on: ``(outputs, launch)``."""
    short_gemv: tuple[int, Launch] | None = None
    """1 token below ``wide_gemv``'s outputs, with at most this many inputs: ``(inputs,
    launch)``."""
    decode_max_m: int = DECODE_MAX_M
    """The most tokens the decode tile takes (a tile of 16 rows runs one program per 16)."""
    moe: Launch = Launch(MOE, block_m=16, block_n=64, block_k=32, use_dot=True)
    """Fused MoE (:func:`wna16_moe_kernel`) while experts get few routed rows each."""
    moe_large: Launch = Launch(MOE, block_m=32, block_n=64, block_k=32, use_dot=True)
    """Fused MoE once the routed rows average more than ``moe.block_m`` per expert."""


SM70 = Table(
    # uint8 zero points: the GEMV is bandwidth-bound, more so on a V100 (900 GB/s for 80 SMs)
    # than on the H100 where they gained (SM90 table below); not measured on SM70.
    gemv=Launch(
        SPLITK,
        block_m=1,
        block_n=256,
        block_k=32,
        programs_per_sm=4,
        reduce_unroll=4,
        byte_zeros=True,
    ),
    # 8 warps: on 4, the 8-bit tile (16 inputs) spilled 8 B at sm_70 once N, K and the strides
    # were compiled as multiples of 16, as the JIT specializes them for model shapes.
    small=Launch(SPLITK, block_m=4, block_n=64, block_k=32, num_warps=8, programs_per_sm=4),
    decode=Launch(SPLITK, block_m=16, block_n=32, block_k=64, use_dot=True, programs_per_sm=4),
    gemm=Launch(GEMM, block_m=32, block_n=64, block_k=32, num_warps=4),
    dequant_from=33,
    dequant=Launch(DEQUANT_MATMUL, block_n=256, block_k=32),
)

# block_k 128: 16 words per slot, so each word slot is its own dot (no interleaving).
# num_stages 3 is what Triton used before the tables named it (its default on CUDA).
# 2-32 tokens: 256 outputs at 2 programs per SM, the best tile overall in the H100 sweeps at
# 4 and 16 tokens: a 128-output tile was 4-7% faster at 4 tokens symmetric but 12-33% slower
# elsewhere; more programs per SM, 4 stages, 8 warps and 128- or 512-output tiles were slower
# on the large layers (the previous tile stayed 8-11% faster on 7168x5120). The splits add
# their partials atomically into one fp32 tile (`Launch.atomic`): the tail after the last
# split is one read of the summed tile instead of a reduction tree's round trips, 4-25%
# faster at 2-32 tokens.
# History: docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#run8, #run9, #run12, #run15.
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
"""The SM90 tile of 2 to 32 tokens (the table's ``small`` and ``decode``)."""


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
"""The SM90 1-token GEMV (the table's ``gemv``); its wide and short tiles differ from it in
warps, programs per SM, fan-in and zero-point form only."""


SM90 = Table(
    # The 1-token tile: 512 outputs x 2 warps at 4 programs per SM, best or within 1.1 us of
    # the best on every layer of the sweeps. From 8192 outputs the wide tile: 4
    # warps (20 resident warps an SM hide each word's load-to-FMA chain: 27648x5120 33.0 ->
    # 31.7 us) at 5 programs per SM (at 8 the grid outgrew what the SMs hold at once and a
    # remainder ran after the rest) with a reduction fan-in of 16. Asymmetric zero points as
    # uint8 on the narrow tile, where they saved 3-4%; the wide tile keeps fp16 ones (uint8
    # cost it 0.2-0.8 us). Both add their splits atomically (1-13% faster than the tree).
    # History: docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#run6, #run9, #run11, #run15, #run16.
    gemv=_SM90_GEMV,
    wide_gemv=(
        8192,
        replace(_SM90_GEMV, num_warps=4, programs_per_sm=5, reduce_unroll=16, byte_zeros=False),
    ),
    # Short inputs (at most 8192): 4 warps at 6 programs per SM, 4-8% faster than the narrow
    # tile on the layers of 5120 inputs; on a long input (5120x27648) 4 warps lose, and between
    # 5120 and 27648 inputs it was not measured (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#run16).
    short_gemv=(8192, replace(_SM90_GEMV, num_warps=4, programs_per_sm=6)),
    small=_SM90_DOT,
    decode=_SM90_DOT,
    # Up to 32 tokens (two 16-row blocks per output tile): at 32 this tile beat the GEMM on
    # every layer timed (5120x27648 98.3 against 243.1 us), at 64 only on 5120x27648
    # (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#run9).
    decode_max_m=32,
    # 33-191 tokens: a 64x64x64 dequantized tile with split-K (the split-K kernel's
    # interleaved-dot path). The GEMM kernel has no split-K, so a layer with few output tiles
    # and a long input ran on few SMs (5120x27648 at 64 tokens: 249.1 us against 121.1 here);
    # from 192 tokens dequantize-then-cuBLAS (it won everywhere at 256, this tile mostly at
    # 128; 192 itself was not measured). The split count is balanced_splits' with 3 resident
    # programs and a fixed cost of 3 steps, fitted to a sweep of every count at 64 tokens:
    # within 1.2 us of the fastest on all eight layer/symmetry cases.
    # History: docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#run9, #run16.
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
    dequant_from=192,
    dequant=Launch(DEQUANT_MATMUL, block_n=256, block_k=32),
    # Fused MoE: 128 inputs per step (one dot per word slot; a group-128 tile loads one row
    # of scales and zero points); 16 rows while the routed rows per expert are few (decode:
    # most blocks hold one or two), 64 rows on 128 outputs from 16 rows per expert on average.
    # On a Qwen3-30B-A3B layer the 128-output decode tile was 7-17% faster than 64 outputs
    # (32 outputs, 256 inputs per step, 2 or 8 warps and 4 stages were slower); at 1024
    # tokens 64x128x64 was within 5% of 128x128x64 on 8 warps and less than half the time of
    # 128 inputs per step (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#run13).
    moe=Launch(MOE, block_m=16, block_n=128, block_k=128, use_dot=True, num_stages=3),
    moe_large=Launch(MOE, block_m=64, block_n=128, block_k=64, use_dot=True, num_stages=3),
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
    input length also acts through :func:`split_count` (a long input is cut into more splits).
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


def choose_moe(pairs: int, experts: int, capability: tuple[int, int]) -> Launch:
    """The fused-MoE launch for ``pairs`` routed (token, expert) rows over ``experts`` local
    experts: the larger tile once the rows average more than the small tile holds per expert.
    Depends on the batch only (not on the routing), so a captured CUDA graph keeps its tile."""
    t = table_for(capability)
    return t.moe_large if pairs > t.moe.block_m * experts else t.moe


def slot_dots(launch: Launch, bits: int) -> bool:
    """Whether ``launch`` runs the dot tile with one ``tl.dot`` per word slot (16 or more words
    per slot; the kernel's ``SLOT_DOTS``), which reads activations two slots at a time as
    32-bit words, so its activation rows must start 4-byte aligned
    (:func:`volta_ct_wna16.ops.wna16_linear` pads them where they do not)."""
    return launch.path in (SPLITK, MOE) and launch.use_dot and launch.block_k // (32 // bits) >= 16


def split_count(n: int, k: int, launch: Launch, sm_count: int, m: int = 1) -> tuple[int, int]:
    """How many input splits, and the input length of each (a multiple of ``block_k``), for
    ``m`` tokens.

    With ``launch.split_cost``, the count :func:`balanced_splits` finds for the launch's
    ``[m, n]`` output tiles. Otherwise enough programs to keep every SM busy with
    ``programs_per_sm`` of them (output columns only), but never a split shorter than one
    tile.
    """
    n_blocks = -(-n // launch.block_n)
    k_blocks = -(-k // launch.block_k)
    if launch.split_cost is not None:
        tiles = n_blocks * -(-m // launch.block_m)
        resident = launch.programs_per_sm
        steps = balanced_splits(tiles, k_blocks, resident, launch.split_cost, sm_count)
    else:
        want = max(1, -(-(launch.programs_per_sm * sm_count) // n_blocks))
        steps = -(-k_blocks // min(want, k_blocks))
    per_split = steps * launch.block_k
    return -(-k // per_split), per_split


@functools.cache
def balanced_splits(tiles: int, k_blocks: int, resident: int, cost: float, sm_count: int) -> int:
    """The input steps per split that let the SMs finish ``tiles`` output tiles soonest.

    Cutting each tile's ``k_blocks`` steps into ``s`` splits makes ``tiles * s`` programs of
    ``ceil(k_blocks / s)`` steps. An SM runs about ``ceil(programs / sm_count)`` of them,
    ``resident`` at a time, each paying a fixed cost of ``cost`` steps (its start, and the
    atomic sum after its last step), and one with fewer than ``resident`` programs gains
    nothing from it (a lone program waits on its own loads). So the time is taken as
    ``max(ceil(programs / sm_count), resident) * (steps + cost)``; ties go to fewer splits.
    A sweep of every split count on the H100 ranked the 2-16-token tile's counts this way: the
    wave edge (280 programs, where 264 run at once) cost 2.7-4.4 us on 7168x5120 and
    5120x27648 (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#run16). The search walks every
    step count (about 20-40 us in Python for a 27648-input layer), so its answers are cached:
    the launcher asks once per layer shape and token count, not on every call.
    """
    if min(tiles, k_blocks, resident, sm_count) < 1:
        raise ValueError(
            f"balanced_splits needs at least one tile, input step, resident program and SM, "
            f"got tiles={tiles}, k_blocks={k_blocks}, resident={resident}, sm_count={sm_count}"
        )
    best = (float("inf"), 0)
    for steps in range(1, k_blocks + 1):
        splits = -(-k_blocks // steps)
        if -(-k_blocks // splits) != steps:
            continue  # the same splits as fewer steps each
        time = max(-(-tiles * splits // sm_count), resident) * (steps + cost)
        if time < best[0] or (time == best[0] and steps > best[1]):
            best = (time, steps)
    return best[1]


def unmasked_build(launch: Launch, bits: int) -> bool:
    """Whether ``launch`` has a build without input and output masks (the split-K kernel's
    ``WHOLE``): an ``unmasked`` launch of the 1-token GEMV, an FMA tile or a slot-dot tile;
    the interleaved dot tile (:func:`slot_dots` false) keeps its masks. The SM70 tables have
    none: not measured on a V100, and the 8-bit GEMV's unspecialized unmasked build spilled
    24 B at sm_70."""
    return (
        launch.unmasked
        and launch.path == SPLITK
        and (not launch.use_dot or slot_dots(launch, bits))
    )


def whole_tiles(n: int, k: int, launch: Launch, bits: int) -> bool:
    """Whether ``launch`` runs its unmasked build on an ``n x k`` layer (the kernel's
    ``WHOLE``): it has one (:func:`unmasked_build`) and every tile lies inside the layer, the
    outputs a multiple of ``block_n`` and the inputs of ``block_k``. Splits start at multiples
    of ``block_k`` (:func:`split_count`), so each split's tiles are then whole too. Model
    layers are (every benchmark shape); a layer that is not runs masked."""
    return unmasked_build(launch, bits) and n % launch.block_n == 0 and k % launch.block_k == 0


def group_tile(launch: Launch, group: int) -> bool:
    """Whether every ``block_k`` tile of a layer with ``group`` inputs per scale lies inside one
    group, so a dot tile loads one row of scales and zero points instead of one per word row.

    Splits start at multiples of ``block_k`` (:func:`split_count`), so tiles are aligned.
    Only the dot paths use it: the 1-token GEMV already loads scales once per 32 inputs.
    """
    return launch.path in (SPLITK, MOE) and launch.use_dot and group % launch.block_k == 0


def splitk_constexprs(
    launch: Launch,
    bits: int,
    zp: bool,
    bias: bool,
    use_ws: bool,
    group_tile: bool,
    atomic: bool = False,
    whole: bool = False,
) -> dict[str, int | bool]:
    """The ``tl.constexpr`` arguments of :func:`wna16_splitk_kernel` for one launch: the
    launcher and the gate both build them here, so the gate compiles what runs."""
    return {
        "BITS": bits,
        "HAS_ZP": zp,
        "HAS_BIAS": bias,
        "USE_WS": use_ws,
        "USE_DOT": launch.use_dot,
        "BLOCK_M": launch.block_m,
        "BLOCK_N": launch.block_n,
        "BLOCK_K": launch.block_k,
        "NUM_STAGES": launch.num_stages,
        "REDUCE_UNROLL": launch.reduce_unroll,
        "GROUP_TILE": group_tile,
        "SLOT_DOTS": slot_dots(launch, bits),
        "ATOMIC": use_ws and atomic,
        "WHOLE": whole,
    }


_SPLITK_SIG = {
    "x_ptr": "*fp16",
    "w_ptr": "*i32",
    "s_ptr": "*fp16",
    "z_ptr": "*fp16",
    "b_ptr": "*fp16",
    "out_ptr": "*fp16",
    "ws_ptr": "*fp32",
    "cnt_ptr": "*i32",
    "M": "i32",
    "N": "i32",
    "K": "i32",
    "KW": "i32",
    "GROUP": "i32",
    "stride_xm": "i32",
    "stride_om": "i32",
    "K_PER_SPLIT": "i32",
}

_GEMM_SIG = {k: v for k, v in _SPLITK_SIG.items() if k not in ("ws_ptr", "cnt_ptr", "K_PER_SPLIT")}

_MOE_SIG = {
    "x_ptr": "*fp16",
    "w_ptr": "*i32",
    "s_ptr": "*fp16",
    "z_ptr": "*fp16",
    "out_ptr": "*fp16",
    "rw_ptr": "*fp32",
    "pair_ptr": "*i32",
    "expert_ptr": "*i32",
    "PAIRS": "i32",
    "N": "i32",
    "K": "i32",
    "KW": "i32",
    "GROUP": "i32",
    "EXPERTS": "i32",
    "ROW_DIV": "i32",
    "OUT_DIV": "i32",
    "stride_xm": "i32",
    "stride_om": "i32",
    "stride_we": "i32",
    "stride_se": "i32",
    "K_PER_SPLIT": "i32",
}

_DEQUANT_SIG = {
    "w_ptr": "*i32",
    "s_ptr": "*fp16",
    "z_ptr": "*fp16",
    "out_ptr": "*fp16",
    "N": "i32",
    "K": "i32",
    "KW": "i32",
    "GROUP": "i32",
}


#: Integer arguments that are multiples of 16 for model-sized layers (every shape of the
#: benchmark, and the group sizes); the JIT specializes them, and the gate compiles them so
#: as well as unspecialized (:func:`volta_devkit.gate.gate_variants`).
_MODEL_DIVISIBLE = ("N", "K", "KW", "GROUP", "stride_xm", "stride_om")
_SPLITK_DIVISIBLE = (*_MODEL_DIVISIBLE, "K_PER_SPLIT")
_DEQUANT_DIVISIBLE = ("N", "K", "KW", "GROUP")
_MOE_DIVISIBLE = (*_MODEL_DIVISIBLE, "stride_we", "stride_se", "K_PER_SPLIT")


def splitk_config(
    launch: Launch,
    bits: int,
    zp: bool,
    bias: bool,
    use_ws: bool,
    group_tile: bool,
    zp8: bool = False,
    atomic: bool = False,
    whole: bool = False,
) -> KernelConfig:
    """The gate's configuration of one split-K launch (named by tile, warps, stages, unroll);
    ``zp8``: zero points as uint8 (``Launch.byte_zeros``); ``atomic``: the splits added
    atomically (``Launch.atomic``); ``whole``: every tile inside the layer
    (:func:`whole_tiles`)."""
    tile = (
        f"m{launch.block_m}n{launch.block_n}k{launch.block_k}"
        f"w{launch.num_warps}s{launch.num_stages}r{launch.reduce_unroll}"
    )
    return KernelConfig(
        name=f"splitk_{'dot' if launch.use_dot else 'fma'}_{tile}_w{bits}{'a' if zp else 's'}"
        f"{'_ws' if use_ws else ''}{'_bias' if bias else ''}{'_gt' if group_tile else ''}"
        f"{'_z8' if zp8 else ''}{'_at' if atomic else ''}{'_wh' if whole else ''}",
        kernel=f"{KERNELS}:wna16_splitk_kernel",
        signature={**_SPLITK_SIG, "z_ptr": "*u8"} if zp8 else _SPLITK_SIG,
        constexprs=splitk_constexprs(launch, bits, zp, bias, use_ws, group_tile, atomic, whole),
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
        divisible_by_16=_SPLITK_DIVISIBLE,
    )


#: Fused-MoE tiles of at most this many rows (decode's) may split the input.
MOE_SPLIT_MAX_ROWS = 16


def moe_splits(launch: Launch) -> bool:
    """Whether ``launch`` may split the input: a decode tile, whose step routes few blocks."""
    return launch.block_m <= MOE_SPLIT_MAX_ROWS


def moe_constexprs(
    launch: Launch, bits: int, zp: bool, mul_router: bool, group_tile: bool, atomic: bool
) -> dict[str, int | bool]:
    """The ``tl.constexpr`` arguments of :func:`wna16_moe_kernel` (launcher and gate)."""
    return {
        "BITS": bits,
        "HAS_ZP": zp,
        "MUL_ROUTER": mul_router,
        "BLOCK_M": launch.block_m,
        "BLOCK_N": launch.block_n,
        "BLOCK_K": launch.block_k,
        "GROUP_TILE": group_tile,
        "SLOT_DOTS": slot_dots(launch, bits),
        "ATOMIC": atomic,
    }


def moe_config(
    launch: Launch, bits: int, zp: bool, mul_router: bool, group_tile: bool, atomic: bool
) -> KernelConfig:
    """The gate's configuration of one fused-MoE launch: fp16 rows stored, or (``atomic``)
    fp32 tiles added into zeroed rows, times the router weights with ``mul_router``."""
    tile = f"m{launch.block_m}n{launch.block_n}k{launch.block_k}"
    tile += f"w{launch.num_warps}s{launch.num_stages}"
    return KernelConfig(
        name=f"moe_{tile}_w{bits}{'a' if zp else 's'}{'_rw' if mul_router else ''}"
        f"{'_atomic' if atomic else ''}{'_gt' if group_tile else ''}",
        kernel=f"{KERNELS}:wna16_moe_kernel",
        signature={**_MOE_SIG, "out_ptr": "*fp32" if atomic else "*fp16"},
        constexprs=moe_constexprs(launch, bits, zp, mul_router, group_tile, atomic),
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
        divisible_by_16=_MOE_DIVISIBLE,
    )


#: ``(mul_router, atomic)`` of every launch a fused-MoE step makes with any tile: gate/up
#: stores fp16 rows, or adds fp32 partials when split; down adds each pair's fp32 tile into
#: its token's row, times the router weight or not (vLLM's ``apply_router_weight_on_input``
#: applies it to the input instead).
MOE_OUTPUTS = ((False, False), (False, True), (True, True))

#: Pairs per program of the routing's first launch (:func:`moe_count_kernel`).
ROUTE_COUNT_BLOCK = 256

#: The most local experts the routing takes: its second launch holds every expert's count in
#: each program (a 1024-expert layer: 16 pairs a program against 1024 counts).
MAX_ROUTED_EXPERTS = 1024

#: Count-by-pair elements one program of the routing's second launch compares at once.
_ROUTE_PLACE_ELEMENTS = 8192


def route_place_tile(experts: int) -> tuple[int, int]:
    """``(E_POW2, BLOCK)`` of :func:`moe_place_kernel` for ``experts`` local experts: the
    counts padded to a power of two (at least 16), and as many pairs per program as keep the
    pairs-by-experts comparisons at ``_ROUTE_PLACE_ELEMENTS`` (16 to 128)."""
    if not 1 <= experts <= MAX_ROUTED_EXPERTS:
        raise ValueError(
            f"{experts} local experts: the fused routing takes 1 to {MAX_ROUTED_EXPERTS}"
        )
    e_pow2 = max(16, 1 << (experts - 1).bit_length())
    return e_pow2, max(16, min(128, _ROUTE_PLACE_ELEMENTS // e_pow2))


#: Columns per program of :func:`silu_mul_kernel`.
SILU_BLOCK = 512


def _routing_variants(table: Table) -> Iterator[KernelConfig]:
    """The routing's two launches and the SiLU product between the expert kernels."""
    for ids, has_map in itertools.product(("*i32", "*i64"), (False, True)):
        yield KernelConfig(
            name=f"moe_count_{ids[1:]}{'_map' if has_map else ''}",
            kernel=f"{KERNELS}:moe_count_kernel",
            signature={
                "ids_ptr": ids,
                "map_ptr": "*i32" if has_map else ids,
                "count_ptr": "*i32",
                "rank_ptr": "*i32",
                "local_ptr": "*i32",
                "PAIRS": "i32",
                "EXPERTS": "i32",
            },
            constexprs={"HAS_MAP": has_map, "BLOCK": ROUTE_COUNT_BLOCK},
        )
    experts = 1
    while experts <= MAX_ROUTED_EXPERTS:
        e_pow2, block = route_place_tile(experts)
        for block_m in sorted({table.moe.block_m, table.moe_large.block_m}):
            yield KernelConfig(
                name=f"moe_place_e{e_pow2}_m{block_m}",
                kernel=f"{KERNELS}:moe_place_kernel",
                signature={
                    "count_ptr": "*i32",
                    "rank_ptr": "*i32",
                    "local_ptr": "*i32",
                    "pair_ptr": "*i32",
                    "expert_ptr": "*i32",
                    "PAIRS": "i32",
                    "EXPERTS": "i32",
                    "BLOCKS": "i32",
                },
                constexprs={"BLOCK_M": block_m, "E_POW2": e_pow2, "BLOCK": block},
            )
        experts = e_pow2 + 1
    for h in ("*fp16", "*fp32"):
        yield KernelConfig(
            name=f"silu_mul_{h[1:]}",
            kernel=f"{KERNELS}:silu_mul_kernel",
            signature={
                "h_ptr": h,
                "out_ptr": "*fp16",
                "INTER": "i32",
                "stride_h": "i32",
                "stride_o": "i32",
            },
            constexprs={"BLOCK": SILU_BLOCK},
            divisible_by_16=("INTER", "stride_h", "stride_o"),
        )


def _moe_variants(table: Table) -> Iterator[KernelConfig]:
    """4 and 8 bits, both symmetries, scales per tile or per word row, every output kind."""
    for launch in (table.moe, table.moe_large):
        for bits, zp, gt in itertools.product((4, 8), (False, True), (False, True)):
            for mul_router, atomic in MOE_OUTPUTS:
                yield moe_config(launch, bits, zp, mul_router, gt, atomic)


def _launches(table: Table) -> list[Launch]:
    """The table's compile-distinct launches (``programs_per_sm`` sizes the grid only, so two
    launches that differ in it alone are one kernel build)."""
    seen: list[Launch] = []
    for launch in (
        table.gemv,
        table.wide_gemv[1] if table.wide_gemv else None,
        table.short_gemv[1] if table.short_gemv else None,
        table.small,
        table.decode,
        table.gemm,
        table.dequant,
    ):
        if launch is None:
            continue
        if launch.path == GEMM and table.dequant_from is not None and table.dequant_from <= 17:
            continue
        if launch.path == DEQUANT_MATMUL and table.dequant_from is None:
            continue
        build = replace(launch, programs_per_sm=1)
        if build not in seen:
            seen.append(build)
    return seen


def _variants(table: Table) -> Iterator[KernelConfig]:
    for base in _launches(table):
        for bits in (4, 8):
            launch = base.scaled_for_bits(bits)
            for zp in (False, True):
                tag = f"w{bits}{'a' if zp else 's'}"
                tile = f"m{launch.block_m}n{launch.block_n}k{launch.block_k}"
                if launch.path == SPLITK:
                    # Split (fused reduction) or unsplit, each with and without bias; the dot
                    # tiles also with scales per tile (a layer whose groups hold whole tiles).
                    group_tiles = (False, True) if launch.use_dot else (False,)
                    # Zero points as uint8 where the launch takes them from a layer's
                    # ``zeros8``, and as fp16 where it has none (a bare ``PackedWeights``).
                    zp8s = (False, True) if zp and launch.byte_zeros else (False,)
                    # Masked, and unmasked where the launch has that build (whole tiles).
                    wholes = (False, True) if unmasked_build(launch, bits) else (False,)
                    for use_ws, bias, in_group, zp8, whole in itertools.product(
                        (True, False), (True, False), group_tiles, zp8s, wholes
                    ):
                        yield splitk_config(
                            launch, bits, zp, bias, use_ws, in_group, zp8, whole=whole
                        )
                        if use_ws and launch.atomic:
                            yield splitk_config(
                                launch, bits, zp, bias, use_ws, in_group, zp8, True, whole
                            )
                elif launch.path == GEMM:
                    for bias in (False, True):
                        yield KernelConfig(
                            name=f"gemm_{tile}_{tag}{'_bias' if bias else ''}",
                            kernel=f"{KERNELS}:wna16_gemm_kernel",
                            signature=_GEMM_SIG,
                            constexprs={
                                "BITS": bits,
                                "HAS_ZP": zp,
                                "HAS_BIAS": bias,
                                "BLOCK_M": launch.block_m,
                                "BLOCK_N": launch.block_n,
                                "BLOCK_K": launch.block_k,
                                "GROUP_M": launch.group_m,
                            },
                            num_warps=launch.num_warps,
                            num_stages=launch.num_stages,
                            divisible_by_16=_MODEL_DIVISIBLE,
                        )
                else:
                    yield KernelConfig(
                        name=f"dequant_n{launch.block_n}k{launch.block_k}_{tag}",
                        kernel=f"{KERNELS}:wna16_dequant_kernel",
                        signature=_DEQUANT_SIG,
                        constexprs={
                            "BITS": bits,
                            "HAS_ZP": zp,
                            "BLOCK_N": launch.block_n,
                            "BLOCK_K": launch.block_k,
                        },
                        num_warps=launch.num_warps,
                        num_stages=launch.num_stages,
                        divisible_by_16=_DEQUANT_DIVISIBLE,
                    )


def kernel_configs(device: Device) -> list[KernelConfig]:
    """Every kernel configuration :func:`choose` can launch on ``device``."""
    table = table_for(device.capability)
    return [*_variants(table), *_moe_variants(table), *_routing_variants(table)]
