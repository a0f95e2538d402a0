#!/usr/bin/env bash
# One GPU call for fused MoE at prefill sizes (issue 35 item 2): the routed-blocks tile sweep at
# 256 and 2048 tokens on both layers (every tile checked against a float32 reference first), the
# stage split of the table's tile and the fastest, and fp16 cuBLAS on the same per-expert shapes
# (padded bmm) beside its 8192-cube rate. The MoE kernels' GPU tests and sanitizer runs are
# gpu_moe.sh's. The benchmark starts no tile after --budget-s (180 s).
#   OUT=DIR bash plugins/ct_wna16/scripts/gpu_moe_prefill.sh
# Run from the repository root; logs land in $OUT (default: `mktemp -d`); keep
# a run's in docs/perf/ct_wna16/moe_prefill/. BENCH_ARGS: the benchmark's own options.
set -uo pipefail
here=plugins/ct_wna16
out=${OUT:-$(mktemp -d -t ct_wna16_moe_prefill_out.XXXXXX)}
mkdir -p "$out"
echo "logs in $out"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}core/src:core/devkit/src:$here/src:$here/tests
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/$here/.tcache
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, triton, sys; print("torch", torch.__version__, "triton", triton.__version__, "python", sys.version.split()[0])'
} 2>&1 | tee "$out/device.txt"
timeout ${BENCH_LIMIT:-240} python3 $here/benchmarks/ct_wna16_moe_prefill_bench.py --out "$out" ${BENCH_ARGS:-} 2>&1 | tee "$out/bench.log" | tail -62
echo "benchmark exit ${PIPESTATUS[0]}"
