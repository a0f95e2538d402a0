"""The KV-cache dtype rules of this plugin: which FP8 KV format runs where, and with which scales.

Pure functions of a :class:`~volta_core.KVRequest`, so the plan and the vLLM adapter see the
same verdict. The rules (README, "KV-dtype policy"):

* ``fp8`` / ``fp8_e4m3`` needs SM89: below it Triton cannot convert e4m3 (``fp8e4nv``), so the
  request is rejected with that reason and ``fp8_e5m2`` is suggested.
* ``fp8_e5m2`` runs everywhere. A checkpoint without KV scales (weight-only int4/int8/AWQ/GPTQ,
  dense FP8 weights without a ``kv_cache_scheme``, unquantized) gets unit scales: e5m2 has the
  exponent range of fp16, so fp16 activations need no scale.
* A checkpoint that ships K/V scales (per-tensor or per-attention-head) has them honoured: the
  cache stores ``fp8(x · (1/scale))`` and attention multiplies back by the scale. Scales calibrated
  for e4m3 are still applied on e5m2, with a warning that says exactly that and what it costs;
  scales calibrated for e5m2 are refused on an e4m3 cache, where they would saturate.

Kept free of torch and triton: loading the plugin must not import them.
"""

from __future__ import annotations

from volta_core import (
    FP8_E4M3_MIN_CAPABILITY,
    FP8_KV_CACHE_DTYPES,
    CheckpointKV,
    KVRequest,
    KVScaleScheme,
    KVVerdict,
    canonical_kv_dtype,
)

_E4M3_MAJOR, _E4M3_MINOR = FP8_E4M3_MIN_CAPABILITY

#: Largest finite magnitude of each FP8 format (e4m3 is the ``fn`` variant vLLM uses).
FP8_MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}

#: Mantissa bits of each FP8 format: round-to-nearest errs by at most 2**-(bits + 1) relative.
FP8_MANTISSA_BITS = {"fp8_e4m3": 3, "fp8_e5m2": 2}

#: ``KVVerdict.scales`` values, for the plan and the adapter: unit scales, or the checkpoint's.
SCALES_UNIT = "unit"
SCALES_CHECKPOINT = {
    KVScaleScheme.PER_TENSOR: "checkpoint:per_tensor",
    KVScaleScheme.PER_ATTENTION_HEAD: "checkpoint:per_attention_head",
}

_LAYOUT_WORDS = {
    KVScaleScheme.PER_TENSOR: "per-tensor",
    KVScaleScheme.PER_ATTENTION_HEAD: "per-attention-head ([num_kv_heads])",
}


def kv_cache_verdict(request: KVRequest) -> KVVerdict | None:
    """Judge an FP8 KV-cache request; ``None`` (no opinion) for fp16/bf16/auto caches."""
    dtype = canonical_kv_dtype(request.kv_cache_dtype, request.activation_dtype)
    if dtype not in FP8_KV_CACHE_DTYPES:
        return None
    if dtype == "fp8_e4m3":
        return _e4m3_verdict(request)
    return _e5m2_verdict(request)


def _e4m3_verdict(request: KVRequest) -> KVVerdict:
    device, ckpt = request.device, request.checkpoint
    if not device.has_fp8_e4m3:
        scales_note = ""
        if ckpt.scheme is not KVScaleScheme.NONE:
            scales_note = (
                f" (the checkpoint's {_LAYOUT_WORDS[ckpt.scheme]} K/V scales are then applied "
                "to the e5m2 cache, with a warning saying how)"
            )
        return KVVerdict.reject(
            f"--kv-cache-dtype {request.kv_cache_dtype} stores e4m3, which needs compute "
            f"capability {_E4M3_MAJOR}.{_E4M3_MINOR} or newer: {device} has no e4m3 conversion "
            f"(Triton's fp8e4nv does not compile below SM{_E4M3_MAJOR}{_E4M3_MINOR}), so no "
            "kernel can write or read that cache here. "
            f"Use --kv-cache-dtype fp8_e5m2{scales_note}."
        )
    if ckpt.scheme is KVScaleScheme.NONE:
        return KVVerdict.accept(
            f"e4m3 KV cache on {device.sm}; {_no_scales(ckpt)}",
            "the checkpoint ships no KV scales: e4m3 with unit scales saturates every K/V "
            f"element above {FP8_MAX['fp8_e4m3']:g} in magnitude; fp8_e5m2 needs no scale",
            scales=SCALES_UNIT,
        )
    if ckpt.calibrated_for == "fp8_e5m2":
        return KVVerdict.reject(
            f"the checkpoint's {_LAYOUT_WORDS[ckpt.scheme]} K/V scales were calibrated for "
            f"e5m2 (|x|/scale up to {FP8_MAX['fp8_e5m2']:g}); an e4m3 cache saturates at "
            f"{FP8_MAX['fp8_e4m3']:g}, so those scales would clip the cache. "
            "Use --kv-cache-dtype fp8_e5m2."
        )
    warnings = ()
    if ckpt.calibrated_for is None:
        warnings = (
            "the checkpoint does not state which FP8 format its KV scales were calibrated for; "
            "they are applied as e4m3 scales",
        )
    return KVVerdict.accept(
        f"e4m3 KV cache on {device.sm} with the checkpoint's {_LAYOUT_WORDS[ckpt.scheme]} "
        f"K/V scales ({_source(ckpt)})",
        *warnings,
        scales=SCALES_CHECKPOINT[ckpt.scheme],
    )


def _e5m2_verdict(request: KVRequest) -> KVVerdict:
    device, ckpt = request.device, request.checkpoint
    if ckpt.scheme is KVScaleScheme.NONE:
        reason = f"e5m2 KV cache on {device.sm}; {_no_scales(ckpt)}"
        if ckpt.weight_format == "fp8":
            reason += (
                " (vLLM's own gate refuses e5m2 for fp8 checkpoints; this one has no KV "
                "scales to conflict with)"
            )
        return KVVerdict.accept(reason, scales=SCALES_UNIT)
    reason = (
        f"e5m2 KV cache on {device.sm} with the checkpoint's {_LAYOUT_WORDS[ckpt.scheme]} "
        f"K/V scales ({_source(ckpt)})"
    )
    if ckpt.calibrated_for == "fp8_e5m2":
        return KVVerdict.accept(reason, scales=SCALES_CHECKPOINT[ckpt.scheme])
    return KVVerdict.accept(
        reason, *_calibrated_for_e4m3_warnings(request), scales=SCALES_CHECKPOINT[ckpt.scheme]
    )


def _calibrated_for_e4m3_warnings(request: KVRequest) -> tuple[str, ...]:
    """Say exactly what becomes of e4m3-calibrated scales in an e5m2 cache."""
    ckpt = request.checkpoint
    target = ckpt.calibrated_for or "an unstated FP8 format (taken as e4m3)"
    e4, e5 = FP8_MANTISSA_BITS["fp8_e4m3"], FP8_MANTISSA_BITS["fp8_e5m2"]
    applied = (
        f"the checkpoint's {_LAYOUT_WORDS[ckpt.scheme]} K/V scales, calibrated for {target}, "
        "are applied unchanged to the e5m2 cache: each element is stored as "
        "e5m2(x · (1/scale)) and attention multiplies back by the scale (K after Q·K, V on the "
        "probabilities before P·V). The calibration aimed |x|/scale at e4m3's maximum "
        f"{FP8_MAX['fp8_e4m3']:g}; e5m2 reaches {FP8_MAX['fp8_e5m2']:g}, so nothing saturates "
        f"that e4m3 would have kept, but e5m2 has {e5} mantissa bits instead of {e4}: each "
        f"element rounds to within 2^-{e5 + 1} relative instead of 2^-{e4 + 1}, so the accuracy "
        "the checkpoint was calibrated for is not reproduced"
    )
    warnings = [applied]
    if request.device.has_fp8_e4m3:
        warnings.append(
            f"{request.device.sm} has e4m3: --kv-cache-dtype fp8 would use these scales as "
            "calibrated"
        )
    warnings.append(
        "query and probability scales in the checkpoint (q_scale, prob_scale) are not used: "
        "queries and probabilities stay in fp16"
    )
    return tuple(warnings)


def _no_scales(ckpt: CheckpointKV) -> str:
    kind = {
        "fp16": "unquantized checkpoint",
        "fp8": "dense FP8-weight checkpoint without KV scales",
    }.get(ckpt.weight_format, f"weight-only ({ckpt.weight_format}) checkpoint")
    return f"{kind}: unit K/V scales (1.0), no checkpoint scales loaded"


def _source(ckpt: CheckpointKV) -> str:
    return ckpt.source or "checkpoint"
