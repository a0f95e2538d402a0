"""The operands every CUDA linear kernel of the plugin takes, checked once for all of them."""

from __future__ import annotations

import torch

from volta_fp8w.layout import Fp8Weights


def check_operands(
    what: str,
    x2: torch.Tensor,
    w: Fp8Weights,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    one_token: bool,
) -> None:
    """``x2`` fp16 ``[M, K]`` (``M`` 1 where ``one_token``), ``bias`` None or fp16 ``[N]`` and
    ``out`` fp16 ``[M, N]`` with unit stride along ``N``, for ``w``'s ``N x K``.

    :raises ValueError: naming ``what`` (the kernel) and every operand's dtype and shape.
    """
    rows = "1" if one_token else "M"
    m = x2.shape[0] if x2.dim() == 2 else -1
    if (
        x2.dim() != 2
        or (one_token and m != 1)
        or x2.shape[1] != w.k
        or x2.dtype != torch.float16
        or out.dtype != torch.float16
        or tuple(out.shape) != (m, w.n)
        or (m > 0 and w.n > 1 and out.stride(1) != 1)
        or (bias is not None and (bias.dtype != torch.float16 or tuple(bias.shape) != (w.n,)))
    ):
        raise ValueError(
            f"{what} takes x fp16 [{rows}, {w.k}], bias fp16 [{w.n}] and out fp16 "
            f"[{rows}, {w.n}] with unit stride along N; got x {x2.dtype} {tuple(x2.shape)}, out "
            f"{out.dtype} {tuple(out.shape)} strides {out.stride()}"
            + ("" if bias is None else f", bias {bias.dtype} {tuple(bias.shape)}")
        )
