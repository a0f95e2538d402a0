"""The benchmark's CPU-side parts: the sweep's variants compile for the H100, its summary.

The sweep runs only on a GPU (the lead's device run); what can go wrong before that is
checked here: every decode tile variant it measures compiles for sm_90 as the JIT builds it
(strides specialized as multiples of 16, and not), so a device call is not spent on a compile
error, and the printed summary picks the fastest variant of each shape against the shipped one.
"""

from __future__ import annotations

import pytest

from volta_attn_v100 import bench
from volta_attn_v100.configs import (
    COMBINE_FLOATS,
    decode_combine,
    decode_kernel_config,
    decode_tiles,
)
from volta_devkit.gate import check_kernel_config, compiled, gate_variants

H100 = (9, 0)


def _sweep_config(name: str, kv_dtype: str, tiles, group_pad: int, **combine) -> object:
    """The sm_90 decode configuration the sweep launches for 32/8 (``group_pad`` 4) or 64/8
    (8) heads at head size 128, as the launcher picks its combine."""
    return decode_kernel_config(
        name,
        128,
        kv_dtype,
        tiles,
        H100,
        decode_combine(tiles.block_m, 1, group_pad, 128, H100, **combine),
    )


def _sweep_decode_configs() -> list:
    configs = [
        _sweep_config(f"sweep_fp8_n{t.block_n}_w{t.num_warps}_s{t.num_stages}", "fp8_e5m2", t, 4)
        for t in bench.SWEEP_FP8_TILES
    ]
    configs += [
        _sweep_config(f"sweep_64of8_m{t.block_m}_n{t.block_n}_w{t.num_warps}", "float16", t, 8)
        for t in bench.SWEEP_WIDE_GROUP_TILES
    ]
    configs += [
        _sweep_config(f"sweep_b1_n{t.block_n}_w{t.num_warps}_s{t.num_stages}", "float16", t, 4)
        for t in bench.SWEEP_BATCH1_TILES
    ]
    configs += [
        _sweep_config(
            f"sweep_combine_{floats}_{kv_dtype}",
            kv_dtype,
            decode_tiles(128, 16, H100, kv_fp8=kv_dtype != "float16"),
            4,
            floats=floats,
        )
        for floats in bench.SWEEP_COMBINE_FLOATS[1:]
        for kv_dtype in ("float16", "fp8_e5m2")
    ]
    return gate_variants(configs)


def test_each_sweep_section_starts_with_the_shipped_configuration() -> None:
    assert bench.SWEEP_SPLIT_POLICIES[0] is None  # the shipped policy of each KV dtype
    assert bench.SWEEP_COMBINE_FLOATS[0] is None  # the shipped choice of each launch
    assert COMBINE_FLOATS in bench.SWEEP_COMBINE_FLOATS
    assert len(set(bench.SWEEP_COMBINE_FLOATS)) == len(bench.SWEEP_COMBINE_FLOATS)
    assert bench.SWEEP_FP8_TILES[0] == decode_tiles(128, 16, H100, kv_fp8=True)
    assert bench.SWEEP_WIDE_GROUP_TILES[0] == decode_tiles(128, 16, H100)
    assert bench.SWEEP_BATCH1_TILES[0] == decode_tiles(128, 16, H100)
    assert len(set(bench.SWEEP_BATCH1_TILES)) == len(bench.SWEEP_BATCH1_TILES)
    assert len(set(bench.SWEEP_SPLIT_POLICIES)) == len(bench.SWEEP_SPLIT_POLICIES)
    assert len(set(bench.SWEEP_FP8_TILES)) == len(bench.SWEEP_FP8_TILES)
    assert len(set(bench.SWEEP_WIDE_GROUP_TILES)) == len(bench.SWEEP_WIDE_GROUP_TILES)


@pytest.mark.parametrize("config", _sweep_decode_configs(), ids=lambda c: c.name)
def test_sweep_decode_variant_compiles_for_sm90(config) -> None:
    report = check_kernel_config(config, capability=90)
    assert compiled(report), report.describe()


def test_sweep_summary_names_the_fastest_variant_per_shape(capsys) -> None:
    def row(variant: str, ms: float, batch: int) -> dict:
        return {
            "kind": "decode",
            "section": "split policy",
            "variant": variant,
            "heads": "32/8",
            "batch": batch,
            "context": 8192,
            "kv_dtype": "float16",
            "ms": ms,
            "fraction_of_copy": 0.5,
            "splits": 32,
            "max_abs_diff": 0.0,
        }

    rows = [row("shipped", 0.02, 1), row("fast", 0.01, 1), row("shipped", 0.1, 2)]
    bench.print_sweep({"sweep": rows})
    best = capsys.readouterr().out.split("best per shape")[1].splitlines()[1:]
    assert len(best) == 2
    assert "best fast" in best[0]
    assert "0.500x shipped" in best[0]
    assert "best shipped" in best[1]
    assert "1.000x shipped" in best[1]


def test_an_unknown_sweep_section_is_refused_before_any_measurement(capsys, tmp_path) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--out", str(tmp_path), "--parts", "sweep", "--sweep-sections", "combin"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown sweep sections ['combin']" in err
    assert "combine" in err


def test_an_unknown_part_is_refused_before_any_measurement(capsys, tmp_path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--out", str(tmp_path), "--parts", "decode,d256"])
    assert exit_info.value.code == 2
    assert "unknown parts ['d256']" in capsys.readouterr().err
    assert not any(tmp_path.iterdir()), "nothing may be measured or written"


def test_e4m3_rows_need_the_decode_part(capsys, tmp_path) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path), "--parts", "prefill,e4m3"])
    assert "name decode too" in capsys.readouterr().err
    assert not (tmp_path / "attn_v100_bench.json").exists()


def test_sweep_sections_name_every_section_the_sweep_runs() -> None:
    import inspect

    source = inspect.getsource(bench.sweep)
    for section in bench.SWEEP_SECTIONS:
        assert f'"{section}"' in source
