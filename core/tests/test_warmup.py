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
from volta_core.host.types import KernelConfig
from volta_core.kernel_api._warm import ANY_SIZE, triton_variants

EXAMPLE = "qwen3-8b-fp8-kv-per-tensor"
# fp8kv's cache write and gather for 128-dim heads (four configurations, each also compiled
# unspecialized) and one of attn_v100's CUDA decode builds.
ONLY = ("fp8kv:*head_pad=128]*", "attn_v100:cuda_decode_d128*float16")
TRITON_BUILDS, CUDA_BUILDS = 8, 1


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


# Records, without a GPU, the cache writes fp8kv's launcher makes for one Qwen3-8B layer (32
# query and 8 KV heads of 128, keys and values sliced from the fused QKV output, blocks of 16)
# in an e5m2 cache, per-tensor and per-head scales, at 1, 5 and 16 tokens, and prints each
# launch as Triton's JIT specializes it (volta_devkit.launch_capture.gate_inputs).
CACHE_WRITES = """
import json, torch
from volta_devkit.launch_capture import gate_inputs, recording_launches
from volta_fp8kv.format import cache_format
from volta_fp8kv.ops import cache_launch
from volta_fp8kv.scales import kv_scales, unit_scales

Q, KV, D, BLOCK, BLOCKS = 32, 8, 128, 16, 64
fmt = cache_format("fp8_e5m2")
cache = torch.empty(BLOCKS, KV, BLOCK, 2 * D, dtype=fmt.storage_dtype)
launches = []
for scales in (unit_scales(), kv_scales(torch.ones(KV), torch.ones(KV), KV)):
    layer = cache_launch(cache, fmt, scales, D, D)
    for tokens in (1, 5, 16):
        qkv = torch.empty(tokens, (Q + 2 * KV) * D, dtype=torch.float16)
        key = qkv[:, Q * D : (Q + KV) * D].view(tokens, KV, D)
        value = qkv[:, (Q + KV) * D :].view(tokens, KV, D)
        with recording_launches() as log:
            layer.run(key, value, torch.arange(tokens, dtype=torch.int64))
        for launch in log.launches:
            inputs = gate_inputs(launch)
            launches.append({
                "tokens": tokens,
                "per_head": scales.per_head,
                "kernel": f"{launch.kernel.__module__}:{launch.name}",
                "signature": inputs.signature,
                "constexprs": inputs.constexprs,
                "divisible_by_16": sorted(inputs.divisible_by_16),
                "num_warps": launch.num_warps,
                "num_stages": launch.num_stages,
            })
print(json.dumps(launches))
"""


def _specialization(
    kernel: str,
    signature: dict[str, str],
    constexprs: dict[str, Any],
    divisible: Any,
    num_warps: int,
    num_stages: int,
) -> str:
    """What Triton's JIT compiles for a launch or a build, as one comparable string."""
    return json.dumps(
        [kernel, signature, constexprs, sorted(divisible), num_warps, num_stages], sort_keys=True
    )


@pytest.mark.needs("vllm-volta-fp8kv", "vllm-volta-devkit", "triton", "torch")
def test_warmup_builds_the_specializations_of_real_fp8kv_cache_writes() -> None:
    """Triton specializes an integer argument by its value (1: a compile-time constant; a
    multiple of 16, 0 included: divisible; else plain), so a build compiled with other values
    is not the one a launch finds. fp8kv's launcher, run on CPU tensors for a Qwen3-8B layer,
    passes 1 token at a one-sequence decode, 16 at a CUDA-graph size and 5 otherwise, its
    scale stride 0 (per-tensor) or 1 (per-head), and head sizes and slot counts of 16k: each
    launch's specialization must be one of the builds warmup compiles for the bundled
    Qwen3-8B example's plan."""
    from volta_core.device import V100
    from volta_core.host.discovery import get_plugin_manager
    from volta_core.planner.model import describe_model, read_config
    from volta_core.planner.plan import PlanOptions, make_plan
    from volta_core.warmup import plan_builds

    launches = _fresh_process_json(CACHE_WRITES)
    assert len(launches) == 6
    manager = get_plugin_manager()
    plan = make_plan(describe_model(*read_config(EXAMPLE)), PlanOptions(device=V100), manager)
    _, builds = plan_builds(plan, manager)
    warmed = {
        _specialization(
            b.config.kernel,
            dict(b.config.signature),
            dict(b.config.constexprs),
            b.config.divisible_by_16,
            b.config.num_warps,
            b.config.num_stages,
        )
        for b in builds
        if isinstance(b.config, KernelConfig)
    }
    missed = [
        (launch["tokens"], launch["per_head"])
        for launch in launches
        if _specialization(
            launch["kernel"],
            launch["signature"],
            launch["constexprs"],
            launch["divisible_by_16"],
            launch["num_warps"],
            launch["num_stages"],
        )
        not in warmed
    ]
    assert not missed, f"(tokens, per_head) launches warmup does not build: {missed}"


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
