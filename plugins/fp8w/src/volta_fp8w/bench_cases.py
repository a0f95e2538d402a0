"""The calls ``vllm-volta bench`` times for the plugin: a claimed linear layer or fused experts
at a token count.

Named by :func:`volta_fp8w.plugin.volta_bench_case` and imported only when the command times a
call on a GPU. Each input set is what the layer's method passes its launcher for one rank at
TP 1, in the kernels' layout (:mod:`volta_fp8w.layout`): random e4m3 codes (never a NaN code:
no checkpoint holds one) and small positive float32 scales in the scheme's blocks (one a row
for channel and tensor scales, as the loader expands them), random fp16 activations; a linear
layer's output; for fused experts the router's output too, each token's ``top_k`` distinct
experts drawn uniformly (what the cost model counts the touched experts by) and weights that
sum to one. The launcher makes the same choice for the call as it does serving
(:func:`volta_fp8w.ops.fp8_linear`, :func:`volta_fp8w.experts.experts_forward`).
"""

from __future__ import annotations

from typing import Any

from volta_core import QuantConfig, QuantLayer
from volta_core.kernel_api import BenchCall, Workload
from volta_fp8w.layout import channel_block_k
from volta_fp8w.scheme import Fp8Scheme, quant_layer_scheme

#: e4m3fn's positive NaN code (``0xFF`` the negative one): the random codes skip both.
_NAN = 0x7F


def _scheme(layer: QuantLayer, quant: QuantConfig | None) -> Fp8Scheme:
    scheme = quant_layer_scheme(quant.raw, layer) if quant is not None else None
    if not isinstance(scheme, Fp8Scheme):
        raise ValueError(f"{layer.prefix} has no FP8 scheme fp8w runs")
    return scheme


def kernel_block(scheme: Fp8Scheme, k: int) -> tuple[int, int]:
    """The ``(block_n, block_k)`` of a layer of ``k`` inputs in the kernels' layout: the
    scheme's blocks, or one row spanning the inputs (:func:`~volta_fp8w.layout.channel_block_k`)
    for channel and tensor scales."""
    return scheme.block if scheme.block is not None else (1, channel_block_k(k))


def _scale_shape(n: int, k: int, block: tuple[int, int]) -> tuple[int, int]:
    return -(-n // block[0]), -(-k // block[1])


def _codes(shape: tuple[int, ...], device: str) -> Any:
    """Random uint8 e4m3fn codes, every byte but the NaN codes ``0x7F`` and ``0xFF``."""
    import torch

    codes = torch.randint(0, 254, shape, dtype=torch.uint8, device=device)
    return codes + (codes >= _NAN).to(torch.uint8)


def _scales(shape: tuple[int, ...], device: str) -> Any:
    import torch

    return torch.rand(shape, dtype=torch.float32, device=device) * 0.01 + 0.001


def linear_call(
    layer: QuantLayer, quant: QuantConfig | None, work: Workload, device: str = "cuda"
) -> BenchCall:
    """``work.tokens`` tokens through ``layer`` (its ``output_size`` x ``input_size``) with the
    checkpoint's scheme, the launch the device's dispatch chooses for that count, on ``device``
    (the tests run it on CPU under the interpreter)."""
    import torch

    from volta_fp8w.layout import Fp8Weights
    from volta_fp8w.ops import fp8_linear

    n, k, m = layer.output_size, layer.input_size, work.tokens
    block = kernel_block(_scheme(layer, quant), k)
    scales = _scale_shape(n, k, block)

    def make_inputs() -> tuple[Any, ...]:
        weights = Fp8Weights(_codes((n, k), device), _scales(scales, device), n, k, *block)
        x = torch.randn(m, k, dtype=torch.float16, device=device)
        return x, weights, torch.empty(m, n, dtype=torch.float16, device=device)

    def run(x: Any, weights: Any, out: Any) -> None:
        fp8_linear(x, weights, out=out)

    nbytes = n * k + 4 * scales[0] * scales[1] + 2 * m * (k + n)
    return BenchCall(make_inputs, run, nbytes)


def experts_call(
    layer: QuantLayer, quant: QuantConfig | None, work: Workload, device: str = "cuda"
) -> BenchCall:
    """One step of ``work.tokens`` tokens through fused experts (``layer.experts`` of them,
    ``layer.top_k`` a token, ``input_size`` the hidden size, ``output_size`` one expert's
    intermediate size on the rank): gate and up stacked as one ``[2 * inter, hidden]`` weight
    and down ``[hidden, inter]`` per expert, in the scheme's blocks; the kernels dispatch
    chooses for the step, on ``device``."""
    import torch

    from volta_fp8w.experts import ExpertWeights, experts_forward
    from volta_fp8w.layout import Fp8Weights

    scheme = _scheme(layer, quant)
    experts, top_k, m = layer.experts, layer.top_k, work.tokens
    hidden, inter = layer.input_size, layer.output_size
    shapes = ((2 * inter, hidden), (hidden, inter))  # gate/up, down
    blocks = [kernel_block(scheme, k) for _, k in shapes]
    scales = [_scale_shape(n, k, b) for (n, k), b in zip(shapes, blocks, strict=True)]

    def stack(i: int) -> Fp8Weights:
        (n, k), block = shapes[i], blocks[i]
        codes = _codes((experts, n, k), device)
        return Fp8Weights(codes, _scales((experts, *scales[i]), device), n, k, *block)

    def make_inputs() -> tuple[Any, ...]:
        weights = ExpertWeights(stack(0), stack(1))
        x = torch.randn(m, hidden, dtype=torch.float16, device=device)
        ids = torch.rand(m, experts, device=device).argsort(dim=1)[:, :top_k].to(torch.int32)
        router = torch.rand(m, top_k, dtype=torch.float32, device=device).softmax(dim=1)
        return x, weights, router, ids.contiguous()

    def run(x: Any, weights: Any, router: Any, ids: Any) -> Any:
        return experts_forward(x, weights, router, ids)

    weight_bytes = sum(
        experts * (n * k + 4 * r * c) for (n, k), (r, c) in zip(shapes, scales, strict=True)
    )
    return BenchCall(make_inputs, run, weight_bytes + 2 * m * hidden + 8 * m * top_k)
