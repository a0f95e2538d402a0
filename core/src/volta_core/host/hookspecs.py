"""The hooks a vllm-volta plugin may implement.

A plugin is a module (or object) named by an entry point in the ``vllm_volta.plugins`` group.
It sets ``VOLTA_HOST_API`` to the host API version it was written for and implements any of the
hooks below with the :data:`hookimpl` marker. Hooks return declarations (see
:mod:`volta_core.host.types`); the host checks them and resolves choices in pure functions
(:mod:`volta_core.host.resolution`), which the ``vllm-volta plan`` command and the vLLM adapter
share.

No hook is ``firstresult`` except :func:`volta_reasoning_postprocess`: the host needs every
plugin's answer to rank claims by priority, to list every refusal, and to combine verdicts.
The four declaration hooks (backends, quant methods, parsers, KV-cache formats) are asked
once, when the plugin registers, and must answer a list or tuple; the others are called when
the host resolves something (the plan command, or vLLM building a layer). None is called at
import, so loading plugins imports no kernel.

Every answer is checked against the return type below before the host reads it
(:mod:`volta_core.host.answers`), and every exception a hook raises is caught: either way the plugin
is recorded as failed in that hook and disabled, and the other plugins' answers stand
(``VLLM_VOLTA_STRICT=1`` makes it an error).

Each plugin's implementation is called through pluggy on its own, together with every hook
wrapper (``@hookimpl(wrapper=True)``), so wrappers, ``pm.enable_tracing()`` and call monitoring
see each call while each answer stays attributed to its plugin; what a wrapper returns is
checked like any answer, and a wrapper that breaks calls is disabled.
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from volta_core.device import Device
from volta_core.host.bench_case import BenchCase
from volta_core.host.dispatch import StageCost, Workload
from volta_core.host.types import (
    AttentionBackendSpec,
    AttentionLayer,
    CudaKernelConfig,
    KernelConfig,
    KernelPath,
    KVCacheOpsSpec,
    KVRequest,
    KVVerdict,
    QuantClaim,
    QuantConfig,
    QuantDecline,
    QuantLayer,
    QuantMethodSpec,
    ReasoningContext,
    ReasoningParserSpec,
    ReasoningSplit,
)

PROJECT_NAME = "vllm_volta"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def volta_attention_backends() -> Iterable[AttentionBackendSpec]:
    """Declare the attention backends this plugin provides.

    Called once, when the plugin registers (not at import). Each declaration states what the
    backend can run; the host tries backends per layer in descending ``priority`` and gives the
    layer to the first whose declaration admits it, falling back to vLLM's built-in backends
    only where they are valid. Backend names must be unique across all plugins (two declaring
    one name are both disabled) and may be one of vLLM's own only with ``replaces_builtin``.
    """


@hookspec
def volta_quant_methods() -> Iterable[QuantMethodSpec]:
    """Declare the quantization methods this plugin can claim layers for.

    Names must be unique across plugins; :func:`volta_quant_method` may only claim or decline
    with a name declared here.
    """


@hookspec
def volta_quant_method(
    config: QuantConfig, layer: QuantLayer, device: Device
) -> QuantClaim | QuantDecline | None:
    """Claim one layer of a quantized checkpoint, decline it with a reason, or pass.

    Called for every quantizable module while vLLM builds the model, and by the plan.

    :param config: the checkpoint's quantization section, as the checkpoint states it.
    :param layer: the module's kind, dotted prefix, full (unsharded) shape, and the
        tensor-parallel size and dimension vLLM divides it by (``tensor_parallel_size``,
        ``split``: host API 1.4), so a claim can decline a layer whose per-rank shard its
        loader would refuse.
    :param device: the device the engine runs on.
    :return: a :class:`~volta_core.QuantClaim` to take the layer (among several claims the
        highest ``priority`` wins; equal priorities are an error naming both plugins); a
        :class:`~volta_core.QuantDecline` when the plugin recognises the layer but cannot
        run it (the reason is shown by the plan); ``None`` when the layer is not its business.
        With no claim, the engine's own lookup decides.
    """


@hookspec
def volta_kv_cache_verdict(request: KVRequest) -> KVVerdict | None:
    """Judge a KV-cache dtype request for a checkpoint on a device.

    Called once at engine configuration (before any layer is built) and by the plan.

    :param request: the requested ``--kv-cache-dtype``, what the checkpoint says about KV
        scales, and the device.
    :return: accept (optionally with warnings), reject with a reason, or ``None`` for no
        opinion. Combined: any reject wins and the error lists every reason; with no accepting
        plugin the engine's own rule stands.
    """


@hookspec
def volta_reasoning_parsers() -> Iterable[ReasoningParserSpec]:
    """Declare reasoning parsers by name. Names must be unique across plugins.

    The adapter registers each with vLLM's ``ReasoningParserManager`` under its name.
    """


@hookspec
def volta_kv_cache_ops() -> Iterable[KVCacheOpsSpec]:
    """Declare the KV-cache formats this plugin writes (one dtype in one layout each).

    The plugin that defines a cache format owns its writer: an attention backend declaring a
    ``kv_cache_layout`` writes through the one format owner the host resolves
    (:func:`volta_core.kv_cache_writer`), and is refused for a dtype no plugin writes. Two
    plugins declaring one format are both disabled, like any other declared name.
    """


@hookspec(firstresult=True)
def volta_reasoning_postprocess(
    split: ReasoningSplit, context: ReasoningContext
) -> ReasoningSplit | None:
    """Adjust a parser's reasoning/content split before it reaches the client.

    Called after the parser for every non-streaming result and for every streaming delta.
    ``firstresult``: the first plugin returning a split replaces the parser's; ``None`` keeps it.
    The host refuses a returned split that drops generated text (it keeps the parser's split
    and logs the offending plugin), and a plugin that raises or answers another type is disabled
    and the next one asked: generated text is never lost.
    """


@hookspec
def volta_kernel_configs(device: Device) -> Iterable[KernelConfig]:
    """List every kernel launch configuration this plugin would use on ``device``.

    Used by the SM70 compile gate: for capability 7.0 this must be exactly what would run on a
    V100, so the gate checks registers, spills and shared memory of the real configurations.
    """


@hookspec
def volta_cuda_kernel_configs(device: Device) -> Iterable[CudaKernelConfig]:
    """List every build of a CUDA-source kernel this plugin would launch on ``device``.

    The CUDA counterpart of :func:`volta_kernel_configs`, used by the SM70 compile gate for
    CUDA sources: for capability 7.0 it must be exactly the builds (source and NVRTC options)
    the plugin's launcher compiles on a V100, so the gate checks registers, spills, shared
    memory and the tensor-core instructions of what would run.
    """


@hookspec
def volta_kernel_paths(
    layer: AttentionLayer | QuantLayer,
    served_by: str,
    device: Device,
    quant: QuantConfig | None,
) -> Iterable[KernelPath]:
    """Say which kernels serve ``layer`` on ``device``, one :class:`KernelPath` per stage.

    Asked only of the plugin whose attention backend or quant method (named ``served_by``)
    the host chose for the layer, when ``vllm-volta plan`` describes it; ``quant`` is the
    checkpoint's quantization config (None for a checkpoint without one). The answer must come
    from the rules the plugin's launcher applies at run time, so the plan shows what the
    engine will run (for example which stages use Volta's tensor cores). Stages must be
    distinct; a kernel that needs NVRTC names its ``fallback``; ``unit`` and ``fallback_unit``
    say where each one's products run.
    """


@hookspec
def volta_kernel_cost(
    layer: AttentionLayer | QuantLayer,
    served_by: str,
    device: Device,
    quant: QuantConfig | None,
    work: Workload,
) -> StageCost | None:
    """Say what ``work`` costs on ``layer`` on ``device``, by the kernel that would run it.

    Asked, like :func:`volta_kernel_paths`, only of the plugin whose backend or quant method
    (``served_by``) serves the layer, when ``vllm-volta plan`` estimates a decode step. The
    answer names the stage of the layer's kernel paths the work falls in, and the cost (bytes,
    FLOPs and the unit they run on, launch by launch) of the kernel chosen there and of its
    fallback where it needs NVRTC: both from the plugin's dispatch module, the one the
    launcher and :func:`volta_kernel_paths` read, so the estimate prices what the plan prints.
    None: the plugin does not price this layer, and the host's own model serves.
    """


@hookspec
def volta_bench_case(
    layer: AttentionLayer | QuantLayer,
    served_by: str,
    device: Device,
    quant: QuantConfig | None,
    work: Workload,
) -> BenchCase | None:
    """Declare how to time the kernel that would run ``work`` on ``layer`` on ``device``.

    Asked, like :func:`volta_kernel_cost` and with the same arguments, only of the plugin whose
    backend or quant method (``served_by``) serves the layer, when ``vllm-volta bench`` lists
    the kernels the plan names (never while vLLM serves). The answer is data: the ``stage`` and
    ``kernel`` :func:`volta_kernel_cost` names for the same work (the report shows a
    mismatch), and the import path of the function making the call
    (:class:`~volta_core.kernel_api.BenchCall`) through the plugin's own launcher, imported only
    when the command times it on a GPU. None: the plugin has no bench case for this layer,
    which the report lists as not measured.
    """
