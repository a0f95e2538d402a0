"""Which kernel runs a call on a device, every launch the plugin ships, and what a launch costs.

The one home of those answers (issue 46), torch- and triton-free, read by everything that needs
one:

* :func:`choose`: for a call (:class:`AttentionCall`) on a device (capability, SM count), *the*
  launch, a :class:`volta_core.kernel_api.Choice`. On a V100 the tensor-core CUDA decode and
  prefill (``cuda/*.cu``, ``mma.m8n8k4``) where :func:`takes_cuda_decode` and
  :func:`takes_cuda_prefill` take them, carrying the Triton launch as ``fallback``; the Triton
  launch of the device family's table (:func:`table_for`) otherwise, on the FMA units below
  SM80 and on the tensor cores from there (:func:`triton_unit`).
  :func:`volta_attn_v100.ops.paged_attention` runs the CUDA launch only where its build loads
  and the tensors allow its loads, else the fallback;
* :func:`kernel_configs` and :func:`cuda_kernel_configs`: every build the launchers can make on a
  device family, what the compile gates compile (the plugin's ``volta_kernel_configs`` and
  ``volta_cuda_kernel_configs``);
* :func:`choice_cost`: what a choice's launch costs (:class:`volta_core.kernel_api.KernelCost`);
* :func:`attention_paths` and :func:`stage_cost`: the plan's kernel per stage of a layer and a
  workload's cost there (``volta_kernel_paths``, ``volta_kernel_cost``), from :func:`choose`, so
  what the plan prints and prices is what the launcher runs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from volta_attn_v100.gate_configs import (
    cuda_decode_config,
    cuda_prefill_config,
    decode_config,
    prefill_config,
)
from volta_attn_v100.launch import (
    GATE_PAGE_SIZE,
    CudaDecodeLaunch,
    DecodeBuild,
    DecodeLaunch,
    Launch,
    PrefillLaunch,
    ahead_tiles,
    cuda_decode_launch,
    cuda_prefill_launch,
    decode_block_m,
    decode_combine,
    decode_launch,
    decode_tiles,
    fp16_partials,
    prefill_build,
    prefill_launch,
    prefill_tile_choices,
    takes_ahead,
    takes_one_stage_tail,
    takes_wide_combine,
)
from volta_attn_v100.limits import (
    E4M3_MIN_CAPABILITY,
    HEAD_SIZES,
    MAX_DECODE_QUERY_LEN,
    MAX_SPLITS,
    fp8_decode,
    head_pad,
)
from volta_attn_v100.tables import (
    CUDA_DECODE_CAPABILITY,
    CUDA_DECODE_KV_DTYPES,
    CUDA_DECODE_MAX_ROW_CHUNKS,
    CUDA_DECODE_ROWS,
    CUDA_PREFILL_CAPABILITY,
    CUDA_PREFILL_KV_DTYPES,
    SM70,
    SM70_CUDA_DECODE,
    SM70_CUDA_PREFILL,
    SM80,
    LaunchTable,
)
from volta_core import (
    AttentionLayer,
    CudaKernelConfig,
    KernelConfig,
    KernelPath,
    canonical_kv_dtype,
)
from volta_core.kernel_api import (
    Choice,
    KernelCost,
    LaunchCost,
    StageCost,
    Unit,
    Workload,
    kernel_paths,
    stage_of,
    stage_ranges,
    token_stage,
)

#: The CUDA kernels on Volta's tensor cores (``cuda/prefill.cu``, ``cuda/decode.cu``), as plans
#: name them.
TENSOR_CORES = "tensor cores (CUDA, mma.m8n8k4)"
#: The Triton kernels (``kernels/``).
TRITON = "Triton"

#: The first compute capability of the SM80 family: ``tl.dot`` runs on the tensor cores there
#: (on the FMA units below it, triton-lang/triton#5066), and its launches take the SM80 table.
SM80_FAMILY = (8, 0)

#: SMs a plan assumes where it names no GPU, by compute capability (a plan's device has only a
#: capability): the V100 SXM2's 80, the A100's 108, the H100 SXM's 132; a V100's elsewhere.
PLAN_SM_COUNTS: dict[tuple[int, int], int] = {(7, 0): 80, (8, 0): 108, (9, 0): 132}


def plan_sm_count(capability: tuple[int, int]) -> int:
    """The SM count a plan prices a device of ``capability`` at (:data:`PLAN_SM_COUNTS`)."""
    return PLAN_SM_COUNTS.get(capability, PLAN_SM_COUNTS[CUDA_DECODE_CAPABILITY])


def table_for(capability: tuple[int, int]) -> LaunchTable:
    """SM70 tiles below SM80 (FMA ``tl.dot`` with Triton 3.3+), SM80 tiles from there."""
    return SM70 if capability < SM80_FAMILY else SM80


def triton_unit(capability: tuple[int, int]) -> Unit:
    """Where the Triton kernels' products run: the FMA units below SM80, tensor cores from it."""
    return Unit.FMA if capability < SM80_FAMILY else Unit.TENSOR_CORES


def takes_cuda_prefill(capability: tuple[int, int], head_size: int, kv_cache_dtype: str) -> bool:
    """Whether a prefill of this head size and KV dtype runs on the SM70 tensor cores (the
    CUDA prefill) on a device of ``capability``: on a V100, for every head size the table
    lists and fp16 or e5m2 KV, since its products there take an eighth of the FMA path's time
    (125 against 15.7 TFLOP/s, V100 whitepaper). The launcher also needs the build to load
    (NVRTC present, the compile passing); otherwise the Triton kernel serves."""
    return (
        capability == CUDA_PREFILL_CAPABILITY
        and head_size in SM70_CUDA_PREFILL
        and kv_cache_dtype in CUDA_PREFILL_KV_DTYPES
    )


def takes_cuda_decode(
    capability: tuple[int, int], head_size: int, kv_cache_dtype: str, group: int, q_len_max: int
) -> bool:
    """Whether a decode of this head size, KV dtype, query group (query heads per KV head) and
    longest query (1..8 tokens, MTP) runs on the SM70 tensor cores (the CUDA decode) on a device
    of ``capability``: on a V100, for the table's head sizes, fp16 or e5m2 KV, groups up to 8 and
    at most :data:`~volta_attn_v100.tables.CUDA_DECODE_MAX_ROW_CHUNKS` chunks of 8 rows. There
    its products pad the group to 8 rows on HMMA instead of 16 on the FMA units, so the SM70
    estimate is bound by the bytes (benchmarks/bench.py). The launcher also needs the build to
    load (NVRTC present, the compile passing) and a cache that allows 16-byte loads; otherwise
    the Triton kernel serves."""
    rows = max(q_len_max, 1) * group
    return (
        capability == CUDA_DECODE_CAPABILITY
        and head_size in SM70_CUDA_DECODE
        and kv_cache_dtype in CUDA_DECODE_KV_DTYPES
        and 1 <= group <= 8
        and -(-rows // CUDA_DECODE_ROWS) <= CUDA_DECODE_MAX_ROW_CHUNKS
    )


# -- the choice of a call -------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionCall:
    """One call of the attention launcher, as far as its launch depends on it: the layer's
    shapes and KV dtype (canonical: ``float16``, ``fp8_e5m2``, ``fp8_e4m3``), the batch
    (sequences, query tokens in all, the longest query and the longest sequence), the cache's
    span in elements and page size, and what the caller forces: decode partitions
    (``num_splits``) and the kernel (``path``: ``"decode"`` or ``"prefill"``; None picks by
    query length, decode up to :data:`~volta_attn_v100.limits.MAX_DECODE_QUERY_LEN`)."""

    head_size: int
    num_heads: int
    num_kv_heads: int
    kv_dtype: str
    num_seqs: int
    num_tokens: int
    max_query_len: int
    max_seq_len: int
    cache_span: int = 0
    page_size: int = GATE_PAGE_SIZE
    num_splits: int | None = None
    path: str | None = None

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.num_heads // self.num_kv_heads

    @property
    def decode(self) -> bool:
        """Whether the call is a decode (the split-KV kernel) rather than a prefill."""
        if self.path is not None:
            return self.path == "decode"
        return self.max_query_len <= MAX_DECODE_QUERY_LEN


def choose(
    call: AttentionCall,
    capability: tuple[int, int],
    num_sms: int,
    table: LaunchTable | None = None,
) -> Choice[Launch]:
    """The launch of ``call`` on a device of ``capability`` with ``num_sms`` SMs: the CUDA
    decode or prefill where :func:`takes_cuda_decode` or :func:`takes_cuda_prefill` takes it
    (the tensor cores, needing NVRTC, the Triton launch as its fallback with the same
    partitions), else the Triton launch of ``table`` (default: the device family's,
    :func:`table_for`) on :func:`triton_unit`."""
    table = table if table is not None else table_for(capability)
    unit = triton_unit(capability)
    if call.decode:
        decode = decode_launch(
            table,
            capability,
            num_sms,
            kv_dtype=call.kv_dtype,
            head_size=call.head_size,
            num_heads=call.num_heads,
            num_kv_heads=call.num_kv_heads,
            num_seqs=call.num_seqs,
            max_query_len=call.max_query_len,
            max_seq_len=call.max_seq_len,
            num_splits=call.num_splits,
            cache_span=call.cache_span,
            page_size=call.page_size,
        )
        triton: Choice[Launch] = Choice(TRITON, unit, decode)
        if not takes_cuda_decode(
            capability, call.head_size, call.kv_dtype, call.group, call.max_query_len
        ):
            return triton
        cuda: Launch = cuda_decode_launch(
            kv_dtype=call.kv_dtype,
            head_size=call.head_size,
            num_heads=call.num_heads,
            num_kv_heads=call.num_kv_heads,
            num_seqs=call.num_seqs,
            max_query_len=call.max_query_len,
            num_splits=decode.num_splits,
        )
        return Choice(TENSOR_CORES, Unit.TENSOR_CORES, cuda, fallback=triton)
    prefill = prefill_launch(
        table,
        capability,
        kv_dtype=call.kv_dtype,
        head_size=call.head_size,
        num_heads=call.num_heads,
        num_kv_heads=call.num_kv_heads,
        num_seqs=call.num_seqs,
        num_tokens=call.num_tokens,
        max_query_len=call.max_query_len,
        cache_span=call.cache_span,
        page_size=call.page_size,
    )
    triton = Choice(TRITON, unit, prefill)
    if not takes_cuda_prefill(capability, call.head_size, call.kv_dtype):
        return triton
    cuda = cuda_prefill_launch(
        kv_dtype=call.kv_dtype,
        head_size=call.head_size,
        num_heads=call.num_heads,
        num_kv_heads=call.num_kv_heads,
        num_seqs=call.num_seqs,
        num_tokens=call.num_tokens,
    )
    return Choice(TENSOR_CORES, Unit.TENSOR_CORES, cuda, fallback=triton)


# -- the cost of a launch -------------------------------------------------------------------------


def _prefill_keys(call: AttentionCall, block_q: int, block_n: int) -> int:
    """Keys one sequence's query blocks of ``block_q`` tokens walk, summed: each its causal
    prefix up to its last token, in whole tiles of ``block_n`` keys."""
    total = call.max_seq_len
    prefix = total - call.max_query_len
    blocks = -(-call.max_query_len // block_q)
    return sum(
        -(-min(prefix + (b + 1) * block_q, total) // block_n) * block_n for b in range(blocks)
    )


def launch_cost(launch: Launch, call: AttentionCall, unit: Unit) -> LaunchCost:
    """The bytes and FLOPs of ``launch`` for ``call``, every sequence taken at the call's longest
    query and sequence (exact for a :class:`~volta_core.kernel_api.Workload`).

    Bytes: the KV cache once (``sequences x keys x 2 x head_size x KV heads x`` 2 for fp16, 1
    for fp8), the query read and the output written (fp16, ``tokens x heads x head_size x 2``
    each) and, for a split decode, the partials written and read back once (``tokens x heads x
    num_splits x (head x partial bytes + 8)``: the Triton decode's ``HEAD_PAD`` columns in fp16
    or fp32 as its build stores them, the CUDA decode's ``head_size`` in fp32, and the running
    max and sum in fp32).

    FLOPs (Q.K^T and P.V, 2 each a multiply-add): ``4 x rows x head_size x keys`` with rows as
    the kernel pads them, per sequence and KV head: the CUDA decode's row chunks of 8
    (``m8n8k4``), the Triton decode's ``BLOCK_M`` per head chunk; a decode's keys are the
    sequence's. A prefill is causal: each block of query tokens (``BLOCK_M`` rows, the CUDA
    tile's or the Triton tile's) walks the keys up to its last token, in whole tiles of
    ``BLOCK_N`` (about half the keys of each query for a long prefill)."""
    kv_bytes = 2 if call.kv_dtype == "float16" else 1
    keys = call.max_seq_len
    io = call.num_tokens * call.num_heads * call.head_size * 2
    kv = call.num_seqs * keys * 2 * call.head_size * call.num_kv_heads * kv_bytes
    partials = 0
    if isinstance(launch, DecodeLaunch | CudaDecodeLaunch):
        if isinstance(launch, DecodeLaunch):
            build = launch.build
            columns = head_pad(build.head_size) * (2 if build.partials_f16 else 4)
            rows = call.num_kv_heads * launch.head_chunks * build.tiles.block_m
        else:
            columns = launch.head_size * 4
            rows = call.num_kv_heads * launch.row_chunks * CUDA_DECODE_ROWS
        if launch.num_splits > 1:
            partials = call.num_tokens * call.num_heads * launch.num_splits * (columns + 8)
        flops = 4 * call.num_seqs * rows * call.head_size * keys
    else:
        if isinstance(launch, PrefillLaunch):
            block_m, block_n = launch.build.tiles.block_m, launch.build.tiles.block_n
        else:
            block_m, block_n = launch.tile.block_m, launch.tile.block_n
        walked = _prefill_keys(call, block_m // launch.heads_per_prog, block_n)
        rows = call.num_kv_heads * launch.head_chunks * block_m
        flops = 4 * call.num_seqs * rows * call.head_size * walked
    return LaunchCost(
        bytes_read=kv + io + partials, bytes_written=io + partials, flops=flops, unit=unit
    )


def choice_cost(choice: Choice[Launch], call: AttentionCall) -> KernelCost:
    """What ``choice`` (of :func:`choose` for ``call``) costs: its one launch
    (:func:`launch_cost`; the split decode combines its partitions in the same launch)."""
    return KernelCost(choice.kernel, (launch_cost(choice.launch, call, choice.unit),))


# -- the plan: kernel paths and stage costs -------------------------------------------------------


def layer_call(layer: AttentionLayer, work: Workload) -> AttentionCall:
    """The call a workload makes on ``layer``: ``work.sequences`` sequences of
    ``work.query_len`` query tokens, reading ``work.context`` keys each (at least their own
    query tokens), a decode up to :data:`~volta_attn_v100.limits.MAX_DECODE_QUERY_LEN` query
    tokens and a prefill past it."""
    return AttentionCall(
        head_size=layer.head_size,
        num_heads=layer.num_heads,
        num_kv_heads=max(1, layer.num_kv_heads),
        kv_dtype=canonical_kv_dtype(layer.kv_cache_dtype, layer.dtype),
        num_seqs=work.sequences,
        num_tokens=work.tokens,
        max_query_len=work.query_len,
        max_seq_len=max(work.context, work.query_len),
    )


def _decode_stage(first: int, last: int | None) -> str:
    return "decode, " + token_stage(first, last, "query token")


def _decode_runs(
    layer: AttentionLayer, capability: tuple[int, int]
) -> list[tuple[int, int | None, Choice[Launch]]]:
    """Decode's query lengths (1 to :data:`~volta_attn_v100.limits.MAX_DECODE_QUERY_LEN`)
    grouped into runs with the same kernels."""
    sms = plan_sm_count(capability)
    return stage_ranges(
        range(1, MAX_DECODE_QUERY_LEN + 1),
        lambda q_len: choose(layer_call(layer, Workload(1, q_len)), capability, sms),
    )


def attention_paths(layer: AttentionLayer, capability: tuple[int, int]) -> list[KernelPath]:
    """The prefill's kernel (stage ``"prefill"``) and the decode's per range of query lengths
    (``"decode, 1-4 query tokens"``...), for ``layer`` on a device of ``capability``."""
    prefill = choose(
        layer_call(layer, Workload(1, MAX_DECODE_QUERY_LEN + 1)),
        capability,
        plan_sm_count(capability),
    )
    return [prefill.path("prefill"), *kernel_paths(_decode_runs(layer, capability), _decode_stage)]


def stage_cost(
    layer: AttentionLayer, capability: tuple[int, int], sm_count: int, work: Workload
) -> StageCost:
    """What ``work`` costs on ``layer`` (:func:`layer_call`): the stage of
    :func:`attention_paths` it falls in, the chosen kernel's cost and, where that kernel needs
    NVRTC, its Triton fallback's."""
    call = layer_call(layer, work)
    choice = choose(call, capability, sm_count)
    if call.decode:
        runs = _decode_runs(layer, capability)
        first, last, _ = runs[stage_of(work.query_len, runs)]
        stage = _decode_stage(first, last)
    else:
        stage = "prefill"
    fallback = choice_cost(choice.fallback, call) if choice.fallback is not None else None
    return StageCost(stage, choice_cost(choice, call), fallback)


# -- every launch shipped: what the compile gates compile -----------------------------------------


def decode_shapes(
    table: LaunchTable, head_size: int, kv_fp8: bool, kv_per_prog: int = 1
) -> list[tuple[int, int, int]]:
    """Every ``(BLOCK_M, COMBINE_M, SPLIT_CHUNK)`` a decode launch of this head size and KV
    dtype can take, over every query-length and head-group pad, wide combine or not; with
    ``kv_per_prog`` over 1, those of launches walking that many KV heads a program."""
    policy = table.policy(kv_fp8)
    pairing = policy.pairing
    if kv_per_prog > 1 and (pairing is None or head_pad(head_size) > pairing.max_pad):
        return []
    # The wide combine as the smallest grid split the most takes it, and as a grid too large
    # for any GPU does not; launches walking several KV heads fill the GPU unsplit.
    grids = ((1, MAX_SPLITS), (1 << 30, 1)) if kv_per_prog == 1 else ((1 << 30, 1),)
    wides = {takes_wide_combine(policy, head_size, n, 1, s) for n, s in grids}
    found: list[tuple[int, int, int]] = []
    q_pads = [1 << i for i in range(MAX_DECODE_QUERY_LEN.bit_length())]
    for q_pad, wide in itertools.product(q_pads, sorted(wides)):
        wide_floats = policy.wide_combine.floats if wide and policy.wide_combine else None
        for group_pad in (1 << i for i in range(8)):
            block_m = decode_block_m(table, head_size, q_pad, group_pad)
            if q_pad * group_pad * kv_per_prog > block_m:
                continue
            rows = group_pad * kv_per_prog
            combine = decode_combine(table, block_m, q_pad, rows, head_size, wide_floats)
            if (block_m, *combine) not in found:
                found.append((block_m, *combine))
    return sorted(found)


def _decode_configs(
    table: LaunchTable, capability: tuple[int, int], head_size: int, kv_dtype: str
) -> list[KernelConfig]:
    """Every decode build of a head size and KV dtype: each launch shape with and without
    scores ahead and each masked-tile loop the table can pick, then those walking several KV
    heads a program (always with scores ahead); then each of their tiles unsplit
    (:meth:`~volta_attn_v100.launch.DecodeBuild.unsplit`, suffix ``_unsplit``)."""
    fp8 = kv_dtype != "float16"
    policy = table.policy(fp8)
    # The choice for the shortest program and for the longest; unsplit, and split short.
    aheads = sorted({takes_ahead(policy, keys) for keys in (1, 1 << 30)})
    tails = sorted({takes_one_stage_tail(table, splits, 1) for splits in (1, 2)})
    unsplit_tails = {takes_one_stage_tail(table, 1, keys) for keys in (1, 1 << 30)}

    def build(
        block_m: int, combine: tuple[int, int], ahead: bool, per_prog: int, tail: bool
    ) -> DecodeBuild:
        tiles = decode_tiles(table, head_size, block_m, fp8)
        return DecodeBuild(
            head_size=head_size,
            tiles=ahead_tiles(table, tiles, head_size) if ahead else tiles,
            kv_fp8=fp8,
            fp8_decode=fp8_decode(kv_dtype, capability),
            halves=policy.halves,
            partials_f16=fp16_partials(table, combine[0]),
            combine_m=combine[0],
            split_chunk=combine[1],
            ahead=ahead,
            kv_per_prog=per_prog,
            one_stage_tail=tail,
        )

    configs: list[KernelConfig] = []
    unsplit: dict[DecodeBuild, str] = {}
    for (block_m, rows, chunk), ahead, tail in itertools.product(
        decode_shapes(table, head_size, fp8), aheads, tails
    ):
        name = (
            f"decode_d{head_size}_m{block_m}_c{rows}x{chunk}_{kv_dtype}"
            f"{'_ahead' if ahead else ''}{'_tail1' if tail else ''}"
        )
        b = build(block_m, (rows, chunk), ahead, 1, tail)
        configs.append(decode_config(name, b, kv_dtype, table))
        if tail in unsplit_tails:
            unsplit.setdefault(b.unsplit(), name.replace(f"_c{rows}x{chunk}", "") + "_unsplit")
    per_progs = policy.pairing.kv_heads if policy.pairing else ()
    for per_prog, tail in itertools.product(per_progs, tails):
        for block_m, rows, chunk in decode_shapes(table, head_size, fp8, per_prog):
            name = (
                f"decode_d{head_size}_m{block_m}_c{rows}x{chunk}_{kv_dtype}"
                f"_kv{per_prog}{'_tail1' if tail else ''}"
            )
            b = build(block_m, (rows, chunk), True, per_prog, tail)
            configs.append(decode_config(name, b, kv_dtype, table))
            if tail in unsplit_tails:
                unsplit.setdefault(b.unsplit(), name.replace(f"_c{rows}x{chunk}", "") + "_unsplit")
    configs += [decode_config(name, b, kv_dtype, table) for b, name in unsplit.items()]
    return configs


def _prefill_configs(
    table: LaunchTable, capability: tuple[int, int], head_size: int, kv_dtype: str
) -> list[KernelConfig]:
    """Every prefill build of a head size and KV dtype, named by its keys per tile where the
    tile follows the query length."""
    choices = prefill_tile_choices(table.prefill_tiles[head_pad(head_size)])
    configs: list[KernelConfig] = []
    for tiles in choices:
        keys = f"_n{tiles.block_n}" if len(choices) > 1 else ""
        build = prefill_build(table, capability, kv_dtype, head_size, tiles)
        name = f"prefill_d{head_size}{keys}_{kv_dtype}"
        configs.append(prefill_config(name, build, kv_dtype, table))
    return configs


def _offsets_64(config: KernelConfig) -> KernelConfig:
    """An attention configuration's build for a cache too large for 32-bit row offsets, named
    with ``_offsets64``."""
    constexprs = {**config.constexprs, "CACHE_OFFSETS_32": False}
    return replace(config, name=f"{config.name}_offsets64", constexprs=constexprs)


def _e4m3_builds(configs: list[KernelConfig], capability: tuple[int, int]) -> list[KernelConfig]:
    """The e4m3 twins listed beside the e5m2 builds (SM89+): every prefill build and each head
    size's first decode build. A twin differs only in the instruction that converts a code
    (``FP8_DECODE``); listing every decode twin would double CI's sm_90 fp8 compiles, and the
    H100 GPU tests compile and run the e4m3 decode in every form the launcher picks."""
    twins: list[KernelConfig] = []
    decode_heads: set[int] = set()
    for config in configs:
        if "_fp8_e5m2" not in config.name:
            continue
        head_size = int(config.constexprs["HEAD_SIZE"])
        if config.name.startswith("decode"):
            if head_size in decode_heads:
                continue
            decode_heads.add(head_size)
        constexprs = {**config.constexprs, "FP8_DECODE": fp8_decode("fp8_e4m3", capability)}
        name = config.name.replace("_fp8_e5m2", "_fp8_e4m3")
        twins.append(replace(config, name=name, constexprs=constexprs))
    return twins


def kernel_configs(capability: tuple[int, int]) -> list[KernelConfig]:
    """Every configuration the launchers would use on a device of this capability, each with
    32-bit cache offsets; from SM89 the e4m3 twins (:func:`_e4m3_builds`); on SM70 (what the
    gate must see exactly) each again with 64-bit offsets. SM80+ lists leave the 64-bit builds
    out: they differ only in one integer's width, doubled CI's sm_90 compile check, and the
    H100 GPU tests compile and run them."""
    table = table_for(capability)
    configs: list[KernelConfig] = []
    for head_size in HEAD_SIZES:
        for kv_dtype in ("float16", "fp8_e5m2"):
            configs += _decode_configs(table, capability, head_size, kv_dtype)
            configs += _prefill_configs(table, capability, head_size, kv_dtype)
    if capability >= E4M3_MIN_CAPABILITY:
        configs += _e4m3_builds(configs, capability)
    if not table.gate_64_bit_offsets:
        return configs
    return [*configs, *(_offsets_64(c) for c in configs if c.constexprs.get("CACHE_OFFSETS_32"))]


def cuda_kernel_configs(capability: tuple[int, int]) -> list[CudaKernelConfig]:
    """Every CUDA-source build the launchers can run on a device of ``capability``: on a V100
    the prefill's for every head size of :data:`~volta_attn_v100.tables.SM70_CUDA_PREFILL` and
    the decode's for every head size of :data:`~volta_attn_v100.tables.SM70_CUDA_DECODE`, each
    for fp16 and e5m2 KV; none elsewhere."""
    prefill = [
        cuda_prefill_config(head_size, kv_dtype)
        for head_size in SM70_CUDA_PREFILL
        for kv_dtype in CUDA_PREFILL_KV_DTYPES
        if takes_cuda_prefill(capability, head_size, kv_dtype)
    ]
    decode = [
        cuda_decode_config(head_size, kv_dtype)
        for head_size in SM70_CUDA_DECODE
        for kv_dtype in CUDA_DECODE_KV_DTYPES
        if takes_cuda_decode(capability, head_size, kv_dtype, 1, 1)
    ]
    return [*prefill, *decode]
