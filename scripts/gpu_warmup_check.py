"""Whether what ``vllm-volta warmup`` builds is what the launches find, on a GPU machine.

From the repository root, with the plugins' sources on ``PYTHONPATH`` (no install) and a fresh
``TRITON_CACHE_DIR``::

    PYTHONPATH=core/src:core/devkit/src:plugins/fp8kv/src:plugins/attn_v100/src:\\
    plugins/ct_wna16/src:plugins/fp8w/src TRITON_CACHE_DIR=/fresh/dir \\
      python3 scripts/gpu_warmup_check.py MODEL [DEVICE]

``MODEL`` as ``vllm-volta plan`` takes it; ``DEVICE`` defaults to this GPU's capability.
Warms the cache for the model's plan on that device (:func:`volta_core.warmup.run_warmup`;
tqdm must be importable), warms it again (every build should be found cached), then runs
``vllm-volta bench --quick`` on the model with the same cache and lists each Triton cache
entry the bench added: a kernel of a plugin that serves the plan there is a launch warmup
missed. Kernels of plugins the plan does not route to on this device (the bench times them
too) and Triton's launcher modules (``__triton_launcher*.so``, ``cuda_utils*.so``: compiled
with the host's C compiler at a signature's first load, not kernels) are listed apart.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
from pathlib import Path

from volta_core.bench.run import load_plugins
from volta_core.device import parse_device
from volta_core.planner.model import describe_model, read_config
from volta_core.planner.plan import PlanOptions, make_plan
from volta_core.warmup import plan_builds, run_warmup

MODULES = (
    "volta_fp8kv.plugin",
    "volta_attn_v100.plugin",
    "volta_ct_wna16.plugin",
    "volta_fp8w.plugin",
)


def cache_entries(cache: Path) -> dict[str, list[str]]:
    """Triton's cache: each entry's folder name and its files."""
    return {d.name: sorted(p.name for p in d.iterdir()) for d in cache.iterdir() if d.is_dir()}


def kernel_of(files: list[str]) -> str | None:
    """The kernel a cache entry holds (its metadata file's name), None for a launcher module."""
    return next(
        (f.removesuffix(".json") for f in files if f.endswith(".json") and "__grp__" not in f),
        None,
    )


def main() -> int:
    model = sys.argv[1]
    if len(sys.argv) > 2:
        device = sys.argv[2]
    else:
        import torch

        device = "sm{}{}".format(*torch.cuda.get_device_capability())
    cache = Path(os.environ["TRITON_CACHE_DIR"])
    manager = load_plugins(MODULES)
    plan = make_plan(
        describe_model(*read_config(model)), PlanOptions(device=parse_device(device)), manager
    )
    for run in (1, 2):
        report = run_warmup(plan, manager, progress=False)
        statuses = collections.Counter(o.status for o in report.outcomes)
        print(f"warmup {run}: {report.seconds:.1f} s, {dict(statuses)}, plugins {report.plugins}")
        for o in [o for o in report.outcomes if o.status not in ("built", "cached")][:8]:
            print(f"  {o.build.label}: {o.status} {o.detail[:300]}")
    _, builds = plan_builds(plan, manager)
    warmed = {b.config.kernel.rsplit(":", 1)[1] for b in builds if b.kind == "triton"}
    before = cache_entries(cache)
    start = time.perf_counter()
    plugins = [arg for module in MODULES for arg in ("--plugin", module)]
    bench = subprocess.run(
        [sys.executable, "-m", "volta_core.cli", "bench", model, "--quick", *plugins],
        capture_output=True,
        text=True,
        check=False,
    )
    print(f"bench: rc {bench.returncode}, {time.perf_counter() - start:.1f} s")
    if bench.returncode:
        print(bench.stdout[-2000:], bench.stderr[-2000:])
        return 1
    added = [files for name, files in cache_entries(cache).items() if name not in before]
    kernels = collections.Counter(kernel_of(files) for files in added)
    launchers = kernels.pop(None, 0)
    missed = {k: n for k, n in kernels.items() if k in warmed}
    others = {k: n for k, n in kernels.items() if k not in warmed}
    print(f"added by the bench: missed (kernels warmup builds): {missed}; kernels of plugins")
    print(f"the plan does not route to here: {others}; launcher modules: {launchers}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
