"""``volta_core.kernel_api.accumulate_splits`` (with :func:`~volta_core.kernel_api.take_sums` and
:func:`~volta_core.kernel_api.store_out`): split-K's serial reduction as Triton device functions,
loaded on first use (importing ``volta_core.kernel_api`` imports no triton: test_prelude.py).
The launch runs a probe kernel in Triton's interpreter, in a child process (``TRITON_INTERPRET``
is read when a kernel is defined); without the core's ``kernels`` extra (triton, torch) the
tests that need it skip."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from volta_core import kernel_api

NAMES = ("accumulate_splits", "store_out", "take_sums")

#: A split-K launch whose splits' partials come from memory: ``parts[split, m, n]`` summed by
#: ``accumulate_splits`` into ``out`` (rows ``stride_om`` apart), twice on the same counters and
#: accumulators, which the first launch must leave zero.
PROBE = """
import torch
import triton
import triton.language as tl

from volta_core.kernel_api import accumulate_splits


@triton.jit
def probe(parts_ptr, ws_ptr, cnt_ptr, b_ptr, out_ptr, M, N, stride_om,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    tile_ok = (rm < M)[:, None] & n_ok[None, :]
    offs = tl.program_id(2) * M * N + rm[:, None] * N + rn[None, :]
    res = tl.load(parts_ptr + offs, mask=tile_ok, other=0.0)
    accumulate_splits(res, ws_ptr, cnt_ptr, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, N,
                      stride_om, HAS_BIAS)


def main():
    torch.manual_seed(0)
    m, n, splits, pad = 5, 40, 3, 3
    # whole numbers: every order of the fp32 adds gives the same sum, exact in fp16
    parts = torch.randint(-64, 64, (splits, m, n)).float()
    bias = torch.randint(-8, 8, (n,)).half()
    ws = torch.zeros(m * n)
    counters = torch.zeros(64, dtype=torch.int32)
    grid = (triton.cdiv(m, 4), triton.cdiv(n, 16), splits)
    for has_bias in (True, False, True):
        out = torch.full((m, n + pad), 7.0, dtype=torch.float16)
        probe[grid](parts, ws, counters, bias, out, m, n, n + pad,
                    BLOCK_M=4, BLOCK_N=16, HAS_BIAS=has_bias)
        want = parts.sum(0) + (bias.float() if has_bias else 0.0)
        assert torch.equal(out[:, :n].float(), want), (out, want)
        assert torch.equal(out[:, n:], torch.full((m, pad), 7.0, dtype=torch.float16))
        assert not ws.any() and not counters.any(), "accumulators and counters left non-zero"
    print("ok")


main()
"""


@pytest.mark.parametrize("name", NAMES)
def test_each_name_is_declared_and_comes_from_its_module(name: str) -> None:
    assert name in kernel_api.__all__
    pytest.importorskip("triton", reason="the split-K functions need the core's `kernels` extra")
    function = getattr(kernel_api, name)
    assert function.fn.__module__ == "volta_core.kernel_api._splitk"
    assert function.__name__ == name


def test_the_splits_sum_in_one_launch_and_leave_the_buffers_zero(tmp_path: Path) -> None:
    for module in ("triton", "torch"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the interpreter launch needs {module} (the core's `kernels` extra)")
    script = tmp_path / "splitk_probe.py"
    script.write_text(textwrap.dedent(PROBE))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == "ok", run.stdout + run.stderr
