"""What the backend declares and the launchers accept, per compute capability.

Pure Python (no torch, triton or vllm; the SM89 e4m3 rule is the host's): the plugin module
builds its declaration from these at discovery, and the launchers refuse anything outside them
before a kernel runs.
"""

from __future__ import annotations

from volta_core import FP8_E4M3_MIN_CAPABILITY

#: Lowest and highest compute capability the kernels are proven on: SM70 through the compile
#: gate and the interpreter (the SM70 tables), SM90 on the H100 (the SM80 tables).
MIN_CAPABILITY = (7, 0)
MAX_CAPABILITY = (9, 0)

#: Activation dtypes the kernels run.
DTYPES: tuple[str, ...] = ("float16",)

#: Head sizes the kernels are tested for; 512 is Gemma-4's global layers.
HEAD_SIZES: tuple[int, ...] = (64, 80, 96, 128, 256, 512)

#: KV-cache dtypes the kernels read (canonical spellings; fp8 caches hold bytes).
KV_DTYPES: tuple[str, ...] = ("float16", "fp8_e5m2", "fp8_e4m3")

#: The lowest compute capability that converts fp8 e4m3 in hardware, the host's rule
#: (:data:`volta_core.FP8_E4M3_MIN_CAPABILITY`): e4m3 is declared from there only.
E4M3_MIN_CAPABILITY = FP8_E4M3_MIN_CAPABILITY

#: Declared KV dtypes that need more than :data:`MIN_CAPABILITY`.
KV_DTYPE_MIN_CAPABILITY: dict[str, tuple[int, int]] = {"fp8_e4m3": E4M3_MIN_CAPABILITY}

#: Most query tokens per sequence on the split-KV decode path (speculative verification).
MAX_DECODE_QUERY_LEN = 8

#: Most KV partitions per sequence: bounds the partial buffers and the combine's serial walk.
MAX_SPLITS = 64

#: How the kernels read fp8 codes as fp16 (their ``FP8_DECODE``), every way exact: e5m2 as the
#: high byte of an fp16 (``byte << 8``) or converted in hardware (SM89+); e4m3 converted in
#: hardware (SM89+) or, under the interpreter, decoded in integer arithmetic by the host's
#: codec (the interpreter's own fp8 conversions are wrong: docs/kernels.md#sm70-facts).
FP8_E5M2_SHIFT = 0
FP8_E5M2_NATIVE = 1
FP8_E4M3_NATIVE = 2
FP8_E4M3_INTEGER = 3


def fp8_decode(kv_dtype: str, capability: tuple[int, int]) -> int:
    """The kernels' ``FP8_DECODE`` for a KV dtype on a device (0 for fp16, which reads no
    codes): the hardware conversion from SM89, else the shift or the integer decode (e4m3
    below SM89 only under the interpreter: :func:`kv_dtype_refusal` refuses it on a GPU)."""
    native = capability >= E4M3_MIN_CAPABILITY
    if kv_dtype == "fp8_e4m3":
        return FP8_E4M3_NATIVE if native else FP8_E4M3_INTEGER
    if kv_dtype == "fp8_e5m2" and native:
        return FP8_E5M2_NATIVE
    return FP8_E5M2_SHIFT


def kv_dtype_refusal(kv_dtype: str, capability: tuple[int, int]) -> str | None:
    """Why a GPU of this capability cannot run a cache of this KV dtype, or None if it can."""
    needed = KV_DTYPE_MIN_CAPABILITY.get(kv_dtype)
    if needed is None or capability >= needed:
        return None
    return (
        f"KV-cache dtype {kv_dtype!r} needs compute capability {needed[0]}.{needed[1]} or newer "
        f"(hardware e4m3 conversion; Triton's fp8e4nv does not compile below it), this device "
        f"has {capability[0]}.{capability[1]}; use fp8_e5m2"
    )


def head_pad(head_size: int) -> int:
    """The power of two a head is padded to inside the kernels."""
    return 1 << (head_size - 1).bit_length()
