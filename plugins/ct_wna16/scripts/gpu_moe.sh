#!/usr/bin/env bash
# One GPU call for the fused-MoE decode kernels (issue 35): their GPU tests and the older MoE
# ones, the benchmark beside vLLM's Triton fused-MoE kernel and fp16 cuBLAS (with the decode
# launches' sweep), then compute-sanitizer memcheck and racecheck on the small launches.
#   OUT=DIR VLLM_FUSED_MOE=.peer_carry/vllm_0_33_fused_moe.py bash plugins/ct_wna16/scripts/gpu_moe.sh
# Run from the repository root; logs land in $OUT (default: `mktemp -d`); keep a run's
# in docs/perf/ct_wna16/moe_decode/. VLLM_FUSED_MOE: vLLM 0.33's fused_moe.py (the benchmark
# takes its Triton kernel from it; without it the vLLM columns stay empty).
set -uo pipefail
here=plugins/ct_wna16
out=${OUT:-$(mktemp -d -t ct_wna16_moe_out.XXXXXX)}
mkdir -p "$out"
echo "logs in $out"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}core/src:core/devkit/src:$here/src:$here/tests
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/$here/.tcache
pytest=(python3 -m pytest -p volta_devkit.testing -p no:cacheprovider --rootdir=$here -q)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, triton, sys; print("torch", torch.__version__, "triton", triton.__version__, "python", sys.version.split()[0])'
} 2>&1 | tee "$out/device.txt"
tests="$here/tests/test_moe_decode.py $here/tests/test_moe_gpu.py $here/tests/test_routing.py"
timeout ${TEST_LIMIT:-150} "${pytest[@]}" -m gpu -rs $tests 2>&1 | tee "$out/gpu_tests.log" | tail -8
peer=()
[ -n "${VLLM_FUSED_MOE:-}" ] && peer=(--vllm-fused-moe "$VLLM_FUSED_MOE")
timeout ${BENCH_LIMIT:-300} python3 $here/benchmarks/ct_wna16_moe_bench.py --out "$out" "${peer[@]}" ${BENCH_ARGS:---sweep} 2>&1 | tee "$out/bench.log" | tail -30
small=$here/tests/test_moe_decode.py::test_gpu_small_for_sanitizer
for tool in memcheck racecheck; do
  timeout ${SANITIZER_LIMIT:-60} compute-sanitizer --tool $tool --error-exitcode 9 "${pytest[@]}" $small > "$out/$tool.log" 2>&1
  echo "$tool exit $?: $(grep -E 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | tr '\n' ' ')"
done
