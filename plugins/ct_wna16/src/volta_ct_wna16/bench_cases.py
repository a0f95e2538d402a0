"""The calls ``vllm-volta bench`` times for the plugin: a claimed linear layer at a token count.

Named by :func:`volta_ct_wna16.plugin.volta_bench_case` and imported only when the command
times a call on a GPU. Each input set is what the linear method passes to
:func:`volta_ct_wna16.ops.wna16_linear` for one rank at TP 1: the weights in the kernels'
layout (:class:`~volta_ct_wna16.layout.PackedWeights`: random packed words, small positive
group scales, random zero points for an asymmetric scheme), random fp16 activations and the
output.
"""

from __future__ import annotations

from typing import Any

from volta_core import QuantConfig, QuantLayer
from volta_core.kernel_api import BenchCall, Workload
from volta_ct_wna16.scheme import WeightScheme, quant_layer_scheme


def linear_call(
    layer: QuantLayer, quant: QuantConfig | None, work: Workload, device: str = "cuda"
) -> BenchCall:
    """``work.tokens`` tokens through ``layer`` (its ``output_size`` x ``input_size``) with the
    checkpoint's scheme, the launch the device's table chooses for that count, on ``device``
    (the tests run it on CPU under the interpreter)."""
    import torch

    from volta_ct_wna16.layout import PackedWeights
    from volta_ct_wna16.ops import wna16_linear

    scheme = quant_layer_scheme(quant.raw, layer) if quant is not None else None
    if not isinstance(scheme, WeightScheme):
        raise ValueError(f"{layer.prefix} has no weight scheme ct_wna16 runs")
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
