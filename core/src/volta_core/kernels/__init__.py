"""The kernel toolkit: the three proofs every vllm-volta Triton kernel passes.

* :mod:`volta_core.kernels.gate`: the SM70 compile gate (compiles for ``sm_70`` on a machine
  without a GPU and checks registers, spills, shared memory and fp8e4nv use);
* :mod:`volta_core.kernels.testing`: the pytest plugin (``gpu`` marker, Triton interpreter on
  CPU-only machines, poisoning and relative-error helpers);
* :mod:`volta_core.kernels.bench`: the GPU benchmark harness (event-timed medians, copy and
  matmul ceilings measured in the same run, JSON + PNG + table).

Nothing here imports triton or torch at import time: those come from the ``kernels`` extra and
are imported inside the functions that need them.
"""
