"""The benchmark's CPU-side parts: the sweep's variants compile for the H100, its summary.

The benchmark is a script beside the package (``benchmarks/bench.py``, in no distribution), so
it is loaded from the source tree; an unpacked sdist has no benchmarks and skips these tests.
The sweep runs only on a GPU (the lead's device run); what can go wrong before that is
checked here: every decode build a tile or combine variant launches on the H100 compiles for
sm_90 as the JIT builds it (strides specialized as multiples of 16, and not), so a device call
is not spent on a compile error, and the printed summary picks the fastest variant of each shape
against the shipped one.
"""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path
from types import ModuleType

import pytest

from volta_attn_v100.dispatch import kernel_configs
from volta_attn_v100.gate_configs import decode_config
from volta_attn_v100.launch import decode_launch, decode_tiles
from volta_attn_v100.tables import SM80, LaunchTable
from volta_core import KernelConfig
from volta_devkit.gate import check_kernel_config, compiled, gate_variants

SUITE = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"
H100, H100_SMS = (9, 0), 132


def load_bench() -> ModuleType:
    if not SUITE.is_file():
        pytest.skip(f"{SUITE} is not here (the sdist holds no benchmarks)")
    spec = importlib.util.spec_from_file_location("attn_v100_bench", SUITE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench()


def _compiled_as(config: KernelConfig) -> tuple:
    """What the compiler sees of a configuration (everything but its name)."""
    return (
        config.kernel,
        tuple(config.signature.items()),
        tuple(config.constexprs.items()),
        config.num_warps,
        config.num_stages,
    )


#: The shipped H100 builds, which CI's sm_90 compile check covers already.
SHIPPED = {_compiled_as(c) for c in kernel_configs(H100)}


def _sweep_builds(name: str, table: LaunchTable, kv_dtype: str, heads, shapes) -> list:
    """The gate configurations of the decode builds ``table`` launches for ``shapes`` on the
    H100 (head size 128) that the shipped list does not hold, one per distinct build."""
    configs: list[KernelConfig] = []
    for batch, ctx in shapes:
        launch = decode_launch(
            table, H100, H100_SMS, kv_dtype=kv_dtype, head_size=128, num_heads=heads[0],
            num_kv_heads=heads[1], num_seqs=batch, max_query_len=1, max_seq_len=ctx,
        )  # fmt: skip
        config = decode_config(f"{name}_{len(configs)}", launch.build, kv_dtype, table)
        seen = SHIPPED | {_compiled_as(c) for c in configs}
        if _compiled_as(config) not in seen:
            configs.append(config)
    return configs


def _sweep_decode_configs() -> list:
    """Every decode build of the tile and combine sections, as :func:`bench.sweep` launches
    them on the H100."""
    if not SUITE.is_file():
        return []
    b = load_bench()
    configs = []
    for t in b.SWEEP_FP8_TILES:
        name = f"sweep_fp8_n{t.block_n}_w{t.num_warps}_s{t.num_stages}"
        table = b.sweep_table(SM80, decode=t)
        configs += _sweep_builds(name, table, "fp8_e5m2", (32, 8), b.SWEEP_FP8_SHAPES)
    for t in b.SWEEP_WIDE_GROUP_TILES:
        name = f"sweep_64of8_m{t.block_m}_n{t.block_n}_w{t.num_warps}"
        table = b.sweep_table(SM80, decode=t)
        configs += _sweep_builds(name, table, "float16", (64, 8), [b.SWEEP_WIDE_GROUP_SHAPE])
    for t in b.SWEEP_BATCH1_TILES:
        name = f"sweep_b1_n{t.block_n}_w{t.num_warps}_s{t.num_stages}"
        table = b.sweep_table(SM80, decode=t)
        configs += _sweep_builds(name, table, "float16", (32, 8), b.SWEEP_BATCH1_SHAPES)
    for floats in b.SWEEP_COMBINE_FLOATS[1:]:
        for kv_dtype in ("float16", "fp8_e5m2"):
            table = b.sweep_table(SM80, combine_floats=floats)
            name = f"sweep_combine_{floats}_{kv_dtype}"
            configs += _sweep_builds(name, table, kv_dtype, (32, 8), b.SWEEP_COMBINE_SHAPES)
    return gate_variants(configs)


def test_each_sweep_section_starts_with_the_shipped_configuration(bench) -> None:
    assert bench.SWEEP_SPLIT_POLICIES[0] is None  # the shipped policy of each KV dtype
    assert bench.SWEEP_COMBINE_FLOATS[0] is None  # the shipped choice of each launch
    assert SM80.combine.floats in bench.SWEEP_COMBINE_FLOATS
    assert SM80.fp16.wide_combine.floats in bench.SWEEP_COMBINE_FLOATS
    assert len(set(bench.SWEEP_COMBINE_FLOATS)) == len(bench.SWEEP_COMBINE_FLOATS)
    assert bench.SWEEP_FP8_TILES[0] == decode_tiles(SM80, 128, 16, kv_fp8=True)
    assert bench.SWEEP_WIDE_GROUP_TILES[0] == decode_tiles(SM80, 128, 16, kv_fp8=False)
    assert bench.SWEEP_BATCH1_TILES[0] == decode_tiles(SM80, 128, 16, kv_fp8=False)
    assert len(set(bench.SWEEP_BATCH1_TILES)) == len(bench.SWEEP_BATCH1_TILES)
    assert len(set(bench.SWEEP_SPLIT_POLICIES)) == len(bench.SWEEP_SPLIT_POLICIES)
    assert len(set(bench.SWEEP_FP8_TILES)) == len(bench.SWEEP_FP8_TILES)
    assert len(set(bench.SWEEP_WIDE_GROUP_TILES)) == len(bench.SWEEP_WIDE_GROUP_TILES)


def test_a_sweep_table_changes_only_its_variant(bench) -> None:
    """A tile variant is the one tile of head size 128 with its rows and stages as given; a
    combine variant sets every step's floats; a split variant both dtypes' policy."""
    tiles = bench.SWEEP_WIDE_GROUP_TILES[-1]
    table = bench.sweep_table(SM80, decode=tiles)
    for group in (1, 8, 16):
        launch = decode_launch(
            table, H100, H100_SMS, kv_dtype="fp8_e5m2", head_size=128, num_heads=8 * group,
            num_kv_heads=8, num_seqs=64, max_query_len=1, max_seq_len=8192,
        )  # fmt: skip
        assert launch.build.ahead
        assert launch.build.tiles == tiles
    floats = bench.sweep_table(SM80, combine_floats=2048)
    assert floats.combine.floats == floats.fp16.wide_combine.floats == 2048
    assert floats.fp8.wide_combine.floats == 2048
    split = bench.SWEEP_SPLIT_POLICIES[-1]
    policies = bench.sweep_table(SM80, split=split)
    assert policies.fp16.split == policies.fp8.split == split
    assert bench.sweep_table(SM80) == SM80


@pytest.mark.parametrize("config", _sweep_decode_configs(), ids=lambda c: c.name)
def test_sweep_decode_variant_compiles_for_sm90(config) -> None:
    report = check_kernel_config(config, capability=90)
    assert compiled(report), report.describe()


def test_sweep_summary_names_the_fastest_variant_per_shape(bench, capsys) -> None:
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


def test_an_unknown_sweep_section_is_refused_before_any_measurement(bench, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--out", str(tmp_path), "--parts", "sweep", "--sweep-sections", "combin"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown sweep sections ['combin']" in err
    assert "combine" in err


def test_an_unknown_part_is_refused_before_any_measurement(bench, capsys, tmp_path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--out", str(tmp_path), "--parts", "decode,d256"])
    assert exit_info.value.code == 2
    assert "unknown parts ['d256']" in capsys.readouterr().err
    assert not any(tmp_path.iterdir()), "nothing may be measured or written"


def test_e4m3_rows_need_the_decode_part(bench, capsys, tmp_path) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path), "--parts", "prefill,e4m3"])
    assert "name decode too" in capsys.readouterr().err
    assert not (tmp_path / "attn_v100_bench.json").exists()


def test_sweep_sections_name_every_section_the_sweep_runs(bench) -> None:
    source = inspect.getsource(bench.sweep)
    for section in bench.SWEEP_SECTIONS:
        assert f'"{section}"' in source
