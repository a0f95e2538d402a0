"""The calls ``vllm-volta bench`` times for the plugin: a claimed linear layer or fused experts
at a token count.

Named by :func:`volta_ct_wna16.plugin.volta_bench_case` and imported only when the command
times a call on a GPU. Each input set is what the layer's method passes its launcher for one
rank at TP 1: the weights in the kernels' layout (:class:`~volta_ct_wna16.layout.PackedWeights`:
random packed words, small positive group scales, random zero points for an asymmetric scheme;
fused experts' stacked on a first axis as :class:`~volta_ct_wna16.experts.ExpertWeights` holds
them), random fp16 activations; a linear layer's output (to
:func:`volta_ct_wna16.ops.wna16_linear`); for fused experts the router's output (to
:func:`volta_ct_wna16.experts.experts_forward`): each token's ``top_k`` distinct experts drawn
uniformly (what the cost model counts the touched experts by) and weights that sum to one.
"""

from __future__ import annotations

from typing import Any

from volta_core import QuantConfig, QuantLayer
from volta_core.kernel_api import BenchCall, Workload
from volta_ct_wna16.scheme import WeightScheme, quant_layer_scheme


def _scheme(layer: QuantLayer, quant: QuantConfig | None) -> WeightScheme:
    scheme = quant_layer_scheme(quant.raw, layer) if quant is not None else None
    if not isinstance(scheme, WeightScheme):
        raise ValueError(f"{layer.prefix} has no weight scheme ct_wna16 runs")
    return scheme


def linear_call(
    layer: QuantLayer, quant: QuantConfig | None, work: Workload, device: str = "cuda"
) -> BenchCall:
    """``work.tokens`` tokens through ``layer`` (its ``output_size`` x ``input_size``) with the
    checkpoint's scheme, the launch the device's table chooses for that count, on ``device``
    (the tests run it on CPU under the interpreter)."""
    import torch

    from volta_ct_wna16.layout import PackedWeights
    from volta_ct_wna16.ops import wna16_linear

    scheme = _scheme(layer, quant)
    n, k, m = layer.output_size, layer.input_size, work.tokens
    bits, group = scheme.num_bits, scheme.group_for(k)
    words, groups = -(-k // scheme.pack_factor), k // group

    def make_inputs() -> tuple[Any, ...]:
        qweight = torch.randint(-(2**31), 2**31 - 1, (words, n), dtype=torch.int32, device=device)
        scales = torch.rand(groups, n, dtype=torch.float16, device=device) * 0.01 + 0.001
        zeros = zeros8 = None
        if not scheme.symmetric:
            zeros8 = torch.randint(0, 2**bits, (groups, n), dtype=torch.uint8, device=device)
            zeros = zeros8.to(torch.float16)
        weights = PackedWeights(qweight, scales, zeros, n, k, bits, group, zeros8)
        x = torch.randn(m, k, dtype=torch.float16, device=device)
        return x, weights, torch.empty(m, n, dtype=torch.float16, device=device)

    def run(x: Any, weights: Any, out: Any) -> None:
        wna16_linear(x, weights, out=out)

    zero_bytes = 0 if scheme.symmetric else 3 * groups * n
    nbytes = 4 * words * n + 2 * groups * n + zero_bytes + 2 * m * (k + n)
    return BenchCall(make_inputs, run, nbytes)


def experts_call(
    layer: QuantLayer, quant: QuantConfig | None, work: Workload, device: str = "cuda"
) -> BenchCall:
    """One step of ``work.tokens`` tokens through fused experts (``layer.experts`` of them,
    ``layer.top_k`` a token, ``input_size`` the hidden size, ``output_size`` one expert's
    intermediate size on the rank) with the checkpoint's scheme: gate and up stacked as one
    ``[2 * inter, hidden]`` weight and down ``[hidden, inter]`` per expert; the kernels the
    device's dispatch chooses for the step, on ``device``."""
    import torch

    from volta_ct_wna16.experts import ExpertWeights, experts_forward
    from volta_ct_wna16.layout import PackedWeights

    scheme = _scheme(layer, quant)
    experts, top_k, m = layer.experts, layer.top_k, work.tokens
    hidden, inter = layer.input_size, layer.output_size
    bits = scheme.num_bits
    shapes = ((2 * inter, hidden), (hidden, inter))  # gate/up, down

    def sizes(k: int) -> tuple[int, int, int]:
        """Words along ``k`` inputs, groups, the group size."""
        group = scheme.group_for(k)
        return -(-k // scheme.pack_factor), k // group, group

    def stack(n: int, k: int) -> PackedWeights:
        words, groups, group = sizes(k)
        qweight = torch.randint(
            -(2**31), 2**31 - 1, (experts, words, n), dtype=torch.int32, device=device
        )
        scales = torch.rand(experts, groups, n, dtype=torch.float16, device=device) * 0.01 + 0.001
        zeros = None
        if not scheme.symmetric:
            zeros = torch.randint(0, 2**bits, (experts, groups, n), device=device).half()
        return PackedWeights(qweight, scales, zeros, n, k, bits, group)

    def make_inputs() -> tuple[Any, ...]:
        weights = ExpertWeights(stack(*shapes[0]), stack(*shapes[1]))
        x = torch.randn(m, hidden, dtype=torch.float16, device=device)
        ids = torch.rand(m, experts, device=device).argsort(dim=1)[:, :top_k].to(torch.int32)
        router = torch.rand(m, top_k, dtype=torch.float32, device=device).softmax(dim=1)
        return x, weights, router, ids.contiguous()

    def run(x: Any, weights: Any, router: Any, ids: Any) -> Any:
        return experts_forward(x, router, ids, weights)

    def weight_bytes(n: int, k: int) -> int:
        words, groups, _ = sizes(k)
        zero_bytes = 0 if scheme.symmetric else 2 * groups * n
        return experts * (4 * words * n + 2 * groups * n + zero_bytes)

    nbytes = sum(weight_bytes(n, k) for n, k in shapes) + 2 * m * hidden + 8 * m * top_k
    return BenchCall(make_inputs, run, nbytes)
