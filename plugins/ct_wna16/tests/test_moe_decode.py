"""The fused-MoE decode kernels (:func:`volta_ct_wna16.ops.moe_decode`, 1-16 tokens straight
from the router's ids), the router's top-k from logits
(:func:`volta_ct_wna16.routing.select_experts`) and the step's refusals of bad input.

Every check is against float64 (:func:`test_moe_gpu.reference`) with the output poisoned first:
each table's launches (both device families) on three schemes, an expert map with another
rank's pairs and a token that has none, the router weight on the input, an expert chosen twice
by one token, int64 ids. Small under the interpreter on CPU; on the GPU (marker ``gpu``) at a
Qwen3.5-35B-A3B layer's shape, eagerly and replayed from a captured CUDA graph with new tokens
and routing over an allocator poisoned with NaN.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from test_moe_gpu import SCHEMES, TOLERANCE, make_experts, reference

from volta_core import Device
from volta_ct_wna16 import experts as experts_module
from volta_ct_wna16 import ops
from volta_ct_wna16.dispatch import decode_builds, moe_decode_choice
from volta_ct_wna16.experts import ExpertWeights, experts_forward
from volta_ct_wna16.gate_configs import kernel_config, kernel_configs
from volta_ct_wna16.launch import fused_whole, pow2_at_least
from volta_ct_wna16.routing import select_experts
from volta_ct_wna16.tables import SM70, SM90, MoEDecode, MoEFused
from volta_devkit.testing import assert_rel_close, poison_

#: Every decode launch pair of both tables: (label, launches).
TABLE_LAUNCHES = [
    (f"{name}-{most}", launches)
    for name, table in (("sm90", SM90), ("sm70", SM70))
    for most, launches in table.moe_decode
]

#: The one-launch step on a small tile whatever the tables take, so that its masks (an
#: intermediate block past the layer's end, outputs past the hidden size) are always checked.
ONE_LAUNCH = MoEFused(block_j=64, block_k=64, block_n=256, num_warps=4, num_stages=2)

#: The one-launch step on a tile that the CPU cases' layers (hidden 128, intermediate 96)
#: hold whole, so that its unmasked build (the kernel's ``WHOLE``) runs too.
ONE_LAUNCH_WHOLE = MoEFused(block_j=32, block_k=64, block_n=128, num_warps=4, num_stages=2)

#: What the CPU and GPU case checks run: the tables' rows and the small one-launch tiles.
CHECKED_LAUNCHES = [
    *TABLE_LAUNCHES,
    ("one-launch", ONE_LAUNCH),
    ("one-launch-whole", ONE_LAUNCH_WHOLE),
]


def _routing(
    m: int, experts: int, top_k: int, seed: int, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(m)])
    w = torch.rand(m, top_k, generator=gen) + 0.1
    return (w / w.sum(-1, keepdim=True)).to(device), ids.to(torch.int32).to(device)


def _decode(
    x, w, ids, experts: ExpertWeights, launches: MoEDecode | MoEFused, **kw
) -> torch.Tensor:
    out = poison_(torch.empty(x.shape, dtype=x.dtype, device=x.device))
    got = ops.moe_decode(x, experts.w13, experts.w2, w, ids, launches, out=out, **kw)
    assert got.data_ptr() == out.data_ptr()
    return out


def _check_cases(
    experts: ExpertWeights, dense, launches: MoEDecode | MoEFused, device: str, what: str
) -> None:
    e = experts.num_experts
    for m in (1, 3):
        x = torch.randn(m, experts.hidden, device=device).half()
        w, ids = _routing(m, e, 2, seed=m, device=device)
        out = _decode(x, w, ids, experts, launches)
        assert_rel_close(out, reference(dense, x, w, ids), TOLERANCE, f"{what} m={m}")
    # An expert map over 6 global experts, 1 and 3 another rank's, the rest local out of
    # order; token 0's pairs are all remote.
    x = torch.randn(3, experts.hidden, device=device).half()
    w, _ = _routing(3, e, 2, seed=5, device=device)
    global_ids = torch.tensor([[1, 3], [2, 1], [0, 5]], dtype=torch.int32, device=device)
    expert_map = torch.tensor([3, -1, 2, -1, 1, 0], dtype=torch.int32, device=device)
    local = expert_map[global_ids.long()]
    out = _decode(x, w, global_ids, experts, launches, expert_map=expert_map)
    want = reference(dense, x, torch.where(local >= 0, w, 0), local.clamp_min(0))
    assert bool((out[0] == 0).all()), what
    assert_rel_close(out, want, TOLERANCE, f"{what} expert map")
    # The router weight on the input (top-1, as vLLM allows it).
    w1, ids1 = _routing(2, e, 1, seed=6, device=device)
    out = _decode(x[:2], w1, ids1, experts, launches, weight_on_input=True)
    xs = (x[:2].float() * w1).half()
    want = reference(dense, xs, torch.ones_like(w1), ids1)
    assert_rel_close(out, want, TOLERANCE, f"{what} weight on input")
    # One expert chosen twice by each token.
    m = 2
    xt = torch.randn(m, experts.hidden, device=device).half()
    wt, _ = _routing(m, e, 2, seed=7, device=device)
    twice = torch.full((m, 2), 2, dtype=torch.int32, device=device)
    out = _decode(xt, wt, twice, experts, launches)
    assert_rel_close(out, reference(dense, xt, wt, twice), TOLERANCE, f"{what} twice")


@pytest.mark.parametrize(
    ("label", "launches"), CHECKED_LAUNCHES, ids=[t[0] for t in CHECKED_LAUNCHES]
)
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.label.replace(" ", "-"))
def test_decode_kernels_under_the_interpreter(
    label: str, launches: MoEDecode | MoEFused, scheme
) -> None:
    if torch.cuda.is_available():
        pytest.skip("the CPU copy of the GPU checks")
    # An intermediate size that is no multiple of 64 (the one-launch tile's rows) where the
    # scheme's group divides it.
    inter = 96 if 96 % scheme.group_for(96) == 0 else 128
    experts, dense = make_experts(scheme, experts=4, hidden=128, inter=inter, device="cpu")
    _check_cases(experts, dense, launches, "cpu", f"{scheme.label} {label}")


def test_the_cpu_cases_run_the_one_launch_whole_and_masked() -> None:
    for inter in (96, 128):
        assert fused_whole(ONE_LAUNCH_WHOLE, 128, inter)
        assert not fused_whole(ONE_LAUNCH, 128, inter)
    assert fused_whole(SM90.moe_decode[0][1], 2048, 512)  # the Qwen3.5-35B-A3B layer
    assert fused_whole(SM90.moe_decode[0][1], 2048, 768)  # Qwen3-30B-A3B


def decode_launches(tokens: int, capability: tuple[int, int]) -> MoEDecode | MoEFused | None:
    """The decode step's launches dispatch chooses for ``tokens`` (None: the routed blocks)."""
    choice = moe_decode_choice(tokens, capability)
    return None if choice is None else choice.launch


def test_experts_forward_takes_the_decode_kernels_up_to_16_tokens() -> None:
    one_launch = SM90.moe_decode[0][1]
    assert isinstance(one_launch, MoEFused)
    assert decode_launches(1, (9, 0)) == decode_launches(4, (9, 0)) == one_launch
    assert decode_launches(5, (9, 0)) == decode_launches(16, (9, 0)) == SM90.moe_decode[1][1]
    assert decode_launches(1, (7, 0)) == decode_launches(16, (7, 0)) == SM70.moe_decode[0][1]
    assert decode_launches(17, (9, 0)) is None
    assert decode_launches(17, (7, 0)) is None
    assert decode_launches(0, (9, 0)) is None


@pytest.mark.parametrize("capability", [(7, 0), (9, 0)], ids=["sm70", "sm90"])
def test_the_gate_list_covers_every_decode_launch(capability) -> None:
    names = {c.name for c in kernel_configs(Device(capability))}
    for tokens in range(1, 17):
        launches = decode_launches(tokens, capability)
        assert launches is not None
        for bits, zp, has_map, mul in itertools.product(
            (4, 8), (False, True), (False, True), (False, True)
        ):
            for build in decode_builds(launches, bits, zp, has_map, mul):
                assert kernel_config(build).name in names, build
    for experts, dtype in itertools.product((1, 16, 17, 256, 300, 1024), ("fp16", "bf16", "fp32")):
        assert f"topk_softmax_e{pow2_at_least(experts, 16)}_{dtype}" in names


def test_int64_ids_and_the_routed_blocks_path_agree_with_the_decode_kernels() -> None:
    if torch.cuda.is_available():
        pytest.skip("the CPU copy of the GPU checks")
    experts, dense = make_experts(SCHEMES[0], experts=4, hidden=128, inter=128, device="cpu")
    x = torch.randn(2, 128).half()
    w, ids = _routing(2, 4, 2, seed=11, device="cpu")
    ref = reference(dense, x, w, ids)
    assert_rel_close(experts_forward(x, w, ids.long(), experts), ref, TOLERANCE, "int64 ids")
    for launch in (SM90.moe, SM90.moe_large):  # the large tile swapped (Launch.swap)
        blocks = experts_forward(x, w, ids, experts, launch=launch)
        assert_rel_close(blocks, ref, TOLERANCE, f"routed blocks {launch}")


def _select_cases(device: str) -> None:
    gen = torch.Generator().manual_seed(3)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for experts, top_k, renormalize in ((8, 2, True), (60, 8, True), (300, 8, False)):
            logits = (3 * torch.randn(5, experts, generator=gen)).to(dtype).to(device)
            w, ids = select_experts(logits, top_k, renormalize=renormalize)
            probs = torch.softmax(logits.double(), -1)
            want_w, want_ids = probs.topk(top_k, -1)
            if renormalize:
                want_w = want_w / want_w.sum(-1, keepdim=True)
            assert w.dtype == torch.float32
            assert ids.dtype == torch.int32
            # Equal probabilities (bf16 logits tie often) may come in either order.
            taken = probs.gather(1, ids.long())
            assert torch.equal(taken, probs.gather(1, want_ids)), (dtype, experts)
            assert all(len(set(row)) == top_k for row in ids.tolist())
            assert torch.allclose(w.double(), want_w, rtol=1e-5, atol=1e-6), (dtype, experts)
    # Ties go to the lower id.
    w, ids = select_experts(torch.zeros(2, 6, device=device), 3)
    assert ids.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert torch.allclose(w, torch.full_like(w, 1 / 3))


def test_select_experts_under_the_interpreter() -> None:
    if torch.cuda.is_available():
        pytest.skip("the CPU copy of the GPU check")
    _select_cases("cpu")


def test_select_experts_refuses_bad_logits_before_the_launch(monkeypatch) -> None:
    from volta_ct_wna16 import kernels

    monkeypatch.setattr(kernels, "topk_softmax_kernel", None)  # a launch would fail otherwise
    with pytest.raises(ValueError, match=r"\[tokens, experts\].*got torch.float16 \(2, 3, 4\)"):
        select_experts(torch.zeros(2, 3, 4).half(), 2)
    with pytest.raises(ValueError, match=r"got torch.int32 \(2, 4\)"):
        select_experts(torch.zeros(2, 4, dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="top_k 5 for 4 experts: it must be 1 to 4"):
        select_experts(torch.zeros(2, 4), 5)
    with pytest.raises(ValueError, match="top_k 0 for 4 experts"):
        select_experts(torch.zeros(2, 4), 0)
    with pytest.raises(ValueError, match="at most 32"):
        select_experts(torch.zeros(2, 64), 33)
    with pytest.raises(ValueError, match="2000 experts: the router's top-k takes 1 to 1024"):
        select_experts(torch.zeros(2, 2000), 2)


@pytest.fixture
def no_launch(monkeypatch):
    """Any launch of the step fails the test: a refusal must come first."""

    def launched(*args, **kwargs):
        raise AssertionError("launched before the refusal")

    monkeypatch.setattr(ops, "moe_decode", launched)
    monkeypatch.setattr(experts_module, "_fused", launched)
    monkeypatch.setattr(experts_module, "_per_expert", launched)


def test_experts_forward_refuses_bad_routing_before_any_launch(no_launch) -> None:
    experts, _ = make_experts(SCHEMES[0], experts=4, hidden=128, inter=128, device="cpu")
    x = torch.randn(2, 128).half()
    w, ids = _routing(2, 4, 2, seed=1, device="cpu")
    with pytest.raises(ValueError, match=r"\[tokens, top_k\] for 2 tokens, got \(4,\)"):
        experts_forward(x, w, ids.reshape(-1), experts)
    with pytest.raises(ValueError, match=r"for 2 tokens, got \(1, 2\)"):
        experts_forward(x, w, ids[:1], experts)
    with pytest.raises(TypeError, match=r"int32 or int64, got torch\.float32"):
        experts_forward(x, w, ids.float(), experts)
    with pytest.raises(ValueError, match=r"router weights must be floating point.*\(2, 1\)"):
        experts_forward(x, w[:, :1], ids, experts)
    with pytest.raises(ValueError, match=r"activations \[tokens, 128\], got \(2, 64\)"):
        experts_forward(x[:, :64], w, ids, experts)
    five = torch.tensor([[0, 1, 2, 3, 0]], dtype=torch.int32)
    with pytest.raises(ValueError, match="top_k 5 is larger than the layer's 4 experts"):
        experts_forward(x[:1], torch.ones(1, 5), five, experts)
    bad = ids.clone()
    bad[1, 1] = 4
    with pytest.raises(
        ValueError, match=r"1 expert id\(s\) outside 0 .. 3: the first, pair 3, is 4"
    ):
        experts_forward(x, w, bad, experts, check_values=True)
    bad[1, 1] = -2
    with pytest.raises(ValueError, match="pair 3, is -2"):
        experts_forward(x, w, bad, experts, check_values=True)
    expert_map = torch.tensor([0, 1, 2, 3, 7, -1], dtype=torch.int32)
    with pytest.raises(ValueError, match="the expert map sends expert 4 to 7"):
        experts_forward(x, w, ids, experts, expert_map=expert_map, check_values=True)
    with pytest.raises(TypeError, match="1-D int32"):
        experts_forward(x, w, ids, experts, expert_map=expert_map.long())


def test_experts_quantized_differently_are_refused(no_launch) -> None:
    four, _ = make_experts(SCHEMES[0], experts=2, hidden=128, inter=128, device="cpu")
    eight, _ = make_experts(SCHEMES[2], experts=2, hidden=128, inter=128, device="cpu")
    mixed = ExpertWeights(four.w13, eight.w2)
    x = torch.randn(1, 128).half()
    w, ids = _routing(1, 2, 2, seed=1, device="cpu")
    with pytest.raises(ValueError, match="gate/up and down are quantized differently: 4-bit"):
        experts_forward(x, w, ids, mixed)
    w13 = [ops._expert(four.w13, 0), ops._expert(eight.w13, 1)]
    w2 = [ops._expert(four.w2, 0), ops._expert(four.w2, 1)]
    with pytest.raises(ValueError, match=r"expert 1 is 8-bit asymmetric channel .* expert 0 4-bit"):
        ExpertWeights.stack(w13, w2, 2)


def _poison_allocator(device: str) -> None:
    """Fill what the caching allocator holds with NaN, so buffers it hands out next (the
    kernels' intermediate rows) start poisoned."""
    block = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    block.fill_(0xFF)
    del block


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", SCHEMES[:2], ids=lambda s: s.label.replace(" ", "-"))
@pytest.mark.parametrize("decode", [None, MoEFused()], ids=["table", "one-launch"])
def test_gpu_decode_at_a_qwen35_layer_eager_and_in_a_cuda_graph(scheme, decode) -> None:
    experts, dense = make_experts(scheme, experts=16, hidden=2048, inter=512, device="cuda")
    for m in (1, 4, 16):
        x = torch.randn(m, 2048, device="cuda").half()
        w, ids = _routing(m, 16, 8, seed=m, device="cuda")
        _poison_allocator("cuda")
        out = experts_forward(x, w, ids, experts, decode=decode)
        assert_rel_close(out, reference(dense, x, w, ids), TOLERANCE, f"{scheme.label} m={m}")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            experts_forward(x, w, ids, experts, decode=decode)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        _poison_allocator("cuda")
        with torch.cuda.graph(graph, stream=stream):
            out = experts_forward(x, w, ids, experts, decode=decode)
        for replay in range(3):
            new_w, new_ids = _routing(m, 16, 8, seed=100 * m + replay, device="cuda")
            x.copy_(torch.randn(m, 2048, device="cuda").half())
            w.copy_(new_w)
            ids.copy_(new_ids)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            ref = reference(dense, x, w, ids)
            assert_rel_close(out, ref, TOLERANCE, f"{scheme.label} m={m} replay {replay}")


@pytest.mark.gpu
def test_gpu_decode_cases_on_both_tables() -> None:
    experts, dense = make_experts(SCHEMES[1], experts=4, hidden=256, inter=128, device="cuda")
    for label, launches in CHECKED_LAUNCHES:
        _poison_allocator("cuda")
        _check_cases(experts, dense, launches, "cuda", label)


@pytest.mark.gpu
def test_gpu_select_experts() -> None:
    _select_cases("cuda")


@pytest.mark.gpu
def test_gpu_small_for_sanitizer() -> None:
    """The decode kernels and the top-k once each at a small size: what compute-sanitizer's
    memcheck and racecheck run."""
    experts, dense = make_experts(SCHEMES[1], experts=4, hidden=256, inter=128, device="cuda")
    logits = torch.randn(3, 4, device="cuda")
    w, ids = select_experts(logits, 2)
    x = torch.randn(3, 256, device="cuda").half()
    for _, launches in CHECKED_LAUNCHES:
        out = _decode(x, w, ids, experts, launches)
        assert_rel_close(out, reference(dense, x, w, ids), TOLERANCE, "sanitizer")
