"""The vLLM adapter: connects the host's hook families to vLLM through vLLM's own plugin points.

- ``vllm.general_plugins`` entry point ``volta`` -> :func:`volta_core.vllm.plugin.register`, run
  by vLLM in every process (API server, engine core, workers): discovers the Volta plugins,
  registers their reasoning parsers, overrides the ``compressed-tensors`` and ``fp8``
  quantization configs with subclasses that ask the host first, and binds plugin attention
  backends to ``AttentionBackendEnum.CUSTOM`` on CUDA compute capability 7.x.
- ``vllm.platform_plugins`` entry point ``volta`` -> :func:`volta_core.vllm.platform.detect`:
  activates a CUDA platform subclass only when every visible GPU is compute capability 7.x,
  which routes attention layers by the host's selection and judges the KV-cache dtype at
  config time.

Every vLLM-version-dependent touchpoint lives in :mod:`volta_core.vllm.compat`, which declares
the supported vLLM versions. The other modules of this package hold the decisions and import
nothing from vLLM, so they are tested without an engine.

Importing this package imports neither torch nor vllm.
"""
