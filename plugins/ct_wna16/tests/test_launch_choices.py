"""The dispatch module chooses what the old code chose, for every shape of a grid.

``data/launch_choices.json`` was written by the 0.2 ``configs.py`` (one module of limits, tables
and gate configurations): per device family, token count, layer shape and bit width the launch,
its split counts on 80 and 132 SMs and whether it runs unmasked; the fused-MoE tile and splits
per batch; the routing tiles; and every gate configuration (name, and a digest of its kernel,
signature, constexprs, warps, stages and divisibility). The grid it covers is stored with it,
so this test recomputes exactly those cases. Its ``gate_note`` says which entries changed
since, and why.

``data/dispatch_record.json`` was written by the 0.6.2 code, before :mod:`volta_ct_wna16.dispatch`
took over ``tables.choose_mma``, ``paths`` and the gate enumeration: on (7, 0) the tensor-core
launch ``choose_mma`` took (or none) at every token count 1-300 for shapes and schemes of a
grid; the plan's kernel paths per device family, shape and scheme; and both gate hooks' full
answers (names and a digest of every field) on every device family.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from volta_core import Device
from volta_core.kernel_api import Unit, token_stage
from volta_ct_wna16 import plugin
from volta_ct_wna16.dispatch import (
    expert_paths,
    linear_choice,
    linear_paths,
    moe_blocks_choice,
    packed_bytes,
    table_launch,
)
from volta_ct_wna16.gate_configs import kernel_configs
from volta_ct_wna16.launch import (
    group_tile,
    moe_splits,
    route_place_tile,
    slot_dots,
    split_count,
    unmasked_build,
    whole_tiles,
)
from volta_ct_wna16.routing import max_blocks
from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.tables import (
    ROUTE_COUNT_BLOCK,
    SILU_BLOCK,
    SM70,
    SPLITK,
    Launch,
    table_for,
)

DATA = Path(__file__).parent / "data"
RECORD = json.loads((DATA / "launch_choices.json").read_text())
#: The 0.6.2 code's answers (see the module's docstring).
DISPATCH = json.loads((DATA / "dispatch_record.json").read_text())
GRID: dict[str, Any] = RECORD["grid"]
LAUNCHES = [Launch(**entry["launch"]) for entry in RECORD["launches"]]
#: Launch fields added after 0.2, at their defaults: an entry that omits one has the default.
LATER_FIELDS: dict[str, Any] = {"swap": False}


def _cap(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def _launch_index(launch: Launch) -> int:
    assert launch in LAUNCHES, f"a launch the 0.2 tables never chose: {launch}"
    return LAUNCHES.index(launch)


def test_capabilities_map_to_the_same_family() -> None:
    for cap, family in RECORD["families"].items():
        assert ("SM70" if table_for(_cap(cap)) is SM70 else "SM90") == family, cap


@pytest.mark.parametrize("key", sorted(RECORD["dense"]))
def test_dense_layers_get_the_same_launch_and_splits(key: str) -> None:
    cap, bits, shape = key.split()
    n, k = (int(v) for v in shape.split("x"))
    expected = RECORD["dense"][key]
    for m, want in zip(GRID["tokens"], expected, strict=True):
        launch = table_launch(m, n, k, int(bits[1:]), _cap(cap))
        got = [_launch_index(launch)]
        for sm_count in GRID["sm_counts"]:
            if launch.path == SPLITK:
                got += split_count(n, k, launch, sm_count, m)
            else:
                got += [0, 0]
        got.append(int(whole_tiles(n, k, launch, int(bits[1:]))))
        assert got == want, (key, m, launch)


@pytest.mark.parametrize("key", sorted(RECORD["moe"]))
def test_moe_batches_get_the_same_tile_and_splits(key: str) -> None:
    cap, experts_tag = key.split()
    experts = int(experts_tag[1:])
    for pairs, want in zip(GRID["moe_pairs"], RECORD["moe"][key], strict=True):
        launch = moe_blocks_choice(pairs, experts, _cap(cap)).launch
        got = [_launch_index(launch)]
        blocks = max_blocks(pairs, experts, launch.block_m)
        for n, k in GRID["moe_layers"]:
            for sm_count in GRID["sm_counts"]:
                got += split_count(n * blocks, k, launch, sm_count)
        assert got == want, (key, pairs, launch)


def test_every_launch_derives_the_same_builds() -> None:
    for launch, entry in zip(LAUNCHES, RECORD["launches"], strict=True):
        assert asdict(launch) == {**LATER_FIELDS, **entry["launch"]}
        assert [int(slot_dots(launch, b)) for b in GRID["bits"]] == entry["slot_dots"], launch
        unmasked = [int(unmasked_build(launch, b)) for b in GRID["bits"]]
        assert unmasked == entry["unmasked_build"], launch
        tiles = [int(group_tile(launch, g)) for g in GRID["groups"]]
        assert tiles == entry["group_tile"], launch
        assert int(moe_splits(launch)) == entry["moe_splits"], launch


def test_routing_and_activation_tiles_are_the_same() -> None:
    assert [[e, *route_place_tile(e)] for e in GRID["routed_experts"]] == RECORD["routing"]
    assert RECORD["route_count_block"] == ROUTE_COUNT_BLOCK
    assert RECORD["silu_block"] == SILU_BLOCK


#: Constexprs kernels gained after 0.2, at the values that build what 0.2 built: the digest
#: leaves them out at those values, so a build that did not change keeps its record.
LATER_CONSTEXPRS: dict[str, Any] = {"SWAP": False}


def _digest(cfg: Any) -> str:
    constexprs = {
        name: value
        for name, value in cfg.constexprs.items()
        if name not in LATER_CONSTEXPRS or value != LATER_CONSTEXPRS[name]
    }
    body = {
        "function": cfg.kernel.rsplit(":", 1)[1],
        "signature": dict(cfg.signature),
        "constexprs": constexprs,
        "num_warps": cfg.num_warps,
        "num_stages": cfg.num_stages,
        "divisible_by_16": list(cfg.divisible_by_16),
        "divisibility_enforced": cfg.divisibility_enforced,
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


@pytest.mark.parametrize("cap", sorted(RECORD["gate"]))
def test_the_gate_compiles_the_same_configurations(cap: str) -> None:
    got = [[cfg.name, _digest(cfg)] for cfg in kernel_configs(Device(_cap(cap)))]
    want = RECORD["gate"][cap]
    changed = {name for name, _ in got} ^ {name for name, _ in want}
    assert not changed, sorted(changed)
    assert got == want, [g[0] for g, w in zip(got, want, strict=True) if g != w]


# -- the 0.6.2 record: tensor-core choices, plan paths, the gate hooks' answers ---------------

SCHEMES = {
    "w4s128": WeightScheme(4, True, 128),
    "w8a64": WeightScheme(8, False, 64),
    "w4ac": WeightScheme(4, False, None),
    "w8s32": WeightScheme(8, True, 32),
}
MMA_LAUNCHES = [Launch(**entry) for entry in DISPATCH["mma_launches"]]


@pytest.mark.parametrize("key", sorted(DISPATCH["mma"]))
def test_v100_takes_the_tensor_cores_where_choose_mma_did(key: str) -> None:
    """At every token count the old ``choose_mma`` answered, the new choice on a V100 is its
    launch (carrying the table's launch as the fallback), or the table's launch where it was
    None."""
    tag, shape = key.split()
    n, k = (int(v) for v in shape.split("x"))
    scheme = SCHEMES[tag]
    bits, weight_bytes = scheme.num_bits, packed_bytes(n, k, scheme)
    for m, want in enumerate(DISPATCH["mma"][key], start=1):
        choice = linear_choice(m, n, k, bits, weight_bytes, (7, 0))
        table = table_launch(m, n, k, bits, (7, 0))
        if want < 0:
            assert choice.launch == table, (key, m)
            assert choice.fallback is None, (key, m)
        else:
            assert choice.launch == MMA_LAUNCHES[want], (key, m)
            assert choice.unit is Unit.TENSOR_CORES
            assert choice.fallback is not None, (key, m)
            assert choice.fallback.launch == table, (key, m)


def _bounds(stage: str) -> tuple[int, int | None]:
    """A stage's first and last token counts (None: open-ended)."""
    counts = stage.split(" ")[0]
    if counts.endswith("+"):
        return int(counts[:-1]), None
    first, _, last = counts.partition("-")
    return int(first), int(last or first)


def _merged(paths: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """Adjacent stages of the same kernel and fallback joined into one."""
    runs: list[tuple[int, int | None, str, str]] = []
    for stage, kernel, fallback in paths:
        first, last = _bounds(stage)
        if runs and runs[-1][2:] == (kernel, fallback):
            runs[-1] = (runs[-1][0], last, kernel, fallback)
        else:
            runs.append((first, last, kernel, fallback))
    return [(token_stage(first, last), kernel, fb) for first, last, kernel, fb in runs]


@pytest.mark.parametrize("key", sorted(DISPATCH["paths"]))
def test_the_plan_paths_are_the_old_ones(key: str) -> None:
    """The same stages and kernels as the 0.6.2 plan on the SM70 family; from SM80 a stage of
    one kernel may split where its unit changes (the 1-token GEMV on the FMA units, the dot
    tiles on the tensor cores), and joined again it is the old stage."""
    parts = key.split()
    capability = (int(parts[0].split(".")[0]), int(parts[0].split(".")[1]))
    if parts[1] == "experts":
        paths = expert_paths(capability)
    else:
        n, k = (int(v) for v in parts[2].split("x"))
        paths = linear_paths(n, k, SCHEMES[parts[1]], capability)
    got = [(p.stage, p.kernel, p.fallback) for p in paths]
    want = [(p["stage"], p["kernel"], p["fallback"]) for p in DISPATCH["paths"][key]]
    if capability < (8, 0):
        assert got == want
    else:
        assert _merged(got) == want
        for before, after in itertools.pairwise(paths):
            if (before.kernel, before.fallback) == (after.kernel, after.fallback):
                assert before.unit != after.unit, (before, after)
    for path in paths:
        assert path.unit
        assert bool(path.fallback_unit) == path.needs_nvrtc


def _full_digest(cfg: Any) -> str:
    body = json.dumps(asdict(cfg), sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


@pytest.mark.parametrize("cap", sorted(DISPATCH["hooks"]))
def test_the_gate_hooks_answer_what_they_did(cap: str) -> None:
    """``volta_kernel_configs`` and ``volta_cuda_kernel_configs`` return the same lists as
    0.6.2: every configuration, in order, every field. The CUDA builds' digests were rewritten
    in 0.7.1, whose source alone changed (the core's SM70 prelude in front of ``wna16_mma.cu``,
    its own copies of the helpers gone; every other field checked equal to 0.6.2's, and every
    build's cubin byte for byte the same), and again later in 0.7.1 when the split-K epilogue
    moved into the prelude (``splitk_mma_epilogue``, with ``h2f``): the source alone changed
    (the old source reproduces the old digests), and NVRTC 12.9 builds every one of the 12
    sm_70 builds to the same cubin, byte for byte, and the same compute_70 PTX. In 0.9.0 the
    dense GEMM's helpers moved to ``mma_common.cuh`` (the source alone changed; NVRTC 12.9
    builds the 12 sm_70 cubins byte for byte the same) and the routed experts' 12 tensor-core
    builds (``wna16_moe_mma.cu``) follow them in the CUDA list. After 0.10.0 the routing's, the
    SiLU product's, the router top-k's and the decode kernels' Triton digests were rewritten:
    their configurations took the stages and stride divisibility their launches run with
    (``data/launch_choices.json``'s ``gate_note``)."""
    device = Device(_cap(cap))
    want = DISPATCH["hooks"][cap]
    got = [[c.name, _full_digest(c)] for c in plugin.volta_kernel_configs(device)]
    assert got == want["kernel_configs"]
    cuda = [[c.name, _full_digest(c)] for c in plugin.volta_cuda_kernel_configs(device)]
    assert cuda == want["cuda_kernel_configs"]
