"""The experts' arithmetic on the kernels, without vLLM (the GPU machine has none).

:func:`volta_ct_wna16.experts.experts_forward` (the fused kernel) over experts packed by this
package's packer (bit-identical to compressed-tensors, proven in ``test_packing.py``) against
the float64 ``sum_k w_k * down_e(silu(gate_e(x)) * up_e(x))``: on CUDA at 8 experts, hidden
512, intermediate 256, top-2 (marker ``gpu``), eagerly and replayed from a captured CUDA graph
(the path vLLM's decode capture takes); the same checks at a small size under the interpreter
keep this file honest on CPU. :func:`volta_ct_wna16.ops.moe_linear` alone: it writes every
routed row (outputs poisoned first) and no other, and refuses bad arguments before launching.
SM90's swapped large tile (``Launch.swap``) through the whole step on every scheme, with
several blocks per expert.
"""

from __future__ import annotations

import pytest
import torch
from ct_wna16_checkpoints import Checkpoint, fresh_checkpoint

from volta_ct_wna16 import ops
from volta_ct_wna16.dispatch import moe_blocks_choice
from volta_ct_wna16.experts import ExpertWeights, experts_forward
from volta_ct_wna16.layout import PackedWeights, dequantize
from volta_ct_wna16.routing import route
from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.tables import SILU_BLOCK, SM70, SM90
from volta_devkit.testing import assert_rel_close, poison_

TOP_K = 2
TOLERANCE = 3e-3
SCHEMES = [WeightScheme(4, True, 128), WeightScheme(4, False, 32), WeightScheme(8, False, None)]


def packed(ckpt: Checkpoint, name: str) -> PackedWeights:
    return ckpt.packed(name)


def gate_up(gate: Checkpoint, up: Checkpoint) -> Checkpoint:
    """One ``[2 * inter, hidden]`` checkpoint from an expert's gate and up, as vLLM fuses them
    (zero points are packed along the output, so ``inter`` must fill whole words)."""
    tensors = {
        name: torch.cat([gate.tensors[name], up.tensors[name]])
        for name in gate.tensors
        if name != "weight_shape"
    }
    n, k = gate.shape
    tensors["weight_shape"] = torch.tensor([2 * n, k])
    return Checkpoint(tensors, gate.config, gate.scheme)


def make_experts(
    scheme: WeightScheme, experts: int, hidden: int, inter: int, device: str
) -> tuple[ExpertWeights, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    """Random experts in the kernels' layout, and each one's float64 (gate, up, down)."""
    w13, w2, dense = [], [], []
    for e in range(experts):
        gate = fresh_checkpoint(inter, hidden, scheme, seed=3 * e, device=device)
        up = fresh_checkpoint(inter, hidden, scheme, seed=3 * e + 1, device=device)
        down = fresh_checkpoint(hidden, inter, scheme, seed=3 * e + 2, device=device)
        w13.append(packed(gate_up(gate, up), f"expert {e} w13"))
        w2.append(packed(down, f"expert {e} w2"))
        fused = dequantize(w13[-1])
        dense.append((fused[:inter], fused[inter:], dequantize(w2[-1])))
    return ExpertWeights.stack(w13, w2, experts), dense


def routing(m: int, experts: int, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:TOP_K] for _ in range(m)])
    weights = torch.rand(m, TOP_K, generator=gen)
    weights /= weights.sum(-1, keepdim=True)
    return weights.to(device), ids.to(torch.int32).to(device)


def reference(
    dense: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
) -> torch.Tensor:
    out = torch.zeros(x.shape[0], dense[0][2].shape[0], dtype=torch.float64, device=x.device)
    xd = x.double()
    for slot in range(ids.shape[1]):
        for e, (gate, up, down) in enumerate(dense):
            rows = ids[:, slot] == e
            if bool(rows.any()):
                h = torch.nn.functional.silu(xd[rows] @ gate.t()) * (xd[rows] @ up.t())
                out[rows] += weights[rows, slot, None].double() * (h @ down.t())
    return out


@pytest.fixture
def poisoned_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """Floating ``torch.empty`` tensors poisoned (:func:`poison_`) as they are made, so a row
    the launcher leaves to a kernel reads NaN unless the kernel writes it."""
    empty = torch.empty

    def poisoned(*args: object, **kwargs: object) -> torch.Tensor:
        t = empty(*args, **kwargs)  # type: ignore[call-overload]
        return poison_(t) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)


def check_eager(experts: ExpertWeights, dense, m: int, device: str, what: str) -> None:
    x = torch.randn(m, experts.hidden, device=device).half()
    weights, ids = routing(m, experts.num_experts, device, seed=m)
    ref = reference(dense, x, weights, ids)
    out = experts_forward(x, weights, ids, experts)
    assert out.dtype == torch.float16
    assert_rel_close(out, ref, TOLERANCE, f"{what} m={m}")


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.label.replace(" ", "-"))
def test_experts_forward_under_the_interpreter(scheme) -> None:
    if torch.cuda.is_available():
        pytest.skip("the CPU copy of the GPU checks")
    experts, dense = make_experts(scheme, experts=4, hidden=128, inter=128, device="cpu")
    for m in (1, 3, 40):  # 40 tokens: 80 pairs over 4 experts take the larger tile
        check_eager(experts, dense, m, "cpu", scheme.label)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.label.replace(" ", "-"))
def test_gpu_experts_eager_and_in_a_cuda_graph(scheme) -> None:
    experts, dense = make_experts(scheme, experts=8, hidden=512, inter=256, device="cuda")
    for m in (1, 16, 200):
        check_eager(experts, dense, m, "cuda", scheme.label)
        # Capture the sync-free path once, then replay it on new tokens and new routing.
        x = torch.randn(m, 512, device="cuda").half()
        weights, ids = routing(m, 8, "cuda", seed=1000 + m)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # compiles before the capture
            experts_forward(x, weights, ids, experts)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = experts_forward(x, weights, ids, experts)
        for replay in range(3):
            new_weights, new_ids = routing(m, 8, "cuda", seed=2000 + 10 * m + replay)
            x.copy_(torch.randn(m, 512, device="cuda").half())
            weights.copy_(new_weights)
            ids.copy_(new_ids)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            ref = reference(dense, x, weights, ids)
            assert_rel_close(out, ref, TOLERANCE, f"{scheme.label} m={m} graph replay {replay}")


def _routed_rows(device: str) -> None:
    """Gate/up rows of ``moe_linear`` for a routing with an idle expert and another rank's
    pairs, on both tables' small tiles (split across the input: the grid is small) and large
    ones (SM90's swapped): rows per pair (fp16, or fp32 where split), fp32 rows per pair, and
    each token's pairs summed into its row. Every routed row equals its expert's float64
    product (summed per token); fp32 rows no pair reaches are zero, fp16 ones stay poisoned
    (:func:`poisoned_empty`)."""
    scheme = SCHEMES[1]
    experts, dense = make_experts(scheme, experts=4, hidden=256, inter=64, device=device)
    m, top_k = 21, 2
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 3, (m, top_k), generator=gen)  # expert 3 idle
    ids[::5, :] = -1  # every fifth token another rank's only
    ids[1::5, 1] = -1
    x = torch.randn(m, 256, generator=gen).half().to(device)
    flat = ids.reshape(-1)
    want = torch.zeros(m * top_k, 128, dtype=torch.float64, device=device)
    for p, e in enumerate(flat.tolist()):
        if e >= 0:
            gate, up, _ = dense[e]
            want[p] = x[p // top_k].double() @ torch.cat([gate, up]).t()
    routed = flat >= 0
    tiles = (SM70.moe, SM70.moe_large, SM90.moe, SM90.moe_large)
    for launch in tiles:  # SM90's also on SM70 sizes: one dot per word slot, 128-input steps
        blocks = route(flat.to(device), 4, launch.block_m)
        for sum_slots in (0, 1, top_k):
            what = f"{launch} sum_slots={sum_slots}"
            out = ops.moe_linear(x, experts.w13, blocks, launch, top_k, sum_slots=sum_slots)
            if sum_slots:
                assert out.dtype == torch.float32
                expect = want.view(-1, sum_slots, 128).sum(1)
                reached = routed.view(-1, sum_slots).any(1).to(device)
                assert out.shape == expect.shape
                assert bool((out[~reached] == 0).all()), what
                assert_rel_close(out[reached], expect[reached], TOLERANCE, what)
            else:
                assert out.shape == (m * top_k, 128)
                if out.dtype == torch.float32:
                    assert bool((out[~routed.to(device)] == 0).all()), what
                else:
                    assert bool(out[~routed.to(device)].isnan().all()), what
                assert_rel_close(out[routed.to(device)], want[routed.to(device)], TOLERANCE, what)


def test_moe_linear_writes_routed_rows_under_the_interpreter(poisoned_empty) -> None:
    if torch.cuda.is_available():
        pytest.skip("the CPU copy of the GPU check")
    _routed_rows("cpu")


@pytest.mark.gpu
def test_gpu_moe_linear_writes_routed_rows(poisoned_empty) -> None:
    _routed_rows("cuda")


def _swapped_step(
    scheme: WeightScheme, experts: int, hidden: int, inter: int, m: int, device: str
) -> None:
    """The whole step on SM90's large tile, which computes the transposed product with scales
    per word row (``Launch.swap``): gate/up's fp16 rows per pair (poisoned as made), the SiLU
    product, down's router-weighted fp32 tiles added into each token's row, against float64.
    ``m * TOP_K / experts`` above the tile's rows gives experts a full block and a partial one."""
    launch = SM90.moe_large
    assert launch.swap
    weights, dense = make_experts(scheme, experts, hidden, inter, device)
    x = torch.randn(m, hidden, device=device).half()
    w, ids = routing(m, experts, device, seed=m)
    out = experts_forward(x, w, ids, weights, launch=launch)
    assert_rel_close(out, reference(dense, x, w, ids), TOLERANCE, f"{scheme.label} swapped")


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.label.replace(" ", "-"))
def test_swapped_tile_under_the_interpreter(poisoned_empty, scheme) -> None:
    if torch.cuda.is_available():
        pytest.skip("the CPU copy of the GPU check")
    _swapped_step(scheme, experts=3, hidden=128, inter=128, m=100, device="cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.label.replace(" ", "-"))
def test_gpu_swapped_tile(poisoned_empty, scheme) -> None:
    _swapped_step(scheme, experts=8, hidden=512, inter=256, m=600, device="cuda")


def test_moe_linear_refuses_bad_arguments() -> None:
    experts, _ = make_experts(SCHEMES[0], experts=2, hidden=128, inter=128, device="cpu")
    launch = moe_blocks_choice(4, 2, (7, 0)).launch
    x = torch.randn(2, 128).half()
    blocks = route(torch.tensor([0, 1, 1, 0]), 2, launch.block_m)
    with pytest.raises(ValueError, match="blocks of 16 rows for a 32-row tile"):
        ops.moe_linear(x, experts.w13, blocks, SM70.moe_large, 2)
    with pytest.raises(ValueError, match=r"router weights must be float32 of shape \(4,\)"):
        ops.moe_linear(x, experts.w13, blocks, launch, 2, torch.ones(4).half())
    with pytest.raises(ValueError, match=r"router weights must be float32 of shape \(4,\)"):
        ops.moe_linear(x, experts.w13, blocks, launch, 2, torch.ones(3))
    with pytest.raises(ValueError, match="input has 64 features; the layer takes 128"):
        ops.moe_linear(x[:, :64], experts.w13, blocks, launch, 2)
    with pytest.raises(TypeError, match="float16 activations"):
        ops.moe_linear(x.float(), experts.w13, blocks, launch, 2)
    with pytest.raises(ValueError, match="4 pairs do not make tokens of 3 slots"):
        ops.moe_linear(x, experts.w13, blocks, launch, 2, sum_slots=3)


def _silu_products(device: str) -> None:
    """``silu_mul`` on fp16 and fp32 rows (a row length past one program's columns, so the
    tail is masked) against float64 of the same rows."""
    gen = torch.Generator().manual_seed(9)
    inter = SILU_BLOCK + 72
    h = (4 * torch.randn(5, 2 * inter, generator=gen, dtype=torch.float64)).to(device)
    for dtype in (torch.float16, torch.float32):
        rows = h.to(dtype)
        exact = rows.double()
        want = exact[:, :inter] * torch.sigmoid(exact[:, :inter]) * exact[:, inter:]
        out = ops.silu_mul(rows, torch.float16)
        assert out.dtype == torch.float16
        assert out.shape == (5, inter)
        assert_rel_close(out, want, 2e-3, f"silu_mul {dtype}")


def test_silu_mul_under_the_interpreter() -> None:
    if torch.cuda.is_available():
        pytest.skip("the CPU copy of the GPU check")
    _silu_products("cpu")


@pytest.mark.gpu
def test_gpu_silu_mul() -> None:
    _silu_products("cuda")


def test_silu_mul_refuses_bad_rows() -> None:
    with pytest.raises(ValueError, match=r"gate/up rows must be fp16 or fp32 \[rows, 2 \* inter\]"):
        ops.silu_mul(torch.zeros(3, 5).half(), torch.float16)
    with pytest.raises(ValueError, match=r"got torch\.float64"):
        ops.silu_mul(torch.zeros(3, 4, dtype=torch.float64), torch.float16)
    with pytest.raises(TypeError, match=r"stored as fp16, not torch\.float32"):
        ops.silu_mul(torch.zeros(3, 4).half(), torch.float32)
