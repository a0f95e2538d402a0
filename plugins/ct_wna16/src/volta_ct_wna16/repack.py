"""AWQ and GPTQ tensors to the kernels' layout, once, at load, with every check done first.

The kernels read :class:`~volta_ct_wna16.layout.PackedWeights`: ``qweight`` int32
``[ceil(K / pack), N]`` whose word ``w`` holds input rows ``w * pack + i`` at bit ``i * bits``
(stored, unsigned values), scales and zero points ``[groups, N]``. GPTQ's ``qweight`` is
already that layout; AWQ's is packed along the output dimension in the order AutoAWQ's
dequantization reads (``[0, 2, 4, 6, 1, 3, 5, 7]`` for 4 bits, ``[0, 2, 1, 3]`` for 8: vLLM's
``awq_pack`` and ``awq_triton.py``), so it is unpacked, put back in column order and packed
along the input dimension.

Zero points: AWQ and GPTQModel's ``gptq_v2`` store them as they are; the original GPTQ format
stores each minus one (AutoGPTQ's packer; vLLM's exllama kernels add the one back). A symmetric
GPTQ layer uses the midpoint ``2 ** (bits - 1)`` whatever ``qzeros`` holds, as vLLM's Marlin
path does.

Activation order (GPTQ ``desc_act``): ``g_idx[k]`` names the group of input row ``k``. The rows
are sorted by group once here, so each group is contiguous again, and the layer gathers its
input by the same permutation at every call (:attr:`Repacked.perm`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from volta_ct_wna16.layout import PackedWeights, WeightFormatError, check_scales, unpack_int32
from volta_ct_wna16.weight_scheme import Packing, WeightScheme

#: AutoAWQ's order of the columns inside one packed word, per bit width.
AWQ_ORDER = {4: (0, 2, 4, 6, 1, 3, 5, 7), 8: (0, 2, 1, 3)}


@dataclass
class Repacked:
    """One rank's weights in the kernels' layout, and the input permutation of an act-order
    layer (``perm``: the layer computes ``x[..., perm] @ W``; None otherwise)."""

    weights: PackedWeights
    perm: torch.Tensor | None = None


def _fail(layer: str, message: str) -> WeightFormatError:
    return WeightFormatError(f"layer {layer}: {message}")


def _expect(layer: str, name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tensor.dtype != torch.int32 or tuple(tensor.shape) != shape:
        raise _fail(
            layer,
            f"{name} is {tensor.dtype} {tuple(tensor.shape)}; expected torch.int32 {shape}",
        )


def pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack stored (unsigned) values ``[K, N]`` into int32 ``[ceil(K / pack), N]`` along K."""
    pack = 32 // bits
    padded = torch.nn.functional.pad(values.to(torch.int64), (0, 0, 0, (-values.shape[0]) % pack))
    words = padded.reshape(-1, pack, padded.shape[1])
    shifts = torch.arange(pack, device=values.device, dtype=torch.int64) * bits
    packed = (words << shifts[None, :, None]).sum(1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_awq(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """AWQ's output-packed words ``[rows, N / pack]`` to stored values ``[rows, N]``."""
    order = AWQ_ORDER[bits]
    values = unpack_int32(packed, bits, n, dim=1)
    # The value at slot i of a word belongs to column order[i] of the word's columns.
    inverse = torch.argsort(torch.tensor(order, device=packed.device))
    return values.reshape(values.shape[0], -1, len(order))[:, :, inverse].reshape(-1, n)


def _scales(layer: str, scales: torch.Tensor, groups: int, n: int) -> None:
    check_scales(layer, scales)
    if tuple(scales.shape) != (groups, n):
        raise _fail(layer, f"scales has shape {tuple(scales.shape)}; expected ({groups}, {n})")


def awq_weights(
    layer: str,
    scheme: WeightScheme,
    *,
    n: int,
    k: int,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    act_dtype: torch.dtype,
) -> Repacked:
    """Check one rank's AWQ tensors against ``(n, k)`` and repack them."""
    bits, pack = scheme.num_bits, scheme.pack_factor
    if n % pack:
        raise _fail(layer, f"output size {n} is not a multiple of {pack} (AWQ packs along it)")
    group = scheme.group_for(k)
    if k % group:
        raise _fail(layer, f"input size {k} is not a multiple of the group size {group}")
    groups = k // group
    _expect(layer, "qweight", qweight, (k, n // pack))
    _expect(layer, "qzeros", qzeros, (groups, n // pack))
    _scales(layer, scales, groups, n)
    zeros = unpack_awq(qzeros, bits, n)
    return Repacked(
        PackedWeights(
            qweight=pack_rows(unpack_awq(qweight, bits, n), bits),
            scales=scales.to(act_dtype).contiguous(),
            zeros=zeros.to(act_dtype).contiguous(),
            n=n,
            k=k,
            bits=bits,
            group=group,
            zeros8=zeros.to(torch.uint8).contiguous(),
        )
    )


def _act_order(
    layer: str, g_idx: torch.Tensor, k: int, group: int, groups_in_checkpoint: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The row permutation that makes each group contiguous, and the group (of the
    checkpoint's scale rows) each of this rank's ``k // group`` groups is."""
    if g_idx.dtype != torch.int32 or tuple(g_idx.shape) != (k,):
        raise _fail(
            layer, f"g_idx is {g_idx.dtype} {tuple(g_idx.shape)}; expected torch.int32 ({k},)"
        )
    g = g_idx.to(torch.int64)
    if bool(((g < 0) | (g >= groups_in_checkpoint)).any()):
        raise _fail(layer, f"g_idx names groups outside 0..{groups_in_checkpoint - 1}")
    perm = torch.argsort(g, stable=True)
    runs = g[perm].reshape(-1, group)
    if bool((runs != runs[:, :1]).any()):
        raise _fail(
            layer,
            f"g_idx does not give every group {group} rows on this rank (an act-order layer "
            "split across tensor-parallel ranks); serve it at tensor parallel size 1",
        )
    return perm, runs[:, 0]


def gptq_weights(
    layer: str,
    scheme: WeightScheme,
    *,
    n: int,
    k: int,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None,
    act_dtype: torch.dtype,
) -> Repacked:
    """Check one rank's GPTQ tensors against ``(n, k)`` and move them to the kernels' layout.

    ``scales`` and ``qzeros`` hold every group of the checkpoint for an act-order layer (vLLM
    does not shard them along the input there), this rank's groups otherwise.
    """
    bits, pack = scheme.num_bits, scheme.pack_factor
    group = scheme.group_for(k)
    if k % pack:
        raise _fail(layer, f"input size {k} is not a multiple of {pack} (GPTQ packs along it)")
    if k % group:
        raise _fail(layer, f"input size {k} is not a multiple of the group size {group}")
    groups = scales.shape[0] if scheme.act_order else k // group
    _expect(layer, "qweight", qweight, (k // pack, n))
    _expect(layer, "qzeros", qzeros, (groups, -(-n // pack)))
    _scales(layer, scales, groups, n)
    stored = unpack_int32(qzeros, bits, n, dim=1).to(torch.int64)
    zeros: torch.Tensor | None = None
    if not scheme.symmetric:
        zeros = stored + (1 if scheme.packing is Packing.GPTQ else 0)
        if int(zeros.max()) > 255:
            raise _fail(layer, "qzeros holds a zero point of 256 (8-bit GPTQ stores it minus one)")
    perm = None
    if scheme.act_order:
        if g_idx is None:
            raise _fail(layer, "the config sets desc_act but the checkpoint has no g_idx")
        perm, chosen = _act_order(layer, g_idx, k, group, groups)
        values = unpack_int32(qweight, bits, k, dim=0)
        qweight = pack_rows(values[perm], bits)
        scales = scales[chosen]
        zeros = zeros[chosen] if zeros is not None else None
    return Repacked(
        PackedWeights(
            qweight=qweight.contiguous(),
            scales=scales.to(act_dtype).contiguous(),
            zeros=zeros.to(act_dtype).contiguous() if zeros is not None else None,
            n=n,
            k=k,
            bits=bits,
            group=group,
            zeros8=zeros.to(torch.uint8).contiguous() if zeros is not None else None,
        ),
        perm,
    )
