"""The memory vLLM keeps on each GPU besides weights and KV cache: a documented estimate.

What it models (vLLM V1's ``Worker.determine_available_memory``, vLLM 0.21 to 0.33 with their
default ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1``)::

    KV memory = total x gpu_memory_utilization
                - weights - peak activation of the profile run - non-torch memory
                - CUDA-graph memory

The engine measures each term at start-up; this module estimates them from the model's shape:

* **peak activation**: the profile run pushes ``max_num_batched_tokens`` tokens through the
  model; per token the largest live set is the residual stream and its normed copy
  (``2 x hidden``) beside the widest projection's output and its activation
  (``3 x widest / tp``, widest = MLP intermediate, fused q/k/v/gate or linear-attention
  projection), all fp16; plus the sampler's dummy run on ``max_num_seqs`` rows of fp32 logits
  over the whole vocabulary, about three copies live (logits, probabilities, sort buffers).
* **non-torch memory**: cuBLAS workspaces and allocator slack (:data:`NON_TORCH_BYTES`), plus
  NCCL's buffers when ``tp > 1`` (:data:`NCCL_BYTES`).
* **CUDA graphs**: the graph pool the largest capture fills, :data:`CUDA_GRAPH_POOL_BYTES`,
  plus :data:`CUDA_GRAPH_BYTES_PER_SIZE` per capture size (:func:`capture_sizes`, the sizes
  the plan's serve command passes). vLLM 0.21+ estimates the same way, a first capture plus a
  per-graph cost (``GPUModelRunner.profile_cudagraph_memory``). The two figures make 0.45 GiB
  for the three sizes of a four-stream server and 0.57 GiB for the 35 of 256 streams, within
  what vLLM logs for 27-40B and 64-layer hybrid models ("took 0.3-0.6 GiB"; a 0.52 GiB pool
  for the default sizes in vLLM issue 52872).

vLLM 0.19 (and forks based before 0.21) do not count CUDA graphs in the budget: they are
captured after the KV cache, in the ``1 - utilisation`` headroom; there the KV memory is larger
by the graphs' estimate and the headroom must hold them. The CUDA context (about
0.3-0.5 GiB) lives in that headroom in every version and is not part of the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
MIB = 1 << 20

#: The vLLM behaviour this estimate models (shown with every fit).
RESERVE_MODEL = (
    "vLLM 0.21-0.33's start-up memory profile (Worker.determine_available_memory; "
    "CUDA graphs counted in the budget)"
)
NON_TORCH_BYTES = 256 * MIB
NCCL_BYTES = 256 * MIB
CUDA_GRAPH_POOL_BYTES = 448 * MIB
CUDA_GRAPH_BYTES_PER_SIZE = 4 * MIB
#: fp32 logits, probabilities and sort buffers live at once in the sampler's dummy run.
SAMPLER_COPIES = 3


@dataclass(frozen=True)
class Reserve:
    """The estimated non-weight, non-KV memory of one rank, term by term (bytes)."""

    activation: int
    sampler: int
    non_torch: int
    cuda_graphs: int

    @property
    def total(self) -> int:
        return self.activation + self.sampler + self.non_torch + self.cuda_graphs

    def as_dict(self) -> dict[str, int]:
        return {
            "activation": self.activation,
            "sampler": self.sampler,
            "non_torch": self.non_torch,
            "cuda_graphs": self.cuda_graphs,
            "total": self.total,
        }


def capture_sizes(
    max_num_seqs: int, query_len: int, max_num_batched_tokens: int
) -> tuple[int, ...]:
    """The CUDA-graph capture sizes (tokens) that cover every decode batch up to
    ``max_num_seqs`` sequences of ``query_len`` tokens (1 + MTP draft tokens) each.

    vLLM's own grid of request counts (1, 2, 4, then steps of 8 below 256 and of 16 above:
    ``VllmConfig._set_cudagraph_sizes``) up to ``max_num_seqs``, which is always included, times
    ``query_len``; a size over ``max_num_batched_tokens`` is never scheduled, so none is kept.
    Passed explicitly, they also replace the shorter lists some families default to (1Cat-vLLM
    captures 1, 2, 4, 8 and 9 only, so larger batches run without graphs).
    """
    counts = {1, 2, 4, *range(8, 256, 8), *range(256, max_num_seqs + 1, 16), max_num_seqs}
    return tuple(
        sorted(
            n * query_len
            for n in counts
            if n <= max_num_seqs and n * query_len <= max_num_batched_tokens
        )
    )


def engine_reserve(
    hidden: int,
    widest: int,
    vocab: int,
    tp: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    graph_sizes: int,
) -> Reserve:
    """The reserve of one rank (formulas in the module doc); ``widest`` is unsplit;
    ``graph_sizes``: how many CUDA-graph sizes are captured (none: no graphs)."""
    per_token = 2 * (2 * hidden + 3 * -(-widest // tp))
    return Reserve(
        activation=max_num_batched_tokens * per_token,
        sampler=SAMPLER_COPIES * max_num_seqs * vocab * 4,
        non_torch=NON_TORCH_BYTES + (NCCL_BYTES if tp > 1 else 0),
        cuda_graphs=CUDA_GRAPH_POOL_BYTES + graph_sizes * CUDA_GRAPH_BYTES_PER_SIZE
        if graph_sizes
        else 0,
    )
