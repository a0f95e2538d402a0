"""Fused-MoE benchmark: ``python plugins/ct_wna16/benchmarks/ct_wna16_moe_bench.py --out DIR
[--vllm-fused-moe PATH]`` (needs CUDA; imports as :mod:`ct_wna16_bench` does).

For two MoE layer shapes of the models V100 owners serve (Qwen3-30B-A3B: 128 experts, top-8,
hidden 2048, intermediate 768; Qwen3.5-35B-A3B: 256 experts, top-8, hidden 2048, intermediate
512), int4 group 128 (symmetric; ``--asymmetric`` adds asymmetric rows) and M tokens, one run
times inside one CUDA graph (as vLLM captures decode; :func:`volta_devkit.bench.time_cuda_graph`):

* ``step``: the router's top-k from its logits (:func:`volta_ct_wna16.routing.select_experts`)
  and :func:`volta_ct_wna16.experts.experts_forward` whole, what a layer's routed experts cost;
* ``kernels``: the expert kernels alone: up to 16 tokens :func:`volta_ct_wna16.ops.moe_decode`
  (every launch of it), above that the two :func:`volta_ct_wna16.ops.moe_linear` calls on
  blocks routed beforehand;
* ``vllm``: vLLM's Triton fused-MoE int4 kernel (``fused_moe_kernel_gptq_awq``, read from the
  vLLM wheel's ``fused_moe.py`` given by ``--vllm-fused-moe``: its ``@triton.jit`` functions are
  taken out with ``ast`` into a module of their own, because the file's vLLM imports cannot be
  met here) for gate/up and down, launched as its ``invoke_fused_moe_wna16_triton_kernel``
  does with its default config, on our weights repacked into its layout, with
  ``moe_align_block_size`` computed in torch beforehand (not timed); ``vllm step`` adds its
  SiLU product and sum over top-k (torch ops standing in for vLLM's compiled ones);
* ``cublas``: fp16 cuBLAS over the same routed experts (each routed expert's tokens through its
  dequantized gate/up, SiLU product, down, weighted and added), and the routed FLOPs over fp16
  cuBLAS's 8192-cube rate (``xdense``).

Each call gets its own random routing (distinct experts per token), cycled so the weights read
per replay far exceed the L2. Reported against ceilings of the same run: the weight bytes of
the experts a call routes to (each read once) over the time, as a fraction of the copy
bandwidth; beside them an SM70 estimate: the larger of those bytes at 900 GB/s and the routed
FMAs (2 FLOPs each) at 15.7 TFLOP/s (the V100's fp32 FMA rate, which Triton's ``tl.dot`` runs
at there: triton-lang/triton#5066), one kernel's bound taken as the step's.

Up to 16 tokens a row also gets the read floor (:func:`volta_devkit.read_floor.read_floor`):
the simplest kernels that read the gate/up experts' bytes and then the down experts' bytes, in
two launches timed the same way (``floor2``), and all of them in one launch (``floor1``): what
no MoE kernel reading those bytes in as many launches can beat, so ``kernels / floor2`` is the
part of the gap a kernel could remove.

Writes ``DIR/ct_wna16_moe_bench.json``; prints the table last.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import torch

# Beside this script: the linear benchmark; in plugins/ct_wna16/tests: the checkpoint maker.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from ct_wna16_bench import matmul_flops, start, versions
from ct_wna16_checkpoints import fresh_checkpoint

from volta_core.kernel_api import V100_RATES
from volta_ct_wna16 import ops
from volta_ct_wna16.dispatch import moe_blocks_choice, moe_decode_choice
from volta_ct_wna16.experts import ExpertWeights, experts_forward
from volta_ct_wna16.layout import dequantize
from volta_ct_wna16.routing import route, select_experts
from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.tables import MOE, Launch, MoEDecode, MoEFused
from volta_devkit.bench import rotation_count, time_cuda_graph
from volta_devkit.read_floor import read_floor

#: name: (experts, top_k, hidden, intermediate)
MODELS = {
    "Qwen3.5-35B-A3B": (256, 8, 2048, 512),
    "Qwen3-30B-A3B": (128, 8, 2048, 768),
}
MS = (1, 16, 64, 256, 2048)
GROUP = 128
#: Distinct experts built; the stack repeats them (same bytes, other addresses).
DISTINCT = 4
#: Routed weight bytes each replay cycles through (well above an H100's 50 MB L2).
ROTATE_BYTES = 400 << 20
MAX_ROUTINGS = 64
REPLAYS = 7
#: The vLLM kernel's functions this benchmark takes from its file.
VLLM_KERNELS = ("write_zeros_to_output", "fused_moe_kernel_gptq_awq")


def stack(experts: int, hidden: int, inter: int, symmetric: bool) -> ExpertWeights:
    scheme = WeightScheme(4, symmetric, GROUP)
    w13 = [
        fresh_checkpoint(2 * inter, hidden, scheme, seed=e, device="cuda").packed(f"w13.{e}")
        for e in range(DISTINCT)
    ]
    w2 = [
        fresh_checkpoint(hidden, inter, scheme, seed=100 + e, device="cuda").packed(f"w2.{e}")
        for e in range(DISTINCT)
    ]
    return ExpertWeights.stack(
        (w13[e % DISTINCT] for e in range(experts)),
        (w2[e % DISTINCT] for e in range(experts)),
        experts,
    )


def routings(
    m: int, experts: int, top_k: int, count: int, gen: torch.Generator
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``count`` routings of ``m`` tokens: (router logits whose top-k are the ids, fp32 weights
    renormalized as the top-k kernel makes them, int32 ids)."""
    out = []
    for _ in range(count):
        ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(m)])
        logits = torch.randn(m, experts, generator=gen)
        # The chosen experts' logits above every other, in slot order.
        top = 10.0 + torch.arange(top_k, 0, -1, dtype=torch.float32)
        logits.scatter_(1, ids, top.expand(m, top_k).contiguous())
        probs = torch.softmax(logits, -1).gather(1, ids)
        w = probs / probs.sum(-1, keepdim=True)
        out.append((logits.half().cuda(), w.cuda(), ids.to(torch.int32).cuda()))
    return out


def load_vllm_kernel(path: Path, out: Path) -> Any:
    """vLLM's ``fused_moe_kernel_gptq_awq`` (and the helper it calls) from its ``fused_moe.py``:
    the two functions' source written to a module of their own (Triton reads a kernel's source
    from its file), importing only triton."""
    source = path.read_text()
    tree = ast.parse(source)
    parts = [
        ast.get_source_segment(source, node, padded=False)
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name in VLLM_KERNELS
    ]
    if len(parts) != len(VLLM_KERNELS):
        raise ValueError(f"{path} lacks one of {VLLM_KERNELS}")
    module = out / "vllm_fused_moe_kernel.py"
    decorated = "\n\n\n".join(f"@triton.jit\n{part}" for part in parts if part)
    module.write_text(f"import triton\nimport triton.language as tl\n\n\n{decorated}\n")
    spec = importlib.util.spec_from_file_location("vllm_fused_moe_kernel", module)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {module}")
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def vllm_layout(weights: ExpertWeights) -> dict[str, torch.Tensor]:
    """Our symmetric int4 stacks in the layout vLLM's kernel reads: ``[E, N, K // 2]`` uint8
    (two values a byte, the even input low) and scales ``[E, N, groups]``."""
    out = {}
    for name, pw in (("w13", weights.w13), ("w2", weights.w2)):
        shifts = torch.arange(0, 32, 4, device=pw.qweight.device, dtype=torch.int32)
        q = (pw.qweight[:, :, None, :] >> shifts[None, None, :, None]) & 0xF  # [E, KW, 8, N]
        q = q.reshape(q.shape[0], -1, q.shape[-1])[:, : pw.k].transpose(1, 2)  # [E, N, K]
        out[name] = (q[..., 0::2] | (q[..., 1::2] << 4)).to(torch.uint8).contiguous()
        out[f"{name}_scale"] = pw.scales.transpose(1, 2).contiguous()
    return out


def vllm_block_m(m: int) -> int:
    """vLLM's default ``BLOCK_SIZE_M`` for int4 W4A16 on its Triton kernel
    (``get_default_config``)."""
    return 16 if m <= 20 else 32 if m <= 40 else 64


def align_block_size(
    ids: torch.Tensor, experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's ``moe_align_block_size`` in torch: pairs sorted by expert, each expert's run
    padded to whole blocks with the pair count, each block's expert, the padded length."""
    flat = ids.reshape(-1).long()
    pairs = flat.numel()
    counts = torch.bincount(flat, minlength=experts).tolist()
    order = torch.argsort(flat, stable=True).tolist()
    size = pairs + experts * (block_m - 1)
    sorted_ids = torch.full((size,), pairs, dtype=torch.int32)
    expert_ids = torch.zeros(-(-size // block_m), dtype=torch.int32)
    pos = src = 0
    for e, c in enumerate(counts):
        if not c:
            continue
        sorted_ids[pos : pos + c] = torch.tensor(order[src : src + c], dtype=torch.int32)
        padded = -(-c // block_m) * block_m
        expert_ids[pos // block_m : (pos + padded) // block_m] = e
        pos += padded
        src += c
    dev = ids.device
    return (
        sorted_ids.to(dev),
        expert_ids.to(dev),
        torch.tensor([pos], dtype=torch.int32, device=dev),
    )


def vllm_gemm(
    kernel: Any,
    a: torch.Tensor,
    b: torch.Tensor,
    scale: torch.Tensor,
    c: torch.Tensor,
    topk_weights: torch.Tensor,
    aligned: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    m: int,
    top_k: int,
    mul_routed_weight: bool,
) -> None:
    """One launch as ``invoke_fused_moe_wna16_triton_kernel`` makes it (vLLM 0.33), symmetric
    int4, group 128, its default config (``BLOCK_SIZE_M`` by tokens, ``BLOCK_SIZE_N``/``_K``
    32/64 where the input is one row, else 64/32; 4 warps, Triton's default stages)."""
    import triton
    import triton.language as tl

    sorted_ids, expert_ids, post_padded = aligned
    block_m = vllm_block_m(m)
    # vLLM's one-token tile where the launch's rows are one token (gate/up of one token).
    block_n, block_k = (32, 64) if a.shape[0] == 1 else (64, 32)
    em = sorted_ids.numel()
    if a.shape[0] < block_m:
        em = min(em, a.shape[0] * top_k * block_m)
    n = b.shape[1]
    grid = (triton.cdiv(em, block_m) * triton.cdiv(n, block_n),)
    kernel.fused_moe_kernel_gptq_awq[grid](
        a, b, c, scale, None, topk_weights, sorted_ids, expert_ids, post_padded,
        n, a.shape[1], em, m * top_k if top_k > 1 else a.shape[0],
        a.stride(0), a.stride(1), b.stride(0), b.stride(2), b.stride(1),
        c.stride(-2), c.stride(-1), scale.stride(0), scale.stride(2), scale.stride(1), 0, 0, 0,
        block_k_diviable=a.shape[1] % block_k == 0, group_size=GROUP,
        BLOCK_SIZE_M=block_m, BLOCK_SIZE_N=block_n, BLOCK_SIZE_K=block_k, GROUP_SIZE_M=1,
        SPLIT_K=1, MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k, compute_type=tl.float16,
        has_zp=False, use_int4_w4a16=True, use_int8_w8a16=False,
    )  # fmt: skip


def vllm_step(
    kernel: Any,
    packed: dict[str, torch.Tensor],
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    aligned: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    top_k: int,
    glue: bool,
) -> torch.Tensor:
    """vLLM's fused experts: gate/up, SiLU product, down times the router weight, the sum over
    top-k (``glue`` off: the two kernels alone, their outputs left per pair)."""
    m = x.shape[0]
    inter = packed["w2"].shape[2] * 2
    h = torch.empty((m, top_k, 2 * inter), dtype=x.dtype, device=x.device)
    vllm_gemm(
        kernel, x, packed["w13"], packed["w13_scale"], h, topk_weights, aligned, m, top_k, False
    )
    h2 = h.view(m * top_k, 2 * inter)
    act = torch.nn.functional.silu(h2[:, :inter]) * h2[:, inter:] if glue else h2[:, :inter]
    y = torch.empty((m, top_k, x.shape[1]), dtype=x.dtype, device=x.device)
    vllm_gemm(kernel, act, packed["w2"], packed["w2_scale"], y, topk_weights, aligned, m, 1, True)
    return y.sum(1) if glue else y[:, 0]


def dense_experts(weights: ExpertWeights) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every expert's dequantized fp16 ``(w13.T, w2.T)``, each its own copy (so cuBLAS reads
    as many distinct bytes as the packed kernels)."""
    out = []
    for e in range(weights.num_experts):
        pair = []
        for pw in (weights.w13, weights.w2):
            one = type(pw)(
                pw.qweight[e], pw.scales[e], None if pw.zeros is None else pw.zeros[e],
                pw.n, pw.k, pw.bits, pw.group,
            )  # fmt: skip
            pair.append(dequantize(one, torch.float16).t().contiguous())
        out.append((pair[0], pair[1]))
    return out


def cublas_step(
    dense: list[tuple[torch.Tensor, torch.Tensor]],
    x: torch.Tensor,
    plan: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """fp16 cuBLAS over the routed experts: ``plan`` holds each routed expert's tokens, their
    router weights and slots (host-known per routing, as one graph captures each)."""
    out = torch.zeros((x.shape[0], x.shape[1]), dtype=torch.float32, device=x.device)
    inter = dense[0][1].shape[0]
    for e, tokens, w, _ in plan:
        h = x[tokens] @ dense[e][0]
        y = (torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]) @ dense[e][1]
        out.index_add_(0, tokens, y.float() * w[:, None])
    return out


def cublas_plan(
    ids: torch.Tensor, weights: torch.Tensor
) -> list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]:
    ids_h = ids.cpu()
    plan = []
    for e in sorted(set(ids_h.reshape(-1).tolist())):
        tokens, slots = (ids_h == e).nonzero(as_tuple=True)
        dev = ids.device
        plan.append((e, tokens.to(dev), weights[tokens.to(dev), slots.to(dev)], slots.to(dev)))
    return plan


def max_rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6))


def time_one(
    name: str,
    symmetric: bool,
    m: int,
    weights: ExpertWeights,
    top_k: int,
    copy_bw: float,
    flops: float,
    gen: torch.Generator,
    peer: tuple[Any, dict[str, torch.Tensor]] | None,
    dense: list[tuple[torch.Tensor, torch.Tensor]] | None,
) -> dict[str, Any]:
    """One row: the whole step, the expert kernels alone, vLLM's kernel and cuBLAS."""
    experts, hidden, inter = weights.num_experts, weights.hidden, weights.inter
    expert_bytes = (weights.w13.nbytes() + weights.w2.nbytes()) / experts
    x = torch.randn(m, hidden, device="cuda", dtype=torch.float16)
    per_call = min(experts, m * top_k) * expert_bytes
    count = max(2, min(MAX_ROUTINGS, int(ROTATE_BYTES // per_call)))
    sets = routings(m, experts, top_k, count, gen)
    distinct = sum(int(ids.unique().numel()) for *_, ids in sets) / len(sets)
    capability = torch.cuda.get_device_capability()
    decode_choice = moe_decode_choice(m, capability)
    decode = None if decode_choice is None else decode_choice.launch
    launch = moe_blocks_choice(m * top_k, experts, capability).launch

    def step(logits: torch.Tensor, *_: Any) -> torch.Tensor:
        w, ids = select_experts(logits, top_k)
        return experts_forward(x, w, ids, weights)

    step_ms = time_cuda_graph(step, sets, replays=REPLAYS).median_ms
    kern_ms = kernels_ms(x, weights, sets, top_k, decode, launch)
    ours = experts_forward(x, sets[0][1], sets[0][2], weights)
    row: dict[str, Any] = {
        "model": name, "symmetric": symmetric, "m": m, "experts": experts, "top_k": top_k,
        "hidden": hidden, "inter": inter, "launch": tile_label(decode, launch),
        "distinct_experts": distinct, "step_us": step_ms * 1e3, "kernels_us": kern_ms * 1e3,
    }  # fmt: skip
    if peer is not None and symmetric:
        kernel, packed = peer
        bm = vllm_block_m(m)
        aligned = [align_block_size(ids, experts, bm) for *_, ids in sets]
        args = [(s[1], a) for s, a in zip(sets, aligned, strict=True)]
        for key, glue in (("vllm_us", False), ("vllm_step_us", True)):
            ms = time_cuda_graph(
                lambda w, a, glue=glue: vllm_step(kernel, packed, x, w, a, top_k, glue),
                args,
                replays=REPLAYS,
            ).median_ms
            row[key] = ms * 1e3
        ref = vllm_step(kernel, packed, x, sets[0][1], aligned[0], top_k, True)
        row["vllm_vs_ours_rel"] = max_rel(ref, ours)
    if dense is not None:
        plans = [(s[1], cublas_plan(s[2], s[1])) for s in sets[: max(2, min(8, len(sets)))]]
        ms = time_cuda_graph(
            lambda _w, plan: cublas_step(dense, x, plan), plans, replays=REPLAYS
        ).median_ms
        row["cublas_us"] = ms * 1e3
    if decode is not None:
        gate_up = round(distinct * weights.w13.nbytes() / experts)
        down = round(distinct * weights.w2.nbytes() / experts)
        floors = {n: floor_us(n) for n in (gate_up, down, gate_up + down)}
        row.update(floor2_us=floors[gate_up] + floors[down], floor1_us=floors[gate_up + down])
    routed_bytes = distinct * expert_bytes
    routed_flops = 2 * m * top_k * 3 * hidden * inter
    sm70_bytes = routed_bytes / V100_RATES.bandwidth
    sm70_flops = routed_flops / V100_RATES.fma_flops
    sm70 = max(sm70_bytes, sm70_flops)
    row.update(
        routed_bytes=routed_bytes,
        copy_fraction=routed_bytes / (kern_ms * 1e-3) / copy_bw,
        step_copy_fraction=routed_bytes / (step_ms * 1e-3) / copy_bw,
        tflops=routed_flops / (kern_ms * 1e-3) / 1e12,
        cublas_fraction=routed_flops / (kern_ms * 1e-3) / flops,
        sm70_estimate_us=sm70 * 1e6,
        sm70_bound="bytes" if sm70_bytes >= sm70_flops else "FMA",
    )
    return row


def floor_us(nbytes: int) -> float:
    """The read floor of ``nbytes`` (rounded to whole 64-byte sectors) in one launch, in us,
    over enough distinct buffers that every replay reads from HBM."""
    words = max(16, nbytes // 64 * 16)
    srcs = [
        torch.empty(words, dtype=torch.int32, device="cuda").random_()
        for _ in range(rotation_count(words * 4))
    ]
    return read_floor(srcs).median_ms * 1e3


def kernels_ms(
    x: torch.Tensor,
    weights: ExpertWeights,
    sets: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    top_k: int,
    decode: MoEDecode | MoEFused | None,
    launch: Launch,
) -> float:
    """The expert kernels alone: the decode launches, or the two routed-block launches on
    blocks routed beforehand."""
    if decode is not None:
        return time_cuda_graph(
            lambda _l, w, ids: ops.moe_decode(x, weights.w13, weights.w2, w, ids, decode),
            sets,
            replays=REPLAYS,
        ).median_ms
    experts, inter = weights.num_experts, weights.inter
    blocks = [route(ids, experts, launch.block_m) for *_, ids in sets]
    act = torch.randn(x.shape[0] * top_k, inter, device="cuda", dtype=torch.float16)

    def kernels(i: int) -> None:
        ops.moe_linear(x, weights.w13, blocks[i], launch, top_k)
        router = sets[i][1].reshape(-1)
        ops.moe_linear(act, weights.w2, blocks[i], launch, 1, router, sum_slots=top_k)

    return time_cuda_graph(kernels, [(i,) for i in range(len(sets))], replays=REPLAYS).median_ms


def tile_label(decode: MoEDecode | MoEFused | None, launch: Launch) -> str:
    if isinstance(decode, MoEFused):
        label = f"one:j{decode.block_j}k{decode.block_k}n{decode.block_n}"
        return label + f"w{decode.num_warps}s{decode.num_stages}"
    if decode is not None:
        g, d = decode.gate_up, decode.down
        return f"d:{g.block_n}x{g.block_k}/{d.block_n}x{d.block_k}"
    return f"m{launch.block_m}n{launch.block_n}k{launch.block_k}"


def _row(n: int, k: int, warps: int, stages: int, per_sm: int, fan_in: int) -> Launch:
    return Launch(MOE, block_m=1, block_n=n, block_k=k, num_warps=warps, num_stages=stages,
                  programs_per_sm=per_sm, reduce_unroll=fan_in)  # fmt: skip


#: The SM90 fused-MoE tile of the routed blocks at decode sizes, timed beside the decode kernels.
BLOCKS = Launch(MOE, block_m=16, block_n=128, block_k=128, use_dot=True, num_stages=3)


def sweep_candidates(m: int) -> list[MoEDecode | MoEFused | Launch]:
    """What the sweep times at ``m`` tokens: decode launches, gate/up and down alike
    (``block_n``, ``block_k``, warps, stages, programs per SM, fan-in), and the routed blocks'
    kernel (a bare Launch)."""
    # The two-launch rows (more programs per SM, swept in call 6, did not help).
    rows = [_row(512, 32, 2, 3, 4, 8), _row(256, 32, 2, 3, 4, 8)]
    # The step in one launch (intermediate rows a program, gate/up's input step, down's
    # outputs at a time, warps, stages), up to 4 tokens: at 16 it took 109-188 us against the
    # two launches' 86 on the H100 (docs/perf/ct_wna16/moe_decode/README.md, call 7).
    fused = (
        [
            MoEFused(32, 256, 1024, 4, 3),
            MoEFused(32, 256, 2048, 4, 3),
            MoEFused(32, 512, 1024, 4, 3),
            MoEFused(32, 512, 2048, 4, 3),
            MoEFused(32, 256, 1024, 8, 3),
            MoEFused(32, 512, 1024, 8, 3),
            MoEFused(32, 256, 2048, 8, 3),
            MoEFused(64, 256, 1024, 8, 3),
        ]
        if m <= 4
        else []
    )
    return [*(MoEDecode(launch, launch) for launch in rows), *fused, BLOCKS]


def sweep(name: str, weights: ExpertWeights, top_k: int, copy_bw: float) -> list[dict[str, Any]]:
    """The decode rows' kernels on every candidate launch, checked against the table's."""
    gen = torch.Generator().manual_seed(1)
    rows = []
    expert_bytes = (weights.w13.nbytes() + weights.w2.nbytes()) / weights.num_experts
    for m in (1, 4, 16):
        x = torch.randn(m, weights.hidden, device="cuda", dtype=torch.float16)
        per_call = min(weights.num_experts, m * top_k) * expert_bytes
        count = max(2, min(MAX_ROUTINGS, int(ROTATE_BYTES // per_call)))
        sets = routings(m, weights.num_experts, top_k, count, gen)
        distinct = sum(int(ids.unique().numel()) for *_, ids in sets) / len(sets)
        ref = experts_forward(x, sets[0][1], sets[0][2], weights)
        for cand in sweep_candidates(m):
            decode = cand if isinstance(cand, (MoEDecode, MoEFused)) else None
            launch = cand if isinstance(cand, Launch) else BLOCKS
            label = tile_label(decode, launch)
            try:
                got = experts_forward(
                    x, sets[0][1], sets[0][2], weights, decode=decode, launch=launch
                )
                ms = kernels_ms(x, weights, sets, top_k, decode, launch)
            except Exception as exc:
                print(f"sweep {name} m={m} {label}: {exc!r}"[:300], flush=True)
                continue
            one = decode.gate_up if isinstance(decode, MoEDecode) else launch
            if isinstance(decode, MoEFused):
                warps, stages, per_sm, fan_in = decode.num_warps, decode.num_stages, 0, 0
            else:
                warps, stages = one.num_warps, one.num_stages
                per_sm, fan_in = one.programs_per_sm, one.reduce_unroll
            row = {
                "model": name, "m": m, "tile": label, "warps": warps, "stages": stages,
                "programs_per_sm": per_sm, "fan_in": fan_in, "kernels_us": ms * 1e3,
                "rel_vs_table": max_rel(got, ref),
                "copy_fraction": distinct * expert_bytes / (ms * 1e-3) / copy_bw,
            }  # fmt: skip
            rows.append(row)
            print(
                f"sweep {name:<16}{m:>4} {row['tile']:<24} w{row['warps']} s{row['stages']} "
                f"p{row['programs_per_sm']} r{row['fan_in']} "
                f"{row['kernels_us']:8.1f} us {100 * row['copy_fraction']:6.1f}% copy "
                f"rel {row['rel_vs_table']:.1e}",
                flush=True,
            )
    return rows


HEADER = (
    f"{'model':<16}{'sym':>4}{'M':>6}{'tile':>24}{'exp':>6}{'MB':>7}{'step us':>9}"
    f"{'kern us':>9}{'%copy':>7}{'step%':>7}{'vllm us':>9}{'xvllm':>7}{'xvstep':>7}"
    f"{'cuBLAS':>9}{'xcublas':>8}{'TFLOP/s':>9}{'xdense':>7}{'SM70 us':>9}"
    f"{'floor2':>8}{'floor1':>8}{'x floor2':>9}"
)


def line(r: dict[str, Any]) -> str:
    vllm = r.get("vllm_us")
    cub = r.get("cublas_us")
    return (
        f"{r['model']:<16}{'y' if r['symmetric'] else 'n':>4}{r['m']:>6}{r['launch']:>24}"
        f"{r['distinct_experts']:>6.0f}{r['routed_bytes'] / 1e6:>7.1f}{r['step_us']:>9.1f}"
        f"{r['kernels_us']:>9.1f}{100 * r['copy_fraction']:>7.1f}"
        f"{100 * r['step_copy_fraction']:>7.1f}"
        + (f"{vllm:>9.1f}{vllm / r['kernels_us']:>7.2f}" if vllm else f"{'-':>9}{'-':>7}")
        + (f"{r['vllm_step_us'] / r['step_us']:>7.2f}" if vllm else f"{'-':>7}")
        + (f"{cub:>9.1f}{cub / r['kernels_us']:>8.2f}" if cub else f"{'-':>9}{'-':>8}")
        + f"{r['tflops']:>9.1f}{r['cublas_fraction']:>7.2f}{r['sm70_estimate_us']:>9.1f}"
        + (
            f"{r['floor2_us']:>8.1f}{r['floor1_us']:>8.1f}{r['kernels_us'] / r['floor2_us']:>9.2f}"
            if "floor2_us" in r
            else f"{'-':>8}{'-':>8}{'-':>9}"
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vllm-fused-moe", type=Path, help="vLLM 0.33's fused_moe.py")
    parser.add_argument("--asymmetric", action="store_true", help="add asymmetric rows")
    parser.add_argument(
        "--sweep", action="store_true", help="sweep the decode launches (first model)"
    )
    parser.add_argument("--ms", type=int, nargs="*", default=list(MS))
    args = parser.parse_args(argv)
    copy_bw = start(args.out)
    if copy_bw is None:
        return 2
    flops = matmul_flops()
    kernel = load_vllm_kernel(args.vllm_fused_moe, args.out) if args.vllm_fused_moe else None
    rows: list[dict[str, Any]] = []
    swept: list[dict[str, Any]] = []
    result = {
        **versions(),
        "copy_bandwidth_gbps": copy_bw / 1e9,
        "fp16_matmul_tflops": flops / 1e12,
    }
    path = args.out / "ct_wna16_moe_bench.json"
    for name, (experts, top_k, hidden, inter) in MODELS.items():
        for symmetric in (True, False) if args.asymmetric else (True,):
            weights = stack(experts, hidden, inter, symmetric)
            if args.sweep and symmetric and name == next(iter(MODELS)):
                swept += sweep(name, weights, top_k, copy_bw)
            peer = (kernel, vllm_layout(weights)) if kernel is not None and symmetric else None
            dense = dense_experts(weights) if symmetric else None
            gen = torch.Generator().manual_seed(0)
            for m in args.ms:
                rows.append(
                    time_one(name, symmetric, m, weights, top_k, copy_bw, flops, gen, peer, dense)
                )
                print(line(rows[-1]), flush=True)
                path.write_text(json.dumps({**result, "rows": rows, "sweep": swept}, indent=1))
            del peer, dense, weights
            torch.cuda.empty_cache()
    print(f"{result['device']}, torch {torch.__version__}, triton {result['versions']['triton']}")
    print(f"copy {copy_bw / 1e9:.0f} GB/s, fp16 cuBLAS 8192^3 {flops / 1e12:.0f} TFLOP/s")
    print(HEADER)
    print("\n".join(line(r) for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
