#!/usr/bin/env bash
# One device call for every kernel-carrying part, sized for a short device budget:
#   OUT=/some/dir bash scripts/gpu_all.sh
# Phase 1 runs the correctness work side by side (GPU tests of attn_v100 and ct_wna16, and
# compute-sanitizer memcheck on attn_v100's small launches): it is compile-bound, and timings
# do not matter there. Phase 2 runs the benchmarks one after another, alone on the GPU: the
# core harness self-check, then each plugin's suite. Logs land under $OUT/<part>/; a run worth
# keeping goes to docs/perf/<plugin>/<topic>/ with an entry in its PERFORMANCE_HISTORY.md.
set -uo pipefail
# Triton's caches, one per concurrent job, in this user's own cache folder (never a fixed /tmp
# path another user could fill first).
triton_cache=${XDG_CACHE_HOME:-$HOME/.cache}/vllm-volta/triton
out=${OUT:?set OUT}
mkdir -p "$out/attn_v100" "$out/ct_wna16" "$out/core"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/device.txt"
python3 -c 'import torch, triton, sys; print("torch", torch.__version__, "triton", triton.__version__, "python", sys.version.split()[0])' | tee -a "$out/device.txt"

attn_path=core/src:core/devkit/src:plugins/fp8kv/src:plugins/attn_v100/src:plugins/attn_v100/tests
ct_path=core/src:core/devkit/src:plugins/ct_wna16/src:plugins/ct_wna16/tests
attn_tests=(plugins/attn_v100/tests/test_kernels.py plugins/attn_v100/tests/test_errors.py)

echo "== phase 1: GPU tests and memcheck, side by side"
PYTHONPATH=$attn_path TRITON_CACHE_DIR=$triton_cache/tc_attn timeout "${TEST_LIMIT:-540}" \
  python3 -m pytest -q -m gpu -p volta_devkit.testing -p no:cacheprovider -W ignore::DeprecationWarning \
  -n "${ATTN_WORKERS:-4}" "${attn_tests[@]}" > "$out/attn_v100/gpu_tests.log" 2>&1 &
PYTHONPATH=$ct_path TRITON_CACHE_DIR=$triton_cache/tc_ct timeout "${TEST_LIMIT:-240}" \
  python3 -m pytest -q -m gpu -p volta_devkit.testing -p no:cacheprovider --rootdir=plugins/ct_wna16 \
  plugins/ct_wna16/tests/test_kernels.py plugins/ct_wna16/tests/test_moe_gpu.py > "$out/ct_wna16/gpu_tests.log" 2>&1 &
PYTHONPATH=$attn_path TRITON_CACHE_DIR=$triton_cache/tc_san timeout "${SAN_LIMIT:-200}" \
  compute-sanitizer --tool memcheck --error-exitcode 9 \
  python3 -m pytest -q -m gpu -p volta_devkit.testing -p no:cacheprovider -W ignore::DeprecationWarning \
  plugins/attn_v100/tests/test_kernels.py -k sanitizer > "$out/attn_v100/sanitizer_memcheck.log" 2>&1 &
wait
for f in attn_v100/gpu_tests ct_wna16/gpu_tests attn_v100/sanitizer_memcheck; do
  echo "$f: $(grep -E 'passed|failed|error|ERROR SUMMARY' "$out/$f.log" | tail -2 | tr '\n' ' ')"
done

echo "== phase 2: benchmarks, one at a time"
if [ "${SELF_LIMIT:-90}" != 0 ]; then
  PYTHONPATH=core/src:core/devkit/src timeout "${SELF_LIMIT:-90}" python3 -m volta_devkit.bench_selfcheck --out "$out/core" \
    > "$out/core/selfcheck.log" 2>&1
fi
PYTHONPATH=$ct_path TRITON_CACHE_DIR=$triton_cache/tc_ct timeout "${CT_BENCH_LIMIT:-200}" \
  python3 plugins/ct_wna16/benchmarks/ct_wna16_bench.py --out "$out/ct_wna16" > "$out/ct_wna16/bench.log" 2>&1
PYTHONPATH=$attn_path TRITON_CACHE_DIR=$triton_cache/tc_attn timeout "${ATTN_BENCH_LIMIT:-240}" \
  python3 plugins/attn_v100/benchmarks/bench.py --out "$out/attn_v100" --parts "${ATTN_PARTS:-decode,prefill,sweep}" \
  > "$out/attn_v100/bench.log" 2>&1
tar -C "$out" -czf "$out/logs.tar.gz" attn_v100 ct_wna16 core device.txt

echo "== tables"
[ -f "$out/core/selfcheck.log" ] && tail -4 "$out/core/selfcheck.log"
tail -60 "$out/ct_wna16/bench.log"
tail -60 "$out/attn_v100/bench.log"
