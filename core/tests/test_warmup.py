"""``vllm-volta warmup``: the plan's kernel builds compiled for sm_70 without a GPU into the
caches the engine reads, and found there by a second run.

The command runs in a child process without ``TRITON_INTERPRET`` (the suite interprets Triton
on a CPU machine, and an interpreted kernel compiles nothing), on a subset of the bundled
example's builds (``--only``): compiling every build its three plugins declare for sm_70 takes
minutes on two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from volta_core.cuda_toolkit import nvrtc_found
from volta_core.host.types import KernelConfig, LayerKind
from volta_core.kernel_api._warm import ANY_SIZE, triton_variants

EXAMPLE = "qwen3-8b-fp8-kv-per-tensor"
# fp8kv's cache write and gather for 128-dim heads (four configurations), its e5m2 cache write
# of one token (whose token count, a runtime argument, the build declares as the constant 1 the
# JIT makes of it), each also compiled unspecialized, and one of attn_v100's CUDA decode builds.
ONLY = (
    "fp8kv:*head_pad=128]*",
    "fp8kv:*[[]fp8_e5m2,head_pad=128,tokens=1]*",
    "attn_v100:cuda_decode_d128*float16",
)
TRITON_BUILDS, CUDA_BUILDS = 10, 1


# One child runs warmup twice, the first time in two compile processes, the second in the child
# itself; then it asks Triton's cache, without compiling, about a build the runs made and one
# they did not (two configurations named by PROBED).
CHILD = """
import json, sys
from volta_core.cli import main
from volta_core.device import parse_device
from volta_core.host.discovery import get_plugin_manager
from volta_core.kernel_api._warm import triton_target

first = main([*sys.argv[1:], "--jobs", "2"])
print(SEPARATOR)
second = main([*sys.argv[1:], "--jobs", "1"])
print(SEPARATOR)
configs = {c.name: c for _, c in get_plugin_manager().kernel_configs(parse_device("sm70"))}
with triton_target(70) as target:
    print(json.dumps({name: target.cached(configs[name]) for name in PROBED}))
sys.exit(first or second)
"""
SEPARATOR = "\f"
BUILT, NOT_BUILT = (
    "fp8kv.cache_write[float16,head_pad=128]",
    "fp8kv.cache_write[float16,head_pad=64]",
)


def _run_child(cache: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, bool]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env |= {
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "VLLM_VOLTA_CUDA_CACHE": str(cache / "cuda"),
    }
    script = CHILD.replace("SEPARATOR", repr(SEPARATOR)).replace("PROBED", repr((BUILT, NOT_BUILT)))
    only = [arg for pattern in ONLY for arg in ("--only", pattern)]
    run = subprocess.run(
        [sys.executable, "-c", script, "warmup", EXAMPLE, *only, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    first, second, probed = run.stdout.split(SEPARATOR)
    return json.loads(first), json.loads(second), json.loads(probed)


@pytest.mark.needs("vllm-volta-fp8kv", "vllm-volta-attn-v100", "triton", "torch")
def test_warmup_builds_the_plans_kernels_for_sm70_and_a_second_run_finds_them(
    tmp_path: Path,
) -> None:
    report, again, probed = _run_child(tmp_path)
    assert report["device"] == "sm_70"
    assert {"attn_v100", "fp8kv"} <= set(report["plugins"])
    assert report["counts"]["triton"] == {
        "built": TRITON_BUILDS,
        "cached": 0,
        "failed": 0,
        "not built": 0,
    }
    names = [b["build"] for b in report["builds"] if b["kind"] == "triton"]
    assert sum(name.endswith(ANY_SIZE) for name in names) == TRITON_BUILDS // 2
    # Triton keeps one folder per compiled kernel, its metadata beside the cubin.
    assert len(list((tmp_path / "triton").glob("*/*.cubin"))) == TRITON_BUILDS
    release, why = nvrtc_found()
    if release is None:  # no CUDA 12 NVRTC here: the one line says why
        assert report["counts"]["cuda"]["not built"] == CUDA_BUILDS, why
    else:
        assert report["counts"]["cuda"]["built"] == CUDA_BUILDS
        assert len(list((tmp_path / "cuda").glob("*.cubin"))) == CUDA_BUILDS

    assert again["counts"]["triton"]["cached"] == TRITON_BUILDS
    assert again["counts"]["triton"]["built"] == 0
    if release is not None:
        assert again["counts"]["cuda"]["cached"] == CUDA_BUILDS
    assert len(list((tmp_path / "triton").glob("*/*.cubin"))) == TRITON_BUILDS
    # The lookup that spares the second run its compiles finds the key Triton stored, and only it.
    assert probed == {BUILT: True, NOT_BUILT: False}


# Keys the kernels named, in the order given ("gather", fp8kv's, first: it shares the host
# codec's dequantize_tile with attention's KV loads).
KEY_ORDER = """
import importlib, json, sys
from triton.runtime.jit import JITFunction

PATHS = {
    "gather": "volta_fp8kv.kernels.gather:gather_kernel",
    "decode": "volta_attn_v100.kernels:paged_decode_kernel",
    "prefill": "volta_attn_v100.kernels:paged_prefill_kernel",
    "ct_splitk": "volta_ct_wna16.kernels.splitk:wna16_splitk_kernel",
    "ct_moe_decode": "volta_ct_wna16.kernels.moe_decode:moe_decode_gate_up_kernel",
    "fp8w_splitk": "volta_fp8w.kernels.splitk:fp8w_splitk_kernel",
    "fp8w_gemm": "volta_fp8w.kernels.gemm:fp8w_gemm_kernel",
}
keys = {}
for name in sys.argv[1:]:
    module, attr = PATHS[name].split(":")
    fn = getattr(importlib.import_module(module), attr)
    assert isinstance(fn, JITFunction), fn
    keys[name] = fn.cache_key
print(json.dumps(keys))
"""


@pytest.mark.needs(
    "vllm-volta-attn-v100", "vllm-volta-fp8kv", "vllm-volta-ct-wna16", "vllm-volta-fp8w", "triton"
)
@pytest.mark.parametrize(
    "orders",
    [
        (("decode", "prefill"), ("prefill", "decode"), ("gather", "prefill", "decode")),
        (("ct_splitk", "ct_moe_decode"), ("ct_moe_decode", "ct_splitk")),
        (("fp8w_splitk", "fp8w_gemm"), ("fp8w_gemm", "fp8w_splitk")),
    ],
    ids=["attn_v100", "ct_wna16", "fp8w"],
)
def test_kernels_have_one_triton_key_whatever_a_process_keys_first(
    orders: tuple[tuple[str, ...], ...],
) -> None:
    """Triton 3.6 puts a callee's ``tl.constexpr`` globals in its caller's key only when the
    callee was keyed first (``triton/runtime/jit.py`` l.99-115): each plugin's kernels share
    helpers that read such globals, so before their packages keyed them at import
    (``settle_cache_keys``) each process's keys depended on which kernel it keyed first, and a
    warmed cache was partly missed. Fresh processes key them in different orders (attention
    once after fp8kv's gather, which shares the host's ``dequantize_tile``): the keys must be
    equal."""
    names = sorted(set(orders[0]) - {"gather"})
    keys = []
    for order in orders:
        found = _fresh_process_json(KEY_ORDER, *order)
        keys.append({name: found[name] for name in names})
    assert all(k == keys[0] for k in keys[1:]), keys


def _fresh_process_json(script: str, *args: str) -> Any:
    """What ``script`` prints as JSON, run in a fresh Python with compiled (not interpreted)
    Triton, as the engine and warmup run it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


# What each recording script starts with: ``record(log, **call)`` keeps every launch of a
# ``recording_launches`` log (volta_devkit.launch_capture), none run, as Triton's JIT specializes
# it (``gate_inputs``), with the call that made it; a call that launched nothing is an error
# (a launcher that took a CPU path instead would check nothing). The script prints ``launches``.
RECORDER = """
import itertools, json, os, torch
from volta_devkit.launch_capture import gate_inputs, recording_launches

launches = []

def record(log, **call):
    assert log.launches, f"no launch recorded for {call}"
    for launch in log.launches:
        inputs = gate_inputs(launch)
        launches.append({
            "call": call,
            "kernel": f"{launch.kernel.__module__}:{launch.name}",
            "signature": inputs.signature,
            "constexprs": inputs.constexprs,
            "divisible_by_16": sorted(inputs.divisible_by_16),
            "num_warps": launch.num_warps,
            "num_stages": launch.num_stages,
        })
"""

# fp8kv's cache writes for one Qwen3-8B layer (32 query and 8 KV heads of 128, keys and values
# sliced from the fused QKV output, blocks of 16) in an e5m2 cache, per-tensor and per-head
# scales, at 1, 5 and 16 tokens; and its gathers of that cache for one and for three sequences,
# through block tables of a multiple of 16 columns (vLLM's for a 40960-token context) and not.
FP8KV = (
    RECORDER
    + """
from volta_fp8kv.format import cache_format
from volta_fp8kv.ops import cache_launch, gather_kv_cache
from volta_fp8kv.scales import kv_scales, unit_scales

Q, KV, D, BLOCK, BLOCKS = 32, 8, 128, 16, 64
fmt = cache_format("fp8_e5m2")
cache = torch.empty(BLOCKS, KV, BLOCK, 2 * D, dtype=fmt.storage_dtype)
for scales in (unit_scales(), kv_scales(torch.ones(KV), torch.ones(KV), KV)):
    layer = cache_launch(cache, fmt, scales, D, D)
    for tokens in (1, 5, 16):
        qkv = torch.empty(tokens, (Q + 2 * KV) * D, dtype=torch.float16)
        key = qkv[:, Q * D : (Q + KV) * D].view(tokens, KV, D)
        value = qkv[:, (Q + KV) * D :].view(tokens, KV, D)
        with recording_launches() as log:
            layer.run(key, value, torch.arange(tokens, dtype=torch.int64))
        record(log, write=tokens, per_head=scales.per_head)
    for seqs, width in itertools.product((1, 3), (2560, 50)):
        with recording_launches() as log:
            gather_kv_cache(
                cache, torch.zeros(seqs, width, dtype=torch.int32),
                torch.full((seqs,), 700, dtype=torch.int32), "fp8_e5m2", D, scales,
                check_indices=False,
            )
        record(log, gather=seqs, table_width=width, per_head=scales.per_head)
print(json.dumps(launches))
"""
)

# ct_wna16's linear layers planned for a V100 (CPU tensors, so the tensor-core GEMM, which is
# CUDA, leaves the calls to its Triton fallback): the bundled Qwen3.5-27B W4A16 example's
# (symmetric int4 in groups of 128: attention output 5120 x 6144, MLP gate/up 34816 x 5120 and
# down 5120 x 17408) and an asymmetric 4096 x 4096 one, at a token count of each launch SM70
# takes (1, 2-4, 5-16, 17-32 and from 33) and within them 16 and 32 (multiples of 16) and
# 5 and 17 (neither).
CT_WNA16 = (
    RECORDER
    + """
import volta_ct_wna16.kernels
from volta_ct_wna16.layout import prepare
from volta_ct_wna16.ops import wna16_linear
from volta_ct_wna16.scheme import WeightScheme

# The launcher launches on CPU tensors under the interpreter only: the kernels, imported
# before, stay compiled JIT functions, as on a GPU.
os.environ["TRITON_INTERPRET"] = "1"
layers = [(5120, 6144, True), (34816, 5120, True), (5120, 17408, True), (4096, 4096, False)]
for n, k, symmetric in layers:
    zero_points = None if symmetric else torch.zeros(n // 8, k // 128, dtype=torch.int32)
    weights = prepare(
        "layer", WeightScheme(4, symmetric, 128), n=n, k=k,
        weight_packed=torch.zeros(n, k // 8, dtype=torch.int32),
        weight_scale=torch.ones(n, k // 128, dtype=torch.float16),
        weight_zero_point=zero_points, act_dtype=torch.float16,
    )
    for tokens in (1, 3, 5, 16, 17, 32, 48):
        with recording_launches() as log:
            wna16_linear(torch.empty(tokens, k, dtype=torch.float16), weights)
        record(log, layer=[n, k], symmetric=symmetric, tokens=tokens)
print(json.dumps(launches))
"""
)

# fp8w's linear layers planned for a V100 as ct_wna16's: the bundled Qwen3.6-27B FP8 example's
# (e4m3 codes in blocks of 128 x 128, the same three shapes) and a channel-scaled
# 5120 x 17408 one, at a token count of each launch SM70 takes (1, 2-8, 9-32 and from 33) and
# within them 16 and 32 (multiples of 16) and 3, 5 and 17 (neither).
FP8W = (
    RECORDER
    + """
import volta_fp8w.kernels
from volta_fp8w.layout import block_weights, channel_weights
from volta_fp8w.ops import fp8_linear

# The launcher launches on CPU tensors under the interpreter only: the kernels, imported
# before, stay compiled JIT functions, as on a GPU.
os.environ["TRITON_INTERPRET"] = "1"
codes = lambda n, k: torch.zeros(n, k, dtype=torch.float8_e4m3fn)
layers = [
    ("block", block_weights("layer", codes(n, k), torch.ones(n // 128, k // 128), n, k, (128, 128)))
    for n, k in ((5120, 6144), (34816, 5120), (5120, 17408))
]
channel = channel_weights("layer", codes(5120, 17408), torch.ones(5120, 1), 5120, 17408)
layers.append(("channel", channel))
for scales, weights in layers:
    for tokens in (1, 3, 5, 16, 17, 32, 48):
        with recording_launches() as log:
            fp8_linear(torch.empty(tokens, weights.k, dtype=torch.float16), weights)
        record(log, layer=[weights.n, weights.k], scales=scales, tokens=tokens)
print(json.dumps(launches))
"""
)

# attn_v100's Triton decode and prefill (what a V100 runs without NVRTC, and the tensor-core
# kernels' fallback) for the bundled Qwen3-8B example's attention (32 query and 8 KV heads of
# 128, blocks of 16) in an e5m2 cache with per-tensor or per-head scales and in an fp16 one,
# without and with sinks and a sliding window, through vLLM's block table for a 40960-token
# context (2560 columns): decodes of one sequence of 1000 and of 32K (16 and 20 partitions), 5
# of 1000 (4), 64 of 2000 (one partition) and 4 of two tokens each (speculative decoding), and
# prefills of one sequence and of two (the script asserts each class of partition count).
ATTENTION = (
    RECORDER
    + """
from volta_attn_v100.ops import paged_attention

Q, KV, D, BLOCK, BLOCKS, WIDTH = 32, 8, 128, 16, 64, 2560
batches = (
    ([1], 1000), ([1], 32768), ([1] * 5, 1000), ([1] * 64, 2000), ([2] * 4, 300), ([40], 40),
    ([3, 40], 100),
)
caches = (("fp8_e5m2", torch.ones(1)), ("fp8_e5m2", torch.ones(KV)), ("float16", None))
splits = set()
for kv_dtype, scale in caches:
    storage = torch.float16 if scale is None else torch.uint8
    cache = torch.empty(BLOCKS, KV, BLOCK, 2 * D, dtype=storage)
    for (sinks, window), (q_lens, seq_len) in itertools.product(
        ((None, None), (torch.zeros(Q), 1024)), batches
    ):
        query = torch.empty(sum(q_lens), Q, D, dtype=torch.float16)
        with recording_launches() as log:
            paged_attention(
                query, cache, torch.zeros(len(q_lens), WIDTH, dtype=torch.int32),
                torch.full((len(q_lens),), seq_len, dtype=torch.int32),
                torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32),
                torch.empty_like(query), max_query_len=max(q_lens), max_seq_len=seq_len,
                sm_scale=0.1, kv_cache_dtype=kv_dtype, k_scale=scale, v_scale=scale,
                sliding_window=window, sinks=sinks, check_bounds=False,
            )
        splits |= {l.arguments["num_splits"] for l in log.launches if "num_splits" in l.arguments}
        record(log, kv=kv_dtype, per_head=scale is not None and scale.numel() > 1,
               sinks_and_window=sinks is not None, seqs=len(q_lens), query_len=max(q_lens),
               seq_len=seq_len)
classes = {"one" if s == 1 else "16k" if s % 16 == 0 else "other" for s in splits}
assert classes == {"one", "16k", "other"}, splits
print(json.dumps(launches))
"""
)


def _specialization(compiled: dict[str, Any]) -> str:
    """What Triton's JIT compiles for a launch or a build (its kernel, signature, constexprs,
    16-divisible integers, warps and stages), as one comparable string."""
    return json.dumps(
        [
            compiled["kernel"],
            dict(compiled["signature"]),
            dict(compiled["constexprs"]),
            sorted(compiled["divisible_by_16"]),
            compiled["num_warps"],
            compiled["num_stages"],
        ],
        sort_keys=True,
    )


def _warmed(model: str, experts: str | None = None) -> set[str]:
    """The specialization of every Triton build warmup compiles for ``model``'s plan (a
    bundled example or a model folder) on a V100 (each declared build, and its any-size
    variant), its kernel named by the module that defines it, as a recorded launch names it (a
    build may name the package that re-exports it); with ``experts``, the plan's routed
    experts are asserted served by that plugin."""
    from volta_core.device import V100
    from volta_core.host.discovery import get_plugin_manager
    from volta_core.planner.model import describe_model, read_config
    from volta_core.planner.plan import PlanOptions, make_plan
    from volta_core.warmup import plan_builds
    from volta_devkit.gate import import_kernel

    manager = get_plugin_manager()
    plan = make_plan(describe_model(*read_config(model)), PlanOptions(device=V100), manager)
    if experts is not None:
        served = {
            q.plugin
            for q in plan.quant
            if q.module is not None and q.module.kind is LayerKind.FUSED_MOE
        }
        assert served == {experts}, served
    _, builds = plan_builds(plan, manager)

    def defined_at(kernel: str) -> str:
        fn = getattr(import_kernel(kernel), "fn", None)
        assert fn is not None, f"{kernel} is not a Triton JIT function"
        return f"{fn.__module__}:{fn.__name__}"

    return {
        _specialization({**vars(b.config), "kernel": defined_at(b.config.kernel)})
        for b in builds
        if isinstance(b.config, KernelConfig)
    }


def _assert_warmed(launches: list[dict[str, Any]], warmed: set[str]) -> None:
    """Each recorded launch's specialization is one of the ``warmed`` builds'."""
    missed = [
        (launch["kernel"].rsplit(":", 1)[1], launch["call"])
        for launch in launches
        if _specialization(launch) not in warmed
    ]
    assert not missed, f"launches warmup does not build ({len(missed)}): {missed}"


def _needs(*plugins: str) -> pytest.MarkDecorator:
    return pytest.mark.needs(*plugins, "vllm-volta-devkit", "triton", "torch")


@pytest.mark.parametrize(
    ("script", "example", "kernels"),
    [
        pytest.param(
            FP8KV,
            EXAMPLE,
            {"cache_write_kernel", "gather_kernel"},
            marks=_needs("vllm-volta-fp8kv"),
            id="fp8kv",
        ),
        pytest.param(
            CT_WNA16,
            "qwen3.5-27b-w4a16",
            {"wna16_splitk_kernel", "wna16_gemm_kernel", "wna16_dequant_kernel"},
            marks=_needs("vllm-volta-ct-wna16"),
            id="ct_wna16",
        ),
        pytest.param(
            FP8W,
            "qwen3.6-27b-fp8",
            {"fp8w_splitk_kernel", "fp8w_gemm_kernel", "fp8w_dequant_kernel"},
            marks=_needs("vllm-volta-fp8w"),
            id="fp8w",
        ),
        pytest.param(
            ATTENTION,
            EXAMPLE,
            {"paged_decode_kernel", "paged_prefill_kernel"},
            marks=_needs("vllm-volta-attn-v100"),
            id="attn_v100",
        ),
    ],
)
def test_warmup_builds_the_specializations_of_real_launches(
    script: str, example: str, kernels: set[str]
) -> None:
    """Triton specializes an integer argument by its value (1: a compile-time constant; a
    multiple of 16, 0 included: divisible; else plain), so a build compiled with other values
    is not the one a launch finds. Each plugin's launcher, run on CPU tensors planned for a
    V100 in a fresh process (the recording scripts above), passes token counts, partition
    counts, scale strides, head-group numbers and block-table widths of every class: each
    launch's specialization must be one of the builds warmup compiles for a bundled example
    whose plan that plugin serves (for the attention and KV-cache plugins Qwen3-8B, for
    ct_wna16 Qwen3.5-27B W4A16, for fp8w Qwen3.6-27B FP8)."""
    launches = _fresh_process_json(script)
    assert {launch["kernel"].rsplit(":", 1)[1] for launch in launches} == kernels
    _assert_warmed(launches, _warmed(example))


#: What each MoE script adds to :data:`RECORDER`: ``note(log)`` keeps the class (``"one"``, a
#: multiple of 16 ``"16k"``, ``"other"``) of every count a launch passed (pairs, tokens, splits,
#: blocks, top-k, row divisors), and ``check_classes()`` asserts that each class came up, so the
#: launches checked pass counts of all three values the JIT tells apart.
CLASSES = """
COUNTS = ("PAIRS", "TOKENS", "SLOT_SPLITS", "BLOCKS", "TOP_K", "ROW_DIV", "OUT_DIV")
classes = set()

def note(log):
    for launch in log.launches:
        for name in COUNTS:
            value = launch.arguments.get(name)
            if isinstance(value, int):
                classes.add("one" if value == 1 else "16k" if value % 16 == 0 else "other")

def check_classes():
    assert classes == {"one", "16k", "other"}, classes
"""

# ct_wna16's experts planned for a V100 (CPU tensors, so the routed blocks' tensor-core GEMM,
# which is CUDA, leaves the steps to its Triton fallback): int4 in groups of 128, symmetric
# and asymmetric, at a token count of each launch SM70 takes (the decode GEMVs up to 16 tokens,
# the routed blocks' small tile above and their large one from 16 routed rows an expert on
# average, 600 tokens) and within them 16 and 32 (multiples of 16) and 3, 5, 17 and 48
# (neither); with the router weight on the output and on the input (vLLM's
# ``apply_router_weight_on_input``), with and without an expert map, vLLM's int32 ids and int64
# ones; and a top-1 router's steps (top-k, and at one token the pair count, of 1). Also the
# router's top-k (``select_experts``, the benchmark's router; vLLM routes before the method)
# with and without renormalizing.
CT_WNA16_MOE = (
    RECORDER
    + CLASSES
    + """
import volta_ct_wna16.kernels
from volta_ct_wna16.experts import ExpertWeights, experts_forward
from volta_ct_wna16.layout import PackedWeights
from volta_ct_wna16.routing import select_experts

# The launcher launches on CPU tensors under the interpreter only: the kernels, imported
# before, stay compiled JIT functions, as on a GPU.
os.environ["TRITON_INTERPRET"] = "1"
E, HIDDEN, INTER, TOP_K, GROUP = 256, 2048, 512, 8, 128

# Never read: the kernels do not run.
def stacked(n, k, symmetric):
    zeros = None if symmetric else torch.empty(E, k // GROUP, n, dtype=torch.float16)
    return PackedWeights(
        torch.empty(E, k // 8, n, dtype=torch.int32),
        torch.empty(E, k // GROUP, n, dtype=torch.float16), zeros, n, k, 4, GROUP,
    )

steps = [*itertools.product([TOP_K], (1, 3, 5, 16, 17, 32, 48, 600)), (1, 1), (1, 17)]
for symmetric in (True, False):
    w13, w2 = stacked(2 * INTER, HIDDEN, symmetric), stacked(HIDDEN, INTER, symmetric)
    weights = ExpertWeights(w13, w2)
    for (top_k, tokens), on_input, mapped, ids_dtype in itertools.product(
        steps, (False, True), (False, True), (torch.int32, torch.int64)
    ):
        ids = (torch.arange(tokens * top_k) % E).reshape(tokens, top_k).to(ids_dtype)
        with recording_launches() as log:
            experts_forward(
                torch.empty(tokens, HIDDEN, dtype=torch.float16), torch.ones(tokens, top_k),
                ids, weights, expert_map=torch.arange(E, dtype=torch.int32) if mapped else None,
                weight_on_input=on_input,
            )
        note(log)
        record(log, symmetric=symmetric, top_k=top_k, tokens=tokens, on_input=on_input,
               mapped=mapped, ids=str(ids_dtype))
for tokens, renormalize in itertools.product((1, 16, 17), (True, False)):
    with recording_launches() as log:
        select_experts(torch.empty(tokens, E, dtype=torch.float16), TOP_K, renormalize=renormalize)
    record(log, router=tokens, renormalize=renormalize)
check_classes()
print(json.dumps(launches))
"""
)

# fp8w's experts planned for a V100 as ct_wna16's: e4m3 codes in blocks of 128 x 128 and with
# one scale a row (channel scales: the builds are declared per device, not per checkpoint), at
# the same token counts (the decode GEMVs up to 16, the routed blocks' tile of 16 rows above
# and of 32 from 16 routed rows an expert on average), the router weight on the output and on
# the input, with and without an expert map, int32 and int64 ids, and a top-1 router's steps.
FP8W_MOE = (
    RECORDER
    + CLASSES
    + """
import volta_fp8w.kernels.moe
from volta_fp8w.experts import ExpertWeights, experts_forward
from volta_fp8w.layout import Fp8Weights, channel_block_k

# The launcher launches on CPU tensors under the interpreter only: the kernels, imported
# before, stay compiled JIT functions, as on a GPU.
os.environ["TRITON_INTERPRET"] = "1"
E, HIDDEN, INTER, TOP_K = 256, 2048, 512, 8

# Never read: the kernels do not run. Blocks of 128 x 128, or one scale a row (channel).
def stacked(n, k, channel):
    codes = torch.empty(E, n, k, dtype=torch.uint8)
    if channel:
        return Fp8Weights(codes, torch.empty(E, n, 1), n, k, 1, channel_block_k(k))
    return Fp8Weights(codes, torch.empty(E, n // 128, k // 128), n, k, 128, 128)

steps = [*itertools.product([TOP_K], (1, 3, 5, 16, 17, 32, 48, 600)), (1, 1), (1, 17)]
for channel in (False, True):
    weights = ExpertWeights(stacked(2 * INTER, HIDDEN, channel), stacked(HIDDEN, INTER, channel))
    for (top_k, tokens), on_input, mapped, ids_dtype in itertools.product(
        steps, (False, True), (False, True), (torch.int32, torch.int64)
    ):
        ids = (torch.arange(tokens * top_k) % E).reshape(tokens, top_k).to(ids_dtype)
        with recording_launches() as log:
            experts_forward(
                torch.empty(tokens, HIDDEN, dtype=torch.float16), weights,
                torch.ones(tokens, top_k), ids,
                torch.arange(E, dtype=torch.int32) if mapped else None, weight_on_input=on_input,
            )
        note(log)
        record(log, channel=channel, top_k=top_k, tokens=tokens, on_input=on_input,
               mapped=mapped, ids=str(ids_dtype))
check_classes()
print(json.dumps(launches))
"""
)


def _moe_config(folder: Path, example: str) -> str:
    """The bundled ``example`` (its quantization kept) made a Qwen3.5-MoE of the 35B-A3B kind
    in ``folder``: 256 experts, 8 a token, 512 wide, hidden 2048; the folder's path."""
    from volta_core.planner.model import read_config

    _, raw = read_config(example)
    raw["model_type"], raw["architectures"] = "qwen3_5_moe", ["Qwen3_5MoeForConditionalGeneration"]
    text = raw["text_config"]
    text.update(
        model_type="qwen3_5_moe_text",
        num_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
        hidden_size=2048,
        num_hidden_layers=40,
        num_attention_heads=16,
        num_key_value_heads=2,
        layer_types=text["layer_types"][:40],
    )
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(raw))
    return str(folder)


@pytest.mark.parametrize(
    ("script", "example", "plugin", "kernels"),
    [
        pytest.param(
            CT_WNA16_MOE,
            "qwen3.5-27b-w4a16",
            "ct_wna16",
            {
                "moe_decode_gate_up_kernel",
                "moe_decode_down_kernel",
                "moe_count_kernel",
                "moe_place_kernel",
                "wna16_moe_kernel",
                "silu_mul_kernel",
                "topk_softmax_kernel",
            },
            marks=_needs("vllm-volta-ct-wna16"),
            id="ct_wna16",
        ),
        pytest.param(
            FP8W_MOE,
            "qwen3.6-27b-fp8",
            "fp8w",
            {
                "moe_gemv_gate_up_kernel",
                "moe_gemv_down_kernel",
                "moe_sum_kernel",
                "moe_count_kernel",
                "moe_place_kernel",
                "moe_gate_up_kernel",
                "moe_down_kernel",
            },
            marks=_needs("vllm-volta-fp8w"),
            id="fp8w",
        ),
    ],
)
def test_warmup_builds_the_specializations_of_real_moe_launches(
    script: str, example: str, plugin: str, kernels: set[str], tmp_path: Path
) -> None:
    """Triton specializes an integer argument by its value, so a build compiled with other
    values is not the one a launch finds. Each plugin's experts, run on CPU tensors planned for
    a V100 in a fresh process (the recording scripts above), pass pair, token, block and split
    counts and top-k of every class: each launch's specialization must be one of the builds
    warmup compiles for the plan of a Qwen3.5-MoE whose experts that plugin serves (ct_wna16's
    W4A16, fp8w's FP8 with 128 x 128 blocks)."""
    launches: list[dict[str, Any]] = _fresh_process_json(script)
    assert {launch["kernel"].rsplit(":", 1)[1] for launch in launches} == kernels
    _assert_warmed(launches, _warmed(_moe_config(tmp_path / "Qwen3.5-MoE", example), plugin))


@pytest.mark.needs("triton", "torch")
def test_stand_ins_specialize_as_the_jit_does_for_the_declared_build() -> None:
    """Each stand-in gets the JIT's own specialization of the declared type: pointers 16-byte
    aligned, ``divisible_by_16`` integers marked divisible, the others plain (never the
    constexpr the JIT makes of a 1)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    from volta_core.kernel_api._warm import _stand_in

    backend = type(make_backend(GPUTarget("cuda", 70, 32)))
    cfg = KernelConfig(
        "k",
        "m:k",
        {"p": "*fp16", "q": "*u8", "n": "i32", "s": "i32", "big": "i64", "x": "fp32"},
        divisible_by_16=("n",),
    )
    specialized = {
        name: native_specialize_impl(backend, _stand_in(cfg, name), False, True, True)[:2]
        for name in cfg.signature
    }
    assert specialized == {
        "p": ("*fp16", "D"),
        "q": ("*u8", "D"),
        "n": ("i32", "D"),
        "s": ("i32", ""),
        "big": ("i64", ""),
        "x": ("fp32", None),
    }
    unspecialized = triton_variants([cfg])[1]
    assert unspecialized.name == "k" + ANY_SIZE
    assert native_specialize_impl(backend, _stand_in(unspecialized, "n"), False, True, True)[
        :2
    ] == ("i32", "")


def test_warmup_refuses_the_interpreter(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from volta_core.cli import main

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    code = main(["warmup", EXAMPLE])
    assert code == 2
    assert "TRITON_INTERPRET=" in capsys.readouterr().err


def test_cuda_builds_an_nvrtc_cannot_make_are_one_line_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CUDA 13's NVRTC cannot build sm_70: each CUDA build is "not built", and the report says
    why once, not once per build; a failed build is named with its error."""
    from volta_core import CudaKernelConfig
    from volta_core.kernel_api import CudaToolkitUnavailable
    from volta_core.warmup import NOT_BUILT, Build, WarmupReport, _warm_one

    reason = "NVRTC 13.0 cannot build sm_70 (CUDA 13 dropped Volta, sm_70)"

    def no_volta(cfg: CudaKernelConfig, capability: int) -> bool:
        raise CudaToolkitUnavailable(reason)

    monkeypatch.setattr("volta_core.warmup.warm_cuda", no_volta)
    builds = [Build("p", CudaKernelConfig(f"mma{i}", "src", "k", 128)) for i in range(3)]
    outcomes = [_warm_one(b, 70, lambda cfg: False) for b in builds]
    assert {o.status for o in outcomes} == {NOT_BUILT}

    def broken(cfg: KernelConfig) -> bool:
        raise RuntimeError("ptxas error: too many resources\nmore")

    triton = Build("p", KernelConfig("gemv", "m:k", {}))
    report = WarmupReport(
        "m", "sm_70", ["p"], "/t", "/c", outcomes=[*outcomes, _warm_one(triton, 70, broken)]
    )
    text = report.render()
    assert f"not built (3): {reason}" in text.splitlines()
    assert "failed (1): p:gemv: RuntimeError: ptxas error: too many resources" in text.splitlines()
    assert "cuda: 0 built, 0 already cached, 0 failed, 3 not built  (/c)" in text
    assert report.counts()["triton"]["failed"] == 1


def test_a_cache_lookup_that_raises_is_compiled_and_reported_once_per_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Triton lookup reads Triton's private functions: when it raises (here as a Triton
    without ``get_cache_key`` would), each build is compiled as not known cached, and the report
    counts the failed lookups under their error, once per error. No NVRTC for a CUDA build is
    not a lookup error: that build is "not built" with the reason."""
    import contextlib
    from collections.abc import Iterator

    from volta_core import CudaKernelConfig
    from volta_core.kernel_api import CudaToolkitUnavailable
    from volta_core.warmup import BUILT, CACHED, NOT_BUILT, Build, WarmupReport, warm

    gone = AttributeError("module 'triton.runtime.cache' has no attribute 'get_cache_key'")

    class BrokenLookup:
        def cached(self, cfg: KernelConfig) -> bool:
            raise gone

        def warm(self, cfg: KernelConfig) -> bool:
            return cfg.name == "found"  # the compiler itself found this one in the cache

    @contextlib.contextmanager
    def target(capability: int) -> Iterator[BrokenLookup]:
        yield BrokenLookup()

    def no_nvrtc(cfg: CudaKernelConfig, capability: int) -> bool:
        raise CudaToolkitUnavailable("no CUDA 12 NVRTC")

    monkeypatch.setattr("volta_core.warmup.triton_target", target)
    monkeypatch.setattr("volta_core.warmup.cuda_cached", no_nvrtc)
    monkeypatch.setattr("volta_core.warmup.warm_cuda", no_nvrtc)
    builds = [Build("p", KernelConfig(name, "m:k", {})) for name in ("found", "new", "new2")]
    builds.append(Build("p", CudaKernelConfig("mma", "src", "k", 128)))
    outcomes = warm(builds, (7, 0), jobs=1, progress=False)
    assert [o.status for o in outcomes] == [CACHED, BUILT, BUILT, NOT_BUILT]
    error = f"AttributeError: {gone}"
    assert [o.lookup_error for o in outcomes] == [error, error, error, ""]
    report = WarmupReport("m", "sm_70", ["p"], "/t", "/c", outcomes=outcomes)
    assert report.lookup_errors() == {error: 3}
    assert report.as_dict()["lookup_errors"] == {error: 3}
    lookup_lines = [line for line in report.render().splitlines() if "lookup" in line]
    assert lookup_lines == [
        f"cache lookup failed (3): {error}: compiled as not known cached (the compiler finds "
        "what is cached, so the results stand; only the time is lost)"
    ]
