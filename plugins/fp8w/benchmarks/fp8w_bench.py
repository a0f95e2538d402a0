"""Benchmark: ``python plugins/fp8w/benchmarks/fp8w_bench.py --out DIR [--quick]
[--vllm-fp8-utils PATH]`` (needs CUDA, and ``volta_fp8w`` and the devkit importable: installed,
or on ``PYTHONPATH``); ``--self-check`` runs only the correctness checks, on tiny layers, on the
GPU or, without one, on the CPU under Triton's interpreter.

For each shape (N, K) (a 32B model's MLP up/down and attention output, a Qwen3-30B-A3B expert's
gate/up and down), e4m3fn weights in 128 x 128 blocks with random positive scales, and M tokens,
one run times, side by side:

(a) ours: :func:`volta_fp8w.ops.fp8_linear` with dispatch's launch for this GPU
    (:func:`volta_fp8w.dispatch.linear_choice`);
(b) fp16 cuBLAS: ``torch.nn.functional.linear`` on the weights dequantized to fp16 (by torch);
(c) dequantize-then-cuBLAS: our dequantize kernel (:func:`volta_fp8w.ops.dequantize`, timed
    alone once per shape) and the whole path (``fp8_linear`` with the table's dequantize launch);
(d) the copy ceilings: per shape, the harness's read floor (the fastest one-launch kernel that
    only streams the fp8 weights' bytes, :func:`volta_devkit.read_floor.read_floor`) and a
    device-to-device copy of a buffer of the weights' size; once, the harness's 1 GiB copy;
(e) vLLM's Triton block-FP8 GEMM ``_w8a8_triton_block_scaled_mm`` on e4m3 activations quantized
    per 1 x 128 token group (in torch, outside the timing): the ``@triton.jit`` function's source
    is taken with ``ast`` from the ``fp8_utils.py`` FILE given by ``--vllm-fp8-utils`` (no vLLM
    package needed) and run with the launch configuration that file's
    ``w8a8_triton_block_scaled_mm`` picks (a tuned JSON in ``configs/`` beside the file for this
    device and shape, else its default dict, evaluated from the file). Skipped, with a note,
    without the file or on a GPU without e4m3 (compute capability below 8.9);
(f) ``torch._scaled_mm`` on e4m3 activations and weights requantized with one scale per tensor
    (a reference for FP8 tensor-core speed, not the checkpoint's block scales), where available.

With ``--mma`` the CUDA tensor-core GEMM (:func:`volta_fp8w.cuda.mma.mma_linear`) is timed too at
the token counts a V100 gives it, built from ``compute_70`` PTX (the build a Hopper GPU can load;
its speed there says little about a V100's).

Every path is first run once into a NaN-poisoned output and checked against the fp32 product of
the same operands (ours and cuBLAS: ``x @ W.T``; vLLM's and ``_scaled_mm``: their quantized
activations and weights); the table marks a wrong one. Timing is the harness's
(:func:`volta_devkit.bench.time_cuda_graph`): calls back to back in one captured CUDA graph,
as vLLM runs decode, over rotating weight copies together larger than the L2 cache, median of
several replays.

Per row: microseconds of each path and its speed over fp16 cuBLAS; at M <= 8 ours as a fraction
of the read floor's and the 1 GiB copy's bandwidth (bytes: weights, scales, activations and
outputs); an SM70 estimate, dispatch's cost (:func:`volta_fp8w.dispatch.linear_cost`) of the
launch a V100 takes at :data:`volta_core.kernel_api.V100_RATES`; the targets (M=1: 1.8x fp16 and
80% of the read floor; M=16: 1.5x; M=2048: 0.85x) as pass/fail columns, not asserts.

Writes ``DIR/fp8w_bench.json`` and ``DIR/fp8w_bench.md`` (device, versions, ceilings, notes,
table); prints the table last.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import linecache
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from triton.runtime.errors import OutOfResources

#: (N, K): a 32B dense model's MLP up (gate/up shard) and down, its attention output, and a
#: Qwen3-30B-A3B expert's fused gate/up (2 x 768 outputs from 2048) and down.
SHAPES = ((27648, 5120), (5120, 27648), (5120, 5120), (1536, 2048), (2048, 768))
MS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 2048)
#: ``--quick``: one large and one expert layer at the targets' token counts.
QUICK_SHAPES = ((5120, 5120), (2048, 768))
QUICK_MS = (1, 16, 2048)
#: The checkpoints' weight block (Qwen's and DeepSeek's FP8 releases).
BLOCK = (128, 128)
#: vLLM's activation quantization group (1 x 128 per token).
GROUP_K = 128
#: The GEMV's token counts: ours is set against the copy ceilings there.
DECODE_MAX_M = 8
#: e4m3fn's largest finite value.
E4M3_MAX = 448.0
#: Graph replays per timing (the median is reported).
REPLAYS = 7
#: Where the timed layers live (the CPU smoke test runs the whole benchmark on "cpu").
DEVICE = "cuda"
#: At most this many weight copies rotate (the small layers need many to pass the L2).
MAX_COPIES = 64

#: Targets: tokens -> (least speed over fp16 cuBLAS, least fraction of the read floor or None).
TARGETS: dict[int, tuple[float, float | None]] = {
    1: (1.8, 0.8),
    16: (1.5, None),
    2048: (0.85, None),
}

#: Largest max|out - ref| / max|ref| a path may have against the fp32 product of its operands:
#: fp16 outputs (2**-11) of fp32 sums, with room for the sums' order.
TOLERANCE = 1e-2

#: The vLLM kernel and the launcher whose configuration logic is followed.
VLLM_KERNEL = "_w8a8_triton_block_scaled_mm"
VLLM_LAUNCHER = "w8a8_triton_block_scaled_mm"
#: vLLM 0.32's default configuration, used only when the file's own cannot be read (noted).
VLLM_DEFAULT_CONFIG = {
    "BLOCK_SIZE_M": 64,
    "BLOCK_SIZE_N": "block_n",
    "BLOCK_SIZE_K": "block_k",
    "GROUP_SIZE_M": 32,
    "num_warps": 4,
    "num_stages": 2,
}

#: ``--self-check``'s layers (a partial row block in each) and token counts: every path of the
#: table (1-token GEMV, small GEMV, GEMM, dequantize-then-cuBLAS on a Hopper GPU's table).
SELF_CHECK_SHAPES = ((192, 384), (320, 256))
SELF_CHECK_MS = (1, 4, 16, 600)


# -- weights and references -----------------------------------------------------------------


def make_weights(n: int, k: int, seed: int, device: str | torch.device) -> Any:
    """An ``n x k`` layer in :data:`BLOCK` blocks: e4m3 codes of ``32 * randn`` (typical codes
    around +-25, none NaN) and scales uniform in ``[5e-4, 1.5e-3)`` (weights around 0.025)."""
    from volta_fp8w.layout import block_weights

    gen = torch.Generator(device=device).manual_seed(seed)
    codes = (torch.randn(n, k, generator=gen, device=device) * 32).clamp_(-E4M3_MAX, E4M3_MAX)
    codes = codes.to(torch.float8_e4m3fn)
    grid = (-(-n // BLOCK[0]), -(-k // BLOCK[1]))
    scales = torch.rand(grid, generator=gen, device=device) * 1e-3 + 5e-4
    return block_weights(f"bench.{n}x{k}", codes, scales, n, k, BLOCK)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref| in fp32 (inf where ``out`` is not finite: an unwritten
    element of a NaN-poisoned output)."""
    o, r = out.float(), ref.float()
    if not bool(torch.isfinite(o).all()):
        return float("inf")
    return float((o - r).abs().max() / r.abs().max().clamp_min(1e-30))


def quant_groups(x: torch.Tensor, group: int = GROUP_K) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's dynamic per-token-group activation quantization in torch: e4m3 ``[m, k]`` and fp32
    scales ``[m, k / group]``, each ``amax / 448`` of its group (``amax`` at least 1e-10, vLLM's
    ``eps``)."""
    m, k = x.shape
    g = x.float().view(m, k // group, group)
    s = g.abs().amax(-1).clamp_min(1e-10) / E4M3_MAX
    q = (g / s[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(m, k), s


def quant_tensor(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` in e4m3 with one fp32 scale for the whole tensor (``amax / 448``)."""
    s = t.float().abs().max().clamp_min(1e-12) / E4M3_MAX
    return (t.float() / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), s


def dequant_groups(q: torch.Tensor, s: torch.Tensor, group: int = GROUP_K) -> torch.Tensor:
    """The fp32 values of :func:`quant_groups`'s output."""
    m, k = q.shape
    return (q.float().view(m, k // group, group) * s[..., None]).view(m, k)


# -- vLLM's Triton block-FP8 GEMM, from its source file ------------------------------------


@dataclass
class VllmKernel:
    """``_w8a8_triton_block_scaled_mm`` compiled from vLLM's ``fp8_utils.py`` (no vLLM import),
    with that file's default launch configuration and its tuned-configuration folder."""

    path: Path
    sha256: str
    kernel: Any
    default_config: dict[str, Any]
    """Values, or ``"block_n"`` / ``"block_k"`` for the weight block's."""
    config_source: str
    """Where :attr:`default_config` came from: the file, or this module's copy (with why)."""
    notes: list[str] = field(default_factory=list)

    @property
    def configs_dir(self) -> Path:
        return self.path.parent / "configs"


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"no top-level function {name!r}")


def extract_kernel_source(source: str, name: str = VLLM_KERNEL) -> str:
    """The source of the top-level function ``name`` of ``source``, its own decorators removed
    and ``@triton.jit`` put back (so the result compiles only with Triton's ``jit``); raises
    :class:`LookupError` where there is no such function or it is not ``@triton.jit``."""
    fn = _function(ast.parse(source), name)
    decorators = [ast.unparse(d) for d in fn.decorator_list]
    if not any(d in ("triton.jit", "jit") or d.startswith("triton.jit(") for d in decorators):
        raise LookupError(f"{name} is not a @triton.jit function (decorators: {decorators})")
    segment = ast.get_source_segment(source, fn)
    if segment is None:
        raise LookupError(f"no source segment for {name}")
    return "@triton.jit\n" + segment + "\n"


def default_config_of(source: str) -> dict[str, Any]:
    """The default launch configuration ``w8a8_triton_block_scaled_mm`` of ``source`` falls back
    to (its ``config = {...}`` dict literal), evaluated with the block size symbolic: entries that
    are ``block_size[0]`` / ``block_size[1]`` become ``"block_n"`` / ``"block_k"``."""
    fn = _function(ast.parse(source), VLLM_LAUNCHER)
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "config"
            and isinstance(node.value, ast.Dict)
        ):
            config: dict[str, Any] = {}
            for key, value in zip(node.value.keys, node.value.values, strict=True):
                if not isinstance(key, ast.Constant):
                    raise LookupError(f"a non-constant key in the default config: {ast.dump(key)}")
                text = ast.unparse(value).replace(" ", "")
                if text == "block_size[0]":
                    config[key.value] = "block_n"
                elif text == "block_size[1]":
                    config[key.value] = "block_k"
                else:
                    config[key.value] = ast.literal_eval(value)
            return config
    raise LookupError(f"no `config = {{...}}` default in {VLLM_LAUNCHER}")


def load_vllm_kernel(path: str | Path) -> VllmKernel:
    """Compile vLLM's kernel from the file at ``path`` (``exec`` with ``triton`` and ``tl`` as
    its globals; the source is registered with :mod:`linecache` under a name of its own, where
    Triton's ``jit`` and interpreter read it)."""
    import triton
    import triton.language as tl

    path = Path(path)
    text = path.read_text()
    code = extract_kernel_source(text)
    digest = hashlib.sha256(text.encode()).hexdigest()
    filename = f"<vllm fp8_utils {digest[:12]}: {VLLM_KERNEL}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    namespace: dict[str, Any] = {"triton": triton, "tl": tl, "__name__": "vllm_fp8_utils_kernel"}
    exec(compile(code, filename, "exec"), namespace)
    notes = []
    try:
        config, source = default_config_of(text), f"{path.name}:{VLLM_LAUNCHER}"
    except (LookupError, ValueError, SyntaxError) as exc:
        config, source = dict(VLLM_DEFAULT_CONFIG), "fp8w_bench's copy of vLLM 0.32's default"
        notes.append(f"vLLM's default config not read from the file ({exc}); used {source}")
    return VllmKernel(path, digest, namespace[VLLM_KERNEL], config, source, notes)


def device_file_name(name: str) -> str:
    """A device name as vLLM's configuration files spell it (``get_device_name_as_file_name``)."""
    return re.sub(r"[\s/]+", "_", name)


def vllm_config(
    vk: VllmKernel, m: int, n: int, k: int, block: tuple[int, int], device_name: str
) -> tuple[dict[str, Any], str]:
    """The configuration vLLM's ``w8a8_triton_block_scaled_mm`` launches for ``m`` tokens: the
    tuned file ``configs/N=..,K=..,device_name=..,dtype=fp8_w8a8,block_shape=[..].json`` beside
    the source file (the entry of the nearest token count), else its default; and which."""
    name = (
        f"N={n},K={k},device_name={device_file_name(device_name)},dtype=fp8_w8a8,"
        f"block_shape=[{block[0]},{block[1]}].json"
    )
    tuned = vk.configs_dir / name
    if tuned.is_file():
        configs = {int(key): val for key, val in json.loads(tuned.read_text()).items()}
        return dict(configs[min(configs, key=lambda x: abs(x - m))]), f"tuned {name}"
    sizes = {"block_n": block[0], "block_k": block[1]}
    config = {
        key: sizes.get(val, val) if isinstance(val, str) else val
        for key, val in vk.default_config.items()
    }
    return config, "default"


def vllm_mm(
    vk: VllmKernel,
    a: torch.Tensor,
    a_s: torch.Tensor,
    w: Any,
    config: dict[str, Any],
    out: torch.Tensor,
) -> torch.Tensor:
    """``out = (a * a_s) @ W.T`` by vLLM's kernel, launched as ``w8a8_triton_block_scaled_mm``
    launches it: ``a`` e4m3 ``[m, k]`` with per-group scales ``a_s`` ``[m, k / 128]``; the
    weights' codes as e4m3 ``[n, k]`` (B, no copy) and their block scales ``[n / 128, k / 128]``
    (Bs: the plugin's layout is vLLM's)."""
    import triton

    b = w.weight.view(torch.float8_e4m3fn)
    bs = w.scales
    m, n, k = a.shape[0], w.n, w.k

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return (triton.cdiv(m, meta["BLOCK_SIZE_M"]) * triton.cdiv(n, meta["BLOCK_SIZE_N"]),)

    vk.kernel[grid](
        a, b, out, a_s, bs, m, n, k, w.block_n, w.block_k,
        a.stride(-2), a.stride(-1), b.stride(1), b.stride(0), out.stride(-2), out.stride(-1),
        a_s.stride(-2), a_s.stride(-1), bs.stride(1), bs.stride(0),
        **config,
    )  # fmt: skip
    return out


# -- the checks -------------------------------------------------------------------------------


def e4m3_gpu(capability: tuple[int, int]) -> bool:
    """Whether a CUDA device of ``capability`` has e4m3 tensor-core products (SM89, SM90+)."""
    return capability >= (8, 9)


def poisoned(m: int, n: int, device: torch.device | str) -> torch.Tensor:
    return torch.full((m, n), float("nan"), dtype=torch.float16, device=device)


def check_paths(
    x: torch.Tensor,
    w: Any,
    w32: torch.Tensor,
    dense: torch.Tensor,
    *,
    vk: VllmKernel | None = None,
    device_name: str = "",
    scaled: tuple[torch.Tensor, torch.Tensor] | None = None,
    mma_launch: Any = None,
) -> dict[str, Any]:
    """Run each path once into a NaN-poisoned output; its error against the fp32 product of its
    own operands (see the module) under ``"<path>_err"``, an exception under ``"<path>_error"``.

    ``w32``: the weights in fp32 (``w.dequantize()``); ``dense``: in fp16, as (b) multiplies
    them; ``vk``: vLLM's kernel (None: not run); ``scaled``: the per-tensor e4m3 weights and
    scale ``_scaled_mm`` takes (None: not run); ``mma_launch``: the tensor-core launch (None:
    not run).
    """
    from volta_core.kernel_api import device_facts
    from volta_fp8w import ops
    from volta_fp8w.tables import table_for

    m, n = x.shape[0], w.n
    ref = x.float() @ w32.t()
    res: dict[str, Any] = {}

    def run(name: str, fn: Callable[[], torch.Tensor], reference: torch.Tensor) -> Any:
        try:
            out = fn()
        except Exception as exc:  # a path that fails here is a finding, not a crash
            res[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
            return None
        res[f"{name}_err"] = rel_error(out, reference)
        return out

    run("ours", lambda: ops.fp8_linear(x, w, out=poisoned(m, n, x.device)), ref)
    run("fp16", lambda: torch.nn.functional.linear(x, dense), ref)
    dequant = table_for(device_facts(x.device).capability).dequant
    run("deqmm", lambda: ops.fp8_linear(x, w, launch=dequant, out=poisoned(m, n, x.device)), ref)
    if mma_launch is not None:
        from volta_fp8w.cuda.mma import mma_linear

        run(
            "mma",
            lambda: mma_linear(
                x, w, None, mma_launch, poisoned(m, n, x.device), ptx_arch="compute_70"
            ),
            ref,
        )
    if vk is not None:
        a, a_s = quant_groups(x)
        config, _ = vllm_config(vk, m, w.n, w.k, (w.block_n, w.block_k), device_name)
        ref_q = dequant_groups(a, a_s) @ w32.t()
        out = run("vllm", lambda: vllm_mm(vk, a, a_s, w, config, poisoned(m, n, x.device)), ref_q)
        if out is not None:  # what quantizing the activations costs in accuracy (not checked)
            res["vllm_vs_fp16_activations"] = rel_error(out, ref)
    if scaled is not None:
        wq, sb = scaled
        aq, sa = quant_tensor(x)
        ref_s = (aq.float() * sa) @ (wq.float() * sb).t()
        run("smm", lambda: scaled_mm(aq, sa, wq, sb), ref_s)
    return res


def scaled_mm(aq: torch.Tensor, sa: torch.Tensor, wq: torch.Tensor, sb: torch.Tensor) -> Any:
    """``torch._scaled_mm`` of e4m3 ``aq [m, k]`` and ``wq [n, k]`` (as its column-major
    ``[k, n]``), one fp32 scale each, fp16 out."""
    return torch._scaled_mm(aq, wq.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float16)


def wrong(res: dict[str, Any], name: str) -> bool:
    """Whether path ``name`` failed its check (an exception, or an error past the tolerance)."""
    if f"{name}_error" in res:
        return True
    err = res.get(f"{name}_err")
    return err is not None and not err <= TOLERANCE


def self_check(
    device: str | torch.device,
    vllm_path: str | Path | None = None,
    shapes: Sequence[tuple[int, int]] = SELF_CHECK_SHAPES,
    ms: Sequence[int] = SELF_CHECK_MS,
) -> dict[str, Any]:
    """The benchmark's checks alone on small layers (no timing): every path against its
    reference, our dequantization against torch's (bit for bit), on ``device`` (CPU tensors
    need ``TRITON_INTERPRET=1``). vLLM's kernel runs where ``vllm_path`` is given and the
    device has e4m3 (or is the CPU interpreter); ``_scaled_mm`` likewise where torch has it.
    Returns ``{"rows": [...], "failures": [...], "notes": [...]}``."""
    from volta_fp8w import ops

    device = torch.device(device)
    fp8_here = device.type != "cuda" or e4m3_gpu(torch.cuda.get_device_capability(device))
    notes: list[str] = []
    vk = None
    if vllm_path is not None and fp8_here:
        vk = load_vllm_kernel(vllm_path)
        notes += vk.notes
    elif vllm_path is not None:
        notes.append("vLLM's kernel not checked: this GPU has no e4m3")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rows, failures = [], []
    for n, k in shapes:
        w = make_weights(n, k, seed=n + k, device=device)
        w32 = w.dequantize()
        dense = w32.half()
        exact = torch.equal(ops.dequantize(w), dense)
        if not exact:
            failures.append(f"{n}x{k}: our dequantize differs from torch's e4m3 * scale in fp16")
        scaled = quant_tensor(w32) if fp8_here and hasattr(torch, "_scaled_mm") else None
        gen = torch.Generator(device=device).manual_seed(7)
        for m in ms:
            x = torch.randn(m, k, generator=gen, device=device).half()
            res = check_paths(x, w, w32, dense, vk=vk, device_name=name, scaled=scaled)
            rows.append({"n": n, "k": k, "m": m, "dequant_exact": exact, **res})
            failures += [
                f"{n}x{k} M={m}: {path} {res.get(f'{path}_error', res.get(f'{path}_err'))}"
                for path in ("ours", "fp16", "deqmm", "vllm", "smm")
                if wrong(res, path)
            ]
    return {"rows": rows, "failures": failures, "notes": notes}


# -- timing -----------------------------------------------------------------------------------


def timed_us(fn: Callable[..., Any], sets: Sequence[Sequence[Any]]) -> float:
    """Median microseconds per call of ``fn`` over ``sets`` in one CUDA graph (the harness's)."""
    from volta_devkit.bench import time_cuda_graph

    return time_cuda_graph(fn, sets, replays=REPLAYS).median_ms * 1e3


def sm70_estimate(m: int, n: int, k: int) -> tuple[float, str, str] | None:
    """``(seconds, bound, path)`` a V100 would need at best for the launch dispatch gives it
    (:func:`volta_fp8w.dispatch.linear_choice` on SM70), by :func:`volta_fp8w.dispatch.
    linear_cost` at :data:`~volta_core.kernel_api.V100_RATES`; None where dispatch has no
    cost function (the column is left out)."""
    try:
        from volta_fp8w.dispatch import linear_choice, linear_cost
    except ImportError:
        return None
    from volta_core.kernel_api import V100_RATES

    try:
        launch = linear_choice(m, n, k, (7, 0)).launch
        cost = linear_cost(launch, m, n, k, BLOCK)
    except TypeError:  # another signature than the one written against: no column
        return None
    return cost.seconds(V100_RATES), cost.bound(V100_RATES), launch.path


@dataclass
class Context:
    """What every shape's measurement shares."""

    capability: tuple[int, int]
    device_name: str
    copy_gbps: float
    vk: VllmKernel | None
    scaled: bool
    mma: bool
    notes: list[str]


def rotation(nbytes: int) -> int:
    """Weight copies for a layer of ``nbytes``: together past three L2s (the harness's count)."""
    from volta_devkit.bench import rotation_count

    return rotation_count(nbytes, at_most=MAX_COPIES)


@dataclass
class Layer:
    """One layer's rotating copies: the plugin's weights, the fp16 weights (b) multiplies, the
    per-tensor e4m3 weights ``_scaled_mm`` takes (empty where it is not run), and the first
    copy's weights in fp32 (the references)."""

    weights: list[Any]
    dense: list[torch.Tensor]
    scaled: list[tuple[torch.Tensor, torch.Tensor]]
    w32: torch.Tensor

    @property
    def sets(self) -> list[tuple[int]]:
        return [(i,) for i in range(len(self.weights))]


def measure_shape(n: int, k: int, ms: Sequence[int], ctx: Context) -> tuple[dict, list[dict]]:
    """One layer: its ceilings (read floor, same-size copy, dequantization alone) and a row per
    token count in ``ms``."""
    from volta_devkit.read_floor import read_floor
    from volta_fp8w import ops

    weights = [make_weights(n, k, seed=i, device=DEVICE) for i in range(rotation(n * k))]
    layer = Layer(
        weights,
        [w.dequantize().half() for w in weights[: rotation(2 * n * k)]],
        [quant_tensor(w.dequantize()) for w in weights] if ctx.scaled else [],
        weights[0].dequantize(),
    )
    floor = read_floor([w.weight for w in weights])
    dst = torch.empty_like(weights[0].weight)
    copy_us = timed_us(lambda i: dst.copy_(weights[i].weight), layer.sets)
    deq_us = timed_us(lambda i: ops.dequantize(weights[i]), layer.sets)
    shape = {
        "n": n,
        "k": k,
        "block": list(BLOCK),
        "weight_copies": len(weights),
        "fp16_copies": len(layer.dense),
        "weight_bytes": weights[0].nbytes(),
        "read_floor_us": floor.median_ms * 1e3,
        "read_floor_gbps": floor.gbps,
        "read_floor_launch": str(floor.best),
        "size_copy_us": copy_us,
        "size_copy_gbps": 2 * n * k / (copy_us * 1e-6) / 1e9,
        "dequant_us": deq_us,
        "dequant_exact": torch.equal(ops.dequantize(weights[0]), layer.dense[0]),
    }
    rows = []
    for m in ms:
        row = measure_row(m, layer, ctx)
        finish_row(row, shape, ctx)
        rows.append(row)
        print(row_line(row, ctx), flush=True)
    return shape, rows


def measure_row(m: int, layer: Layer, ctx: Context) -> dict[str, Any]:
    """Check, then time, every path at ``m`` tokens of ``layer``."""
    from volta_fp8w import ops
    from volta_fp8w.dispatch import linear_choice
    from volta_fp8w.tables import MMA, table_for

    w0 = layer.weights[0]
    n, k, ws, sets = w0.n, w0.k, layer.weights, layer.sets
    x = torch.randn(m, k, device=DEVICE, dtype=torch.float16)
    outs = [torch.empty(m, n, device=DEVICE, dtype=torch.float16) for _ in range(2)]
    sm70 = linear_choice(m, n, k, (7, 0)).launch
    mma_launch = sm70 if ctx.mma and sm70.path == MMA else None
    res = check_paths(
        x, w0, layer.w32, layer.dense[0], vk=ctx.vk, device_name=ctx.device_name,
        scaled=layer.scaled[0] if layer.scaled else None, mma_launch=mma_launch,
    )  # fmt: skip
    # What ran: dispatch's choice, or its fallback where the choice's CUDA build did not load.
    ran = ops.plan_for(w0).chosen(m, x, None).launch
    row: dict[str, Any] = {"n": n, "k": k, "m": m, "path": ran.path, **res}
    row["launch"] = repr(ran)

    def time_path(name: str, fn: Callable[..., Any], s: Sequence[Sequence[Any]]) -> None:
        if f"{name}_error" in row:
            return
        try:
            row[f"{name}_us"] = timed_us(fn, s)
        except Exception as exc:  # recorded, and the run goes on
            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]

    dequant = table_for(ctx.capability).dequant
    time_path("ours", lambda i: ops.fp8_linear(x, ws[i], out=outs[i % 2]), sets)
    dense = layer.dense
    time_path(
        "fp16", lambda i: torch.nn.functional.linear(x, dense[i]), [(i,) for i in range(len(dense))]
    )
    time_path("deqmm", lambda i: ops.fp8_linear(x, ws[i], launch=dequant, out=outs[i % 2]), sets)
    if mma_launch is not None:
        from volta_fp8w.cuda.mma import mma_linear

        time_path(
            "mma",
            lambda i: mma_linear(x, ws[i], None, mma_launch, outs[i % 2], ptx_arch="compute_70"),
            sets,
        )
    vk = ctx.vk
    if vk is not None:
        a, a_s = quant_groups(x)
        config, source = vllm_config(vk, m, n, k, BLOCK, ctx.device_name)
        row["vllm_config"], row["vllm_config_source"] = config, source
        time_path("vllm", lambda i: vllm_mm(vk, a, a_s, ws[i], config, outs[i % 2]), sets)
        time_path("act_quant", lambda: quant_groups(x), [()])
    if layer.scaled:
        aq, sa = quant_tensor(x)
        scaled = layer.scaled
        time_path("smm", lambda i: scaled_mm(aq, sa, *scaled[i]), sets)
    return row


def finish_row(row: dict[str, Any], shape: dict[str, Any], ctx: Context) -> None:
    """Speeds over fp16 cuBLAS, ours against the ceilings at M <= 8, the SM70 estimate, the
    target's verdict."""
    n, k, m = row["n"], row["k"], row["m"]
    fp16 = row.get("fp16_us")
    for name in ("ours", "deqmm", "vllm", "smm", "mma"):
        if fp16 is not None and row.get(f"{name}_us"):
            row[f"{name}_x"] = fp16 / row[f"{name}_us"]
    row["bytes"] = shape["weight_bytes"] + 2 * m * k + 2 * m * n
    if m <= DECODE_MAX_M and row.get("ours_us"):
        gbps = row["bytes"] / (row["ours_us"] * 1e-6) / 1e9
        row["ours_gbps"] = gbps
        row["of_floor"] = gbps / shape["read_floor_gbps"]
        row["of_copy"] = gbps / ctx.copy_gbps
    est = sm70_estimate(m, n, k)
    if est is not None:
        row["sm70_us"], row["sm70_bound"], row["sm70_path"] = est[0] * 1e6, est[1], est[2]
    target = TARGETS.get(m)
    if target is not None:
        speed, floor = target
        ok = not wrong(row, "ours") and row.get("ours_x", 0.0) >= speed
        if floor is not None:
            ok = ok and row.get("of_floor", 0.0) >= floor
        row["target"] = f">={speed}x" + (f" >={floor:.0%}fl" if floor is not None else "")
        row["target_ok"] = ok


# -- output -----------------------------------------------------------------------------------

#: The table's columns: heading, width, and how a row fills it.
PATH_SHORT = {
    "splitk": "splitk",
    "gemm": "gemm",
    "dequant_matmul": "deq+mm",
    "mma": "mma",
    "cuda_gemv": "cu-gemv",
}


def _us(row: dict[str, Any], name: str) -> str:
    if f"{name}_error" in row:
        return "err"
    value = row.get(f"{name}_us")
    if value is None:
        return "-"
    return f"{value:.1f}" + ("!" if wrong(row, name) else "")


def _x(row: dict[str, Any], name: str) -> str:
    value = row.get(f"{name}_x")
    return "-" if value is None else f"{value:.2f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}"


def columns(ctx: Context) -> list[tuple[str, int, Callable[[dict[str, Any]], str]]]:
    """The table's columns for this run (vLLM's, ``_scaled_mm``'s, the tensor cores' and the
    SM70 estimate only where they were measured)."""
    cols: list[tuple[str, int, Callable[[dict[str, Any]], str]]] = [
        ("N", 6, lambda r: str(r["n"])),
        ("K", 6, lambda r: str(r["k"])),
        ("M", 5, lambda r: str(r["m"])),
        ("path", 7, lambda r: PATH_SHORT.get(r["path"], r["path"])),
        ("ours us", 9, lambda r: _us(r, "ours")),
        ("fp16 us", 9, lambda r: _us(r, "fp16")),
        ("x fp16", 6, lambda r: _x(r, "ours")),
        ("deq+mm", 8, lambda r: _us(r, "deqmm")),
        ("x", 5, lambda r: _x(r, "deqmm")),
    ]
    if ctx.mma:
        cols += [("mma70", 8, lambda r: _us(r, "mma")), ("x", 5, lambda r: _x(r, "mma"))]
    if ctx.vk is not None:
        cols += [("vllm us", 8, lambda r: _us(r, "vllm")), ("x", 5, lambda r: _x(r, "vllm"))]
    if ctx.scaled:
        cols += [("smm us", 8, lambda r: _us(r, "smm")), ("x", 5, lambda r: _x(r, "smm"))]
    cols += [
        ("GB/s", 5, lambda r: f"{r['ours_gbps']:.0f}" if "ours_gbps" in r else "-"),
        ("%floor", 6, lambda r: _pct(r.get("of_floor"))),
        ("%copy", 5, lambda r: _pct(r.get("of_copy"))),
    ]
    if sm70_estimate(1, 256, 256) is not None:
        cols += [
            ("SM70 us", 8, lambda r: f"{r['sm70_us']:.1f}" if "sm70_us" in r else "-"),
            ("bound", 7, lambda r: r.get("sm70_bound", "-")[:7]),
        ]
    cols += [
        ("target", 14, lambda r: r.get("target", "-")),
        ("ok", 4, lambda r: {True: "pass", False: "FAIL"}.get(r.get("target_ok"), "-")),
    ]
    return cols


def row_line(row: dict[str, Any], ctx: Context) -> str:
    """One row at the columns' least widths (printed as each row completes)."""
    return " ".join(f"{fill(row):>{width}}" for _, width, fill in columns(ctx))


def table(rows: list[dict[str, Any]], ctx: Context) -> str:
    """The heading and the rows, every column as wide as its widest entry."""
    cols = columns(ctx)
    cells = [[fill(r) for _, _, fill in cols] for r in rows]
    widths = [
        max([width, len(name), *(len(line[i]) for line in cells)])
        for i, (name, width, _) in enumerate(cols)
    ]
    lines = [[name for name, _, _ in cols], *cells]
    return "\n".join(
        " ".join(f"{cell:>{w}}" for cell, w in zip(line, widths, strict=True)) for line in lines
    )


def markdown_table(rows: list[dict[str, Any]], ctx: Context) -> str:
    cols = columns(ctx)
    lines = [
        "| " + " | ".join(name for name, _, _ in cols) + " |",
        "|" + "|".join("---:" for _ in cols) + "|",
    ]
    lines += ["| " + " | ".join(fill(r) for _, _, fill in cols) + " |" for r in rows]
    return "\n".join(lines)


def shape_lines(shapes: list[dict[str, Any]]) -> list[str]:
    return [
        f"{s['n']}x{s['k']}: {s['weight_bytes'] / 1e6:.1f} MB fp8+scales, {s['weight_copies']} "
        f"copies; read floor {s['read_floor_us']:.1f} us ({s['read_floor_gbps']:.0f} GB/s); "
        f"same-size copy {s['size_copy_us']:.1f} us ({s['size_copy_gbps']:.0f} GB/s r+w); our "
        f"dequantize alone {s['dequant_us']:.1f} us"
        + ("" if s["dequant_exact"] else " (DIFFERS from torch's dequantization)")
        for s in shapes
    ]


def legend(ctx: Context) -> list[str]:
    lines = [
        "us: median microseconds per call inside a CUDA graph; '!' a path that failed its check, "
        "'err' one that raised (JSON has the message); x: fp16 cuBLAS time over the path's",
        "path: ours (dispatch's launch here); deq+mm: our dequantize then cuBLAS; GB/s, %floor, "
        "%copy (M<=8): ours' bytes (weights, scales, activations, outputs) per second, over the "
        "shape's read floor and the 1 GiB copy",
    ]
    if ctx.vk is not None:
        lines.append(
            "vllm: vLLM's _w8a8_triton_block_scaled_mm on 1x128-group e4m3 activations (their "
            "quantization not timed)"
        )
    if ctx.scaled:
        lines.append("smm: torch._scaled_mm e4m3, one scale per tensor (speed reference)")
    if ctx.mma:
        lines.append("mma70: the CUDA tensor-core GEMM from compute_70 PTX (a V100's build)")
    if sm70_estimate(1, 256, 256) is not None:
        lines.append(
            "SM70 us, bound: dispatch's linear_cost of the V100's launch at V100_RATES "
            "(900 GB/s, 125 TFLOP/s tensor, 15.7 TFLOP/s FMA)"
        )
    return lines


def environment_record(vk: VllmKernel | None) -> dict[str, Any]:
    import volta_fp8w
    from volta_devkit.bench import environment

    env = environment()
    env["volta_fp8w"] = volta_fp8w.__version__
    env["vllm_fp8_utils"] = {"path": str(vk.path), "sha256": vk.sha256} if vk else None
    return env


# -- entry points -------------------------------------------------------------------------------


def run_self_check(vllm_path: Path | None) -> int:
    """``--self-check``: on the GPU, or on the CPU under the interpreter."""
    if torch.cuda.is_available():
        device = "cuda"
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        device = "cpu"
    begin = time.perf_counter()
    result = self_check(device, vllm_path)
    for note in result["notes"]:
        print(f"note: {note}")
    for row in result["rows"]:
        errs = ", ".join(
            f"{key[:-4]} {value:.1e}" for key, value in row.items() if key.endswith("_err")
        )
        print(f"{row['n']}x{row['k']} M={row['m']}: {errs}")
    print("\n".join(result["failures"]) or "all checks passed", end="")
    print(f" ({device}, {time.perf_counter() - begin:.1f} s)")
    return 1 if result["failures"] else 0


#: Token counts ``--sweep`` times candidate launches at.
SWEEP_MS = (1, 4, 16, 32)

#: From this many tokens ``--sweep`` times only prefill GEMM tiles.
PREFILL_M = 512


def sweep_candidates(m: int) -> list[Any]:
    """Launches ``--sweep`` times for ``m`` tokens: split-K's, the GEMV's tiles at one token,
    dot tiles of 16 or 32 rows above it, over output tiles, input tiles, warps and programs per
    SM; at one token the CUDA GEMV's, over rows a warp, warps, loads in flight and the blocks an
    SM its input splits aim for; the tiled GEMM's at 16 and 32 tokens; and from
    :data:`PREFILL_M` tokens only the tiled GEMM's prefill tiles (64 to 128 rows, 64 to 256
    outputs, 3 or 4 pipeline stages), the rivals of dequantize-then-cuBLAS."""
    from volta_fp8w.tables import CUDA_GEMV, GEMM, SPLITK, Launch

    if m >= PREFILL_M:
        return [
            Launch(GEMM, block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=st)
            for bm in (64, 128)
            for bn in (64, 128, 256)
            for bk in (64, 128)
            for w in (4, 8)
            for st in (3, 4)
        ]
    rows = (1,) if m == 1 else ((8, 16) if m <= 8 else (16, 32))
    out = [
        Launch(SPLITK, block_m=bm, block_n=bn, block_k=bk, num_warps=w, programs_per_sm=p)
        for bm in rows
        for bn in (32, 64, 128)
        for bk in (64, 128)
        for w in (2, 4, 8)
        for p in (1, 2, 4, 8)
    ]
    if m == 1:
        out += [
            Launch(CUDA_GEMV, block_n=rows * w, num_warps=w, loads=loads, programs_per_sm=p)
            for rows in (1, 2)
            for w in (4, 8)
            for loads in (1, 2, 4, 8)
            for p in (4, 8, 16)
        ]
    if m >= 16:
        out += [
            Launch(GEMM, block_m=bm, block_n=bn, block_k=bk, num_warps=w)
            for bm in (16, 32)
            for bn in (64, 128)
            for bk in (64, 128)
            for w in (4, 8)
        ]
    return out


def sweep_row(m: int, weights: list[Any], dense: list[torch.Tensor]) -> dict[str, Any]:
    """One (shape, M) of :func:`sweep`: fp16 cuBLAS, the table's launch and every candidate."""
    from volta_fp8w import ops
    from volta_fp8w.dispatch import table_launch

    n, k = weights[0].n, weights[0].k
    sets = [(i,) for i in range(len(weights))]
    x = torch.randn(m, k, device=DEVICE).half()
    fp16 = timed_us(lambda i: torch.nn.functional.linear(x, dense[i % len(dense)]), sets)
    table = table_launch(m, n, k, torch.cuda.get_device_capability())
    times = []
    for launch in [table] + [c for c in sweep_candidates(m) if c != table]:
        try:
            us = timed_us(lambda i, la=launch: ops.fp8_linear(x, weights[i], launch=la), sets)
        except (ValueError, RuntimeError, OutOfResources) as exc:
            print(f"  skip {launch}: {type(exc).__name__}: {str(exc)[:80]}")
            continue
        times.append((us, launch))
    times.sort(key=lambda t: t[0])
    table_us = next(us for us, la in times if la == table)
    best = [{"us": us, "x_fp16": fp16 / us, "launch": str(la)} for us, la in times[:5]]
    return {"n": n, "k": k, "m": m, "fp16_us": fp16, "table_us": table_us, "best": best}


def sweep(shapes: Sequence[tuple[int, int]], ms: Sequence[int], out: Path) -> int:
    """Time every :func:`sweep_candidates` launch beside the table's and fp16 cuBLAS, per
    (shape, M); the five fastest per row to ``out/fp8w_sweep.json`` and the screen (the data the
    SM90 table is chosen from)."""
    record: dict[str, Any] = {"environment": environment_record(None), "rows": []}
    for n, k in shapes:
        weights = [make_weights(n, k, seed=i, device=DEVICE) for i in range(rotation(n * k))]
        dense = [w.dequantize().half() for w in weights[: rotation(2 * n * k)]]
        for m in ms:
            row = sweep_row(m, weights, dense)
            record["rows"].append(row)
            fp16, table_us = row["fp16_us"], row["table_us"]
            print(
                f"sweep {n}x{k} M={m}: fp16 {fp16:.1f}us, table {table_us:.1f}us "
                f"({fp16 / table_us:.2f}x); best "
                + "; ".join(
                    f"{b['us']:.1f}us {b['x_fp16']:.2f}x {b['launch']}" for b in row["best"][:3]
                ),
                flush=True,
            )
            (out / "fp8w_sweep.json").write_text(json.dumps(record, indent=1, default=str))
        del weights, dense
        torch.cuda.empty_cache()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for fp8w_bench.json and .md")
    parser.add_argument("--quick", action="store_true", help="two shapes at M = 1, 16, 2048")
    parser.add_argument("--vllm-fp8-utils", type=Path, help="vLLM's fp8_utils.py (for (e))")
    parser.add_argument("--mma", action="store_true", help="also the compute_70 tensor-core GEMM")
    parser.add_argument("--self-check", action="store_true", help="checks only, tiny layers")
    parser.add_argument("--shapes", help="override: N,K;N,K;...")
    parser.add_argument("--ms", help="override: token counts, comma-separated")
    parser.add_argument("--sweep", action="store_true", help="only time candidate launches")
    args = parser.parse_args(argv)
    if args.self_check:
        return run_self_check(args.vllm_fp8_utils)
    if args.out is None:
        parser.error("--out is required (except with --self-check)")
    if not torch.cuda.is_available():
        print("the benchmark needs a CUDA GPU (--self-check runs on the CPU)", file=sys.stderr)
        return 2
    shapes = QUICK_SHAPES if args.quick else SHAPES
    ms = QUICK_MS if args.quick else MS
    if args.shapes:
        shapes = tuple(tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";"))
    if args.ms:
        ms = tuple(int(v) for v in args.ms.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.sweep:
        return sweep(
            shapes, tuple(int(v) for v in args.ms.split(",")) if args.ms else SWEEP_MS, args.out
        )
    return run(shapes, ms, args)


def run(shapes: Sequence[tuple[int, int]], ms: Sequence[int], args: argparse.Namespace) -> int:
    from volta_devkit.bench import measure_copy_bandwidth

    capability = torch.cuda.get_device_capability()
    device_name = torch.cuda.get_device_name()
    notes: list[str] = []
    vk = None
    if args.vllm_fp8_utils is None:
        notes.append("(e) vLLM's Triton block-FP8 GEMM skipped: no --vllm-fp8-utils given")
    elif not e4m3_gpu(capability):
        notes.append(
            f"(e) vLLM's Triton block-FP8 GEMM skipped: sm_{capability[0]}{capability[1]} has "
            "no e4m3 (needs compute capability 8.9+)"
        )
    else:
        try:
            vk = load_vllm_kernel(args.vllm_fp8_utils)
            notes += vk.notes
            notes.append(
                f"(e) vLLM's kernel from {vk.path} (sha256 {vk.sha256[:16]}), default config "
                f"{vk.default_config} from {vk.config_source}"
            )
        except (OSError, LookupError, SyntaxError) as exc:
            notes.append(f"(e) vLLM's Triton block-FP8 GEMM skipped: {type(exc).__name__}: {exc}")
    scaled = e4m3_gpu(capability) and hasattr(torch, "_scaled_mm")
    if not scaled:
        notes.append("(f) torch._scaled_mm skipped: no e4m3 on this GPU (or no _scaled_mm)")
    mma = args.mma
    if mma:
        try:
            import volta_fp8w.cuda.mma  # noqa: F401
        except ImportError as exc:
            notes.append(f"--mma: volta_fp8w.cuda.mma not importable ({exc}); not timed")
            mma = False
    if sm70_estimate(1, 256, 256) is None:
        notes.append("SM70 estimate left out: volta_fp8w.dispatch has no linear_cost it can call")
    copy_gbps = measure_copy_bandwidth()[0]
    ctx = Context(capability, device_name, copy_gbps, vk, scaled, mma, notes)
    env = environment_record(vk)
    record: dict[str, Any] = {
        "suite": "fp8w_bench",
        "environment": env,
        "copy_gbps": copy_gbps,
        "targets": {str(m): t for m, t in TARGETS.items()},
        "tolerance": TOLERANCE,
        "notes": notes,
        "shapes": [],
        "rows": [],
    }
    path = args.out / "fp8w_bench.json"
    print(f"{device_name} (sm {capability[0]}.{capability[1]}), copy {copy_gbps:.0f} GB/s")
    for n, k in shapes:
        shape, rows = measure_shape(n, k, ms, ctx)
        torch.cuda.empty_cache()
        record["shapes"].append(shape)
        record["rows"] += rows
        path.write_text(json.dumps(record, indent=1, default=str))  # a time limit loses one shape
    header = [
        f"fp8w_bench on {device_name} (sm {capability[0]}.{capability[1]}, driver "
        f"{env['driver']}, torch {env['torch']}, triton {env['triton']}, CUDA "
        f"{env['cuda_runtime']}, volta_fp8w {env['volta_fp8w']})",
        f"copy ceiling (1 GiB device-to-device, read+write): {copy_gbps:.0f} GB/s",
        *shape_lines(record["shapes"]),
        *(f"note: {note}" for note in notes),
        *legend(ctx),
    ]
    failed = [r for r in record["rows"] if r.get("target_ok") is False]
    wrong_paths = [
        f"{r['n']}x{r['k']} M={r['m']} {p}"
        for r in record["rows"]
        for p in ("ours", "deqmm", "vllm", "smm", "mma")
        if wrong(r, p)
    ]
    checks = "WRONG: " + ", ".join(wrong_paths) if wrong_paths else "all paths correct"
    passed = sum(1 for r in record["rows"] if r.get("target_ok"))
    summary = f"targets: {passed} pass, {len(failed)} fail; checks: {checks}"
    md = "\n".join(
        [
            f"# fp8w benchmark, {device_name}",
            "",
            *(f"- {line}" for line in header),
            f"- {summary}",
            "",
            markdown_table(record["rows"], ctx),
            "",
        ]
    )
    (args.out / "fp8w_bench.md").write_text(md)
    record["summary"] = summary
    path.write_text(json.dumps(record, indent=1, default=str))
    print("\n".join(header))
    print(summary)
    print(table(record["rows"], ctx))
    return 0


if __name__ == "__main__":
    sys.exit(main())
