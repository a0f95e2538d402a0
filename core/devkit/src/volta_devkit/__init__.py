"""vllm-volta-devkit: the three proofs every vllm-volta Triton kernel passes.

* :mod:`volta_devkit.gate`: the SM70 compile gate (compiles for ``sm_70`` on a machine
  without a GPU and checks registers, spills, shared memory and fp8e4nv use);
* :mod:`volta_devkit.testing`: the pytest plugin (``gpu`` marker, Triton interpreter on
  CPU-only machines, poisoning and relative-error helpers);
* :mod:`volta_devkit.bench`: the GPU benchmark harness (event-timed medians, copy and
  matmul ceilings measured in the same run, JSON + PNG + table).

Developer tooling, kept out of the host (``vllm-volta-core``) that vLLM imports in every
process: plugins list this distribution in their ``test`` and ``bench`` extras. Nothing here
imports triton or torch at import time; the functions that need them import them.
"""

__version__ = "0.4.1"
