"""vLLM attention backend classes over the Volta kernels (imports vLLM: load lazily).

The host's adapter binds :class:`VoltaAttentionBackend` to ``AttentionBackendEnum.CUSTOM`` in
every process, so ``get_name()`` returns ``"CUSTOM"`` (``Attention.__init__`` looks the member up
by that name). The class methods vLLM validates with agree with the plugin's declaration
(:data:`volta_attn_v100.plugin.SPEC`): ``supports_head_size`` is answered from the same head-size
set as the declaration, which 1Cat-vLLM's FLASH_ATTN_V100 does not do: it declares head sizes
64/128/256 but validates through TRITON_ATTN's ``supports_head_size``, so Gemma-4's 512-dim
layers reached its kernel (``vllm/v1/attention/backends/flash_attn_v100.py``).

vLLM writes the new tokens' K/V before attention (``forward_includes_kv_cache_update = False``
and :meth:`VoltaAttentionImpl.do_kv_cache_update`) through the writer of the plugin that owns
the cache's format in the packed layout (vllm-volta-fp8kv), which each impl asks the host for
once (:func:`volta_core.kv_cache_writer`); ``forward`` then attends over the paged cache only,
which covers chunked prefill, prefix caching and mixed batches.

Checks sit where vLLM's data is on the host: every layer's fp8 scales once, when the metadata
builder is made (after the weights are loaded); each step's lengths in
:meth:`VoltaAttentionMetadataBuilder.build`, once for all layers, from the CPU copies vLLM
keeps. The per-layer cache write and attention read nothing back from the GPU, in eager steps
as in captured ones: a read-back there waits for the GPU to drain at every layer.

Host work is done once where it can be, since eager and mixed steps pay it at every layer: a
layer's arguments (scales, sinks cast to float32, masking) when the builder is made
(:func:`volta_attn_v100.ops.layer_args`), its tensors' layout on its first call and whenever
its cache or its query's or output's token stride changes; a step's batch tensors in
:meth:`VoltaAttentionMetadataBuilder.build`, and its launches (the choice and the decode's
partial buffers) by the step's first layer of each shape
(:class:`volta_attn_v100.ops.StepLaunches`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from vllm.config import CUDAGraphMode, VllmConfig
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionLayer,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.kv_cache_interface import AttentionSpec

from volta_attn_v100.dispatch import takes_cuda_decode, takes_cuda_prefill
from volta_attn_v100.inputs import (
    KV_STORAGE,
    AttentionInputError,
    cache_view,
    check_inputs,
    check_lengths,
    check_step_tensors,
)
from volta_attn_v100.limits import (
    HEAD_SIZES,
    MAX_CAPABILITY,
    MAX_DECODE_QUERY_LEN,
    MIN_CAPABILITY,
    kv_dtype_refusal,
)
from volta_attn_v100.ops import (
    LayerArgs,
    StepLaunches,
    TensorLayout,
    default_num_splits,
    layer_args,
    run_attention,
    tensor_layout,
)
from volta_core import PACKED_KV_LAYOUT, KVCacheWriter, canonical_kv_dtype, kv_cache_writer

#: vLLM's ``--kv-cache-dtype`` spellings the kernels read, and the format each names (the
#: host's spelling rule: ``auto`` is the fp16 activations' dtype, ``fp8`` is e4m3).
KV_CACHE_DTYPES: dict[str, str] = {
    spelling: canonical_kv_dtype(spelling, "float16")
    for spelling in ("auto", "float16", "fp8_e5m2", "fp8", "fp8_e4m3")
}


@dataclass
class VoltaAttentionMetadata:
    """What one forward step needs: vLLM's per-batch tensors, the decode partition count, and
    the step's launches, which its layers share (:class:`volta_attn_v100.ops.StepLaunches`)."""

    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    num_splits: int
    launches: StepLaunches


class VoltaAttentionMetadataBuilder(AttentionMetadataBuilder[VoltaAttentionMetadata]):
    """Builds :class:`VoltaAttentionMetadata` from vLLM's common metadata.

    CUDA graphs: uniform batches (decode, or decode with speculative tokens) are graph-safe
    because the decode kernel reads lengths from device tensors and the partition count
    depends only on the number of requests and the model's maximum length.

    Made after the model's weights are loaded, it checks the fp8 scales of its layers (found
    in vLLM's ``static_forward_context``) once; :meth:`build` checks each step's lengths.
    """

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        model_config = vllm_config.model_config
        self.num_kv_heads = model_config.get_num_kv_heads(vllm_config.parallel_config)
        self.max_model_len = model_config.max_model_len
        self.cache_format = KV_CACHE_DTYPES.get(vllm_config.cache_config.cache_dtype, "float16")
        self.graphs = vllm_config.compilation_config.cudagraph_mode != CUDAGraphMode.NONE
        self.block_size = kv_cache_spec.block_size
        layers = vllm_config.compilation_config.static_forward_context
        for name in layer_names:
            layer = layers.get(name)
            impl = getattr(layer, "impl", None)
            if isinstance(impl, VoltaAttentionImpl):
                impl.prepare(layer, device)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> VoltaAttentionMetadata:
        m = common_attn_metadata
        # Per-sequence CPU lengths exist from vLLM 0.32 on (upper bounds under asynchronous
        # speculative decoding, CommonAttentionMetadata.seq_lens_cpu_upper_bound); 0.19's
        # seq_lens_cpu property copies them from the device, so there max_seq_len bounds
        # every sequence.
        seq_lens_cpu = getattr(m, "seq_lens_cpu_upper_bound", None)
        if seq_lens_cpu is None:
            seq_lens_cpu = torch.full((m.num_reqs,), m.max_seq_len, dtype=torch.int32)
        check_lengths(
            m.query_start_loc_cpu,
            seq_lens_cpu,
            m.num_actual_tokens,
            self.block_size,
            m.block_table_tensor.shape[1],
        )
        check_step_tensors(m.block_table_tensor, m.seq_lens, m.query_start_loc)
        length = self.max_model_len if self.graphs else m.max_seq_len
        num_splits = default_num_splits(
            m.num_reqs, self.num_kv_heads, length, self.device, self.cache_format
        )
        decode = m.max_query_len <= MAX_DECODE_QUERY_LEN
        return VoltaAttentionMetadata(
            num_actual_tokens=m.num_actual_tokens,
            max_query_len=m.max_query_len,
            max_seq_len=m.max_seq_len,
            query_start_loc=m.query_start_loc,
            seq_lens=m.seq_lens,
            block_table=m.block_table_tensor,
            slot_mapping=m.slot_mapping,
            num_splits=num_splits,
            launches=StepLaunches(
                m.block_table_tensor,
                m.seq_lens,
                m.query_start_loc,
                max_query_len=m.max_query_len,
                max_seq_len=m.max_seq_len,
                num_splits=num_splits if decode else None,
                path="decode" if decode else "prefill",
            ),
        )

    def build_for_cudagraph_capture(
        self, common_attn_metadata: CommonAttentionMetadata
    ) -> VoltaAttentionMetadata:
        return self.build(0, common_attn_metadata)


class VoltaAttentionBackend(AttentionBackend):
    """The Volta backend as vLLM sees it; every answer matches the plugin's declaration."""

    accept_output_buffer: bool = True
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16]
    supported_kv_cache_dtypes: ClassVar[list[Any]] = list(KV_CACHE_DTYPES)

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type[VoltaAttentionImpl]:
        return VoltaAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[VoltaAttentionMetadataBuilder]:
        return VoltaAttentionMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[int | MultipleOf]:
        return [MultipleOf(16)]

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        """The cache shape vLLM before 0.32 allocates from (0.32 and later allocate the same
        4-D view, K and V packed in the last dimension, by ``KVCacheLayout``; this is unused
        there): one layout for the kernels in every vLLM version."""
        return (num_blocks, num_kv_heads, block_size, 2 * head_size)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(HEAD_SIZES)

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return head_size in HEAD_SIZES

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_combination(
        cls,
        head_size: int,
        dtype: torch.dtype,
        kv_cache_dtype: Any,
        block_size: int | None,
        use_mla: bool,
        has_sink: bool,
        use_sparse: bool,
        *flags_then_capability: Any,
        **named: Any,
    ) -> str | None:
        """The one answer that depends on the device and the KV dtype together: e4m3 caches
        from SM89 only (the declaration's ``kv_dtype_min_capability``). The device capability
        comes last: vLLM 0.19 passes it eighth, 1Cat-vLLM and 0.32+ after ``use_mm_prefix``."""
        device_capability = named.get("device_capability", (flags_then_capability or [None])[-1])
        if device_capability is None:
            return None
        cache_format = KV_CACHE_DTYPES.get(kv_cache_dtype or "auto")
        if cache_format is None:
            return None
        return kv_dtype_refusal(cache_format, (device_capability.major, device_capability.minor))

    @classmethod
    def supports_compute_capability(cls, capability: Any) -> bool:
        return MIN_CAPABILITY <= (capability.major, capability.minor) <= MAX_CAPABILITY


class VoltaAttentionImpl(AttentionImpl[VoltaAttentionMetadata]):
    """Runs one layer. Anything the kernels do not implement is refused here, at build time,
    with the reason: a layer must never reach a kernel that would compute something else; so is
    a cache format no installed plugin writes (the host's :class:`volta_core.PluginError`
    names it)."""

    supports_quant_query_input: bool = False

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
        **unsupported: Any,
    ) -> None:
        refuse = AttentionInputError
        if head_size not in HEAD_SIZES:
            raise refuse(
                f"head size {head_size} is not supported by the Volta attention backend "
                f"(supported: {', '.join(map(str, HEAD_SIZES))}); the host should have given "
                "this layer to a fallback backend"
            )
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise refuse(
                f"KV-cache dtype {kv_cache_dtype!r} is not supported by the Volta attention "
                f"backend (supported: {', '.join(KV_CACHE_DTYPES)})"
            )
        if torch.cuda.is_available():
            refusal = kv_dtype_refusal(
                KV_CACHE_DTYPES[kv_cache_dtype], torch.cuda.get_device_capability()
            )
            if refusal:
                raise refuse(refusal)
        if alibi_slopes is not None:
            raise refuse("ALiBi is not implemented by the Volta attention backend")
        if attn_type != AttentionType.DECODER:
            raise refuse(f"attention type {attn_type} is not supported (causal decoder only)")
        extra = {k for k, v in unsupported.items() if v not in (None, False, -1)}
        if extra:
            raise refuse(f"options {sorted(extra)} are not implemented by the Volta backend")
        num_kv_heads = num_kv_heads or num_heads
        if num_heads % num_kv_heads:
            raise refuse(f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
        if sinks is not None and sinks.shape != (num_heads,):
            raise refuse(f"sinks must have one value per query head ({num_heads})")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.kv_cache_dtype = kv_cache_dtype
        self.cache_format = KV_CACHE_DTYPES[kv_cache_dtype]
        self.logits_soft_cap = float(logits_soft_cap or 0.0)
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.sinks = sinks
        self.supports_quant_query_input = False
        self.write_kv_cache: KVCacheWriter = kv_cache_writer(
            PACKED_KV_LAYOUT, kv_cache_dtype, "float16"
        )
        self._storage = KV_STORAGE[self.cache_format]
        self._args: LayerArgs | None = None
        self._layout: TensorLayout | None = None
        self._layout_key: tuple[int, int, int] | None = None
        if torch.cuda.is_available():
            self._load_tensor_core_builds(torch.cuda.get_device_capability())

    def _load_tensor_core_builds(self, capability: tuple[int, int]) -> None:
        """Compile and load the CUDA builds this layer's prefill and decode take on the current
        device (of ``capability``) now, before vLLM captures CUDA graphs: a build first asked
        for during capture leaves that launch to Triton. A missing NVRTC is logged once (an
        error with ``VLLM_VOLTA_STRICT=1``), and the Triton kernels serve."""
        group = self.num_heads // self.num_kv_heads
        prefill = takes_cuda_prefill(capability, self.head_size, self.cache_format)
        decode = takes_cuda_decode(capability, self.head_size, self.cache_format, group, 1)
        if not (prefill or decode):
            return
        from volta_attn_v100.cuda import decode as cuda_decode
        from volta_attn_v100.cuda import prefill as cuda_prefill

        device = torch.device("cuda", torch.cuda.current_device())
        if prefill:
            cuda_prefill.warm_up(device, self.head_size, self.cache_format)
        if decode:
            cuda_decode.warm_up(device, self.head_size, self.cache_format)

    def _scales(self, layer: AttentionLayer) -> tuple[Any, Any]:
        if self.cache_format == "float16":
            return None, None
        return layer._k_scale, layer._v_scale

    def prepare(self, layer: AttentionLayer, device: torch.device) -> None:
        """Make the layer's kernel arguments once its weights are loaded: the fp8 scales,
        refused unless finite and positive (read back to the host: called once per layer, by
        the metadata builder, never in a step), and the sinks cast to float32."""
        self._args = self._layer_args(layer, device, check_values=True)

    def _layer_args(
        self, layer: AttentionLayer, device: torch.device, *, check_values: bool
    ) -> LayerArgs:
        k_scale, v_scale = self._scales(layer)
        return layer_args(
            self.num_heads,
            self.num_kv_heads,
            self.head_size,
            self.cache_format,
            device,
            sm_scale=self.scale,
            k_scale=k_scale,
            v_scale=v_scale,
            sinks=self.sinks,
            sliding_window=self.sliding_window,
            logits_soft_cap=self.logits_soft_cap,
            check_values=check_values,
        )

    def do_kv_cache_update(
        self,
        layer: AttentionLayer,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        k_scale, v_scale = self._scales(layer)
        self.write_kv_cache(
            key,
            value,
            kv_cache,
            slot_mapping,
            kv_cache_dtype=self.cache_format,
            k_scale=k_scale,
            v_scale=v_scale,
            check_values=False,
        )

    def forward(
        self,
        layer: AttentionLayer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: VoltaAttentionMetadata,
        output: torch.Tensor | None = None,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output is None:
            raise AttentionInputError(
                "the Volta backend writes into vLLM's output buffer (accept_output_buffer); "
                "none was passed"
            )
        if output_scale is not None or output_block_scale is not None:
            raise AttentionInputError("fused output quantization is not supported on Volta")
        if attn_metadata is None:  # profiling run: no cache yet
            return output.fill_(0)
        # vLLM's query and output tensors themselves ([tokens, heads, head_size], or flat), whole
        # (vLLM pads the batch's rows under CUDA graphs): the kernels read the layout's strides
        # and touch only the batch's rows, ``num_actual_tokens`` of them.
        if kv_cache.dtype != self._storage:
            kv_cache = cache_view(kv_cache, self.cache_format)
        args = self._args
        if args is None:  # a layer no metadata builder prepared: its scales are not read back
            args = self._args = self._layer_args(layer, query.device, check_values=False)
        launches = attn_metadata.launches
        layout = self._layout
        key = (kv_cache.data_ptr(), query.stride(0), output.stride(0))
        if layout is None or key != self._layout_key:
            layout = self._check_layout(query, kv_cache, output, launches, args)
        run_attention(
            args, launches, query, kv_cache, output, num_tokens=attn_metadata.num_actual_tokens,
            layout=layout,
        )  # fmt: skip
        return output

    def _check_layout(
        self,
        query: torch.Tensor,
        kv: torch.Tensor,
        out: torch.Tensor,
        launches: StepLaunches,
        args: LayerArgs,
    ) -> TensorLayout:
        """Check the layer's tensors (shapes, dtypes, strides, devices; nothing read back) and
        keep their layout: vLLM calls a layer with the same cache and tensors of the same width
        at every step, so this runs on its first call and again only if the cache's address or
        the query's or output's token stride changes."""
        key = (kv.data_ptr(), query.stride(0), out.stride(0))
        heads = (self.num_heads, self.head_size)
        shapes = ((heads[0] * heads[1],), heads)
        if query.shape[1:] not in shapes or out.shape[1:] not in shapes:
            raise AttentionInputError(
                f"query and output must be [tokens, {heads[0]}, {heads[1]}] or [tokens, "
                f"{heads[0] * heads[1]}], got {tuple(query.shape)} and {tuple(out.shape)}"
            )
        query, out = query.view(-1, *heads), out.view(-1, *heads)
        check_inputs(
            query,
            kv,
            launches.block_table,
            launches.seq_lens,
            launches.query_start_loc,
            out,
            args.sinks if args.has_sinks else None,
            check_bounds=False,
        )
        self._layout = tensor_layout(query, kv, out)
        self._layout_key = key
        return self._layout
