#!/usr/bin/env bash
# One GPU call for the routed experts' tensor-core GEMM (issue 51): its GPU tests (both MoE
# layers at 64-4096 tokens on every scheme, uneven routing, expert map, graph replay), the
# benchmark beside the Triton routed blocks (and vLLM's fused-MoE kernel where VLLM_FUSED_MOE
# names its fused_moe.py) at 512, 2048 and 4096 tokens, then compute-sanitizer memcheck and
# racecheck on its small launches.
#   OUT=DIR bash plugins/ct_wna16/scripts/gpu_moe_mma.sh
# Needs cuda-bindings 12.x and an NVRTC importable, as gpu_mma.sh. Run from the repository
# root; logs land in $OUT (default: `mktemp -d`); keep a run's in docs/perf/ct_wna16/moe_mma/.
set -uo pipefail
here=plugins/ct_wna16
name=ct_wna16_moe_mma
source scripts/gpu_common.sh
timeout ${TEST_LIMIT:-240} "${pytest[@]}" -m gpu -rs $here/tests/test_moe_mma.py 2>&1 | tee "$out/gpu_tests.log" | tail -15
peer=()
[ -n "${VLLM_FUSED_MOE:-}" ] && peer=(--vllm-fused-moe "$VLLM_FUSED_MOE")
timeout ${BENCH_LIMIT:-200} python3 $here/benchmarks/ct_wna16_moe_mma_bench.py --out "$out" "${peer[@]}" 2>&1 | tee "$out/bench.log" | tail -12
small=$here/tests/test_moe_mma.py::test_gpu_small_for_sanitizer
# --report-api-errors no: torch's CUDA 13 runtime probes driver entry points that return
# CUDA_ERROR_INVALID_VALUE (host API calls, not kernel accesses), which memcheck would count.
for tool in memcheck racecheck; do
  timeout ${SANITIZER_LIMIT:-60} compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 "${pytest[@]}" $small > "$out/$tool.log" 2>&1
  echo "$tool exit $?: $(grep -E 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | tr '\n' ' ')"
done
