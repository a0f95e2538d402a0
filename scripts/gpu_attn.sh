#!/usr/bin/env bash
# The attention plugin alone on the GPU machine, from the repository root:
#   OUT=/some/dir [PART=tests|bench|all] [BENCH_PARTS=decode,prefill,d512] bash scripts/gpu_attn.sh
# tests: its GPU tests on WORKERS processes (default 5), with compute-sanitizer memcheck and
# racecheck on the small launches beside them (compile-bound, so side by side); bench: the
# benchmark alone on the GPU, its table printed last. all (the default): both, in that order.
# Logs land under $OUT/attn_v100/.
set -uo pipefail
# Triton's caches, one per concurrent job, in this user's own cache folder (never a fixed /tmp
# path another user could fill first).
triton_cache=${XDG_CACHE_HOME:-$HOME/.cache}/vllm-volta/triton
out=${OUT:?set OUT}/attn_v100
part=${PART:-all}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH=core/src:core/devkit/src:plugins/fp8kv/src:plugins/attn_v100/src:plugins/attn_v100/tests
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/device.txt"
python3 -c 'import sys, torch, triton; print(torch.__version__, triton.__version__, torch.version.cuda, sys.version.split()[0])' >> "$out/device.txt"
T="python3 -m pytest -q -m gpu -p volta_devkit.testing -p no:cacheprovider -W ignore::DeprecationWarning"
tests=plugins/attn_v100/tests
if [ "$part" = tests ] || [ "$part" = all ]; then
  TRITON_CACHE_DIR=$triton_cache/tc1 timeout 540 $T -n "${WORKERS:-5}" \
    $tests/test_kernels.py $tests/test_errors.py $tests/test_backend_steps.py \
    > "$out/gpu_tests.log" 2>&1 &
  TRITON_CACHE_DIR=$triton_cache/tc_m timeout 540 compute-sanitizer --tool memcheck --error-exitcode 9 \
    $T $tests/test_kernels.py -k "sanitizer or past_32" > "$out/memcheck.log" 2>&1 &
  TRITON_CACHE_DIR=$triton_cache/tc_r timeout 540 compute-sanitizer --tool racecheck --error-exitcode 9 \
    $T $tests/test_kernels.py -k sanitizer > "$out/racecheck.log" 2>&1 &
  wait
  for f in gpu_tests memcheck racecheck; do
    echo "$f: $(grep -E 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY' "$out/$f.log" | tail -2 | tr '\n' ' ')"
  done
  grep -E "FAILED|Error" "$out/gpu_tests.log" | head -10
fi
if [ "$part" = bench ] || [ "$part" = all ]; then
  TRITON_CACHE_DIR=$triton_cache/tc1 timeout 580 python3 plugins/attn_v100/benchmarks/bench.py --out "$out" \
    --parts "${BENCH_PARTS:-decode,prefill,d512}" > "$out/bench.log" 2>&1
  grep -v "^case" "$out/bench.log" | tail -70
fi
