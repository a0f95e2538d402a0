"""The plugin host: the hooks a plugin implements (:mod:`~volta_core.host.hookspecs`), the
declarations it answers with (:mod:`~volta_core.host.types`), the dispatch contract its kernels
answer (:mod:`~volta_core.host.dispatch`), the checks every answer passes
(:mod:`~volta_core.host.answers`, :mod:`~volta_core.host.declarations`), vLLM's own
declarations (:mod:`~volta_core.host.builtins`), the checkpoint's declared quantization
(:mod:`~volta_core.host.checkpoint`), the pure resolutions (:mod:`~volta_core.host.resolution`),
what the host records of each plugin and the environment switches
(:mod:`~volta_core.host.records`), the registry that registers plugins and calls their hooks
checked (:mod:`~volta_core.host.registry`), the manager that resolves with their answers
(:mod:`~volta_core.host.manager`) and the discovery of the installed plugins
(:mod:`~volta_core.host.discovery`).

Plugins read it through ``volta_core``'s ``__all__`` and :mod:`volta_core.kernel_api` only.
"""
