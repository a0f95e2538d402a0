"""Recording a third-party host function's Triton launches, on CPU tensors, for the gate."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = triton.language

from triton.runtime.jit import JITFunction  # noqa: E402

from volta_devkit.launch_capture import build_key, gate_inputs, recording_launches  # noqa: E402


def _scale_rows(x, out, n_cols, stride, one, factor, bias, BLOCK: tl.constexpr, FLAG: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    v = tl.load(x + row * stride + cols, mask=mask).to(tl.float32) * factor * one
    if FLAG:
        v += tl.load(bias + cols, mask=mask).to(tl.float32)
    tl.store(out + row * stride + cols, v.to(tl.float16), mask=mask)


# Built as a JIT function whatever TRITON_INTERPRET says: recording needs its parameters.
scale_rows = JITFunction(_scale_rows)
tuned = triton.heuristics({"FLAG": lambda args: args["bias"] is not None})(scale_rows)
tuned = triton.autotune(
    configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (64, 128) for w in (2, 4)],
    key=["n_cols"],
    prune_configs_by={"early_config_prune": lambda configs, nargs, **kw: configs[1:]},
)(tuned)


def host(x: torch.Tensor) -> torch.Tensor:
    """A library's host function: allocates, then launches through the autotuner."""
    out = torch.empty_like(x)
    tuned[(x.shape[0],)](x, out, x.shape[1], x.stride(0), 1, 0.5, None)
    return out


def test_the_autotuner_hands_on_every_configuration_it_would_time() -> None:
    x = torch.zeros(4, 96, dtype=torch.float16)
    with recording_launches() as log:
        out = host(x)
    assert out.shape == x.shape  # the host code ran; the kernel did not
    # early_config_prune dropped the first of four: the three left, one group, in order.
    assert [(launch.arguments["BLOCK"], launch.num_warps) for launch in log.launches] == [
        (64, 4),
        (128, 2),
        (128, 4),
    ]
    assert len({launch.autotune_group for launch in log.launches}) == 1
    assert len({build_key(launch) for launch in log.launches}) == 3
    # Outside the block, launches run again (here: the patched methods are restored).
    assert JITFunction.run.__name__ == "run"


def test_gate_inputs_follow_triton_specialization() -> None:
    x = torch.zeros(4, 96, dtype=torch.float16)
    with recording_launches() as log:
        host(x)
    inputs = gate_inputs(log.launches[0])
    assert inputs.signature == {
        "x": "*fp16",
        "out": "*fp16",
        "n_cols": "i32",
        "stride": "i32",
        "factor": "fp32",
    }
    # 1 is a compile-time 1, None a constexpr, the heuristic's value a constexpr.
    assert inputs.constexprs == {"one": 1, "bias": None, "BLOCK": 64, "FLAG": False}
    assert inputs.divisible_by_16 == ("n_cols", "stride")  # 96 is a multiple of 16


def test_an_argument_triton_cannot_take_is_named() -> None:
    x = torch.zeros(4, 96, dtype=torch.float16)
    odd = torch.zeros(3, dtype=torch.complex64)
    with recording_launches() as log:
        scale_rows[(1,)](x, x, 96, 96, 2, 0.5, odd, BLOCK=128, FLAG=True)
    with pytest.raises(TypeError, match="argument bias is a complex64 tensor"):
        gate_inputs(log.launches[0])
