"""The launch tables choose what the 0.2 code chose, for every shape of a grid.

``data/launch_choices.json`` was written by the 0.2 ``configs.py`` (one module of limits, tables
and gate configurations, before they became :mod:`~volta_ct_wna16.limits`,
:mod:`~volta_ct_wna16.launch`, :mod:`~volta_ct_wna16.tables` and
:mod:`~volta_ct_wna16.gate_configs`): per device family, token count, layer shape and bit width
the launch, its split counts on 80 and 132 SMs and whether it runs unmasked; the fused-MoE tile
and splits per batch; the routing tiles; and every gate configuration (name, and a digest of its
kernel, signature, constexprs, warps, stages and divisibility). The grid it covers is stored
with it, so this test recomputes exactly those cases. Its ``gate_note`` says which entries
changed since, and why.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from volta_core import Device
from volta_ct_wna16.gate_configs import kernel_configs
from volta_ct_wna16.launch import (
    SPLITK,
    Launch,
    group_tile,
    moe_splits,
    slot_dots,
    split_count,
    unmasked_build,
    whole_tiles,
)
from volta_ct_wna16.routing import max_blocks
from volta_ct_wna16.tables import (
    ROUTE_COUNT_BLOCK,
    SILU_BLOCK,
    SM70,
    choose,
    choose_moe,
    route_place_tile,
    table_for,
)

RECORD = json.loads((Path(__file__).parent / "data" / "launch_choices.json").read_text())
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
        launch = choose(m, n, _cap(cap), int(bits[1:]), k=k)
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
        launch = choose_moe(pairs, experts, _cap(cap))
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
