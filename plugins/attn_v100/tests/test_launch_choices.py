"""Dispatch chooses what the launchers chose before it, launch for launch.

``data/launch_choices.json`` holds the launch arguments the launchers passed to the Triton kernels
before the choices became tables (its ``description`` says how they were captured), over grids
of capability, SM count, head size, KV dtype, head counts, query length, batch, longest sequence
and given partition count, and the gate's configurations per capability. Here every grid point
is chosen again (:func:`volta_attn_v100.dispatch.choose`): its Triton launch (the choice, or the
fallback of a CUDA choice) is the captured one, and the choice is the CUDA kernel with that
fallback exactly where a V100 takes the tensor cores. The gate's list is made again, and the
launcher is checked to launch what the choice says.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from volta_attn_v100 import ops
from volta_attn_v100.dispatch import TENSOR_CORES, TRITON, AttentionCall, choose, kernel_configs
from volta_attn_v100.launch import (
    CudaDecodeLaunch,
    CudaPrefillLaunch,
    DecodeLaunch,
    Launch,
    PrefillLaunch,
)
from volta_core import KernelConfig
from volta_core.kernel_api import Choice, DeviceFacts, Unit

EXPECTED = json.loads((Path(__file__).parent / "data" / "launch_choices.json").read_text())
CHUNK = EXPECTED["chunk"]


def decode_values(launch: DecodeLaunch) -> dict[str, Any]:
    build = launch.build
    return {
        **build.constexprs(),
        "num_warps": build.tiles.num_warps,
        "num_stages": build.tiles.num_stages,
        "kv_programs": launch.kv_programs,
        "num_splits": launch.num_splits,
        "heads_per_prog": launch.heads_per_prog,
        "head_chunks": launch.head_chunks,
        "part_acc_dtype": "float16" if build.partials_f16 else "float32",
        "partials": launch.num_splits > 1,
    }


def prefill_values(launch: PrefillLaunch) -> dict[str, Any]:
    build = launch.build
    return {
        **build.constexprs(),
        "num_warps": build.tiles.num_warps,
        "num_stages": build.tiles.num_stages,
        "grid_q": launch.grid[0],
        "grid_kv": launch.grid[1],
        "heads_per_prog": launch.heads_per_prog,
        "head_chunks": launch.head_chunks,
    }


def point_json(values: dict[str, Any], fields: list[str]) -> str:
    return json.dumps([v if isinstance(v, str) else int(v) for v in (values[f] for f in fields)])


def cuda_decode_on_a_v100(capability, head_size, kv_dtype, heads, kv_heads, q_len) -> bool:
    """Where a V100 takes the tensor-core decode, as issue 34 set it: head sizes 128 and 256,
    fp16 or e5m2 KV, groups up to 8 and at most two chunks of 8 rows (query tokens x group)."""
    group = heads // kv_heads
    return (
        capability == (7, 0)
        and head_size in (128, 256)
        and kv_dtype in ("float16", "fp8_e5m2")
        and group <= 8
        and q_len * group <= 16
    )


def cuda_prefill_on_a_v100(capability, head_size, kv_dtype) -> bool:
    """Where a V100 takes the tensor-core prefill: head sizes 64 to 256, fp16 or e5m2 KV."""
    return capability == (7, 0) and head_size <= 256 and kv_dtype in ("float16", "fp8_e5m2")


def triton_launch(choice: Choice[Launch], cuda: bool, cuda_type: type, capability) -> Launch:
    """The Triton launch of a choice, checked to be the choice itself or, where ``cuda``, the
    fallback of a CUDA choice (tensor cores, a launch of ``cuda_type``)."""
    triton_unit = Unit.FMA if capability < (8, 0) else Unit.TENSOR_CORES
    if cuda:
        assert (choice.kernel, choice.unit) == (TENSOR_CORES, Unit.TENSOR_CORES)
        assert isinstance(choice.launch, cuda_type)
        assert choice.fallback is not None
        choice = choice.fallback
    assert (choice.kernel, choice.unit, choice.fallback) == (TRITON, triton_unit, None)
    return choice.launch


def plan_decode(point: tuple) -> DecodeLaunch:
    capability, sms, head_size, kv_dtype, (heads, kv_heads), q_len, seqs, seq_len, splits = point
    capability = tuple(capability)
    call = AttentionCall(
        head_size=head_size,
        num_heads=heads,
        num_kv_heads=kv_heads,
        kv_dtype=kv_dtype,
        num_seqs=seqs,
        num_tokens=seqs * q_len,
        max_query_len=q_len,
        max_seq_len=seq_len,
        num_splits=splits,
    )
    choice = choose(call, capability, sms)
    cuda = cuda_decode_on_a_v100(capability, head_size, kv_dtype, heads, kv_heads, q_len)
    launch = triton_launch(choice, cuda, CudaDecodeLaunch, capability)
    assert isinstance(launch, DecodeLaunch)
    if cuda:
        assert isinstance(choice.launch, CudaDecodeLaunch)
        assert choice.launch.num_splits == launch.num_splits
    return launch


def plan_prefill(point: tuple) -> PrefillLaunch:
    capability, head_size, kv_dtype, (heads, kv_heads), q_len, seqs = point
    capability = tuple(capability)
    call = AttentionCall(
        head_size=head_size,
        num_heads=heads,
        num_kv_heads=kv_heads,
        kv_dtype=kv_dtype,
        num_seqs=seqs,
        num_tokens=seqs * q_len,
        max_query_len=q_len,
        max_seq_len=q_len,
        path="prefill",
    )
    choice = choose(call, capability, 80)
    cuda = cuda_prefill_on_a_v100(capability, head_size, kv_dtype)
    launch = triton_launch(choice, cuda, CudaPrefillLaunch, capability)
    assert isinstance(launch, PrefillLaunch)
    return launch


def check_grid(grid: dict, fields: list[str], plan, values) -> None:
    """Each chunk of the grid's points planned again hashes as the captured one; the first that
    does not is shown point by point."""
    points = list(itertools.product(*grid["axes"].values()))
    assert len(grid["digests"]) == -(-len(points) // CHUNK)
    for i, digest in enumerate(grid["digests"]):
        chunk = points[i * CHUNK : (i + 1) * CHUNK]
        planned = [point_json(values(plan(p)), fields) for p in chunk]
        got = hashlib.sha256("\n".join(planned).encode()).hexdigest()[:10]
        shown = "\n".join(f"{p}: {v}" for p, v in zip(chunk, planned, strict=True))
        assert got == digest, f"chunk {i} of {list(grid['axes'])} differs; planned now:\n{shown}"


@pytest.mark.parametrize("index", range(len(EXPECTED["decode"]["grids"])))
def test_decode_launches_are_unchanged(index) -> None:
    grid = EXPECTED["decode"]["grids"][index]
    check_grid(grid, EXPECTED["decode"]["fields"], plan_decode, decode_values)


def test_prefill_launches_are_unchanged() -> None:
    (grid,) = EXPECTED["prefill"]["grids"]
    check_grid(grid, EXPECTED["prefill"]["fields"], plan_prefill, prefill_values)


def config_digest(config: KernelConfig) -> str:
    canonical = {
        "kernel": config.kernel,
        "signature": config.signature,
        "constexprs": config.constexprs,
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
        "divisible_by_16": list(config.divisible_by_16),
        "divisibility_enforced": config.divisibility_enforced,
    }
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()[:8]


@pytest.mark.parametrize("capability", list(EXPECTED["gate"]))
def test_gate_configurations_are_unchanged(capability) -> None:
    """The same configurations in the same order: the README's register table and CI's sm_90
    compile check see the builds they saw."""
    major, minor = (int(x) for x in capability.split("."))
    made = {c.name: config_digest(c) for c in kernel_configs((major, minor))}
    assert list(made) == list(EXPECTED["gate"][capability])
    changed = [name for name, d in made.items() if d != EXPECTED["gate"][capability][name]]
    assert not changed


class _Spy:
    """A kernel stand-in recording its launch: grid, arguments and keywords."""

    def __init__(self) -> None:
        self.launches: list[tuple[tuple, tuple, dict]] = []

    def __getitem__(self, grid: tuple):
        def launch(*args, **kwargs) -> None:
            self.launches.append((tuple(grid), args, kwargs))

        return launch


#: Grid points launched through :func:`volta_attn_v100.ops.paged_attention`: SM70 and SM90,
#: split and not, KV heads paired, head groups over several programs, fp8 with scores ahead.
LAUNCHED = [
    ((7, 0), 80, 128, "float16", (32, 8), 1, 8, 2048, None),
    ((7, 0), 80, 256, "fp8_e5m2", (128, 4), 8, 1, 100, 3),
    ((9, 0), 132, 128, "fp8_e5m2", (32, 8), 1, 128, 2048, None),
    ((9, 0), 132, 64, "fp8_e4m3", (64, 8), 2, 1, 32768, None),
    ((9, 0), 132, 512, "float16", (16, 1), 3, 33, 8192, 3),
]


@pytest.mark.parametrize("point", LAUNCHED, ids=str)
def test_the_launcher_launches_the_plan(monkeypatch, point) -> None:
    """Through ``paged_attention`` (shapes only: meta tensors, kernels replaced) the decode and
    prefill kernels get the planned grid, head groups and constants."""
    from volta_attn_v100 import kernels

    capability, sms, head_size, kv_dtype, (heads, kv_heads), q_len, seqs, seq_len, splits = point
    monkeypatch.setattr(ops, "device_facts", lambda device: DeviceFacts(capability, sms))
    decode, prefill = _Spy(), _Spy()
    monkeypatch.setattr(kernels, "paged_decode_kernel", decode)
    monkeypatch.setattr(kernels, "paged_prefill_kernel", prefill)
    meta = torch.device("meta")
    storage = torch.float16 if kv_dtype == "float16" else torch.uint8
    cache = torch.empty(4, kv_heads, 16, 2 * head_size, dtype=storage, device=meta)
    for path, tokens in (("decode", q_len), ("prefill", 9)):
        query = torch.empty(seqs * tokens, heads, head_size, dtype=torch.float16, device=meta)
        ops.paged_attention(
            query,
            cache,
            torch.empty(seqs, 2, dtype=torch.int32, device=meta),
            torch.empty(seqs, dtype=torch.int32, device=meta),
            torch.empty(seqs + 1, dtype=torch.int32, device=meta),
            torch.empty_like(query),
            max_query_len=tokens,
            max_seq_len=seq_len,
            sm_scale=0.1,
            kv_cache_dtype=kv_dtype,
            num_splits=splits if path == "decode" else None,
            path=path,
            check_bounds=False,
        )
    plan = plan_decode(point)
    ((grid, args, kwargs),) = decode.launches
    assert grid == (seqs, plan.kv_programs, plan.num_splits)
    assert args[17:19] == (plan.heads_per_prog, plan.head_chunks)
    assert args[9].dtype == (torch.float16 if plan.build.partials_f16 else torch.float32)
    assert kwargs.pop("num_warps") == plan.build.tiles.num_warps
    assert kwargs.pop("num_stages") == plan.build.tiles.num_stages
    assert kwargs == plan.build.constexprs()
    planned = plan_prefill((capability, head_size, kv_dtype, (heads, kv_heads), 9, seqs))
    ((grid, args, kwargs),) = prefill.launches
    assert grid == planned.grid
    assert args[14:16] == (planned.heads_per_prog, planned.head_chunks)
    assert kwargs.pop("num_warps") == planned.build.tiles.num_warps
    assert kwargs.pop("num_stages") == planned.build.tiles.num_stages
    assert kwargs == planned.build.constexprs()
