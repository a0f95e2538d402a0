"""The benchmark's CPU-side parts: its SM70 model and its refusal without a GPU."""

from __future__ import annotations

import pytest
import torch

from volta_ct_wna16 import bench, configs
from volta_ct_wna16.layout import prepare
from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.testing import fresh_checkpoint


def test_sm70_estimate_follows_the_path_sm70_takes() -> None:
    n, k = 256, 512
    t = fresh_checkpoint(n, k, WeightScheme(4, True, 128)).tensors
    pw = prepare(
        "b",
        WeightScheme(4, True, 128),
        n=n,
        k=k,
        weight_packed=t["weight_packed"],
        weight_scale=t["weight_scale"],
        weight_zero_point=None,
        act_dtype=torch.float16,
    )
    seconds, bound = bench.sm70_estimate(1, n, k, pw)
    assert bound == "memory"
    assert seconds == pytest.approx((pw.nbytes() + 2 * k + 2 * n) / bench.V100_BANDWIDTH)
    assert bench.sm70_estimate(16, n, k, pw)[1] == "FMA"
    assert configs.choose(2048, 256, 512, (7, 0), 4).path == configs.DEQUANT_MATMUL
    assert bench.sm70_estimate(2048, n, k, pw)[1] == "dequant+cuBLAS"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_refuses_to_run_without_cuda(tmp_path) -> None:
    assert bench.main(["--out", str(tmp_path)]) == 2
