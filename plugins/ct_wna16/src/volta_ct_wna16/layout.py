"""From checkpoint tensors to the kernels' layout, with every check done before any launch.

compressed-tensors ``pack-quantized`` (as the compressed-tensors library writes it, which the
tests use to make real checkpoints): ``weight_packed`` int32 ``[N, ceil(K/pack)]``
(offset-binary values along the input dimension), ``weight_scale`` ``[N, groups]``,
``weight_zero_point`` int32 ``[ceil(N/pack), groups]`` packed along the *output* dimension, and
``weight_shape`` ``[N, K]``. The kernels want the output dimension contiguous (each tile load is
then whole words along N, and one shift gives the same input slot of every word), so the words
are transposed (bits untouched), scales transposed, and zero points unpacked to one byte per
group; the checkpoint's tensors are then released.

Every failure raises :class:`WeightFormatError` naming the layer and the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.weight_scheme import split_groups_reason


class WeightFormatError(ValueError):
    """A checkpoint tensor that does not match its layer's scheme or shape."""


#: Dtypes a checkpoint's scales may have (the checkpoint's own floating dtype).
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass
class PackedWeights:
    """One layer's weights in the kernels' layout (per tensor-parallel rank).

    ``qweight`` int32 ``[ceil(k / pack), n]``; ``scales`` ``[groups, n]`` in the activation
    dtype; ``zeros`` ``[groups, n]`` in the activation dtype too (the stored, offset values,
    0 to 255, exact there) or None when symmetric. Not uint8: a tile's row of 1-byte zero
    points is 2 bytes per thread, below what ``cp.async`` copies (4), so the dot tiles loaded
    it in every iteration and waited for it; 2-byte values are copied ahead with the scales.

    ``zeros8``: the same zero points as uint8 ``[groups, n]`` (None when symmetric, and where
    no 1-token GEMV reads them: stacked MoE experts). The 1-token GEMV loads zero points where
    it uses them, one per output and group, and is bandwidth-bound on them as on the weights,
    so 1 byte instead of 2 is faster (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#zeros8_gemv).
    Kept beside ``zeros`` (one more byte per group and output, 0.8% of a group-128 int4 layer)
    because the dot tiles need the 2-byte rows.
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    n: int
    k: int
    bits: int
    group: int
    zeros8: torch.Tensor | None = None

    @property
    def groups(self) -> int:
        return self.scales.shape[0]

    @property
    def words_per_column(self) -> int:
        """Words along the input dimension (``ceil(k / pack)``)."""
        return self.qweight.shape[0]

    def zero_points_for(self, byte_zero_points: bool) -> torch.Tensor | None:
        """The zero points a launch reads: ``zeros8`` where it takes byte zero points
        (``Launch.byte_zeros``) and has them, else ``zeros``."""
        if byte_zero_points and self.zeros8 is not None:
            return self.zeros8
        return self.zeros

    def nbytes(self, byte_zero_points: bool = False) -> int:
        """Bytes a kernel reads for the weights: packed values, scales, the zero points it
        takes (see :meth:`zero_points_for`)."""
        total = self.qweight.numel() * 4 + self.scales.numel() * self.scales.element_size()
        zeros = self.zero_points_for(byte_zero_points)
        if zeros is not None:
            total += zeros.numel() * zeros.element_size()
        return total


def _fail(layer: str, message: str) -> WeightFormatError:
    return WeightFormatError(f"layer {layer}: {message}")


def require_whole_groups(layer: str, group_size: int | None, sizes: dict[str, int]) -> None:
    """Raise if a quantization group would straddle a size (``what -> size``) of ``layer``: the
    rule the claim declines by too (:func:`volta_ct_wna16.weight_scheme.split_groups_reason`)."""
    reason = split_groups_reason(group_size, sizes)
    if reason is not None:
        raise _fail(layer, reason)


def unpack_int32(packed: torch.Tensor, bits: int, length: int, dim: int) -> torch.Tensor:
    """Unpack offset-binary values stored ``32 // bits`` per int32 along ``dim`` (0 or 1).

    Returns the stored (unsigned) values as int32, ``length`` of them along ``dim``.
    """
    pack = 32 // bits
    mask = (1 << bits) - 1
    src = packed if dim == 1 else packed.t()
    shifts = torch.arange(pack, device=src.device, dtype=torch.int32) * bits
    values = (src.unsqueeze(-1) >> shifts) & mask
    values = values.reshape(src.shape[0], -1)[:, :length]
    return values if dim == 1 else values.t()


def pack_int32(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Pack signed values (``-2**(bits-1)`` to ``2**(bits-1)-1``) as compressed-tensors does.

    The inverse of :func:`unpack_int32` after the offset: used by tests and the benchmark to
    make fresh checkpoints on machines without the compressed-tensors library (its equality
    with the library is tested on CPU).
    """
    pack = 32 // bits
    src = values.to(torch.int64) + (1 << (bits - 1))
    if dim == 0:
        src = src.t()
    src = torch.nn.functional.pad(src, (0, (-src.shape[1]) % pack))
    words = src.reshape(src.shape[0], -1, pack)
    shifts = torch.arange(pack, device=src.device, dtype=torch.int64) * bits
    packed = (words << shifts).sum(-1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed if dim == 1 else packed.t().contiguous()


def check_scales(layer: str, scale: torch.Tensor) -> None:
    """Scales must be floating point in a checkpoint dtype, finite, and not all zero rows."""
    if scale.dtype not in SCALE_DTYPES:
        raise _fail(layer, f"weight_scale has dtype {scale.dtype}; expected one of {SCALE_DTYPES}")
    bad = ~torch.isfinite(scale)
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise _fail(
            layer,
            f"weight_scale holds {int(bad.sum())} NaN/Inf value(s), the first at index {where}",
        )


def prepare(
    layer: str,
    scheme: WeightScheme,
    *,
    n: int,
    k: int,
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_zero_point: torch.Tensor | None,
    act_dtype: torch.dtype,
) -> PackedWeights:
    """Check one rank's loaded tensors against ``(n, k)`` and the scheme, and repack them.

    ``n`` and ``k`` are this rank's output and input sizes.
    """
    bits, pack = scheme.num_bits, scheme.pack_factor
    group = scheme.group_for(k)
    if scheme.group_size and k % scheme.group_size:
        raise _fail(layer, f"input size {k} is not a multiple of the group size {group}")
    words = -(-k // pack)
    if weight_packed.dtype != torch.int32:
        raise _fail(layer, f"weight_packed has dtype {weight_packed.dtype}; expected torch.int32")
    if tuple(weight_packed.shape) != (n, words):
        raise _fail(
            layer,
            f"weight_packed has shape {tuple(weight_packed.shape)}; {bits}-bit weights of "
            f"shape ({n}, {k}) pack to ({n}, {words})",
        )
    groups = k // group if scheme.group_size else 1
    check_scales(layer, weight_scale)
    if weight_scale.dim() != 2 or weight_scale.shape[0] != n:
        raise _fail(
            layer, f"weight_scale has shape {tuple(weight_scale.shape)}; expected ({n}, {groups})"
        )
    if weight_scale.shape[1] != groups:
        raise _fail(
            layer,
            f"weight_scale has {weight_scale.shape[1]} group(s) per row; input size {k} with "
            f"group size {group} makes {groups}",
        )
    zeros = zeros8 = None
    if scheme.symmetric:
        if weight_zero_point is not None and weight_zero_point.numel():
            raise _fail(layer, "the checkpoint has weight_zero_point but the scheme is symmetric")
    else:
        if weight_zero_point is None or not weight_zero_point.numel():
            raise _fail(
                layer, "the scheme is asymmetric but the checkpoint has no weight_zero_point"
            )
        zp_rows = -(-n // pack)
        if weight_zero_point.dtype != torch.int32 or tuple(weight_zero_point.shape) != (
            zp_rows,
            groups,
        ):
            raise _fail(
                layer,
                f"weight_zero_point is {weight_zero_point.dtype} {tuple(weight_zero_point.shape)}; "
                f"expected torch.int32 ({zp_rows}, {groups}) (packed along the output dimension)",
            )
        stored = unpack_int32(weight_zero_point, bits, n, dim=0).t()
        zeros = stored.to(act_dtype).contiguous()
        zeros8 = stored.to(torch.uint8).contiguous()
    return PackedWeights(
        qweight=weight_packed.t().contiguous(),
        scales=weight_scale.to(act_dtype).t().contiguous(),
        zeros=zeros,
        n=n,
        k=k,
        bits=bits,
        group=group,
        zeros8=zeros8,
    )


def dequantize(pw: PackedWeights, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``(q - z) * s`` as a dense ``[n, k]`` matrix: the reference and the CPU path."""
    q = unpack_int32(pw.qweight, pw.bits, pw.k, dim=0).to(dtype)
    idx = torch.arange(pw.k, device=q.device) // pw.group
    if pw.zeros is None:
        z = torch.full((), 1 << (pw.bits - 1), dtype=dtype, device=q.device)
    else:
        z = pw.zeros.to(dtype)[idx]
    return ((q - z) * pw.scales.to(dtype)[idx]).t()
