#!/usr/bin/env bash
# One device call: GPU tests, compute-sanitizer (memcheck, racecheck) on small launches, then
# the benchmarks; the table is printed last. Run from the repository root on the GPU machine:
#   OUT=/some/dir bash plugins/attn_v100/gpu_run.sh
set -uo pipefail
export PYTHONPATH=core/src:plugins/attn_v100/src:plugins/attn_v100/tests
export PYTHONUNBUFFERED=1
py=python3
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
$py -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/device.txt"

echo "== GPU tests"
$py -m pytest -q -m gpu -p no:cacheprovider -W ignore::DeprecationWarning \
  plugins/attn_v100/tests/test_kernels.py plugins/attn_v100/tests/test_cache_write.py plugins/attn_v100/tests/test_errors.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -15

echo "== benchmarks"
$py -m volta_attn_v100.bench --out "$OUT" > "$OUT/bench.log" 2>&1 || tail -30 "$OUT/bench.log"

echo "== compute-sanitizer"
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 9 \
    $py -m pytest -q -m gpu -p no:cacheprovider -W ignore::DeprecationWarning \
    plugins/attn_v100/tests/test_kernels.py -k sanitizer > "$OUT/sanitizer_$tool.log" 2>&1
  echo "$tool exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' "$OUT/sanitizer_$tool.log" | tr '\n' ' ')"
done

echo "== table"
tail -110 "$OUT/bench.log"
