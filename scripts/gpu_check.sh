#!/usr/bin/env bash
# One device call that re-proves the kernel plugins after a change to how they choose or
# specialize their launches: every GPU test of attn_v100 (Triton kernels, the CUDA decode and
# prefill routed as on a V100, the backend's steps), of ct_wna16 (split-K, GEMM, tensor-core
# GEMM, MoE), of fp8w (dense and MoE) and of fp8kv (cache write and gather), side by side, with
# compute-sanitizer memcheck on attn_v100's and ct_wna16's small launches (memory errors only: the
# driver's own probes answer CUDA API errors that are not the kernels'). Then, with BENCH=1,
# ct_wna16's benchmark alone on the GPU. Logs under $OUT.
#   OUT=/some/dir [SELECT="not ptx70"] [BENCH=1] bash scripts/gpu_check.sh
# The ptx70 cases build compute_70 PTX, which needs a CUDA 12 NVRTC (CUDA 13 dropped sm_70);
# SELECT="not ptx70" leaves them out on a machine whose NVRTC is CUDA 13. scripts/ptx70_bundle.sh
# builds a CUDA 12.9 NVRTC bundle to carry (.ptx70) and sets it up there for them.
set -uo pipefail
# Triton's caches, one per concurrent job, in this user's own cache folder (never a fixed /tmp
# path another user could fill first).
triton_cache=${XDG_CACHE_HOME:-$HOME/.cache}/vllm-volta/triton
out=${OUT:?set OUT}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
python3 -c 'import sys, torch, triton; print(torch.__version__, triton.__version__, torch.version.cuda, sys.version.split()[0])' | tee -a "$out/device.txt"
attn=core/src:core/devkit/src:plugins/fp8kv/src:plugins/attn_v100/src:plugins/attn_v100/tests
ct=core/src:core/devkit/src:plugins/ct_wna16/src:plugins/ct_wna16/tests
f8=core/src:core/devkit/src:plugins/fp8w/src:plugins/fp8w/tests
kv=core/src:core/devkit/src:plugins/fp8kv/src:plugins/fp8kv/tests
T="python3 -m pytest -q -m gpu -p volta_devkit.testing -p no:cacheprovider -W ignore::DeprecationWarning"
a=plugins/attn_v100/tests
c=plugins/ct_wna16/tests
w=plugins/fp8w/tests
limit=${LIMIT:-480}
select=${SELECT:-}
K=(); [ -n "$select" ] && K=(-k "$select")
PYTHONPATH=$attn TRITON_CACHE_DIR=$triton_cache/tc_a timeout "$limit" $T -vv -rfE -n "${WORKERS:-8}" "${K[@]}" \
  $a/test_kernels.py $a/test_errors.py $a/test_backend_steps.py $a/test_cuda_decode.py \
  $a/test_cuda_prefill.py > "$out/attn_gpu.log" 2>&1 &
PYTHONPATH=$ct TRITON_CACHE_DIR=$triton_cache/tc_c timeout "$limit" $T -vv -rfE -n 4 "${K[@]}" --rootdir=plugins/ct_wna16 \
  $c/test_kernels.py $c/test_moe_gpu.py $c/test_mma.py $c/test_moe_decode.py > "$out/ct_gpu.log" 2>&1 &
PYTHONPATH=$f8 TRITON_CACHE_DIR=$triton_cache/tc_w timeout "$limit" $T -vv -rfE -n 3 "${K[@]}" --rootdir=plugins/fp8w \
  $w/test_kernels.py $w/test_moe.py $w/test_mma.py $w/test_moe_mma.py > "$out/fp8w_gpu.log" 2>&1 &
PYTHONPATH=$kv TRITON_CACHE_DIR=$triton_cache/tc_kv timeout "$limit" $T -vv -rfE "${K[@]}" --rootdir=plugins/fp8kv \
  plugins/fp8kv/tests/test_gpu.py > "$out/fp8kv_gpu.log" 2>&1 &
PYTHONPATH=$attn TRITON_CACHE_DIR=$triton_cache/tc_am timeout "$limit" compute-sanitizer --tool memcheck \
  --report-api-errors no --error-exitcode 9 $T $a/test_kernels.py $a/test_cuda_decode.py $a/test_cuda_prefill.py \
  -k sanitizer > "$out/attn_memcheck.log" 2>&1 &
PYTHONPATH=$ct TRITON_CACHE_DIR=$triton_cache/tc_cm timeout "$limit" compute-sanitizer --tool memcheck \
  --report-api-errors no --error-exitcode 9 $T --rootdir=plugins/ct_wna16 $c/test_kernels.py $c/test_mma.py \
  -k sanitizer > "$out/ct_memcheck.log" 2>&1 &
wait
for f in attn_gpu ct_gpu fp8w_gpu fp8kv_gpu attn_memcheck ct_memcheck; do
  echo "$f: $(grep -E 'passed|failed|ERROR SUMMARY' "$out/$f.log" | tail -2 | tr '\n' ' ')"
done
grep -hE "FAILED|^ERROR" "$out"/{attn,ct,fp8w,fp8kv}_gpu.log | head -20
if [ "${BENCH:-0}" = 1 ]; then
  PYTHONPATH=$ct TRITON_CACHE_DIR=$triton_cache/tc_c timeout "${BENCH_LIMIT:-200}" \
    python3 plugins/ct_wna16/benchmarks/ct_wna16_bench.py --out "$out" > "$out/ct_bench.log" 2>&1
  tail -40 "$out/ct_bench.log"
fi
