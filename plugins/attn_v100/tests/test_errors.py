"""Bad input reaching the kernels directly: one clear error, before any launch.

Each case starts from a valid batch, breaks one thing, and checks the error names it and that
the (poisoned) output was not touched, i.e. nothing was launched.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attn_v100_cases import make_case

from volta_attn_v100 import inputs, ops
from volta_attn_v100.inputs import AttentionInputError
from volta_attn_v100.ops import paged_attention
from volta_core.kernel_api import DeviceFacts


def attempt(case, **kwargs) -> torch.Tensor:
    out = kwargs.pop("out", None)
    if out is None:
        out = torch.full_like(case.query, float("nan"))
    merged = {**case.kwargs(), **kwargs}
    try:
        paged_attention(*case.tensors(), out, **merged)
    finally:
        if out.dtype == torch.float16 and out.shape == case.query.shape:
            assert torch.isnan(out).all(), "output was written although the input was refused"
    return out


@pytest.fixture
def case():
    return make_case([(1, 40), (3, 20)], head_size=64, kv_cache_dtype="float16")


def test_unsupported_head_size() -> None:
    bad = make_case([(1, 10)], head_size=64)
    bad.query = torch.randn(1, 4, 72).to(torch.float16)
    bad.kv_cache = torch.zeros((*bad.kv_cache.shape[:3], 144), dtype=torch.float16)
    with pytest.raises(AttentionInputError, match="head size 72 is not supported"):
        attempt(bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unsupported_activation_dtype(case, dtype) -> None:
    case.query = case.query.to(dtype)
    with pytest.raises(AttentionInputError, match=f"query dtype {dtype}"):
        attempt(case, out=torch.empty_like(case.query))


def test_fp16_cache_declared_fp8(case) -> None:
    with pytest.raises(AttentionInputError, match=r"dtype torch.float16 but .*'fp8_e5m2'"):
        attempt(case, kv_cache_dtype="fp8_e5m2")


def test_byte_cache_declared_fp16() -> None:
    case = make_case([(1, 40)], head_size=64, kv_cache_dtype="fp8_e5m2")
    with pytest.raises(AttentionInputError, match=r"dtype torch.uint8 but .*'float16'"):
        attempt(case, kv_cache_dtype="float16")


@pytest.mark.parametrize("kv_dtype", ["fp8", "bfloat16", "int8_per_token_head"])
def test_unsupported_kv_dtype(case, kv_dtype) -> None:
    with pytest.raises(AttentionInputError, match=f"KV-cache dtype '{kv_dtype}' is not supported"):
        attempt(case, kv_cache_dtype=kv_dtype)


@pytest.mark.parametrize("target", ["query", "out"])
def test_odd_strides_at_head_512_on_sm70(target) -> None:
    """Head size 512 runs only the aligned-stride builds on SM70 (the interpreter runs SM70
    tiles): a query or output whose token rows are not a multiple of 16 elements apart is
    refused, naming the stride, instead of running a build the gate never passed."""
    case = make_case([(3, 20)], head_size=512, num_heads=2, num_kv_heads=1)
    padded = torch.full((3, 2 * 512 + 8), float("nan"), dtype=torch.float16)
    view = padded[:, : 2 * 512].view(3, 2, 512)
    if target == "query":
        view.copy_(case.query)
        case.query = view
        with pytest.raises(AttentionInputError, match="query token stride 1032"):
            attempt(case)
    else:
        with pytest.raises(AttentionInputError, match="output token stride 1032"):
            attempt(case, out=view)
        assert torch.isnan(padded).all(), "output was written although the input was refused"


def test_block_table_past_the_cache(case) -> None:
    num_blocks = case.kv_cache.shape[0]
    case.block_table[1, 1] = num_blocks
    with pytest.raises(AttentionInputError, match=r"entry \[1, 1\] = .* past the KV cache"):
        attempt(case)


def test_negative_block_id(case) -> None:
    case.block_table[0, 0] = -1
    with pytest.raises(AttentionInputError, match=r"entry \[0, 0\] = -1"):
        attempt(case)


def test_block_table_too_narrow(case) -> None:
    case.block_table = case.block_table[:, :1].contiguous()
    with pytest.raises(AttentionInputError, match="block table has 1 columns"):
        attempt(case)


def test_more_queries_than_tokens(case) -> None:
    case.seq_lens[1] = 2
    with pytest.raises(AttentionInputError, match="sequence 1 has 3 query tokens but only 2"):
        attempt(case)


def test_heads_not_a_multiple(case) -> None:
    case.query = torch.randn(case.query.shape[0], 3, 64).to(torch.float16)
    with pytest.raises(AttentionInputError, match="3 query heads are not a multiple of 2"):
        attempt(case)


def test_cache_width_mismatch(case) -> None:
    case.kv_cache = case.kv_cache[..., :96]
    with pytest.raises(AttentionInputError, match=r"2 \* head_size"):
        attempt(case)


def test_too_many_tokens_for_decode(case) -> None:
    with pytest.raises(AttentionInputError, match="at most 8 query tokens"):
        attempt(case, path="decode", max_query_len=9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sliding_window": 0}, "sliding window must be positive"),
        ({"logits_soft_cap": -1.0}, "soft cap"),
        ({"k_scale": torch.ones(3), "v_scale": torch.ones(3)}, "k_scale has 3 elements"),
        ({"num_splits": 65, "path": "decode"}, "num_splits must be in 1..64"),
        ({"k_scale": torch.tensor([0.0]), "v_scale": 1.0}, "k_scale must be finite and positive"),
        ({"k_scale": 1.0, "v_scale": float("nan")}, "v_scale must be finite and positive"),
    ],
)
def test_bad_options(kwargs, message) -> None:
    case = make_case([(1, 40)], head_size=64, kv_cache_dtype="fp8_e5m2")
    with pytest.raises(AttentionInputError, match=message):
        attempt(case, **kwargs)


def test_wrong_index_dtypes(case) -> None:
    bad = dataclasses.replace(case, seq_lens=case.seq_lens.long())
    with pytest.raises(AttentionInputError, match="seq_lens must be int32"):
        attempt(bad)


def test_sinks_shape(case) -> None:
    with pytest.raises(AttentionInputError, match="sinks must have one value per query head"):
        attempt(case, sinks=torch.zeros(3))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("programs_per_sm", 0),
        ("min_keys_per_split", 0),
        ("min_keys_per_split", 1.5),
        ("max_splits", 0),
        ("max_splits", 65),
    ],
)
def test_split_policy_needs_positive_integers_within_bounds(field, value) -> None:
    from volta_attn_v100.tables import SplitPolicy

    expected = "at most 64" if value == 65 else "a positive integer"
    with pytest.raises(ValueError, match=f"SplitPolicy.{field} must be {expected}"):
        SplitPolicy(**{field: value})


@pytest.mark.gpu
def test_e4m3_cache_refused_on_a_gpu_below_sm89(monkeypatch) -> None:
    """A CUDA e4m3 cache on a GPU that reports compute capability 7.0 is refused by the
    launcher itself (the kernels' hardware e4m3 conversion does not compile there), before
    any launch: the capability the launcher reads is set to a V100's."""
    case = make_case(
        [(1, 40), (3, 20)], head_size=64, kv_cache_dtype="fp8_e4m3", scales="head", device="cuda"
    )
    for module in (ops, inputs):
        monkeypatch.setattr(module, "device_facts", lambda device: DeviceFacts((7, 0), 80))
    with pytest.raises(AttentionInputError, match=r"'fp8_e4m3' needs compute capability 8\.9"):
        attempt(case)
