"""The SM70 compile gate catches what would break on a V100 and passes what would run.

These compile for sm_70 on a machine with no GPU (CI). Under the CPU-only test run the kernels
below are interpreted functions (``TRITON_INTERPRET=1``), so they also exercise the gate's
compile worker; on the GPU machine they are ordinary JIT functions.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

triton = pytest.importorskip("triton")
tl = triton.language

from volta_core.host.types import KernelConfig  # noqa: E402
from volta_devkit import example  # noqa: E402
from volta_devkit.gate import (  # noqa: E402
    MAX_SHARED_BYTES,
    assert_gate_passes,
    build_key,
    check_kernel_config,
    compile_for,
    compiled,
    distinct_builds,
    gate_variants,
    pairwise_cover,
    sass_histogram,
)


@triton.jit
def tile_matmul(a, b, c, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """One [BM, BN] fp32 accumulator tile: on SM70 ``tl.dot`` runs on FMA units."""
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        x = tl.load(a + rm[:, None] * K + (k + rk)[None, :])
        y = tl.load(b + (k + rk)[:, None] * BN + rn[None, :])
        acc += tl.dot(x, y)
    tl.store(c + rm[:, None] * BN + rn[None, :], acc.to(tl.float16))


@triton.jit
def to_e4m3(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x + offs, mask=mask)
    tl.store(out + offs, v.to(tl.float8e4nv).to(tl.float16), mask=mask)


@triton.jit
def transpose(x, out, M: tl.constexpr, N: tl.constexpr):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    tile = tl.load(x + rm[:, None] * N + rn[None, :])
    tl.store(out + rn[:, None] * M + rm[None, :], tl.trans(tile))


MATMUL_SIG = {"a": "*fp16", "b": "*fp16", "c": "*fp16", "K": "i32"}
E4M3_SIG = {"x": "*fp16", "out": "*fp16", "n": "i32"}


@pytest.mark.parametrize(
    "cfg", distinct_builds(example.sm70_kernel_configs()), ids=lambda c: c.name
)
def test_example_kernel_configs_pass_at_sm70(cfg: KernelConfig) -> None:
    report = check_kernel_config(cfg, capability=70)
    assert_gate_passes(report)
    assert report.name == cfg.name
    assert report.n_regs is not None
    assert 0 < report.n_regs <= 255
    assert report.n_spills == 0
    assert report.shared_bytes is not None
    assert report.shared_bytes <= MAX_SHARED_BYTES
    # It loads x and w, stores out, and reduces across the row with warp shuffles.
    for opcode in ("LDG", "STG", "SHFL"):
        assert report.sass_histogram.get(opcode, 0) > 0, report.sass_histogram


def test_small_fp32_dot_tile_passes_and_runs_on_fma_units() -> None:
    report = compile_for(
        tile_matmul, MATMUL_SIG, {"BM": 16, "BN": 32, "BK": 16}, num_warps=4, capability=70
    )
    assert_gate_passes(report)
    # Triton deprecated MMAv1 (triton-lang/triton#5066): tl.dot on sm_70 is FMA, not tensor cores.
    assert report.sass_histogram.get("FFMA", 0) > 0
    assert "HMMA" not in report.sass_histogram


def test_spilling_kernel_is_caught() -> None:
    # 64 x 128 fp32 accumulators on one warp: 256 live values per thread, over the 255
    # registers a thread can have, so ptxas must spill.
    report = compile_for(
        tile_matmul, MATMUL_SIG, {"BM": 64, "BN": 128, "BK": 16}, num_warps=1, capability=70
    )
    assert not report.passed
    assert report.n_spills is not None
    assert report.n_spills > 0
    assert report.n_regs is not None
    assert report.n_regs > 0
    assert any("spills registers" in p for p in report.problems), report.problems
    assert report.sass_histogram.get("STL", 0) > 0  # the spill stores, seen in the SASS
    with pytest.raises(AssertionError, match=r"spill stores=\d+ B") as info:
        assert_gate_passes(report)
    assert "FAILS" in str(info.value)


def test_fp8e4nv_is_caught_below_sm89() -> None:
    report = compile_for(to_e4m3, E4M3_SIG, {"BLOCK": 1024}, capability=70)
    assert not report.passed
    assert len(report.problems) == 1
    assert "fp8e4nv" in report.problems[0]
    assert "sm_70" in report.problems[0]


def test_fp8e4nv_is_allowed_from_sm89() -> None:
    # Ada and Hopper convert e4m3 in hardware: the same kernel compiles and passes there.
    for capability in (89, 90):
        report = compile_for(to_e4m3, E4M3_SIG, {"BLOCK": 1024}, capability=capability)
        assert_gate_passes(report)
        assert report.capability == capability


def test_compile_errors_are_reported_not_raised() -> None:
    unknown = compile_for(
        tile_matmul, {**MATMUL_SIG, "bogus": "i32"}, {"BM": 16, "BN": 16, "BK": 16}
    )
    assert not unknown.passed
    assert "bogus" in unknown.problems[0]
    missing = compile_for(tile_matmul, MATMUL_SIG, {"BM": 16, "BN": 16})
    assert not missing.passed
    assert "BK" in missing.problems[0]
    # Not a valid constexpr, and not picklable for the compile worker either: a problem, and
    # the next compile (through the same worker, under the interpreter) still works.
    odd = compile_for(tile_matmul, MATMUL_SIG, {"BM": 16, "BN": 16, "BK": lambda: 16})
    assert not odd.passed
    assert odd.problems
    assert_gate_passes(compile_for(tile_matmul, MATMUL_SIG, {"BM": 16, "BN": 16, "BK": 16}))
    not_a_kernel = compile_for(len, {}, {}, name="len")
    assert not not_a_kernel.passed
    assert "not a @triton.jit function" in not_a_kernel.problems[0]


def test_kernel_config_that_cannot_be_imported_is_a_problem() -> None:
    cfg = KernelConfig("ghost", "volta_devkit.example:no_such_kernel", {})
    report = check_kernel_config(cfg)
    assert not report.passed
    assert "cannot import kernel" in report.problems[0]
    bad_path = check_kernel_config(KernelConfig("ghost", "no_colon_here", {}))
    assert "package.module:function" in bad_path.problems[0]


def test_shared_memory_over_96kb_is_caught() -> None:
    # tl.trans of a register tile goes through shared memory: 64 x 64 fp32 is 16 KB, fine;
    # 256 x 256 fp32 is 256 KB, which no Volta block can have.
    small = compile_for(transpose, {"x": "*fp32", "out": "*fp32"}, {"M": 64, "N": 64})
    assert_gate_passes(small)
    assert small.shared_bytes is not None
    assert 0 < small.shared_bytes <= MAX_SHARED_BYTES
    big = compile_for(transpose, {"x": "*fp32", "out": "*fp32"}, {"M": 256, "N": 256}, num_warps=32)
    assert big.shared_bytes is not None
    assert big.shared_bytes > MAX_SHARED_BYTES
    assert big.n_spills == 0
    assert [p for p in big.problems if "shared memory" in p] == big.problems
    assert len(big.problems) == 1


def test_sass_histogram_counts_opcodes_without_modifiers() -> None:
    sass = """
        /*0000*/                   IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;
        /*0010*/              @!PT SHFL.IDX PT, RZ, RZ, RZ, RZ ;
        /*0020*/               @P0 LDG.E.128.SYS R4, [R2] ;
        /*0030*/                   LDG.E.SYS R8, [R2+0x10] ;
        /*0040*/                   EXIT ;
    """
    assert sass_histogram(sass) == {"LDG": 2, "IMAD": 1, "SHFL": 1, "EXIT": 1}


@triton.jit
def strided_copy(x, out, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    tl.store(out + row * stride + cols, tl.load(x + row * stride + cols))


COPY_SIG = {"x": "*fp16", "out": "*fp16", "stride": "i32"}


def test_divisibility_specialization_changes_the_build() -> None:
    """Declared multiples of 16 compile as the JIT specializes them: here the row stride lets
    each thread load its eight fp16 in one 16-byte access instead of eight."""
    plain = compile_for(strided_copy, COPY_SIG, {"BLOCK": 256}, num_warps=1)
    specialized = compile_for(
        strided_copy, COPY_SIG, {"BLOCK": 256}, num_warps=1, divisible_by_16=("stride",)
    )
    assert_gate_passes(plain)
    assert_gate_passes(specialized)
    assert specialized.sass_histogram["LDG"] < plain.sass_histogram["LDG"], (
        specialized.sass_histogram,
        plain.sass_histogram,
    )


def test_divisibility_names_must_be_integer_arguments() -> None:
    report = compile_for(strided_copy, COPY_SIG, {"BLOCK": 256}, divisible_by_16=("x", "nope"))
    assert not compiled(report)
    assert "divisible_by_16 names ['nope', 'x']" in report.describe()


def test_gate_variants_add_the_any_size_build() -> None:
    plain = KernelConfig("copy", "m:k", COPY_SIG, {"BLOCK": 256})
    special = KernelConfig("copy16", "m:k", COPY_SIG, {"BLOCK": 256}, divisible_by_16=("stride",))
    variants = gate_variants([plain, special])
    assert [v.name for v in variants] == ["copy", "copy16", "copy16[any-size]"]
    assert variants[2].divisible_by_16 == ()
    assert variants[2].signature == special.signature


def test_gate_variants_skip_the_build_a_launcher_refuses() -> None:
    """A launcher that refuses odd strides never makes the JIT build the unspecialized kernel."""
    enforced = KernelConfig(
        "copy16", "m:k", COPY_SIG, {"BLOCK": 256}, divisible_by_16=("stride",),
        divisibility_enforced=True,
    )  # fmt: skip
    assert gate_variants([enforced]) == [enforced]


def test_distinct_builds_keep_the_first_name_of_each_build() -> None:
    """Names and key order do not make a build; any field the compiler reads does."""
    a = KernelConfig("a", "m:k", COPY_SIG, {"BLOCK": 256, "EVEN": True})
    renamed = KernelConfig("a_renamed", "m:k", dict(reversed(COPY_SIG.items())),
                           {"EVEN": True, "BLOCK": 256})  # fmt: skip
    other = [
        replace(a, name="warps", num_warps=8),
        replace(a, name="block", constexprs={"BLOCK": 128, "EVEN": True}),
        replace(a, name="special", divisible_by_16=("stride",)),
    ]
    assert build_key(renamed) == build_key(a)
    assert [c.name for c in distinct_builds([a, renamed, *other])] == [
        "a",
        "warps",
        "block",
        "special",
    ]
    assert len({build_key(c) for c in [a, *other]}) == 4


def _pairs(cfg: KernelConfig) -> set[tuple[object, ...]]:
    values = [("warps", cfg.num_warps), ("stages", cfg.num_stages)]
    values += sorted(cfg.constexprs.items()) + sorted(cfg.signature.items())
    group = (cfg.kernel, bool(cfg.divisible_by_16))
    return {(group, a, b) for a in values for b in values if a < b}


def test_pairwise_cover_keeps_every_pair_of_values_in_fewer_builds() -> None:
    """Four two-valued parameters and a three-valued one, for two kernels, each specialized
    and not: the product has 48 builds a kernel and build, all pairs fit in far fewer."""
    configs = [
        KernelConfig(
            f"{kernel}_{i}",
            f"pkg.mod:{kernel}",
            {"x": x, "n": "i32"},
            {"BLOCK": block, "ZP": zp, "BIAS": bias},
            num_warps=warps,
            num_stages=2,
            divisible_by_16=spec,
        )
        for kernel in ("a", "b")
        for spec in ((), ("n",))
        for i, (x, block, zp, bias, warps) in enumerate(
            itertools.product(("*fp16", "*u8"), (16, 32, 64), (False, True), (False, True), (4, 8))
        )
    ]
    cover = pairwise_cover(configs)
    assert set().union(*map(_pairs, cover)) == set().union(*map(_pairs, configs))
    assert len(cover) < len(configs) // 3
    assert [c for c in configs if c in cover] == cover  # the given order
    assert pairwise_cover(configs) == cover
    groups = {(c.kernel, bool(c.divisible_by_16)) for c in cover}
    assert len(groups) == 4


def test_pairwise_cover_keeps_a_build_needed_for_its_pair() -> None:
    """A lone build of a kernel, and a value only one build has, are never dropped."""
    base = KernelConfig("a", "pkg.mod:a", {"x": "*fp16"}, {"BLOCK": 16})
    configs = [
        base,
        KernelConfig("a2", "pkg.mod:a", {"x": "*fp16"}, {"BLOCK": 16}),
        KernelConfig("a_odd", "pkg.mod:a", {"x": "*fp16"}, {"BLOCK": 16}, num_stages=3),
        KernelConfig("b", "pkg.mod:b", {"x": "*fp32"}, {"BLOCK": 16}),
    ]
    assert [c.name for c in pairwise_cover(configs)] == ["a", "a_odd", "b"]
