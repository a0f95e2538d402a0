"""Which kernel serves a linear layer or a layer's experts at each token count, for
``vllm-volta plan``.

The answer comes from the launcher's own rules (:func:`volta_ct_wna16.tables.choose` and
:func:`~volta_ct_wna16.tables.choose_mma`, which :func:`volta_ct_wna16.ops.select_launch` calls
at run time; :func:`~volta_ct_wna16.tables.choose_moe_decode` for the experts), walked over every
token count until the choice no longer changes, and grouped into ranges. Torch-free: the
plugin's hooks import it.
"""

from __future__ import annotations

from volta_core import KernelPath
from volta_ct_wna16.launch import DEQUANT_MATMUL, GEMM, MMA, SPLITK, MoEFused
from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.tables import MMA_MAX_M, choose, choose_mma, choose_moe_decode, table_for

#: What each launch path is called in a plan.
KERNEL_NAMES = {
    SPLITK: "Triton split-K",
    GEMM: "Triton tiled GEMM",
    DEQUANT_MATMUL: "dequantize, then cuBLAS",
    MMA: "tensor cores (CUDA, mma.m8n8k4)",
}

#: The experts' kernels: the decode step on the router's ids in one launch or two
#: (:mod:`volta_ct_wna16.kernels.moe_decode`), and the routed blocks
#: (:mod:`volta_ct_wna16.kernels.moe`).
MOE_DECODE_ONE = "Triton MoE decode step in one launch on the router's ids"
MOE_DECODE = "Triton MoE decode GEMVs on the router's ids"
MOE_BLOCKS = "Triton grouped GEMM over routed blocks"


def packed_bytes(n: int, k: int, scheme: WeightScheme) -> int:
    """Bytes the kernels read for an ``n x k`` layer's weights: packed values, fp16 scales and,
    for an asymmetric scheme, fp16 zero points (one per group and output), as
    :meth:`volta_ct_wna16.layout.PackedWeights.nbytes` counts them."""
    groups = -(-k // scheme.group_for(k))
    per_group = 2 if scheme.symmetric else 4
    return n * (-(-k // scheme.pack_factor)) * 4 + groups * n * per_group


def _kernels(
    m: int, n: int, k: int, scheme: WeightScheme, capability: tuple[int, int]
) -> tuple[str, str]:
    """The launch path for ``m`` tokens and, where it is the tensor cores, the Triton launch's
    path that serves without NVRTC (else "")."""
    bits = scheme.num_bits
    triton = choose(m, n, capability, bits, k=k).path
    if choose_mma(m, n, k, capability, bits, packed_bytes(n, k, scheme)) is not None:
        return MMA, triton
    return triton, ""


def _stage(first: int, last: int | None) -> str:
    if last is None:
        return f"{first}+ tokens"
    if first == last:
        return f"{first} token" + ("s" if first > 1 else "")
    return f"{first}-{last} tokens"


def linear_paths(
    n: int, k: int, scheme: WeightScheme, capability: tuple[int, int]
) -> list[KernelPath]:
    """One :class:`KernelPath` per range of token counts with the same kernels, for an ``n``
    outputs by ``k`` inputs layer. The tensor-core ranges need NVRTC; without it the Triton
    launch of the same token count serves."""
    table = table_for(capability)
    # Past every threshold of the tables the choice no longer depends on the token count.
    last = max(MMA_MAX_M, table.decode_max_m, table.dequant_from or 0) + 1
    kernels = [_kernels(m, n, k, scheme, capability) for m in range(1, last + 1)]
    paths: list[KernelPath] = []
    first = 1
    for m in range(1, last + 1):
        if m < last and kernels[m] == kernels[m - 1]:
            continue
        kernel, fallback = kernels[m - 1]
        stage = _stage(first, None if m == last else m)
        paths.append(
            KernelPath(stage, KERNEL_NAMES[kernel], kernel == MMA, KERNEL_NAMES.get(fallback, ""))
        )
        first = m + 1
    return paths


def expert_paths(capability: tuple[int, int]) -> list[KernelPath]:
    """The experts' kernels by token count, as :func:`~volta_ct_wna16.tables.choose_moe_decode`
    picks them for the launcher: the decode step (one launch or two) up to the table's last
    decode row, grouped into ranges, the routed blocks above it."""
    last = max((most for most, _ in table_for(capability).moe_decode), default=0)
    names = [
        MOE_DECODE_ONE if isinstance(choose_moe_decode(m, capability), MoEFused) else MOE_DECODE
        for m in range(1, last + 1)
    ]
    paths: list[KernelPath] = []
    first = 1
    for m in range(1, last + 1):
        if m < last and names[m] == names[m - 1]:
            continue
        paths.append(KernelPath(_stage(first, m), names[m - 1]))
        first = m + 1
    return [*paths, KernelPath(_stage(last + 1, None), MOE_BLOCKS)]
