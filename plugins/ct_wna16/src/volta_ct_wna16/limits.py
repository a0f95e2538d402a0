"""What the plugin declares at discovery: the devices, weight formats and expert counts its
kernels take (torch-free: the plugin's hooks read it while nothing else is imported)."""

from __future__ import annotations

#: Compute capability majors the kernels are built for: Volta, which vLLM's own WNA16 method
#: refuses (``CompressedTensorsWNA16.get_min_capability()`` is 75), and Turing.
CAPABILITY_MAJORS = (7,)

#: The device the tensor-core GEMM (CUDA, ``mma.m8n8k4``) is selected on: m8n8k4 is Volta's own
#: shape; the PTX ISA says it is optimized for sm_70 only (later GPUs emulate it).
MMA_CAPABILITY = (7, 0)

#: Other compute capabilities the kernels are tested on (the H100 of docs/perf/ct_wna16).
TESTED_CAPABILITIES = ((9, 0),)

#: Weight bit widths the kernels unpack (8 or 4 values per int32 word).
SUPPORTED_BITS = (4, 8)

#: Group sizes the kernels take besides channel-wise scales: each a multiple of the 1-token
#: GEMV's 32-input sub-tile, so one scale row serves a sub-tile.
SUPPORTED_GROUP_SIZES = (32, 64, 128)

#: The most local experts the fused routing takes: its second launch holds every expert's
#: count in each program (a 1024-expert layer: 16 pairs a program against 1024 counts).
MAX_ROUTED_EXPERTS = 1024


def supports_device(capability: tuple[int, int]) -> bool:
    """Whether the kernels run on a device of ``capability`` (built for it or tested on it)."""
    return capability[0] in CAPABILITY_MAJORS or capability in TESTED_CAPABILITIES
