#!/usr/bin/env bash
# One device call for tuning: the GPU tests of the kernels being tuned (so a variant that is
# adopted has been checked on the GPU), then each plugin's sweep, one at a time, alone on the
# GPU. Logs land under $OUT/<part>/ and, packed, in $OUT/logs.tar.gz (the device returns few
# files); a sweep worth keeping goes to docs/perf/<plugin>/<topic>/.
#   OUT=/some/dir bash scripts/gpu_sweep.sh
# PLUGINS="attn_v100 ct_wna16" (default both) picks the plugins; ATTN_PARTS (default "sweep")
# the attention benchmark's parts, e.g. "sweep,decode" for the main decode table after the sweep.
set -uo pipefail
# Triton's caches, one per concurrent job, in this user's own cache folder (never a fixed /tmp
# path another user could fill first).
triton_cache=${XDG_CACHE_HOME:-$HOME/.cache}/vllm-volta/triton
out=${OUT:?set OUT}
mkdir -p "$out/attn_v100" "$out/ct_wna16"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/device.txt"
python3 -c 'import torch, triton, sys; print("torch", torch.__version__, "triton", triton.__version__, "python", sys.version.split()[0])' | tee -a "$out/device.txt"

attn_path=core/src:core/devkit/src:plugins/fp8kv/src:plugins/attn_v100/src:plugins/attn_v100/tests
ct_path=core/src:core/devkit/src:plugins/ct_wna16/src:plugins/ct_wna16/tests

plugins=${PLUGINS:-attn_v100 ct_wna16}
has() { [[ " $plugins " == *" $1 "* ]]; }

echo "== phase 1: GPU tests, side by side"
has attn_v100 && PYTHONPATH=$attn_path TRITON_CACHE_DIR=$triton_cache/tc_attn timeout "${TEST_LIMIT:-110}" \
  python3 -m pytest -q -m gpu -p volta_devkit.testing -p no:cacheprovider -W ignore::DeprecationWarning \
  plugins/attn_v100/tests/test_kernels.py -k "decode" > "$out/attn_v100/gpu_tests.log" 2>&1 &
has ct_wna16 && PYTHONPATH=$ct_path TRITON_CACHE_DIR=$triton_cache/tc_ct timeout "${TEST_LIMIT:-110}" \
  python3 -m pytest -q -m gpu -p volta_devkit.testing -p no:cacheprovider --rootdir=plugins/ct_wna16 \
  plugins/ct_wna16/tests/test_kernels.py > "$out/ct_wna16/gpu_tests.log" 2>&1 &
wait
for p in $plugins; do
  echo "$p gpu_tests: $(grep -E 'passed|failed|error' "$out/$p/gpu_tests.log" | tail -1)"
done

echo "== phase 2: sweeps, one at a time"
has attn_v100 && PYTHONPATH=$attn_path TRITON_CACHE_DIR=$triton_cache/tc_attn timeout "${ATTN_LIMIT:-190}" \
  python3 plugins/attn_v100/benchmarks/bench.py --out "$out/attn_v100" --parts "${ATTN_PARTS:-sweep}" > "$out/attn_v100/sweep.log" 2>&1
has ct_wna16 && PYTHONPATH=$ct_path TRITON_CACHE_DIR=$triton_cache/tc_ct timeout "${CT_LIMIT:-270}" \
  python3 plugins/ct_wna16/benchmarks/ct_wna16_bench.py --out "$out/ct_wna16" --sweep-only > "$out/ct_wna16/sweep.log" 2>&1
tar -C "$out" -czf "$out/logs.tar.gz" attn_v100 ct_wna16 device.txt

echo "== tables"
has ct_wna16 && tail -45 "$out/ct_wna16/sweep.log"
has attn_v100 && grep -v "^case" "$out/attn_v100/sweep.log" | tail -90
