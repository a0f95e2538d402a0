"""The read-floor kernel: exact against torch under the interpreter, gated for sm_70 and sm_90.

A wrong floor would be worse than none, so the kernel's per-program xor is compared exactly
with :func:`xor_per_program` on random words with a masked tail, into poisoned outputs; the
host's argument checks are shown to refuse bad sources before any launch; the launches the
host tries compile for a V100 without spills and for the H100. The timing itself runs on the
GPU only (``-m gpu``).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from volta_core.host.types import KernelConfig  # noqa: E402
from volta_devkit.gate import (  # noqa: E402
    assert_gate_passes,
    check_kernel_config,
    compiled,
    gate_variants,
)
from volta_devkit.read_floor import (  # noqa: E402
    WORD_ALIGN,
    check_sources,
    kernel_configs,
    launch_plan,
    read_floor,
    stream_read_kernel,
    xor_per_program,
)
from volta_devkit.testing import poison_  # noqa: E402


def _words(n: int, device: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)  # fresh data every run
    return torch.randint(-(2**31), 2**31, (n,), generator=gen, dtype=torch.int32).to(device)


def _run(words: torch.Tensor, words_per_program: int, block: int, stages: int) -> torch.Tensor:
    programs = -(-words.numel() // words_per_program)
    out = poison_(torch.empty(programs + 1, dtype=torch.int32, device=words.device))
    stream_read_kernel[(programs,)](
        words, out, words.numel(), words_per_program, BLOCK=block, NUM_STAGES=stages, num_warps=4
    )
    return out


@pytest.mark.parametrize(
    ("n_words", "words_per_program", "block"),
    [
        (1000, 64, 64),  # whole tiles, masked last program (1000 = 15 * 64 + 40)
        (1000, 96, 64),  # two iterations per program, the second masked in every program
        (777, 256, 128),  # a program's share not a multiple of BLOCK, odd n
        (300, 1024, 512),  # one program, shorter than a tile
    ],
)
def test_kernel_matches_torch_xor(
    kernel_device: str, n_words: int, words_per_program: int, block: int
) -> None:
    words = _words(n_words, kernel_device)
    out = _run(words, words_per_program, block, stages=3)
    programs = -(-n_words // words_per_program)
    expected = xor_per_program(words, words_per_program)
    assert expected.shape == (programs,)
    assert torch.equal(out[:programs], expected), (out[:programs], expected)
    assert out[programs].item() == poison_(torch.empty(1, dtype=torch.int32)).item()


def test_every_word_counts(kernel_device: str) -> None:
    # Flipping one bit of any single word changes its program's output: no load was dropped.
    words = _words(200, kernel_device)
    base = _run(words, 48, 32, stages=3)
    for i in (0, 47, 48, 130, 199):
        flipped = words.clone()
        flipped[i] ^= 1 << 7
        out = _run(flipped, 48, 32, stages=3)
        changed = (out != base).nonzero().flatten().tolist()
        assert changed == [i // 48], (i, changed)


def test_reference_is_xor() -> None:
    words = torch.tensor([1, 2, 4, 8, 16, 3, 5], dtype=torch.int32)
    assert xor_per_program(words, 3).tolist() == [1 ^ 2 ^ 4, 8 ^ 16 ^ 3, 5]
    assert xor_per_program(words, 7).tolist() == [1 ^ 2 ^ 4 ^ 8 ^ 16 ^ 3 ^ 5]


@pytest.mark.parametrize("n_words", [1, 15, 16, 3_276_800, 3_276_801, 10**7])
@pytest.mark.parametrize(("sm_count", "per_sm"), [(132, 8), (80, 2), (1, 1)])
def test_launch_plan_covers_every_word_evenly(n_words: int, sm_count: int, per_sm: int) -> None:
    programs, words_per_program = launch_plan(n_words, sm_count, per_sm)
    assert words_per_program % WORD_ALIGN == 0
    assert programs <= sm_count * per_sm
    assert (programs - 1) * words_per_program < n_words <= programs * words_per_program


def test_launch_plan_of_the_5120_square_int4_layer() -> None:
    # 13.5 MB on 132 SMs at 8 programs each: exactly one program per slot, no tail.
    assert launch_plan(5120 * 5120 // 8, 132, 8) == (1056, 3104)


def test_sources_are_refused_before_any_launch(kernel_device: str) -> None:
    a = torch.zeros(64, dtype=torch.uint8, device=kernel_device)
    with pytest.raises(ValueError, match="at least one source"):
        read_floor([])
    with pytest.raises(ValueError, match=r"srcs\[1\] has 60 bytes, srcs\[0\] has 64"):
        read_floor([a, a[:60].clone()])
    with pytest.raises(ValueError, match="multiple of 4 bytes, got 62"):
        read_floor([a[:62]])
    with pytest.raises(ValueError, match="positive multiple of 4 bytes, got 0"):
        read_floor([a[:0]])
    with pytest.raises(ValueError, match=r"srcs\[0\] must be contiguous"):
        read_floor([a.view(8, 8).t()])
    with pytest.raises(ValueError, match=r"blocks must be among the gated"):
        read_floor([a], blocks=(256,))
    with pytest.raises(ValueError, match=r"stages must be among the gated"):
        read_floor([a], stages=())
    with pytest.raises(ValueError, match="programs_per_sm must be positive"):
        read_floor([a], programs_per_sm=(0,))
    assert check_sources([a, torch.zeros(16, dtype=torch.float32, device=kernel_device)]) == 64
    if kernel_device == "cpu":
        with pytest.raises(ValueError, match="CUDA tensors"):
            read_floor([a])


@pytest.mark.parametrize("cfg", gate_variants(kernel_configs()), ids=lambda c: c.name)
def test_candidate_launches_pass_sm70_gate(cfg: KernelConfig) -> None:
    report = check_kernel_config(cfg, capability=70)
    assert_gate_passes(report)
    assert report.n_spills == 0
    # Loads the words, stores one int32 per program, and the xor reduce crosses lanes.
    for opcode in ("LDG", "STG", "SHFL"):
        assert report.sass_histogram.get(opcode, 0) > 0, report.sass_histogram


@pytest.mark.parametrize("cfg", gate_variants(kernel_configs()), ids=lambda c: c.name)
def test_candidate_launches_compile_for_sm90(cfg: KernelConfig) -> None:
    report = check_kernel_config(cfg, capability=90)
    assert compiled(report), report.describe()
    assert report.n_spills == 0, report.describe()


@pytest.mark.gpu
def test_read_floor_on_gpu(kernel_device: str) -> None:
    assert kernel_device == "cuda"
    nbytes = 5120 * 5120 // 2
    srcs = [torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda") for _ in range(8)]
    floor = read_floor(srcs)
    assert floor.nbytes == nbytes
    assert len(floor.tried) == 18
    assert floor.median_ms == min(ms for _, ms in floor.tried) > 0
    assert floor.gbps == pytest.approx(nbytes / floor.median_ms / 1e6)
