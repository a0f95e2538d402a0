"""The experts' arithmetic, without vLLM: ``sum_k w_k * down(SiLU(gate(x)) * up(x))``.

Each expert is two linear layers in the plugin's layout (``gate`` and ``up`` stacked as one
``[2 * inter, hidden]`` weight, ``down`` ``[hidden, inter]``). On CUDA (and under the Triton
interpreter) up to 16 tokens run through the decode kernels (:func:`volta_ct_wna16.ops.moe_decode`,
reading the router's ids directly), more through the fused kernel over routed blocks
(:func:`volta_ct_wna16.ops.moe_linear`, pairs grouped by :mod:`volta_ct_wna16.routing`); on
CPU each expert runs its tokens through the dense layers' reference op. Bad routing or experts
are refused before any launch.
:mod:`volta_ct_wna16.moe` wraps this for vLLM; kept apart so the GPU tests run it on a machine
without vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from volta_core.kernel_api import device_facts, interpreting
from volta_ct_wna16 import ops
from volta_ct_wna16.dispatch import ExpertShape, expert_choice, moe_decode_choice
from volta_ct_wna16.layout import PackedWeights
from volta_ct_wna16.routing import route
from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.tables import Launch, MoEDecode, MoEFused


@dataclass
class ExpertWeights:
    """Every local expert's gate/up (``w13``, ``[2 * inter, hidden]``) and down (``w2``,
    ``[hidden, inter]``) weights: each a :class:`~volta_ct_wna16.layout.PackedWeights` whose
    tensors carry the expert first (``qweight[e]``, ``scales[e]``, ``zeros[e]`` are expert
    ``e``'s, in the layout :func:`~volta_ct_wna16.layout.prepare` makes)."""

    w13: PackedWeights
    w2: PackedWeights

    @classmethod
    def stack(
        cls, w13: Iterable[PackedWeights], w2: Iterable[PackedWeights], experts: int
    ) -> ExpertWeights:
        """``experts`` experts' prepared weights, each iterable consumed one expert at a time
        (so a generator of ``prepare`` calls holds one repacked expert besides the result).
        On a V100 the routed experts' tensor-core builds for their scheme are loaded now
        (:func:`volta_ct_wna16.ops.warm_up_experts`), before any CUDA-graph capture."""
        stacked = cls(_stack(w13, experts), _stack(w2, experts))
        ops.warm_up_experts(stacked.w13)
        return stacked

    @property
    def num_experts(self) -> int:
        return self.w13.qweight.shape[0]

    @property
    def hidden(self) -> int:
        return self.w13.k

    @property
    def inter(self) -> int:
        return self.w2.k

    @property
    def shape(self) -> ExpertShape:
        """One expert's sizes and the layer's scheme, as the dispatch prices them."""
        w2 = self.w2
        group = None if w2.group >= w2.k else w2.group
        return ExpertShape(self.hidden, self.inter, WeightScheme(w2.bits, w2.zeros is None, group))

    def check(self) -> None:
        """gate/up and down fit each other and share one scheme (bits, zero points or none)."""
        w13, w2 = self.w13, self.w2
        if w13.n != 2 * w2.k or w2.n != w13.k or w13.qweight.shape[0] != w2.qweight.shape[0]:
            raise ValueError(
                f"gate/up [{w13.qweight.shape[0]} x {w13.n} x {w13.k}] and down "
                f"[{w2.qweight.shape[0]} x {w2.n} x {w2.k}] are not one expert stack: gate/up "
                "needs twice down's inputs as outputs, and down gate/up's inputs as outputs"
            )
        if (w13.bits, w13.zeros is None) != (w2.bits, w2.zeros is None):
            raise ValueError(
                f"gate/up and down are quantized differently: {_label(w13)} and {_label(w2)}"
            )

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """``down(SiLU(gate(x)) * up(x))`` for expert ``e``, in the activation dtype."""
        h = _linear(self.w13, e, x).float()
        act = torch.nn.functional.silu(h[:, : self.inter]) * h[:, self.inter :]
        return _linear(self.w2, e, act.to(x.dtype))


def _linear(pw: PackedWeights, e: int, x: torch.Tensor) -> torch.Tensor:
    zeros = pw.zeros[e] if pw.zeros is not None else None
    return ops.linear_op(x, pw.qweight[e], pw.scales[e], zeros, None, None, pw.k, pw.bits, pw.group)


def _label(pw: PackedWeights) -> str:
    zeros = "asymmetric" if pw.zeros is not None else "symmetric"
    group = f"group {pw.group}" if pw.group < pw.k else "channel"
    return f"{pw.bits}-bit {zeros} {group} {pw.n} x {pw.k}"


def _stack(parts: Iterable[PackedWeights], experts: int) -> PackedWeights:
    out: PackedWeights | None = None
    count = 0
    for e, pw in enumerate(parts):
        if out is not None and _label(pw) != _label(out):
            raise ValueError(
                f"expert {e} is {_label(pw)}, expert 0 {_label(out)}: a layer's experts share "
                "one scheme and shape"
            )
        if out is None:
            out = PackedWeights(
                pw.qweight.new_empty((experts, *pw.qweight.shape)),
                pw.scales.new_empty((experts, *pw.scales.shape)),
                None if pw.zeros is None else pw.zeros.new_empty((experts, *pw.zeros.shape)),
                pw.n,
                pw.k,
                pw.bits,
                pw.group,
            )
        out.qweight[e] = pw.qweight
        out.scales[e] = pw.scales
        if out.zeros is not None and pw.zeros is not None:
            out.zeros[e] = pw.zeros
        count = e + 1
    if out is None or count != experts:
        raise ValueError(f"expected {experts} experts' weights, got {count}")
    return out


def experts_forward(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    weights: ExpertWeights,
    *,
    expert_map: torch.Tensor | None = None,
    weight_on_input: bool = False,
    launch: Launch | None = None,
    decode: MoEDecode | MoEFused | None = None,
    check_values: bool = False,
    ptx_arch: str | None = None,
) -> torch.Tensor:
    """``sum_k w_k * expert_{id_k}(x)`` per token, accumulated in fp32, returned in ``x.dtype``.

    ``topk_ids`` are global expert ids; ``expert_map`` (expert parallelism) maps them to this
    rank's experts, -1 for another rank's. ``weight_on_input`` scales each token's input by its
    router weight instead of the output (vLLM's ``apply_router_weight_on_input``).

    On CUDA (and under the interpreter), up to 16 tokens take the decode kernels
    (:func:`volta_ct_wna16.ops.moe_decode`: one launch or two, reading the ids directly); more
    tokens six launches (routing in two, gate/up, the SiLU product, down into each token's
    fp32 row, the cast) and up to three memsets. Neither synchronizes with the host, so a step
    can be captured in a CUDA graph. ``launch`` (the routed blocks' tile) or ``decode`` (the
    decode kernels') override the device's choice: the benchmark's sweep; ``ptx_arch``
    (``"compute_70"``, with a tensor-core ``launch``) runs the V100's PTX build, JIT-compiled by
    the driver (the GPU tests' proof of what a V100 loads). On CPU each expert
    runs its tokens through the reference linear op (one synchronization for the counts).

    Shapes, dtypes and the experts' schemes are checked before any launch; ``check_values``
    also reads the ids back to check each is an expert (and maps to one of this rank's or -1):
    a host synchronization, so the engine's per-step call leaves it off.
    """
    _check_call(x, topk_weights, topk_ids, weights, expert_map)
    if check_values:
        _check_ids(topk_ids, weights.num_experts, expert_map)
    if x.is_cuda or interpreting():
        capability = device_facts(x.device).capability
        if launch is None and decode is None:
            choice = moe_decode_choice(topk_ids.shape[0], capability)
            decode = None if choice is None else choice.launch
        if decode is not None:
            ids = topk_ids if topk_ids.dtype == torch.int32 else topk_ids.to(torch.int32)
            return ops.moe_decode(
                x,
                weights.w13,
                weights.w2,
                topk_weights.float().contiguous(),
                ids.contiguous(),
                decode,
                expert_map,
                weight_on_input,
            )
        return _fused(
            x, topk_weights, topk_ids, weights, expert_map, weight_on_input, launch, ptx_arch
        )
    ids = topk_ids.long()
    if expert_map is not None:
        ids = expert_map[ids].long()
    return _per_expert(x, topk_weights, ids, weights, weight_on_input)


def _check_call(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    weights: ExpertWeights,
    expert_map: torch.Tensor | None,
) -> None:
    """One clear error before any launch: the router's outputs against the tokens and the
    experts, and the experts' two projections against each other."""
    weights.check()
    if x.dim() != 2 or x.shape[1] != weights.hidden:
        raise ValueError(f"expected activations [tokens, {weights.hidden}], got {tuple(x.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(
            f"expert ids must be [tokens, top_k] for {x.shape[0]} tokens, got "
            f"{tuple(topk_ids.shape)}"
        )
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"expert ids must be int32 or int64, got {topk_ids.dtype}")
    if topk_weights.shape != topk_ids.shape or not topk_weights.is_floating_point():
        raise ValueError(
            f"router weights must be floating point of the ids' shape {tuple(topk_ids.shape)}, "
            f"got {topk_weights.dtype} {tuple(topk_weights.shape)}"
        )
    global_experts = weights.num_experts if expert_map is None else expert_map.numel()
    if topk_ids.shape[1] > global_experts:
        raise ValueError(
            f"top_k {topk_ids.shape[1]} is larger than the layer's {global_experts} experts"
        )
    if expert_map is not None and (expert_map.dim() != 1 or expert_map.dtype != torch.int32):
        raise TypeError(
            f"the expert map must be 1-D int32 (vLLM's), got {expert_map.dtype} "
            f"{tuple(expert_map.shape)}"
        )


def _check_ids(ids: torch.Tensor, experts: int, expert_map: torch.Tensor | None) -> None:
    """Every id names one of the layer's experts, and the map sends each to a local one or -1
    (one host read of each)."""
    global_experts = experts if expert_map is None else expert_map.numel()
    flat = ids.reshape(-1).cpu()
    bad = ((flat < 0) | (flat >= global_experts)).nonzero()
    if bad.numel():
        first = int(bad[0])
        raise ValueError(
            f"{bad.numel()} expert id(s) outside 0 .. {global_experts - 1}: the first, pair "
            f"{first}, is {int(flat[first])}"
        )
    if expert_map is not None:
        local = expert_map.cpu()
        wrong = ((local < -1) | (local >= experts)).nonzero()
        if wrong.numel():
            first = int(wrong[0])
            raise ValueError(
                f"the expert map sends expert {first} to {int(local[first])}: the rank holds "
                f"experts 0 .. {experts - 1} (-1: another rank's)"
            )


def _fused(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    weights: ExpertWeights,
    expert_map: torch.Tensor | None,
    weight_on_input: bool,
    launch: Launch | None,
    ptx_arch: str | None = None,
) -> torch.Tensor:
    """Route (two launches), gate/up for every routed pair, ``SiLU(gate) * up`` (one launch),
    then down times the router weight, each pair's row added into its token's fp32 row."""
    m, top_k = topk_ids.shape
    experts = weights.num_experts
    if launch is None:
        capability = device_facts(x.device).capability
        choice = expert_choice(m, top_k, experts, capability, weights.shape)
        launch = ops.select_moe_launch(choice, weights.w13)
    blocks = route(topk_ids, experts, launch.block_m, expert_map)
    router = topk_weights.reshape(-1).float()
    if weight_on_input:
        rows = (x.float().repeat_interleave(top_k, 0) * router[:, None]).to(x.dtype)
        row_div = 1
    else:
        rows, row_div = x, top_k
    h = ops.moe_linear(rows, weights.w13, blocks, launch, row_div, ptx_arch=ptx_arch)
    act = ops.silu_mul(h, x.dtype)
    # Tokens whose pairs are all another rank's stay zero.
    on_output = None if weight_on_input else router
    y = ops.moe_linear(
        act, weights.w2, blocks, launch, 1, on_output, sum_slots=top_k, ptx_arch=ptx_arch
    )
    return y.to(x.dtype)


def _per_expert(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    ids: torch.Tensor,
    weights: ExpertWeights,
    weight_on_input: bool,
) -> torch.Tensor:
    """Each expert's tokens through the reference linear op, counts read on the host."""
    m, top_k = ids.shape
    experts = weights.num_experts
    out = torch.zeros((m, weights.hidden), dtype=torch.float32, device=x.device)
    flat = ids.reshape(-1)
    flat = torch.where(flat < 0, experts, flat)  # another rank's experts: a bucket never run
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts + 1)[:experts].tolist()
    flat_weights = topk_weights.reshape(-1).float()
    start = 0
    for e, count in enumerate(counts):
        if not count:
            continue
        pairs = order[start : start + count]
        start += count
        tokens = pairs // top_k
        w = flat_weights[pairs].unsqueeze(-1)
        xe = x[tokens]
        if weight_on_input:
            xe = (xe.float() * w).to(x.dtype)
        y = weights.expert(e, xe).float()
        out.index_add_(0, tokens, y if weight_on_input else y * w)
    return out.to(x.dtype)
