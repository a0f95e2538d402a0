"""Declarations exchanged between the host and its plugins.

Plugins answer hooks with these small frozen dataclasses instead of code, so the host can check
them, print them (``vllm-volta plugins``, ``vllm-volta plan``) and resolve choices without importing
any kernel. Implementations are named by import path (``"package.module:Name"``) and imported only
by the vLLM adapter when a layer actually uses them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from volta_core.device import Device

#: Activation dtypes, spelled as vLLM spells ``--dtype``.
ACTIVATION_DTYPES = frozenset({"float16", "bfloat16", "float32"})

#: KV-cache dtypes, spelled as vLLM spells ``--kv-cache-dtype`` (``fp8`` means e4m3).
KV_CACHE_DTYPES = frozenset({"auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"})

#: KV-cache dtypes whose cache stores one byte per element.
FP8_KV_CACHE_DTYPES = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2"})


def canonical_kv_dtype(kv_cache_dtype: str, activation_dtype: str) -> str:
    """Spell a KV-cache dtype the one way declarations use.

    ``auto`` stores the cache in the activation dtype; ``fp8`` is e4m3 in vLLM.
    """
    if kv_cache_dtype == "auto":
        return activation_dtype
    if kv_cache_dtype == "fp8":
        return "fp8_e4m3"
    return kv_cache_dtype


class AttentionFeature(str, enum.Enum):
    """Something a layer needs from its attention backend beyond causal decoder attention."""

    SLIDING_WINDOW = "sliding_window"
    LOGITS_SOFT_CAP = "logits_soft_cap"
    SINKS = "sinks"
    ALIBI = "alibi"
    ENCODER = "encoder"
    """Bidirectional (non-causal) attention, as in encoder-only models."""


def _frozen(values: Any) -> frozenset[Any]:
    return values if isinstance(values, frozenset) else frozenset(values)


@dataclass(frozen=True)
class AttentionBackendSpec:
    """What an attention backend can run, declared as data.

    A layer is admitted when every one of its properties is inside the declaration; the
    resolution names the first property that is not, so the plan can say why a layer fell back.

    ``vllm_name`` is the ``AttentionBackendEnum`` member the adapter binds the backend to (vLLM
    looks backends up by member name, and members added at run time do not survive pickling into
    spawned processes). ``builtin`` marks vLLM's own backends, which the host only uses as
    fallbacks and never imports.
    """

    name: str
    impl: str
    priority: int
    min_capability: tuple[int, int]
    max_capability: tuple[int, int]
    dtypes: frozenset[str]
    kv_cache_dtypes: frozenset[str]
    head_sizes: frozenset[int] = frozenset()
    """The head sizes the kernels run; empty means any size of at least ``min_head_size``."""
    min_head_size: int = 0
    kv_dtype_min_capability: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """KV dtypes that need more than ``min_capability`` (e4m3 needs SM89)."""
    block_size_multiple: int = 16
    features: frozenset[AttentionFeature] = frozenset()
    vllm_name: str = "CUSTOM"
    builtin: bool = False
    notes: str = ""
    replaces_builtin: bool = False
    """The plugin means to take the name of one of vLLM's own backends (the plan says so);
    without it such a name is refused, so a plugin never shadows a built-in by accident."""
    kv_cache_layout: str = ""
    """The KV-cache layout whose writer the host provides (:class:`KVCacheOpsSpec`): the backend
    writes its cache through the plugin that owns the format, and is refused for a KV-cache
    dtype no plugin writes in that layout. Empty: the backend writes its own cache."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "head_sizes", _frozen(self.head_sizes))
        object.__setattr__(self, "dtypes", _frozen(self.dtypes))
        object.__setattr__(self, "kv_cache_dtypes", _frozen(self.kv_cache_dtypes))
        object.__setattr__(self, "features", _frozen(AttentionFeature(f) for f in self.features))
        object.__setattr__(
            self, "kv_dtype_min_capability", MappingProxyType(dict(self.kv_dtype_min_capability))
        )

    def __hash__(self) -> int:
        return hash((self.name, self.impl))


@dataclass(frozen=True)
class AttentionLayer:
    """One attention layer as the resolution sees it (per rank: heads already divided by TP)."""

    prefix: str
    head_size: int
    num_heads: int
    num_kv_heads: int
    dtype: str
    kv_cache_dtype: str
    block_size: int = 16
    features: frozenset[AttentionFeature] = frozenset()
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", _frozen(AttentionFeature(f) for f in self.features))


@dataclass(frozen=True)
class BackendRefusal:
    """Why one candidate backend did not take a layer."""

    backend: str
    reason: str
    other_device: bool = False
    """The backend targets other compute capabilities, so it was never a candidate here."""


@dataclass(frozen=True)
class AttentionChoice:
    """The backend chosen for one layer, and the refusals of every candidate tried before it."""

    layer: AttentionLayer
    backend: AttentionBackendSpec
    refusals: tuple[BackendRefusal, ...] = ()

    @property
    def is_fallback(self) -> bool:
        """Whether a preferred candidate refused the layer before this one took it."""
        return bool(self.refusals)


class LayerKind(str, enum.Enum):
    """What a quantizable module is, for the quant-method lookup."""

    LINEAR = "linear"
    ATTENTION = "attention"
    FUSED_MOE = "fused_moe"
    EMBEDDING = "embedding"


@dataclass(frozen=True)
class QuantConfig:
    """A checkpoint's ``quantization_config`` as the checkpoint states it.

    ``method`` is its ``quant_method`` (``compressed-tensors``, ``fp8``, ``awq``, ``gptq``...);
    ``raw`` is the whole section, unchanged, for plugins that need more than the method.
    """

    method: str
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ignore(self) -> tuple[str, ...]:
        """Module names or ``re:`` patterns the checkpoint keeps unquantized."""
        ignore = self.raw.get("ignore")
        return tuple(ignore) if isinstance(ignore, list | tuple) else ()

    @property
    def kv_cache_scheme(self) -> Mapping[str, Any] | None:
        """The compressed-tensors ``kv_cache_scheme``; None for weight-only checkpoints."""
        scheme = self.raw.get("kv_cache_scheme")
        return scheme if isinstance(scheme, Mapping) else None


class TensorSplit(str, enum.Enum):
    """Which dimension of a linear layer's weight tensor parallelism divides across the ranks,
    as vLLM's parallel layers divide it (``vllm/model_executor/layers/linear.py``)."""

    OUTPUT = "output"
    """``ColumnParallelLinear`` and its merged and QKV forms (q/k/v, gate/up), and the output
    head: each rank holds a slice of the output rows."""
    INPUT = "input"
    """``RowParallelLinear`` (o_proj, down_proj, out_proj): each rank holds a slice of the
    inputs, and the ranks' partial outputs are summed."""
    NONE = "none"
    """``ReplicatedLinear`` (an MoE router): every rank holds the whole weight."""


@dataclass(frozen=True)
class QuantLayer:
    """One quantizable module: its kind, its dotted prefix, its full (unsharded) shape, and how
    tensor parallelism splits it.

    Fused experts (``LayerKind.FUSED_MOE``): ``input_size`` is the hidden size, ``output_size``
    one expert's intermediate size, ``experts`` the routed experts and ``top_k`` how many each
    token takes (0 where not known). vLLM divides the intermediate size across the ranks (each
    rank's gate/up rows and down inputs), so ``split`` is ``OUTPUT`` for them.

    ``tensor_parallel_size`` is the ranks the layer is divided over (1: whole on each GPU) and
    ``split`` the dimension divided. A plugin whose loader needs a whole number of scale groups
    or blocks per rank reads both, so the claim declines what its loader would refuse (host
    API 1.4; a plugin written for an older API sees the defaults).
    """

    kind: LayerKind
    prefix: str
    input_size: int = 0
    output_size: int = 0
    experts: int = 0
    top_k: int = 0
    tensor_parallel_size: int = 1
    split: TensorSplit = TensorSplit.OUTPUT

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", LayerKind(self.kind))
        object.__setattr__(self, "split", TensorSplit(self.split))
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size {self.tensor_parallel_size} is below 1")

    @property
    def splits_input(self) -> bool:
        """Whether each rank holds only part of the inputs (a row-parallel layer above one
        rank)."""
        return self.tensor_parallel_size > 1 and self.split is TensorSplit.INPUT

    @property
    def splits_output(self) -> bool:
        """Whether each rank holds only part of the outputs (a column-parallel layer, or fused
        experts' intermediate size, above one rank)."""
        return self.tensor_parallel_size > 1 and self.split is TensorSplit.OUTPUT

    @property
    def inputs_per_rank(self) -> int:
        """The inputs one rank holds: ``input_size`` over the ranks where they divide the
        inputs, else ``input_size``; 0 where it is not known or the ranks do not divide it
        (vLLM's own refusal, ``divide`` in ``vllm/distributed/utils.py``)."""
        return self._per_rank(self.input_size, self.splits_input)

    @property
    def outputs_per_rank(self) -> int:
        """The outputs one rank holds (fused experts: the intermediate size), as
        :attr:`inputs_per_rank` for the outputs."""
        return self._per_rank(self.output_size, self.splits_output)

    def _per_rank(self, size: int, divided: bool) -> int:
        if not divided:
            return size
        return 0 if size % self.tensor_parallel_size else size // self.tensor_parallel_size


@dataclass(frozen=True)
class QuantMethodSpec:
    """A quantization method a plugin can run, declared by name for listings and checks."""

    name: str
    impl: str
    description: str = ""
    replaces_builtin: bool = False
    """The name is one of vLLM's own quant methods and the plugin means to replace it."""


@dataclass(frozen=True)
class QuantClaim:
    """A plugin taking a layer: ``method`` is its name, ``impl`` the import path of the method."""

    method: str
    impl: str
    priority: int = 0
    detail: str = ""


@dataclass(frozen=True)
class QuantDecline:
    """A plugin recognising a layer and declining it, with the reason the plan shows."""

    method: str
    reason: str


@dataclass(frozen=True)
class QuantResolution:
    """The outcome of the quant-method lookup for one layer.

    ``claim`` is None when no plugin claimed it: the engine's own lookup then decides.
    ``source`` is the plugin that made the winning claim.
    """

    layer: QuantLayer
    claim: QuantClaim | None
    source: str | None
    declines: tuple[tuple[str, QuantDecline], ...] = ()


class KVScaleScheme(str, enum.Enum):
    """How a checkpoint's KV-cache scales are laid out."""

    NONE = "none"
    PER_TENSOR = "per_tensor"
    PER_ATTENTION_HEAD = "per_attention_head"


@dataclass(frozen=True)
class CheckpointKV:
    """What a checkpoint says about its KV cache.

    ``scheme`` is the layout of the KV scales it ships; ``calibrated_for`` the KV dtype those
    scales were calibrated for (``fp8_e4m3`` for llm-compressor checkpoints); ``weight_format``
    is the weight quantization (``fp16``, ``fp8``, ``int4``...), which decides whether vLLM's
    own gate treats the checkpoint as an "fp8 checkpoint".
    """

    scheme: KVScaleScheme = KVScaleScheme.NONE
    calibrated_for: str | None = None
    weight_format: str = "fp16"
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "scheme", KVScaleScheme(self.scheme))


@dataclass(frozen=True)
class KVRequest:
    """A KV-cache dtype request to validate: what was asked, for which checkpoint and device."""

    kv_cache_dtype: str
    checkpoint: CheckpointKV
    device: Device
    activation_dtype: str = "float16"


class VerdictStatus(str, enum.Enum):
    """A plugin's answer to a KV-cache dtype request."""

    ACCEPT = "accept"
    REJECT = "reject"


@dataclass(frozen=True)
class KVVerdict:
    """One plugin's verdict. Warnings go with an accept; a reject carries its reason."""

    status: VerdictStatus
    reason: str = ""
    warnings: tuple[str, ...] = ()
    scales: str = ""
    """Where the scales come from if accepted: ``unit``, ``checkpoint``... (shown by the plan)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", VerdictStatus(self.status))
        object.__setattr__(self, "warnings", tuple(self.warnings))

    @classmethod
    def accept(cls, reason: str = "", *warnings: str, scales: str = "") -> KVVerdict:
        return cls(VerdictStatus.ACCEPT, reason, tuple(warnings), scales)

    @classmethod
    def reject(cls, reason: str) -> KVVerdict:
        return cls(VerdictStatus.REJECT, reason)


@dataclass(frozen=True)
class KVDecision:
    """All verdicts combined.

    ``accepted`` is True when some plugin accepted and none rejected, False when any rejected,
    and None when no plugin had an opinion: then the engine's own rule stands.
    """

    request: KVRequest
    accepted: bool | None
    verdicts: tuple[tuple[str, KVVerdict], ...] = ()

    @property
    def reasons(self) -> tuple[str, ...]:
        """Every rejecting plugin's reason, prefixed with the plugin's name."""
        return tuple(
            f"{name}: {v.reason}" for name, v in self.verdicts if v.status is VerdictStatus.REJECT
        )

    @property
    def warnings(self) -> tuple[str, ...]:
        """Every accepting plugin's warnings, prefixed with the plugin's name."""
        return tuple(
            f"{name}: {w}"
            for name, v in self.verdicts
            if v.status is VerdictStatus.ACCEPT
            for w in v.warnings
        )


@dataclass(frozen=True)
class ReasoningParserSpec:
    """A named reasoning parser; ``impl`` is the import path of its engine-independent class."""

    name: str
    impl: str
    description: str = ""
    replaces_builtin: bool = False
    """The name is one of vLLM's own parsers and the plugin means to replace it."""


@dataclass(frozen=True)
class ReasoningSplit:
    """Generated text split into reasoning and content (either may be None: absent)."""

    reasoning: str | None
    content: str | None


@dataclass(frozen=True)
class ReasoningContext:
    """What a reasoning post-processor sees besides the split itself.

    ``text`` is the whole generated text so far (for streaming: up to and including this
    delta); ``delta`` is the piece this call is about (empty for non-streaming output).
    """

    parser: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    streaming: bool
    delta: str = ""
    in_reasoning: bool | None = None
    """Whether the prompt left a think block open (None: the engine did not say)."""


#: The paged KV-cache layout the Volta kernels share: ``[num_blocks, num_kv_heads, block_size,
#: head_size_k + head_size_v]``, K and V packed in each slot's last dimension.
PACKED_KV_LAYOUT = "packed"


@dataclass(frozen=True)
class KVCacheOpsSpec:
    """How one KV-cache format is written, declared by the plugin that defines the format.

    The format is ``kv_cache_dtype`` (canonical: ``float16``, ``fp8_e5m2``, ``fp8_e4m3``) in
    ``layout``; one plugin owns each, and an attention backend that declares the layout
    (``AttentionBackendSpec.kv_cache_layout``) writes its cache through it. ``impl`` names the
    write function by import path; it is called as::

        write(key, value, kv_cache, slot_mapping, *, kv_cache_dtype, k_scale, v_scale,
              check_values)

    with ``key``/``value`` ``[num_tokens, num_kv_heads, head_size]``, the cache in ``layout``,
    negative slots skipped, ``k_scale``/``v_scale`` the layer's scales (a tensor of one element
    or one per KV head, or None for an unscaled format), and ``check_values`` asking it to check
    slots and scale values against the cache (which reads them back to the host; the engine's
    step passes False).
    """

    kv_cache_dtype: str
    impl: str
    layout: str = PACKED_KV_LAYOUT
    description: str = ""

    @property
    def name(self) -> str:
        """The format's name, ``layout.dtype`` (what two plugins may not both declare)."""
        return f"{self.layout}.{self.kv_cache_dtype}"


@dataclass(frozen=True)
class KernelConfig:
    """One kernel launch configuration a plugin would use on a device, for the SM70 gate.

    ``kernel`` is the import path of the ``@triton.jit`` function; ``signature`` maps argument
    names to Triton type strings (``*fp16``, ``i32``...) and ``constexprs`` fixes the rest.
    ``divisible_by_16`` names the integer arguments that are multiples of 16 at the launches
    that matter (strides and sizes of real models): the JIT specializes those, and the gate
    compiles the configuration that way too. ``divisibility_enforced`` says the launcher refuses,
    with one error before any launch, every launch where one of them is not a multiple of 16: the
    JIT then never builds this configuration unspecialized, so the gate does not compile that
    build either (a tile that fits the register file only with aligned rows, such as Volta's
    512-dim attention, is still gated as it runs).
    """

    name: str
    kernel: str
    signature: Mapping[str, str]
    constexprs: Mapping[str, Any] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 1
    divisible_by_16: tuple[str, ...] = ()
    divisibility_enforced: bool = False


@dataclass(frozen=True)
class CudaKernelConfig:
    """One build of a CUDA-source kernel a plugin would launch on a device, for the SM70 gate.

    ``source`` is the CUDA C++ text and ``kernel`` its ``extern "C" __global__`` function;
    ``options`` are the NVRTC options other than the architecture (``-DHEAD=128``...), the
    same ones the plugin's launcher compiles with. ``block_threads`` and
    ``dynamic_shared_bytes`` are what the launcher asks for. ``claims_tensor_cores``: the
    kernel's products are meant to run on tensor cores, so the gate requires ``HMMA`` in its
    SASS.
    """

    name: str
    source: str
    kernel: str
    block_threads: int
    options: tuple[str, ...] = ()
    dynamic_shared_bytes: int = 0
    claims_tensor_cores: bool = False


@dataclass(frozen=True)
class KernelPath:
    """Which kernel serves one part of a layer's work on a device, by the plugin's own rules.

    ``stage`` names the part (``"prefill"``, ``"decode"``, ``"8-64 tokens"``) and ``kernel``
    what runs it (``"tensor cores (CUDA, mma.m8n8k4)"``, ``"Triton"``). ``needs_nvrtc``: the
    kernel is compiled at first use by NVRTC (:mod:`volta_core.kernel_api`), and where no CUDA
    12 NVRTC is installed ``fallback`` serves instead. ``unit`` and ``fallback_unit`` say where
    each one's products run (``"tensor cores"`` or ``"FMA"``,
    :class:`volta_core.kernel_api.Unit`): the speed estimate prices the stage at that rate.
    """

    stage: str
    kernel: str
    needs_nvrtc: bool = False
    fallback: str = ""
    unit: str = ""
    fallback_unit: str = ""
