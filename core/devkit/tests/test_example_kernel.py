"""The example RMSNorm kernel through the checks plugins use: interpreter on CPU, GPU at size.

On a CPU-only machine the kernel runs under the Triton interpreter at small shapes; with
``-m gpu`` on the GPU machine the same checks run at a realistic size.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from volta_devkit.example import rms_norm, rms_norm_kernel, rms_norm_reference  # noqa: E402
from volta_devkit.testing import assert_rel_close, poison_, rel_error  # noqa: E402

FP16_TOL = 2e-3  # fp16 output rounding (2^-11 relative) over fp32 arithmetic
FP32_TOL = 1e-5


def _inputs(rows: int, cols: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)  # fresh data every run
    x = torch.randn(rows, cols, generator=gen, dtype=torch.float32) * 3 + 0.5
    w = torch.rand(cols, generator=gen, dtype=torch.float32) + 0.5
    return x.to(device, dtype), w.to(device, dtype)


def _launch_into(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rows: int) -> None:
    """Run the kernel on the first ``rows`` rows only, writing into a poisoned ``out``."""
    block = 1 << (x.shape[1] - 1).bit_length()
    rms_norm_kernel[(rows,)](
        x, w, out, x.shape[1], x.stride(0), out.stride(0), 1e-6, BLOCK_N=block, num_warps=4
    )


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float16, FP16_TOL), (torch.float32, FP32_TOL)])
@pytest.mark.parametrize(("rows", "cols"), [(3, 64), (5, 100)])
def test_rms_norm_matches_float64_reference(
    kernel_device: str, dtype: torch.dtype, tol: float, rows: int, cols: int
) -> None:
    x, w = _inputs(rows, cols, dtype, kernel_device)
    out = poison_(torch.empty_like(x))
    _launch_into(out, x, w, rows)
    assert_rel_close(out, rms_norm_reference(x, w), tol, f"rms_norm {dtype} [{rows}, {cols}]")
    assert_rel_close(rms_norm(x, w), rms_norm_reference(x, w), tol, "rms_norm launcher")


def test_unwritten_rows_are_caught(kernel_device: str) -> None:
    x, w = _inputs(4, 64, torch.float16, kernel_device)
    out = poison_(torch.empty_like(x))
    _launch_into(out, x, w, rows=3)  # a grid one program short: row 3 stays poisoned
    with pytest.raises(AssertionError, match=r"rms_norm: 64 of 256 elements are NaN.*\(3, 0\)"):
        assert_rel_close(out, rms_norm_reference(x, w), FP16_TOL, "rms_norm")


def test_launcher_refuses_bad_input_before_launch(kernel_device: str) -> None:
    x, w = _inputs(2, 64, torch.float16, kernel_device)
    with pytest.raises(ValueError, match="2-D"):
        rms_norm(x[0], w)
    with pytest.raises(ValueError, match=r"weight must have shape \(64,\)"):
        rms_norm(x, w[:32])
    with pytest.raises(ValueError, match="weight must match x"):
        rms_norm(x, w.float())
    with pytest.raises(ValueError, match="float16 or float32"):
        rms_norm(x.double(), w.double())
    with pytest.raises(ValueError, match="eps must be positive"):
        rms_norm(x, w, eps=0.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_rms_norm_at_llm_size_on_gpu(kernel_device: str, dtype: torch.dtype) -> None:
    assert kernel_device == "cuda"
    tol = FP16_TOL if dtype == torch.float16 else FP32_TOL
    for rows, cols in ((4096, 8192), (1000, 5120), (7, 4096)):
        x, w = _inputs(rows, cols, dtype, kernel_device)
        out = poison_(torch.empty_like(x))
        _launch_into(out, x, w, rows)
        torch.cuda.synchronize()
        assert_rel_close(out, rms_norm_reference(x, w), tol, f"rms_norm {dtype} [{rows}, {cols}]")
        err = rel_error(rms_norm(x, w), rms_norm_reference(x, w))
        assert err <= tol, f"launcher at [{rows}, {cols}]: {err:.3e}"
