"""The planner behind ``vllm-volta plan``: a model's description from its config
(:mod:`~volta_core.planner.model`, bundled ``examples``), the per-layer plan
(:mod:`~volta_core.planner.plan`), its weights (:mod:`~volta_core.planner.weights`, read from
safetensors headers by :mod:`~volta_core.planner.safetensors_header`), the memory fit
(:mod:`~volta_core.planner.fit`, :mod:`~volta_core.planner.reserve`) and the V100 speed
estimate (:mod:`~volta_core.planner.estimate`), put together by
:mod:`~volta_core.planner.capacity`. Torch-, triton- and vLLM-free: it plans for a V100 on any
machine.
"""
