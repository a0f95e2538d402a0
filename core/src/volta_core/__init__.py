"""vllm-volta core: the host that makes vLLM serve well on NVIDIA V100 (SM70) through plugins.

The plugin API is this package's ``__all__`` (plus :mod:`volta_core.kernel_api` for kernel code):
the hook marker, the declarations plugins answer hooks with, the errors they may raise and the
rules they share with the host. Plugins import nothing else from the host (an import-linter
contract in the repository checks it); every other module is the host's own.

Importing this package imports neither torch, triton nor vllm: the command-line tool plans for
a V100 on any machine, and vLLM loads the host in every process at start-up.
"""

from volta_core.device import FP8_E4M3_MIN_CAPABILITY, V100, Device, parse_device
from volta_core.errors import (
    KVCacheDtypeRejected,
    PluginError,
    ReasoningTextLost,
    UsageError,
    VoltaError,
)
from volta_core.host.ct_targets import (
    DEFAULT_FUSED,
    ignored_module,
    match_name,
    matching_group,
    shard_names,
)
from volta_core.host.discovery import get_plugin_manager
from volta_core.host.hookspecs import hookimpl
from volta_core.host.kv_cache_ops import KVCacheWriter, kv_cache_writer
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.records import (
    ENTRY_POINT_GROUP,
    HOST_API_VERSION,
    PluginRecord,
    PluginStatus,
    strict_mode,
)
from volta_core.host.resolution.reasoning import check_no_text_lost
from volta_core.host.types import (
    ACTIVATION_DTYPES,
    FP8_KV_CACHE_DTYPES,
    KV_CACHE_DTYPES,
    PACKED_KV_LAYOUT,
    AttentionBackendSpec,
    AttentionFeature,
    AttentionLayer,
    CheckpointKV,
    CudaKernelConfig,
    KernelConfig,
    KernelPath,
    KVCacheOpsSpec,
    KVRequest,
    KVScaleScheme,
    KVVerdict,
    LayerKind,
    QuantClaim,
    QuantConfig,
    QuantDecline,
    QuantLayer,
    QuantMethodSpec,
    ReasoningContext,
    ReasoningParserSpec,
    ReasoningSplit,
    TensorSplit,
    VerdictStatus,
    canonical_kv_dtype,
)

__version__ = "0.10.1"

__all__ = [
    "ACTIVATION_DTYPES",
    "DEFAULT_FUSED",
    "ENTRY_POINT_GROUP",
    "FP8_E4M3_MIN_CAPABILITY",
    "FP8_KV_CACHE_DTYPES",
    "HOST_API_VERSION",
    "KV_CACHE_DTYPES",
    "PACKED_KV_LAYOUT",
    "V100",
    "AttentionBackendSpec",
    "AttentionFeature",
    "AttentionLayer",
    "CheckpointKV",
    "CudaKernelConfig",
    "Device",
    "KVCacheDtypeRejected",
    "KVCacheOpsSpec",
    "KVCacheWriter",
    "KVRequest",
    "KVScaleScheme",
    "KVVerdict",
    "KernelConfig",
    "KernelPath",
    "LayerKind",
    "PluginError",
    "PluginRecord",
    "PluginStatus",
    "QuantClaim",
    "QuantConfig",
    "QuantDecline",
    "QuantLayer",
    "QuantMethodSpec",
    "ReasoningContext",
    "ReasoningParserSpec",
    "ReasoningSplit",
    "ReasoningTextLost",
    "TensorSplit",
    "UsageError",
    "VerdictStatus",
    "VoltaError",
    "VoltaPluginManager",
    "canonical_kv_dtype",
    "check_no_text_lost",
    "get_plugin_manager",
    "hookimpl",
    "ignored_module",
    "kv_cache_writer",
    "match_name",
    "matching_group",
    "parse_device",
    "shard_names",
    "strict_mode",
]
