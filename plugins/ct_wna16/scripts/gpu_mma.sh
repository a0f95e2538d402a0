#!/usr/bin/env bash
# One GPU call for the tensor-core GEMM (issue 34 item 4): its GPU tests, its benchmark rows,
# then compute-sanitizer memcheck and racecheck on its small launches.
#   OUT=DIR bash plugins/ct_wna16/scripts/gpu_mma.sh
# Needs cuda-bindings 12.x and a CUDA 12 NVRTC importable (pip install "vllm-volta-core[cuda]",
# or PYTHONPATH/LD_LIBRARY_PATH set by the caller). Run from the repository root; logs land in
# $OUT (default: `mktemp -d`); keep a run's in docs/perf/ct_wna16/<topic>/.
set -uo pipefail
here=plugins/ct_wna16
name=ct_wna16_mma
source scripts/gpu_common.sh
timeout ${TEST_LIMIT:-150} "${pytest[@]}" -m gpu -rs $here/tests/test_mma.py 2>&1 | tee "$out/gpu_tests.log" | tail -12
timeout ${BENCH_LIMIT:-120} python3 $here/benchmarks/ct_wna16_mma_bench.py --out "$out" 2>&1 | tee "$out/bench.log" | tail -40
small=$here/tests/test_mma.py::test_gpu_small_for_sanitizer
for tool in memcheck racecheck; do
  timeout ${SANITIZER_LIMIT:-60} compute-sanitizer --tool $tool --error-exitcode 9 "${pytest[@]}" $small > "$out/$tool.log" 2>&1
  echo "$tool exit $?: $(grep -E 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | tr '\n' ' ')"
done
