#!/usr/bin/env bash
# One GPU call for the tensor-core decode (issue 34 item 3): its GPU tests (sm_90 cubin and the
# compute_70 PTX JIT-compiled by the driver), compute-sanitizer memcheck and racecheck on its
# small launches, then the benchmark's CUDA decode rows (achieved bandwidth here, m8n8k4
# emulated) and the SM70 estimates of every issue-34 decode target.
#   OUT=DIR bash plugins/attn_v100/scripts/gpu_cuda_decode.sh
# Needs cuda-bindings 12.x and a CUDA 12 NVRTC importable (pip install "vllm-volta-core[cuda]",
# or PYTHONPATH/LD_LIBRARY_PATH set by the caller). Run from the repository root; logs land in
# $OUT (default: `mktemp -d`); keep a run's in docs/perf/attn_v100/cuda_decode/.
set -uo pipefail
here=plugins/attn_v100
name=attn_v100_cuda_decode
source scripts/gpu_common.sh
timeout ${TEST_LIMIT:-170} "${pytest[@]}" -m gpu -rs $here/tests/test_cuda_decode.py 2>&1 | tee "$out/gpu_tests.log" | tail -15
small=$here/tests/test_cuda_decode.py::test_gpu_small_for_sanitizer
for tool in memcheck racecheck; do
  timeout ${SANITIZER_LIMIT:-60} compute-sanitizer --tool $tool --error-exitcode 9 "${pytest[@]}" $small > "$out/$tool.log" 2>&1
  echo "$tool exit $?: $(grep -E 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | tr '\n' ' ')"
done
timeout ${BENCH_LIMIT:-100} python3 $here/benchmarks/bench.py --parts cuda_decode --out "$out" 2>&1 | tee "$out/bench.log" | tail -32
