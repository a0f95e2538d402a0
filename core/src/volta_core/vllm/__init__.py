"""The vLLM adapter: connects the host's hooks to vLLM through vLLM's own plugin points.

- ``vllm.general_plugins`` entry point ``volta`` -> :func:`volta_core.vllm.plugin.register`, run
  by vLLM in every process (API server, engine core, workers): discovers the Volta plugins,
  registers their reasoning parsers, overrides the ``compressed-tensors`` and ``fp8``
  quantization configs with subclasses that ask the host first, and binds plugin attention
  backends to ``AttentionBackendEnum.CUSTOM`` on CUDA compute capability 7.x.
- ``vllm.platform_plugins`` entry point ``volta`` -> :func:`volta_core.vllm.platform.detect`:
  activates a CUDA platform subclass only when every visible GPU is compute capability 7.x,
  which routes attention layers by the host's selection and judges the KV-cache dtype at
  config time.

The modules, by layer (the import-linter contract "The vLLM adapter's layers"):

1. entry points: :mod:`~volta_core.vllm.plugin`, :mod:`~volta_core.vllm.platform`,
   :mod:`~volta_core.vllm.cuda_platform`;
2. the vLLM objects the adapter builds (vLLM imported inside their functions):
   :mod:`~volta_core.vllm.platform_class` (the platform class),
   :mod:`~volta_core.vllm.quantization` (the quantization-config overrides),
   :mod:`~volta_core.vllm.reasoning_parser` (the reasoning-parser subclass),
   :mod:`~volta_core.vllm.model_config_hooks` (Gemma-4's configuration hooks);
3. what those read from vLLM: :mod:`~volta_core.vllm.families` (the supported vLLM families:
   the one table of what differs between them), :mod:`~volta_core.vllm.devices`,
   :mod:`~volta_core.vllm.engine_config`, :mod:`~volta_core.vllm.backend_binding`;
4. the decisions, free of vLLM and tested without an engine: :mod:`~volta_core.vllm.attention`,
   :mod:`~volta_core.vllm.kv_cache`, :mod:`~volta_core.vllm.reasoning`,
   :mod:`~volta_core.vllm.report`.

Importing this package imports neither torch nor vllm.
"""
