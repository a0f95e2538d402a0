"""The paged KV-cache format this plugin writes, and the scale algebra every reader must follow.

This module is the contract with the attention kernels (``vllm-volta-attn-v100`` reads what this
plugin writes; plugins never import each other, so that side follows this text and the README).

Layout (vLLM 0.32/0.33: ``vllm/v1/kv_cache_interface.py`` and ``KVCacheLayout``): each
attention layer's cache is a 4-D tensor with logical
shape ``[num_blocks, num_kv_heads, block_size, head_size_k + head_size_v]``: K in the first
``head_size_k`` entries of the last dim, V in the next ``head_size_v``. The physical order of the
first three dims is whatever vLLM's ``KVCacheLayout`` chose: kernels take the strides of those
three dims and require only the last dim to be contiguous. Token ``t`` with slot ``s`` lives in
block ``s // block_size`` at offset ``s % block_size``; a negative slot is a padding token and is
not written.

Element formats (``storage dtype`` is what the tensor holds):

* ``float16`` (``auto`` on fp16 models): the activation values, unscaled; storage ``float16``.
* ``fp8_e5m2``: storage ``uint8`` holding e5m2 codes (1 sign, 5 exponent, 2 mantissa bits, bias
  15, max 57344): the high byte of an fp16. Runs on SM70.
* ``fp8_e4m3``: storage ``uint8`` holding e4m3fn codes (bias 7, max 448, no infinities). SM89+.

Scale semantics (one float32 ``s_k[h]`` and ``s_v[h]`` per KV head ``h``; a per-tensor scale is
the same value for every head): writing stores ``code = fp8(x · r)`` with ``r = 1/s`` rounded once
to float32 (IEEE division, as ``torch.reciprocal``), the product rounded once to float32, then to
FP8 to nearest even and saturated to the largest finite code; reading recovers
``x̂ = decode(code) · s``. (``x · r`` differs from vLLM's ``x / s`` by at most one float32 ulp
before the FP8 rounding, which changes a code only when ``x / s`` lies within that ulp of an FP8
rounding midpoint; a multiply is what makes the write kernel memory-bound on the H100.)

Attention never needs ``x̂`` itself: with ``softmax_scale`` the usual ``1/sqrt(head_size)``,
for query head ``q`` of KV head ``h``

* K scale after Q·K:   ``logits[j] = (softmax_scale · s_k[h]) · (q · decode(K[j]))``
* V scale on the probabilities before P·V:   ``out = (s_v[h] · p) · decode(V)``, with
  ``p = softmax(logits)``

which equal attention over ``x̂`` exactly in real arithmetic (``s_k[h]`` and ``s_v[h]`` are
constant over tokens and channels of a head), so a tile of codes is decoded (e5m2: ``code << 8``
is the fp16 bit pattern) and fed to the dots unscaled. The tests pin this in float64.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from volta_fp8kv.configs import FORMAT_CODES


class CacheFormat(str, enum.Enum):
    """A KV-cache element format, spelled as the canonical ``--kv-cache-dtype``."""

    FLOAT16 = "float16"
    FP8_E5M2 = "fp8_e5m2"
    FP8_E4M3 = "fp8_e4m3"

    @property
    def storage_dtype(self) -> torch.dtype:
        """What the cache tensor holds: fp16 values or uint8 codes."""
        return torch.float16 if self is CacheFormat.FLOAT16 else torch.uint8

    @property
    def element_bytes(self) -> int:
        return 2 if self is CacheFormat.FLOAT16 else 1

    @property
    def kernel_code(self) -> int:
        """The ``FMT`` constexpr of the kernels (see :mod:`volta_core.kernel_api`)."""
        return FORMAT_CODES[self.value]

    @property
    def torch_fp8_dtype(self) -> torch.dtype | None:
        """The torch FP8 dtype whose bit pattern the codes use (None for float16)."""
        return {
            CacheFormat.FLOAT16: None,
            CacheFormat.FP8_E5M2: torch.float8_e5m2,
            CacheFormat.FP8_E4M3: torch.float8_e4m3fn,
        }[self]

    @property
    def max_finite(self) -> float:
        return {CacheFormat.FLOAT16: 65504.0, CacheFormat.FP8_E5M2: 57344.0}.get(self, 448.0)

    @property
    def needs_e4m3(self) -> bool:
        return self is CacheFormat.FP8_E4M3


def cache_format(kv_cache_dtype: str) -> CacheFormat:
    """The format for a ``--kv-cache-dtype`` (``fp8`` is e4m3, as in vLLM)."""
    spelled = {"fp8": "fp8_e4m3", "auto": "float16", "half": "float16"}.get(
        kv_cache_dtype, kv_cache_dtype
    )
    try:
        return CacheFormat(spelled)
    except ValueError:
        known = ", ".join(f.value for f in CacheFormat)
        raise ValueError(
            f"KV-cache dtype {kv_cache_dtype!r} is not one this plugin writes ({known})"
        ) from None


@dataclass(frozen=True)
class CacheGeometry:
    """The logical shape of one layer's paged cache."""

    num_blocks: int
    num_kv_heads: int
    block_size: int
    head_size_k: int
    head_size_v: int

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.num_blocks, self.num_kv_heads, self.block_size, self.entry_size)

    @property
    def entry_size(self) -> int:
        return self.head_size_k + self.head_size_v

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size


def bytes_per_token(num_kv_heads: int, head_size_k: int, head_size_v: int, fmt: CacheFormat) -> int:
    """Bytes one token takes in one layer's cache: e5m2 is exactly half of fp16."""
    return num_kv_heads * (head_size_k + head_size_v) * fmt.element_bytes


def empty_cache(
    geometry: CacheGeometry, fmt: CacheFormat, device: torch.device | str | None = None
) -> torch.Tensor:
    """A contiguous cache tensor of the layout above (vLLM allocates its own; this is for tests)."""
    return torch.empty(geometry.shape, dtype=fmt.storage_dtype, device=device)


# -- reference implementations (torch, for tests and verification) --------------------------


def encode_reference(x: torch.Tensor, scale: torch.Tensor, fmt: CacheFormat) -> torch.Tensor:
    """Codes the kernels must produce for ``x`` (``[..., H, D]``) with per-head ``scale``.

    ``x`` times the float32 reciprocal of the scale, then torch's float32 -> FP8 conversion
    (round to nearest even), made saturating: torch turns e5m2 overflow into infinity, the cache
    keeps the largest finite code instead.
    """
    dtype = fmt.torch_fp8_dtype
    if dtype is None:
        raise ValueError("float16 caches store values, not codes")
    y = x.float() * torch.reciprocal(scale.float()).reshape(-1, 1)
    y = torch.where(y.isnan(), y, y.clamp(-fmt.max_finite, fmt.max_finite))
    return y.to(dtype).view(torch.uint8)


def decode_reference(
    codes: torch.Tensor,
    scale: torch.Tensor,
    fmt: CacheFormat,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Values of ``codes`` (``[..., H, D]``) times the per-head ``scale``, computed in ``dtype``.

    float32 is what the gather kernel computes (one rounding); float64 is exact.
    """
    fp8 = fmt.torch_fp8_dtype
    if fp8 is None:
        raise ValueError("float16 caches store values, not codes")
    return codes.view(fp8).to(dtype) * scale.to(dtype).reshape(-1, 1)


def attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float
) -> torch.Tensor:
    """Causal-free attention of one sequence in float64: q ``[Hq, D]``, k/v ``[T, Hkv, D]``.

    Query head ``i`` reads KV head ``i // (Hq // Hkv)`` (grouped-query attention).
    """
    group = q.shape[0] // k.shape[1]
    k64 = k.double().repeat_interleave(group, dim=1)
    v64 = v.double().repeat_interleave(group, dim=1)
    logits = torch.einsum("hd,thd->ht", q.double(), k64) * softmax_scale
    return torch.einsum("ht,thd->hd", torch.softmax(logits, dim=-1), v64)


def attention_scale_folded(
    q: torch.Tensor,
    k_codes: torch.Tensor,
    v_codes: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    softmax_scale: float,
    fmt: CacheFormat,
) -> torch.Tensor:
    """Attention as a reader of this cache computes it, in float64: codes decoded *unscaled*,
    the K scale applied to the Q·K logits and the V scale to the probabilities before P·V.
    """
    group = q.shape[0] // k_codes.shape[1]
    one = torch.ones(1)
    k_dec = decode_reference(k_codes, one, fmt, torch.float64).repeat_interleave(group, dim=1)
    v_dec = decode_reference(v_codes, one, fmt, torch.float64).repeat_interleave(group, dim=1)
    s_k = k_scale.double().reshape(-1).expand(k_codes.shape[1]).repeat_interleave(group)
    s_v = v_scale.double().reshape(-1).expand(v_codes.shape[1]).repeat_interleave(group)
    logits = torch.einsum("hd,thd->ht", q.double(), k_dec) * (softmax_scale * s_k[:, None])
    probs = torch.softmax(logits, dim=-1) * s_v[:, None]
    return torch.einsum("ht,thd->hd", probs, v_dec)
