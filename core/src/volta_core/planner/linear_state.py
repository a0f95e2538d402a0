"""The fixed per-sequence state a linear-attention layer keeps instead of per-token KV.

A Gated DeltaNet layer (Qwen3-Next, Qwen3.5/3.6 ``linear_attention``) holds, per sequence and
per rank, whatever the context length (vLLM's ``MambaStateShapeCalculator
.gated_delta_net_state_shape``):

* a convolution state of ``(2 k_heads k_dim + v_heads v_dim) / tp x (conv_kernel - 1)`` in the
  model dtype;
* a recurrent state of ``v_heads / tp x v_dim x k_dim`` in the config's ``mamba_ssm_dtype``
  (float32 in the published Qwen3.5/3.6 configs: vLLM 0.19's
  ``Qwen3_5ForConditionalGenerationConfig`` makes it the ``auto`` ``--mamba-ssm-cache-dtype``),
  else the model dtype.

vLLM pads each layer's state page to the attention page size of the same model (it enlarges the
attention block size until one attention page holds at least one state page); that padding, a
fraction of a percent, is not counted. Other non-attention layer types (Mamba, short
convolutions) are not modelled: :func:`state_bytes_per_sequence` returns None for them and the
fit says so.
"""

from __future__ import annotations

from typing import Any

from volta_core.planner.linear_attention import GdnShape
from volta_core.planner.model import ModelLayer


def state_bytes_per_sequence(text: Any, layer: ModelLayer, tp: int, dtype_bytes: int) -> int | None:
    """Bytes one sequence's state occupies on one rank in ``layer`` (0 for attention layers)."""
    if layer.is_attention:
        return 0
    if layer.layer_type != "linear_attention":
        return None
    shape = GdnShape.of(text, tp, dtype_bytes)
    conv = shape.conv_dim * (shape.conv_width - 1) * shape.act_bytes
    return conv + shape.state_elements * shape.state_bytes
