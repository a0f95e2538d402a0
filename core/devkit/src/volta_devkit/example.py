"""The worked example: an RMSNorm kernel carried through all three proofs.

The toolkit proves itself on this kernel (interpreter test in CI, GPU test and benchmark on the
lent H100, SM70 gate), and ``docs/kernels.md`` walks through it as the pattern for plugins:
a ``@triton.jit`` kernel, a launcher that refuses bad input before any launch, a float64
reference, and the launch configurations it would use on a V100.

RMSNorm is memory-bound (one read of ``x``, one write of ``out``), so its speed is judged
against the device's copy bandwidth measured in the same run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from volta_core import KernelConfig

if TYPE_CHECKING:
    import torch

#: Widest row one program normalizes (the whole row is held in registers).
MAX_COLS = 16384

#: Hidden sizes the example declares SM70 configurations for.
SM70_HIDDEN_SIZES = (1024, 2048, 4096, 5120, 8192)


@triton.jit
def rms_norm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    n_cols,
    x_row_stride,
    out_row_stride,
    eps,
    BLOCK_N: tl.constexpr,
):
    """One program per row: ``out = x / sqrt(mean(x^2) + eps) * w``, fp32 arithmetic."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) / n_cols
    inv_rms = 1.0 / tl.sqrt(mean_square + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * inv_rms * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def launch_config(n_cols: int) -> tuple[int, int]:
    """``(BLOCK_N, num_warps)`` for a row of ``n_cols``: about 8 fp32 values per thread."""
    block = triton.next_power_of_2(n_cols)
    return block, max(1, min(16, block // 256))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension of a 2-D fp16/fp32 tensor.

    Raises :class:`ValueError` naming the offending argument before any launch.
    """
    import torch

    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [rows, cols], got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"x must be float16 or float32, got {x.dtype}")
    if weight.shape != (x.shape[1],):
        raise ValueError(f"weight must have shape ({x.shape[1]},), got {tuple(weight.shape)}")
    if weight.dtype != x.dtype or weight.device != x.device:
        raise ValueError(
            f"weight must match x ({x.dtype} on {x.device}), got {weight.dtype} on {weight.device}"
        )
    if x.shape[1] > MAX_COLS:
        raise ValueError(f"rows of more than {MAX_COLS} columns are not supported: {x.shape[1]}")
    if x.shape[1] and x.stride(1) != 1:
        raise ValueError("x must be contiguous along its last dimension")
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out
    block, num_warps = launch_config(x.shape[1])
    rms_norm_kernel[(x.shape[0],)](
        x, weight.contiguous(), out, x.shape[1], x.stride(0), out.stride(0), eps,
        BLOCK_N=block, num_warps=num_warps,
    )  # fmt: skip
    return out


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The float64 reference the kernel is checked against."""
    x64, w64 = x.double(), weight.double()
    return x64 * (x64.square().mean(dim=1, keepdim=True) + eps).rsqrt() * w64


def sm70_kernel_configs(dtype: str = "fp16") -> list[KernelConfig]:
    """Every configuration :func:`rms_norm` would launch on a V100 for the declared sizes."""
    configs = []
    for n_cols in SM70_HIDDEN_SIZES:
        block, num_warps = launch_config(n_cols)
        configs.append(
            KernelConfig(
                name=f"rms_norm_{dtype}_n{n_cols}",
                kernel="volta_devkit.example:rms_norm_kernel",
                signature={
                    "x_ptr": f"*{dtype}",
                    "w_ptr": f"*{dtype}",
                    "out_ptr": f"*{dtype}",
                    "n_cols": "i32",
                    "x_row_stride": "i32",
                    "out_row_stride": "i32",
                    "eps": "fp32",
                },
                constexprs={"BLOCK_N": block},
                num_warps=num_warps,
            )
        )
    return configs
