"""Which kernel and tile each call uses, per device, and the list the SM70 gate checks.

Kept free of torch and triton: the plugin's ``volta_kernel_configs`` hook returns
:func:`kernel_configs`, and the launcher (:mod:`volta_ct_wna16.ops`) asks :func:`choose` for the
launch of each call, so the gate checks exactly the configurations that run.

Two tables. On SM70 ``tl.dot`` runs on the FMA units (FACTS.md 2), so decode tiles are modest
(no spills) and one to four tokens use the plain-FMA GEMV rather than a dot padded to 16 rows;
above 32 tokens the weights are dequantized once and the product goes to cuBLAS, which still
has the V100's tensor cores (125 TFLOP/s against Triton's 15.7). On SM80 and newer (the H100
the kernels are measured on) ``tl.dot`` uses tensor cores, so decode tiles are wider.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace

from volta_core.device import Device
from volta_core.types import KernelConfig

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
    # than on the H100 where they gained (run 15, below); not measured on SM70.
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
# 2-16 tokens: 256 outputs at 2 programs per SM, from run 8's sweep (after the in-place
# dequantization): M=16 5120x5120 26.3 -> 19.7 us, 27648x5120 57.7 -> 52.2, 5120x27648
# 63.5 -> 56.2; 7168x5120 was 8-11% slower (M=16 22.4 -> 24.3 us). Run 9 kept it: the
# 128-output tile with a reduction fan-in of 4 at 4 per SM was 4-7% faster at M=4
# symmetric, but in run 9's benchmark 12-21% slower at M=4 asymmetric (5120x27648 68.7 us
# against 56.9 in run 8), and 12-33% slower at M=16.
# Run 12 (`results/run12/`), after the tile's activations and zero points became pipelined
# copies and its weights subnormals scaled after the dot: kept. At M=16, 3 or 4 programs
# per SM, 4 stages, 8 warps and 128- or 512-output tiles were slower on the large layers
# (27648x5120 symmetric 46.6 us here, 49.2-66.0 for the others).
# Run 15 (`results/run15/`): the splits add their partials atomically (`Launch.atomic`).
# Against the tree in one call (call 8, `probe_reduce.log`, best of two alternating runs,
# symmetric) at 2-16 tokens: 5120x5120 11.6-14.2 against 14.6-18.4 us, 7168x5120 15.8-18.5
# against 18.7-22.4, 27648x5120 37.5-43.6 against 39.4-46.2, 5120x27648 37.6-44.4 against
# 41.0-48.8; at 32 tokens 22.4 / 29.7, 27.5 / 32.5, 71.1 / 76.9, 79.5 / 83.0. The tail after
# the last split is one read of the summed tile instead of the tree's round trips, and no
# partial tiles are stored.
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
    # The 1-token tile. Runs 3-5 (H100) chose 256 outputs x 1 warp at 8 programs per SM
    # below 8192 outputs and 512 x 2 warps from there on. Run 6's sweep (on an H200: the
    # device lent that call was one), after the GEMV loop went from 5.2 to 3.9-4.0 SASS
    # instructions per weight: the 512 x 2-warp tile (its activations now one cp.async tile
    # per iteration) at 4 programs per SM was best or within 0.7 us on every narrow shape
    # (5120x5120 11.7 us against 13.0 for the old narrow tile, 7168x5120 12.7 against 14.5,
    # 5120x27648 30.6 against 38.3), and at 8 per SM best at 27648x5120 (32.4 us, 36.5 at 4
    # per SM). So one tile; the output count picks the programs per SM. Run 9's sweep (H100,
    # with the reduction tree, fan-in 4-16 at 4-12 programs per SM) kept the tile: best or
    # within 1.1 us on every shape and both symmetries. A follow-up on 27648x5120 (5 to 9 per
    # SM, twice each): 5 per SM took 33.9 us symmetric and 34.1-34.5 asymmetric, 6 34.1-34.8,
    # 7 34.6-35.4, 8 (shipped until then) 36.8-38.4, 9 37.2-38.5. At 8 the grid (1080
    # programs) is larger than the 1056 the SMs hold at once (8 each at 128 registers x 64
    # threads), so 24 programs ran after the rest. Fan-in 16 on the wide tile (its 13 splits
    # then sum in one level; 144 registers, 7 per SM): 33.4-33.8 us against 33.8-34.4 at 8,
    # both symmetries, three repetitions (`results/run9/wide_fan_in.log`). Run 11 (H100,
    # `results/run11/`): the wide tile on 4 warps instead of 2 (64 and 80 registers, the same
    # grid) took 27648x5120 from 33.0-33.7 to 31.7-32.3 us (3.18-3.21x fp16). One SM then
    # holds 20 warps instead of 10 to hide each word's load-to-FMA chain. On the narrow
    # shapes, 4 warps gained on a short input (5120x5120 11.9 -> 10.8 us) but lost on a long
    # one (5120x27648 asymmetric 32.4 -> 33.5). The narrow tile stays on 2 warps.
    # Run 15 (`results/run15/`): asymmetric zero points as uint8 (one byte a group and output
    # instead of two) took this tile's layers from 34.0 to 33.1 us (5120x27648), 12.7 to 12.2
    # (5120x5120) and 14.3 to 13.7 (7168x5120); on the wide tile below they cost 0.2-0.8 us
    # (27648x5120 32.4 -> 32.6-33.2), so it keeps fp16 ones.
    # Run 16 (`results/run16/`): both GEMV tiles add their splits atomically, as the dot tile
    # does since run 15. Call 1, against the tree in the same call (best of two alternating
    # runs, symmetric / asymmetric): 5120x5120 11.7 / 12.1 -> 10.9 / 10.8 us, 7168x5120
    # 12.8 / 13.8 -> 12.2 / 12.0, 5120x27648 32.1 / 32.7 -> 30.5 / 30.5, and on the wide tile
    # 27648x5120 31.4 / 31.9 -> 29.6 / 31.7.
    gemv=_SM90_GEMV,
    wide_gemv=(
        8192,
        replace(_SM90_GEMV, num_warps=4, programs_per_sm=5, reduce_unroll=16, byte_zeros=False),
    ),
    # Run 16 call 7 (`results/run16/call7/probe_tiles.log`): on the narrow layers with 5120
    # inputs the GEMV on 4 warps at 6 programs per SM took 5120x5120 9.9 / 10.0 us (symmetric
    # / asymmetric) against 10.8 / 10.8 for the table's 2 warps at 4, and 7168x5120 11.6 /
    # 11.7 against 12.2 / 12.2; on 5120x27648 29.1 / 31.3 against 29.7 / 29.3 (run 11 saw the
    # same: 4 warps gained on a short input and lost on a long one). Between 5120 and 27648
    # inputs it was not measured.
    short_gemv=(8192, replace(_SM90_GEMV, num_warps=4, programs_per_sm=6)),
    small=_SM90_DOT,
    decode=_SM90_DOT,
    # Up to 32 tokens (two 16-row blocks per output tile), from run 9's follow-up
    # (`results/run9/decode_tile_m32_m64_m128.log`): at M=32 this tile against the GEMM
    # 5120x5120 29.6 against 46.1 us, 7168x5120 37.6 / 45.4, 27648x5120 100.2 / 107.1,
    # 5120x27648 98.3 / 243.1 (asymmetric 128.8 / 246.6). At 64 it won on 5120x27648 only
    # (173.0 / 245.5) and lost on 7168x5120 and 27648x5120 (58-62 / 45.5, and 107.5 for the
    # GEMM on 27648x5120).
    decode_max_m=32,
    # 33-191 tokens: a 64x64x64 dequantized tile with split-K (the split-K kernel's
    # interleaved-dot path and its reduction tree), from run 9's follow-up
    # (`results/run9/splitk_gemm_tiles.log`). The GEMM kernel has no split-K, so a layer with
    # few output tiles and a long input ran on few SMs: 5120x27648 at 64 tokens is 80 tiles of
    # 432 steps each, 249.1 us against 121.1 here at 2 programs per SM (5120x5120 45.6 -> 29.1,
    # 7168x5120 45.7 -> 36.1, 27648x5120 108.4 -> 109.5). At 128 tokens this tile at 2 per SM
    # against dequantize-then-cuBLAS: 5120x5120 42.5 / 52.1, 5120x27648 186.5 / 236.0
    # (asymmetric 206.1 / 235.9), 27648x5120 203.6 / 230.1, 7168x5120 67.2 / 64.3; at 256 the
    # dequantization won everywhere (56.6 / 80.3 on 5120x5120, 248.5 / 358.3 on 5120x27648).
    # 192, between the two, was not measured.
    # Run 16 call 4 (`results/run16/call4/probe_counts.log`) timed every split count at 64
    # tokens. The programs-per-SM rule's counts (4, 1, 4, 3 on 5120x5120, 27648x5120,
    # 5120x27648, 7168x5120) took 29.0, 107.2, 123.6 and 36.1 us symmetric (asymmetric 30.5,
    # 125.3, 130.2, 37.8); the balanced counts with 3 resident and a fixed cost of 3 steps
    # (fitted to those timings: 8, 3, 8, 3) took 27.5, 101.8, 98.3, 36.1 (28.0, 105.6, 105.0,
    # 37.8), within 1.2 us of the fastest count on all eight.
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
    # Run 13 (`results/run13/call2/probe_moe.log`, Qwen3-30B-A3B layer, both symmetries): the
    # 128-output decode tile took M=1 21.3-22.3 us against 23.3-24.1 for 64 outputs (8 per
    # SM: 23.0-24.2), M=16 110.6-122.0 against 132.7-138.1; 32 outputs, 256 inputs per step,
    # 2 or 8 warps and 4 stages were slower. At 1024 tokens the 64x128x64 tile took 540-634
    # us, 128x128x64 on 8 warps 517-625, 64-row tiles of 128 inputs per step 1308-1742.
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
    Run 16's sweep of every split count on the H100 (``results/run16/``) ranked the counts
    of the 2-16-token tile this way: the wave edge (280 programs, where 264 run at once) cost
    2.7-4.4 us on 7168x5120 and 5120x27648. The search walks every step count (about 20-40
    us in Python for a 27648-input layer), so its answers are cached: the launcher asks once
    per layer shape and token count, not on every call.
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
#: as well as unspecialized (:func:`volta_core.kernels.gate.gate_variants`).
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
