"""What the plugin declares at discovery: the devices and FP8 weight layouts its kernels take
(torch-free: the plugin's hooks read it while nothing else is imported)."""

from __future__ import annotations

#: Compute capability majors the kernels are built for: Volta, which vLLM's ``Fp8Config`` refuses
#: (``get_min_capability()`` is 75), and Turing.
CAPABILITY_MAJORS = (7,)

#: The device the tensor-core GEMM (CUDA, ``mma.m8n8k4``) is selected on: m8n8k4 is Volta's own
#: shape; the PTX ISA says it is optimized for sm_70 only (later GPUs emulate it).
MMA_CAPABILITY = (7, 0)

#: Other compute capabilities the kernels are tested on (the lent Hopper GPUs of docs/perf/fp8w).
TESTED_CAPABILITIES = ((9, 0),)

#: A scale block's input length must be a multiple of this: the kernels' smallest input tile,
#: so one scale serves a whole tile and is multiplied once per tile, not per weight.
BLOCK_K_QUANTUM = 32

#: The most local experts the routed kernels take.
MAX_ROUTED_EXPERTS = 1024


def supports_device(capability: tuple[int, int]) -> bool:
    """Whether the kernels run on a device of ``capability`` (built for it or tested on it)."""
    return capability[0] in CAPABILITY_MAJORS or capability in TESTED_CAPABILITIES
