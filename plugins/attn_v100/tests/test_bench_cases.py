"""The calls ``vllm-volta bench`` times for the backend compute attention, and so does the
KV-cache write it times beside them.

Run through the plugin's hook as the command asks it (``volta_bench_case``, then the named
function), on CPU under the Triton interpreter in CI: a decode and a prefill chunk over the
random paged cache the call built equal causal attention over the cache read back through the
block table, and the bytes each call declares are the bytes it allocates. The host's KV-cache
write call stores each token's K and V at its slot through fp8kv's writer.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from volta_attn_v100 import plugin
from volta_core import AttentionLayer, Device, kv_cache_writer
from volta_core.bench.cases import kv_write_call
from volta_core.kernel_api import Workload
from volta_devkit.testing import assert_rel_close

V100 = Device((7, 0))
LAYER = AttentionLayer("model.layers.0.self_attn", 64, 4, 2, "float16", "auto")


def _reference(query, cache, table, seq_len: int, q_len: int) -> torch.Tensor:
    """Causal attention in float64 over the cache read back through the block table."""
    block, head = cache.shape[2], cache.shape[3] // 2
    heads, kv_heads = query.shape[1], cache.shape[1]
    outs = []
    for s in range(table.shape[0]):
        slots = [(int(table[s, j // block]), j % block) for j in range(seq_len)]
        kv = torch.stack([cache[b, :, i] for b, i in slots]).double()  # [seq, kv_heads, 2 * head]
        keys, values = kv[..., :head], kv[..., head:]
        q = query[s * q_len : (s + 1) * q_len].double()
        for t in range(q_len):
            visible = seq_len - q_len + t + 1
            rows = []
            for h in range(heads):
                g = h // (heads // kv_heads)
                scores = keys[:visible, g] @ q[t, h] / math.sqrt(head)
                rows.append(torch.softmax(scores, 0) @ values[:visible, g])
            outs.append(torch.stack(rows))
    return torch.stack(outs)


@pytest.mark.parametrize(
    "work", [Workload(2, 1, 40), Workload(1, 24, 40)], ids=["decode", "prefill chunk"]
)
def test_the_bench_call_is_attention_over_its_cache(kernel_device: str, work: Workload) -> None:
    case = plugin.volta_bench_case(LAYER, plugin.BACKEND_NAME, V100, None, work)
    assert case is not None
    cost = plugin.volta_kernel_cost(LAYER, plugin.BACKEND_NAME, V100, None, work)
    assert cost is not None
    assert (case.stage, case.kernel) == (cost.stage, cost.cost.kernel)
    module, _, name = case.impl.partition(":")
    call = getattr(importlib.import_module(module), name)(LAYER, None, work, kernel_device)
    torch.manual_seed(0)
    inputs = call.make_inputs()
    assert call.bytes_per_set == sum(t.numel() * t.element_size() for t in inputs)
    call.run(*inputs)
    query, cache, table, _, _, out, _ = inputs
    expected = _reference(query, cache, table, work.context, work.query_len)
    assert_rel_close(out, expected, 1e-2, f"bench call, {case.stage}")


def test_the_kv_cache_write_call_stores_each_token_at_its_slot(kernel_device: str) -> None:
    write = kv_cache_writer("packed", "auto")
    call = kv_write_call(write, LAYER, 5, 2, kernel_device)
    inputs = call.make_inputs()
    assert call.bytes_per_set == sum(t.numel() * t.element_size() for t in inputs)
    key, value, cache, slots, scale = inputs
    call.run(key, value, cache, slots, scale)
    block = cache.shape[2]
    for token, slot in enumerate(slots.tolist()):
        stored = cache[slot // block, :, slot % block]
        assert torch.equal(stored, torch.cat([key[token], value[token]], dim=-1))
