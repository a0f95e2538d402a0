#!/usr/bin/env bash
# One GPU call: the kernels' GPU tests (the README's, "Tests"), then the benchmark (table last).
#   OUT=DIR bash plugins/ct_wna16/scripts/gpu_run.sh [bench options, e.g. --sweep]
# Logs land under $OUT (default: `mktemp -d`); keep a run's in docs/perf/ct_wna16/<run>/.
# Run from the repository root on the device machine (no vllm, no compressed-tensors there):
# library-made checkpoints come as plugins/ct_wna16/.fixtures
# (python plugins/ct_wna16/tests/ct_wna16_checkpoints.py writes them).
set -uo pipefail
here=plugins/ct_wna16
out=${OUT:-$(mktemp -d -t ct_wna16_out.XXXXXX)}
mkdir -p "$out"
echo "logs in $out"
export PYTHONPATH=core/src:core/devkit/src:$here/src:$here/tests PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$PWD/$here/.tcache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout ${TEST_LIMIT:-240} python3 -m pytest -p volta_devkit.testing -m gpu \
  $here/tests/test_kernels.py $here/tests/test_moe_gpu.py $here/tests/test_routing.py \
  -q -p no:cacheprovider --rootdir=$here 2>&1 | tee "$out/gpu_tests.log" | tail -15
timeout ${BENCH_LIMIT:-200} python3 $here/benchmarks/ct_wna16_bench.py --out "$out" "$@" 2>&1 | tee "$out/bench.log" | tail -80
tar czf "$out/tcache.tgz" -C $here .tcache 2>/dev/null || true
