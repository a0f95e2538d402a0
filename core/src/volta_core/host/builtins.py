"""vLLM's own attention backends, declared with the limits they really have on CUDA.

The host falls back to these only where they are valid for a layer. The declarations are read
from vLLM 0.32/0.33 (``vllm/v1/attention/backends/triton_attn.py``): TRITON_ATTN accepts any
head size of at least 32 and block sizes that are multiples of 16, but its impl raises for any
fp8 KV cache below SM89 and for a bf16 KV cache below SM80 (``TritonAttentionImpl``'s
constructor), which ``kv_dtype_min_capability`` records so a plan never picks it where it
would fail.
"""

from __future__ import annotations

from volta_core.device import BF16_MIN_CAPABILITY, FP8_E4M3_MIN_CAPABILITY
from volta_core.host.types import AttentionBackendSpec, AttentionFeature

TRITON_ATTN = AttentionBackendSpec(
    name="TRITON_ATTN",
    impl="vllm.v1.attention.backends.triton_attn:TritonAttentionBackend",
    priority=0,
    min_capability=(7, 0),
    max_capability=(12, 9),
    dtypes=frozenset({"float16", "bfloat16", "float32"}),
    kv_cache_dtypes=frozenset({"float16", "bfloat16", "float32", "fp8_e4m3", "fp8_e5m2"}),
    min_head_size=32,
    # Its impl converts fp8 of either kind in hardware only, from SM89.
    kv_dtype_min_capability={
        "fp8_e4m3": FP8_E4M3_MIN_CAPABILITY,
        "fp8_e5m2": FP8_E4M3_MIN_CAPABILITY,
        "bfloat16": BF16_MIN_CAPABILITY,
    },
    block_size_multiple=16,
    features=frozenset(AttentionFeature),
    vllm_name="TRITON_ATTN",
    builtin=True,
    notes="vLLM built-in; fallback only where valid",
)

#: Built-in backends in the order the host falls back to them.
BUILTIN_BACKENDS: tuple[AttentionBackendSpec, ...] = (TRITON_ATTN,)

#: 1Cat-vLLM's own V100 backend (CUDA WMMA), declared from its
#: ``vllm/v1/attention/backends/flash_attn_v100.py``: SM70 only, head sizes 64, 128 and 256
#: (``get_supported_head_sizes``; its validation asks TRITON_ATTN's ``supports_head_size``, which
#: let Gemma-4's 512-dim layers through to a kernel that has no 512 path), fp16, fp16 or e5m2
#: KV, block sizes of 16; what its fast paths lack it hands to the Triton code it subclasses.
FLASH_ATTN_V100 = AttentionBackendSpec(
    name="FLASH_ATTN_V100",
    impl="vllm.v1.attention.backends.flash_attn_v100:FlashAttnV100Backend",
    priority=0,
    min_capability=(7, 0),
    max_capability=(7, 0),
    dtypes=frozenset({"float16"}),
    kv_cache_dtypes=frozenset({"float16", "fp8_e5m2"}),
    head_sizes=frozenset({64, 128, 256}),
    block_size_multiple=16,
    features=frozenset(AttentionFeature),
    vllm_name="FLASH_ATTN_V100",
    builtin=True,
    notes="1Cat-vLLM 1.2-1.3 only; used only when named with --attention-backend",
)

#: The same backend in 1Cat-vLLM 1.4-1.5 (the ``flash_v100/`` package; 1.5.1, October 2026),
#: declared from its sources: ``backend.py`` keeps head sizes 64, 128 and 256
#: (``get_supported_head_sizes``, "aligned with the dense prefill kernel dispatch table") and
#: Triton's block sizes (multiples of 16; exactly 16 with ``VLLM_FLASH_V100_KERNEL_BLOCK_SIZE16``);
#: ``routing.py`` declares fp16, fp8_e4m3 and fp8_e5m2 as its native KV codecs (``codec.py``
#: maps ``fp8`` to E4M3; bf16 only through its Triton fallbacks, which SM70 cannot run); fp16
#: activations as before.
FLASH_ATTN_V100_1CAT_15 = AttentionBackendSpec(
    name="FLASH_ATTN_V100",
    impl="vllm.v1.attention.backends.flash_v100.backend:FlashAttnV100Backend",
    priority=0,
    min_capability=(7, 0),
    max_capability=(7, 0),
    dtypes=frozenset({"float16"}),
    kv_cache_dtypes=frozenset({"float16", "fp8_e4m3", "fp8_e5m2"}),
    head_sizes=frozenset({64, 128, 256}),
    block_size_multiple=16,
    features=frozenset(AttentionFeature),
    vllm_name="FLASH_ATTN_V100",
    builtin=True,
    notes="1Cat-vLLM 1.4-1.5 only; used only when named with --attention-backend",
)

#: Built-ins that exist in one vLLM family only: judged when named with
#: ``--attention-backend``, never a fallback. Without a known family, the current 1Cat release's.
NAMED_ONLY_BACKENDS: tuple[AttentionBackendSpec, ...] = (FLASH_ATTN_V100_1CAT_15,)

#: Per vLLM family (``volta_core.vllm.families.Family.name``): its own named-only backends.
FAMILY_NAMED_BACKENDS: dict[str, tuple[AttentionBackendSpec, ...]] = {
    "1Cat-vLLM 1.2-1.3": (FLASH_ATTN_V100,),
    "1Cat-vLLM 1.4-1.5": (FLASH_ATTN_V100_1CAT_15,),
}


def named_only_backends(family: str | None) -> tuple[AttentionBackendSpec, ...]:
    """The named-only built-ins of a vLLM family; for any other family, or none known (a
    planning machine), the current 1Cat release's (what a plan for it would run)."""
    return FAMILY_NAMED_BACKENDS.get(family or "", NAMED_ONLY_BACKENDS)


def _names(text: str) -> frozenset[str]:
    """A set of names written one after another, separated by white space."""
    return frozenset(text.split())


#: Every attention backend name vLLM 0.32 itself defines (``AttentionBackendEnum`` members), and
#: 1Cat-vLLM's ``FLASH_ATTN_V100``.
#: Reserved: a plugin backend of one of these names would be confused with vLLM's own in
#: ``--attention-backend``, listings and the engine's registry, unless it says it replaces it.
RESERVED_BACKENDS = _names(
    """
    AMX_MLA B12X CPU_ATTN CPU_MLA CUSTOM CUTLASS_MLA CUTLASS_MSA FLASHINFER FLASHINFER_MLA
    FLASHINFER_MLA_SPARSE FLASHINFER_MLA_SPARSE_DSV4 FLASHINFER_MLA_SPARSE_DSV41
    FLASHINFER_MLA_SPARSE_SM120 FLASHINFER_MLA_SPARSE_SM90 FLASHMLA FLASHMLA_MEGA_ATTN_DSV41
    FLASHMLA_SPARSE FLASHMLA_SPARSE_DSV4 FLASHMLA_SPARSE_DSV41 FLASH_ATTN FLASH_ATTN_DIFFKV
    FLASH_ATTN_MLA FLASH_ATTN_MLA_SPARSE FLEX_ATTENTION HPC_ATTN MINIMAX_M3_SPARSE NO_ATTENTION
    ROCM_AITER_FA ROCM_AITER_MLA ROCM_AITER_MLA_SPARSE ROCM_AITER_TRITON_MLA
    ROCM_AITER_UNIFIED_ATTN ROCM_ATTN ROCM_FLASHMLA_SPARSE_DSV4 ROCM_SEGMENTED_ATTN
    TOKENSPEED_MLA TORCH_SDPA TRITON_ATTN TRITON_ATTN_DIFFKV TRITON_FLASHINFER TRITON_FLASH_ATTN
    TRITON_MLA TRITON_MSA TURBOQUANT ULTRAQUANT XPU_MLA_SPARSE
    FLASH_ATTN_V100
    """
)

#: vLLM 0.32's quantization methods (``QUANTIZATION_METHODS``): the ``quant_method`` values a
#: checkpoint may state, and names a plugin's quant method may not take unless it replaces one.
QUANT_METHODS = _names(
    """
    auto_awq auto_gptq awq awq_marlin compressed-tensors deepseek_v4_fp8 experts_int8 fbgemm_fp8
    fp8 fp8_per_block fp8_per_channel fp8_per_tensor fp_quant gpt_oss_mxfp4 gptq gptq_marlin
    humming inc int8_per_channel_weight_only modelopt modelopt_fp4 modelopt_mixed modelopt_mxfp8
    moe_wna16 mxfp4 mxfp8 nvfp4_per_token online quark torchao
    """
)

#: vLLM 0.32's own reasoning parser names (``ReasoningParserManager``), reserved likewise.
REASONING_PARSERS = _names(
    """
    cohere_command3 cohere_command4 deepseek_r1 deepseek_v3 deepseek_v4 deepseek_v41 ernie45
    gemma4 glm45 glm47 granite granite_thinking_parser hf holo2 hunyuan_a13b hy_v3 hy_v4 inkling
    k2_horizon kimi_k2 kimi_k3 ling3 mimo minicpmv minimax_m2 minimax_m2_append_think minimax_m3
    mistral muse_glimmer nemotron_v3 olmo3 openai_gptoss plamo3 poolside_v1 qwen3 seed_oss step3
    step3p5
    """
)
