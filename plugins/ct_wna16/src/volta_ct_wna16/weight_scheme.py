"""What a layer's weight quantization is, as the kernels need it, and how its checkpoint
stores it (torch-free: the claim reads it while nothing else is imported)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


class Packing(str, enum.Enum):
    """How a checkpoint stores a layer's integers (each is repacked once, at load, into the
    one layout the kernels read: :mod:`volta_ct_wna16.layout`, :mod:`volta_ct_wna16.repack`)."""

    CT = "compressed-tensors"
    """``weight_packed`` ``[N, K / pack]`` offset-binary along the input dimension."""
    AWQ = "awq"
    """AutoAWQ's GEMM layout: ``qweight`` ``[K, N / pack]`` along the output dimension in an
    interleaved order, ``qzeros`` packed the same way, zero points stored as they are."""
    GPTQ = "gptq"
    """``qweight`` ``[K / pack, N]`` along the input dimension, ``qzeros`` ``[groups, N / pack]``
    holding each zero point minus one (the original GPTQ/AutoGPTQ convention)."""
    GPTQ_V2 = "gptq_v2"
    """GPTQ with zero points stored as they are (GPTQModel's ``checkpoint_format: gptq_v2``)."""


@dataclass(frozen=True)
class WeightScheme:
    """The weight quantization of one layer, as the kernels need it.

    ``group_size`` is None for channel-wise scales (one group spanning the whole input).
    ``packing`` says how the checkpoint stores it; ``act_order``: GPTQ's activation order
    (``desc_act``), whose groups are spread over the input by ``g_idx``.
    """

    num_bits: int
    symmetric: bool
    group_size: int | None
    packing: Packing = Packing.CT
    act_order: bool = False

    @property
    def pack_factor(self) -> int:
        """Values per int32 word in ``weight_packed``."""
        return 32 // self.num_bits

    @property
    def label(self) -> str:
        grouping = f"g{self.group_size}" if self.group_size else "channel"
        label = f"W{self.num_bits}A16 {grouping} {'sym' if self.symmetric else 'asym'}"
        if self.packing is not Packing.CT:
            label += f" ({self.packing.value}{', act-order' if self.act_order else ''})"
        return label

    def group_for(self, input_size: int) -> int:
        """The group length along the input dimension (the whole input when channel-wise)."""
        return self.group_size if self.group_size else input_size


@dataclass(frozen=True)
class Unsupported:
    """A layer the checkpoint quantizes in a way this plugin does not run, and why."""

    reason: str


def split_groups_reason(group_size: int | None, sizes: Mapping[str, int]) -> str | None:
    """Why a layer's inputs cannot be cut into whole quantization groups, or None.

    ``sizes`` names each input length the layer is built with (``what -> size``): the whole
    input and each tensor-parallel rank's. The kernels read one scale row per group of inputs,
    and vLLM's loaders give each rank the scale rows of its own inputs (``GroupQuantScaleParameter``
    sharded along the input), so a group straddling a rank's boundary has no scale row there.
    Channel-wise schemes (``group_size`` None) have one group and always pass. The claim
    (:func:`volta_ct_wna16.scheme.quant_layer_scheme`) and the loaders
    (:func:`volta_ct_wna16.layout.require_whole_groups`) both ask this.
    """
    for what, size in sizes.items():
        if group_size and size % group_size:
            return f"{what} {size} is not a multiple of the group size {group_size}"
    return None


def act_order_split_reason(scheme: WeightScheme, input_split: bool) -> str | None:
    """Why an act-order (GPTQ ``desc_act``) layer cannot run with its inputs divided across
    tensor-parallel ranks, or None.

    ``g_idx`` spreads each group's rows over the whole input (GPTQ quantizes in the order of
    decreasing Hessian diagonal), so a rank's slice of the rows holds parts of many groups and
    sorting them (:mod:`volta_ct_wna16.repack`) cannot make whole groups. The claim declines such
    a layer and the linear method refuses it when built, with this reason.
    """
    if scheme.act_order and input_split:
        return (
            "act-order (desc_act) inputs divided across tensor-parallel ranks: g_idx spreads "
            "each group over the whole input, so a rank's rows are not whole groups; serve it "
            "at tensor parallel size 1"
        )
    return None
