"""What vLLM's Gated DeltaNet kernels cost on a V100: bytes and FMA FLOPs, kernel by kernel.

A Gated DeltaNet layer (Qwen3-Next, Qwen3.5/3.6 ``linear_attention``) runs FLA's Triton kernels
(vLLM's ``model_executor/layers/fla/ops/``; ``third_party/flash_linear_attention/ops/`` from 0.32).
On sm_70 Triton's ``tl.dot`` is unrolled FMAs, so every product below runs on the FMA units.
Each launch is priced as ``max(bytes / HBM, FLOPs / FMA)``
(:class:`~volta_core.host.dispatch.LaunchCost`). One rank's shapes: ``Hg`` key heads and ``H``
value heads (the config's over TP), head dims ``K`` and ``V``, conv width ``W``, conv channels
``C = 2 Hg K + H V``; activations ``a`` bytes (fp16 on a V100), the recurrent state ``s``
bytes (``mamba_ssm_dtype``: fp32 in the published Qwen3.5/3.6 configs, else the model dtype, as
vLLM's ``Qwen3_5ForConditionalGenerationConfig`` sets ``mamba_ssm_cache_dtype``). Bytes are
each tensor read or written once (a value head's programs share their key head's tiles in L2).

**Decode** of ``n`` sequences with ``q`` new tokens each (``N = n q`` tokens;
``gdn_linear_attn.py``)::

    _causal_conv1d_update_kernel   bytes a (2 N C + n C (W - 1) (1 + q) + C W)   FLOPs 2 W C N
                                   (causal_conv1d.py: the conv state read, shifted, written)
    fused_sigmoid_gating_          bytes n H V K s (1 + q)  (the state: read once, written
      delta_rule_update_kernel           after each token, fused_sigmoid_gating.py)
                                         + a N (2 Hg K + 2 H V + 2 H)  (q, k, v, a, b; o)
                                   FLOPs 7 N H K V  (decay, k.h, rank-1 update, q.h)
    layer_norm_fwd_kernel          bytes a (3 N H V + V)   FLOPs 6 N H V  (the gated RMSNorm,
                                   layernorm_guard.py)

``fused_recurrent_gated_delta_rule_packed_decode_kernel`` (fused_recurrent.py, taken with
``VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE``) reads the conv output instead of q, k and v: the
same bytes and FLOPs.

**Prefill** of one ``T``-token chunk of one sequence (``chunk.py``: chunk size ``BT = 64``,
``NT = ceil(T / 64)`` chunks)::

    _causal_conv1d_fwd_kernel      bytes a (2 T C + C W) + 2 a C (W - 1)   FLOPs 2 W C T
    fused_gdn_gating_kernel        bytes T H (2 a + 4 + a)   FLOPs 8 T H  (g fp32, beta)
    l2norm_fwd_kernel2 (q, then k) bytes 2 a T Hg K each   FLOPs 3 T Hg K each (l2norm.py)
    chunk_local_cumsum_scalar_     bytes 8 T H   FLOPs T H  (cumsum.py)
      kernel
    chunk_scaled_dot_kkt_fwd_      bytes a T Hg K + T H (a + 4) + 4 T H BT
      kernel                       FLOPs 2 T H BT K  (beta k k^T per chunk, fp32 out)
    merge_16x16_to_64x64_          bytes T H BT (4 + a)   FLOPs T H x 159744 / 64  (four 16 x
      inverse_kernel               16 forward substitutions of 14 rows, 16 16x16x16 products
                                   per chunk; solve_tril.py)
    recompute_w_u_fwd_kernel       bytes a (T Hg K + T H V + T H BT + T H K + T H V) + T H (a + 4)
                                   FLOPs 2 T H BT (K + V)  (u = A (beta v), w = A (beta g k);
                                   wy_fast.py)
    chunk_gated_delta_rule_fwd_    bytes a (T Hg K + T H K + 2 T H V + NT H V K) + 4 T H
      kernel_h_blockdim64                + (s + 4) H V K
                                   FLOPs 4 T H K V  (w h^T and k^T v per chunk;
                                   chunk_delta_h.py: h of every chunk written, the state read,
                                   the final state written in fp32)
    chunk_fwd_kernel_o             bytes a (2 T Hg K + 2 T H V + NT H V K) + 4 T H
                                   FLOPs T H (2 K V + 2 BT K V / BV + 2 BT V)  (q h^T, q k^T
                                   once per BV-wide value block, A v; chunk_o.py, BV = 64, the
                                   widest it tries on sm_70)
    layer_norm_fwd_kernel          as in decode, N = T

1Cat-vLLM and vLLM 0.32+ fold the gating and the l2norms into ``_fused_post_conv_kernel``
(``fused_gdn_prefill_post_conv.py``): bytes ``a (2 T C + 2 T H) + 8 T H``, FLOPs
``3 T (2 Hg K) + 8 T H``. Not counted: the initial state's gather and the final state's copy
into the cache (``s H V K`` each way), under 1 % of a 2048-token chunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from volta_core.host.dispatch import KernelCost, LaunchCost, Unit

#: What the project found of vLLM's FLA Gated DeltaNet kernels on sm_70, which the plan and
#: ``doctor --model`` state for a model that has such layers: every kernel a Qwen3.5/3.6 layer
#: launches compiles within 96 KB of shared memory with a configuration its autotuner keeps, in
#: each family (CI's ``tests/gdn_sm70``), and computes the recurrence at those configurations
#: within fp16 error of a float64 reference (the README's "Qwen3.5 / 3.6 Gated DeltaNet kernels
#: on sm_70").
SM70_VERDICT = (
    "vLLM's FLA Gated DeltaNet kernels run them; every one builds and fits sm_70 in vLLM 0.19, "
    "0.32-0.33 and 1Cat-vLLM 1.3, no plugin needed"
)

#: ``chunk_gated_delta_rule_fwd``'s chunk size (chunk.py).
CHUNK = 64

#: ``chunk_fwd_kernel_o``'s value block: the widest of ``BKV_LIST`` (32, 64 where a block has
#: under 100 KB of shared memory, as on sm_70); its ``q k^T`` is recomputed per value block.
O_BLOCK_V = 64

#: FLOPs of ``merge_16x16_to_64x64_inverse_kernel`` per 64-token chunk and value head: four
#: 16 x 16 forward substitutions (rows 2-15, 2 x 16 x 16 each) and 16 products of 16 x 16 x 16.
SOLVE_TRIL_FLOPS = 4 * 14 * 2 * 16 * 16 + 16 * 2 * 16**3

#: The decode and prefill kernels of vLLM 0.19's layer, in launch order.
DECODE_KERNELS = (
    "_causal_conv1d_update_kernel",
    "fused_sigmoid_gating_delta_rule_update_kernel",
    "layer_norm_fwd_kernel",
)
PREFILL_KERNELS = (
    "_causal_conv1d_fwd_kernel",
    "fused_gdn_gating_kernel",
    "l2norm_fwd_kernel2",
    "chunk_local_cumsum_scalar_kernel",
    "chunk_scaled_dot_kkt_fwd_kernel",
    "merge_16x16_to_64x64_inverse_kernel",
    "recompute_w_u_fwd_kernel",
    "chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
    "chunk_fwd_kernel_o",
    "layer_norm_fwd_kernel",
)

_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


@dataclass(frozen=True)
class GdnShape:
    """One rank's share of a Gated DeltaNet layer and its element sizes."""

    key_heads: int
    value_heads: int
    head_k: int
    head_v: int
    conv_width: int
    act_bytes: int = 2
    state_bytes: int = 4

    def __post_init__(self) -> None:
        sizes = (self.key_heads, self.value_heads, self.head_k, self.head_v, self.conv_width)
        if min(sizes) < 1:
            raise ValueError(f"a Gated DeltaNet layer has heads, head dims and a conv: {self}")

    @classmethod
    def of(cls, text: Any, tp: int, act_bytes: int) -> GdnShape:
        """The layer of ``text`` (a Qwen3.5/3.6 or Qwen3-Next text config) on one of ``tp``
        ranks, with activations of ``act_bytes``."""
        ssm = getattr(text, "mamba_ssm_dtype", None)
        state = _DTYPE_BYTES.get(str(ssm).removeprefix("torch."), act_bytes) if ssm else act_bytes
        return cls(
            int(text.linear_num_key_heads) // tp,
            int(text.linear_num_value_heads) // tp,
            int(text.linear_key_head_dim),
            int(text.linear_value_head_dim),
            int(getattr(text, "linear_conv_kernel_dim", 4)),
            act_bytes,
            state,
        )

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_heads * self.head_k + self.value_heads * self.head_v

    @property
    def state_elements(self) -> int:
        return self.value_heads * self.head_v * self.head_k


def _fma(name: str, nbytes: float, flops: float) -> KernelCost:
    return KernelCost(name, (LaunchCost(int(nbytes), 0, int(flops), Unit.FMA),))


def _gated_rmsnorm(s: GdnShape, tokens: int) -> KernelCost:
    n = tokens * s.value_heads * s.head_v
    return _fma("layer_norm_fwd_kernel", s.act_bytes * (3 * n + s.head_v), 6 * n)


def _conv_update(s: GdnShape, sequences: int, query: int) -> KernelCost:
    c, w, a, tokens = s.conv_dim, s.conv_width, s.act_bytes, sequences * query
    state = sequences * c * (w - 1) * (1 + query)
    return _fma(
        "_causal_conv1d_update_kernel", a * (2 * tokens * c + state + c * w), 2 * w * c * tokens
    )


def _recurrent(name: str, s: GdnShape, sequences: int, query: int) -> KernelCost:
    tokens, h, a = sequences * query, s.value_heads, s.act_bytes
    state = sequences * s.state_elements * s.state_bytes * (1 + query)
    io = a * tokens * (2 * s.key_heads * s.head_k + 2 * h * s.head_v + 2 * h)
    return _fma(name, state + io, 7 * tokens * s.state_elements)


def decode_kernel(name: str, s: GdnShape, sequences: int, query: int = 1) -> KernelCost:
    """One decode kernel's cost for ``sequences`` sequences of ``query`` new tokens each."""
    if name == "_causal_conv1d_update_kernel":
        return _conv_update(s, sequences, query)
    if name in (
        "fused_sigmoid_gating_delta_rule_update_kernel",
        "fused_recurrent_gated_delta_rule_packed_decode_kernel",
    ):
        return _recurrent(name, s, sequences, query)
    if name == "layer_norm_fwd_kernel":
        return _gated_rmsnorm(s, sequences * query)
    raise ValueError(f"no SM70 cost for the Gated DeltaNet decode kernel {name!r}")


def decode_step(s: GdnShape, sequences: int, query: int = 1) -> list[KernelCost]:
    """The layer's decode kernels (vLLM 0.19's path), each priced."""
    return [decode_kernel(name, s, sequences, query) for name in DECODE_KERNELS]


def _prefill_costs(s: GdnShape, t: int) -> dict[str, Callable[[], KernelCost]]:
    a, h, hg, k, v, c, w = (
        s.act_bytes,
        s.value_heads,
        s.key_heads,
        s.head_k,
        s.head_v,
        s.conv_dim,
        s.conv_width,
    )
    bt, nt = CHUNK, math.ceil(t / CHUNK)
    th, tk = t * h, t * hg * k
    state = s.state_elements
    return {
        "_causal_conv1d_fwd_kernel": lambda: _fma(
            "_causal_conv1d_fwd_kernel",
            a * (2 * t * c + c * w + 2 * c * (w - 1)),
            2 * w * c * t,
        ),
        "fused_gdn_gating_kernel": lambda: _fma(
            "fused_gdn_gating_kernel", th * (2 * a + 4 + a), 8 * th
        ),
        "_fused_post_conv_kernel": lambda: _fma(
            "_fused_post_conv_kernel", a * (2 * t * c + 2 * th) + 8 * th, 3 * 2 * tk + 8 * th
        ),
        "l2norm_fwd_kernel2": lambda: KernelCost(
            "l2norm_fwd_kernel2",
            tuple(LaunchCost(2 * a * tk, 0, 3 * tk, Unit.FMA) for _ in ("q", "k")),
        ),
        "chunk_local_cumsum_scalar_kernel": lambda: _fma(
            "chunk_local_cumsum_scalar_kernel", 8 * th, th
        ),
        "chunk_scaled_dot_kkt_fwd_kernel": lambda: _fma(
            "chunk_scaled_dot_kkt_fwd_kernel",
            a * tk + th * (a + 4) + 4 * th * bt,
            2 * th * bt * k,
        ),
        "merge_16x16_to_64x64_inverse_kernel": lambda: _fma(
            "merge_16x16_to_64x64_inverse_kernel",
            th * bt * (4 + a),
            nt * h * SOLVE_TRIL_FLOPS,
        ),
        "recompute_w_u_fwd_kernel": lambda: _fma(
            "recompute_w_u_fwd_kernel",
            a * (tk + 2 * th * v + th * bt + th * k) + th * (a + 4),
            2 * th * bt * (k + v),
        ),
        "chunk_gated_delta_rule_fwd_kernel_h_blockdim64": lambda: _fma(
            "chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
            a * (tk + th * k + 2 * th * v + nt * state) + (s.state_bytes + 4) * state + 4 * th,
            4 * th * k * v,
        ),
        "chunk_fwd_kernel_o": lambda: _fma(
            "chunk_fwd_kernel_o",
            a * (2 * tk + 2 * th * v + nt * state) + 4 * th,
            th * (2 * k * v + 2 * bt * k * math.ceil(v / O_BLOCK_V) + 2 * bt * v),
        ),
        "layer_norm_fwd_kernel": lambda: _gated_rmsnorm(s, t),
    }


def prefill_kernel(name: str, s: GdnShape, tokens: int) -> KernelCost:
    """One prefill kernel's cost for one sequence's ``tokens``-token chunk."""
    if tokens < 1:
        raise ValueError(f"a prefill chunk has at least one token, not {tokens}")
    costs = _prefill_costs(s, tokens)
    if name not in costs:
        raise ValueError(f"no SM70 cost for the Gated DeltaNet prefill kernel {name!r}")
    return costs[name]()


def prefill_chunk(s: GdnShape, tokens: int) -> list[KernelCost]:
    """The layer's prefill kernels for one ``tokens``-token chunk (vLLM 0.19's path)."""
    if tokens < 1:
        raise ValueError(f"a prefill chunk has at least one token, not {tokens}")
    costs = _prefill_costs(s, tokens)
    return [costs[name]() for name in PREFILL_KERNELS]
