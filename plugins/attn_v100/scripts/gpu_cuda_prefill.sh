#!/usr/bin/env bash
# One GPU call for the tensor-core prefill (issue 34 item 2): its GPU tests (sm_90 cubin and the
# compute_70 PTX JIT-compiled by the driver), compute-sanitizer memcheck and racecheck on its
# small launches, then the benchmark's CUDA prefill rows beside the Triton prefill and SDPA.
#   OUT=DIR bash plugins/attn_v100/scripts/gpu_cuda_prefill.sh
# Needs cuda-bindings 12.x and a CUDA 12 NVRTC importable (pip install "vllm-volta-core[cuda]",
# or PYTHONPATH/LD_LIBRARY_PATH set by the caller). Run from the repository root; logs land in
# $OUT (default: `mktemp -d`); keep a run's in docs/perf/attn_v100/<topic>/.
set -uo pipefail
here=plugins/attn_v100
name=attn_v100_cuda_prefill
source scripts/gpu_common.sh
timeout ${TEST_LIMIT:-200} "${pytest[@]}" -m gpu -rs $here/tests/test_cuda_prefill.py 2>&1 | tee "$out/gpu_tests.log" | tail -15
small=$here/tests/test_cuda_prefill.py::test_gpu_small_for_sanitizer
for tool in memcheck racecheck; do
  timeout ${SANITIZER_LIMIT:-80} compute-sanitizer --tool $tool --error-exitcode 9 "${pytest[@]}" $small > "$out/$tool.log" 2>&1
  echo "$tool exit $?: $(grep -E 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | tr '\n' ' ')"
done
timeout ${BENCH_LIMIT:-150} python3 $here/benchmarks/bench.py --parts cuda_prefill --out "$out" 2>&1 | tee "$out/bench.log" | tail -20
