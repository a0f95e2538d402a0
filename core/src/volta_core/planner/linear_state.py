"""The fixed per-sequence state a linear-attention layer keeps instead of per-token KV.

A Gated DeltaNet layer (Qwen3-Next, Qwen3.5/3.6 ``linear_attention``) holds, per sequence and
per rank, whatever the context length (vLLM's ``MambaStateShapeCalculator
.gated_delta_net_state_shape``, state dtype = the model dtype when ``mamba_ssm_cache_dtype`` is
``auto``):

* a convolution state of ``(2 k_heads k_dim + v_heads v_dim) / tp x (conv_kernel - 1)``;
* a recurrent state of ``v_heads / tp x v_dim x k_dim``.

vLLM pads each layer's state page to the attention page size of the same model (it enlarges the
attention block size until one attention page holds at least one state page); that padding, a
fraction of a percent, is not counted. Other non-attention layer types (Mamba, short
convolutions) are not modelled: :func:`state_bytes_per_sequence` returns None for them and the
fit says so.
"""

from __future__ import annotations

from typing import Any

from volta_core.planner.model import ModelLayer


def state_bytes_per_sequence(text: Any, layer: ModelLayer, tp: int, dtype_bytes: int) -> int | None:
    """Bytes one sequence's state occupies on one rank in ``layer`` (0 for attention layers)."""
    if layer.is_attention:
        return 0
    if layer.layer_type != "linear_attention":
        return None
    nk, nv = int(text.linear_num_key_heads), int(text.linear_num_value_heads)
    dk, dv = int(text.linear_key_head_dim), int(text.linear_value_head_dim)
    kernel = int(getattr(text, "linear_conv_kernel_dim", 4))
    conv = (2 * nk * dk + nv * dv) // tp * (kernel - 1)
    recurrent = nv // tp * dv * dk
    return (conv + recurrent) * dtype_bytes
