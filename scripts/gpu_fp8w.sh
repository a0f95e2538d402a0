#!/usr/bin/env bash
# The FP8 weight plugin (fp8w) alone on the GPU machine, from the repository root:
#   OUT=/some/dir [PART=tests|bench|all|moe] [QUICK=1] [MMA=1] [PTX70=1] \
#     [VLLM_FP8_UTILS=path/fp8_utils.py] [VLLM_FUSED_MOE=path/fused_moe.py] \
#     [SELECT="not ptx70"] [WORKERS=4] [LIMIT=270] [BENCH_LIMIT=300] bash scripts/gpu_fp8w.sh
# tests: fp8w's GPU tests (-m gpu; whichever of test_kernels.py, test_cuda_gemv.py, test_mma.py,
# test_moe.py, test_moe_mma.py exist) on WORKERS processes, with compute-sanitizer memcheck and racecheck
# beside them on the kernel tests' small launches (-k "sanitizer or every_code_is_exact";
# SAN_SELECT overrides), each under LIMIT seconds; the driver's own probes answer CUDA API errors
# that are not the kernels' (--report-api-errors no).
# bench: plugins/fp8w/benchmarks/fp8w_bench.py alone on the GPU under BENCH_LIMIT seconds
# (QUICK=1: --quick), after its --self-check, with vLLM's Triton block-FP8 GEMM from
# VLLM_FP8_UTILS (the venv's vllm/model_executor/layers/quantization/utils/fp8_utils.py,
# carried: the GPU machine has no vLLM; unset, the benchmark skips that column with a note);
# its table printed last; MMA=1 times the CUDA tensor-core GEMM's compute_70 build too (needs
# a CUDA 12 NVRTC; elsewhere its column says err). Exits 1 if a phase failed.
# all (the default): both, in that order; keep LIMIT + BENCH_LIMIT under a call's 600 s, or run
# the parts in two calls. Logs, the benchmark's JSON and markdown land under $OUT/fp8w/.
# moe: the fused experts alone, in one call: the GPU tests of test_moe_mma.py (the routed
# experts' tensor-core GEMM) and test_moe.py on WORKERS processes under LIMIT seconds, memcheck
# and racecheck beside them on test_moe_mma.py's small launches, then
# plugins/fp8w/benchmarks/fp8w_moe_bench.py (Qwen3-30B-A3B's and Qwen3.5-35B-A3B's MoE layers
# at 2048 tokens: the tensor-core GEMM's ms beside the Triton routed blocks', with dispatch's
# SM70 estimates; PTX70=1 adds the compute_70 build; with VLLM_FUSED_MOE and VLLM_FP8_UTILS,
# the venv's vllm/model_executor/layers/fused_moe/fused_moe.py and .../quantization/utils/
# fp8_utils.py, carried (the GPU machine has no vLLM; carry fused_moe/configs/ too for the
# tuned column, vllm/_version.py for the version), also vLLM's Triton fused-MoE kernel on
# block-FP8 experts with e4m3 activations, default and tuned configs, with its error; either
# unset, the benchmark skips those columns with a note) under BENCH_LIMIT seconds (default 240
# here); its table printed last. Logs, JSON and markdown land under $OUT/fp8w/ (moe_*).
# The ptx70 cases build compute_70 PTX, which needs a CUDA 12 NVRTC (CUDA 13 dropped sm_70);
# SELECT="not ptx70" leaves them out on a machine whose NVRTC is CUDA 13. scripts/ptx70_bundle.sh
# builds a CUDA 12.9 NVRTC bundle to carry (.ptx70) and sets it up there for them.
set -uo pipefail
# Triton's caches, one per concurrent job, in this user's own cache folder (never a fixed /tmp
# path another user could fill first).
triton_cache=${XDG_CACHE_HOME:-$HOME/.cache}/vllm-volta/triton
out=${OUT:?set OUT}/fp8w
part=${PART:-all}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH=core/src:core/devkit/src:plugins/fp8w/src:plugins/fp8w/tests
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
python3 -c 'import sys, torch, triton; print(torch.__version__, triton.__version__, torch.version.cuda, sys.version.split()[0])' | tee -a "$out/device.txt"
T="python3 -m pytest -q -m gpu -p volta_devkit.testing -p no:cacheprovider -W ignore::DeprecationWarning --rootdir=plugins/fp8w"
t=plugins/fp8w/tests
limit=${LIMIT:-270}
select=${SELECT:-}
K=(); [ -n "$select" ] && K=(-k "$select")
gpu_tests=(); for f in test_kernels.py test_cuda_gemv.py test_mma.py test_moe.py test_moe_mma.py; do [ -f "$t/$f" ] && gpu_tests+=("$t/$f"); done
kernel_tests=(); for f in test_kernels.py test_cuda_gemv.py test_mma.py test_moe_mma.py; do [ -f "$t/$f" ] && kernel_tests+=("$t/$f"); done
san=${SAN_SELECT:-sanitizer or every_code_is_exact}
status=0
if [ "$part" = tests ] || [ "$part" = all ]; then
  pids=()
  if [ ${#gpu_tests[@]} -eq 0 ]; then
    echo "no fp8w GPU test files yet (test_kernels.py, test_mma.py, test_moe.py)" | tee "$out/gpu_tests.log"
  else
    TRITON_CACHE_DIR=$triton_cache/tc_f timeout "$limit" $T -vv -rfE -n "${WORKERS:-4}" "${K[@]}" \
      "${gpu_tests[@]}" > "$out/gpu_tests.log" 2>&1 &
    pids+=($!)
  fi
  if [ ${#kernel_tests[@]} -gt 0 ]; then
    TRITON_CACHE_DIR=$triton_cache/tc_fm timeout "$limit" compute-sanitizer --tool memcheck \
      --report-api-errors no --error-exitcode 9 $T "${kernel_tests[@]}" -k "$san" \
      > "$out/memcheck.log" 2>&1 &
    pids+=($!)
    TRITON_CACHE_DIR=$triton_cache/tc_fr timeout "$limit" compute-sanitizer --tool racecheck \
      --report-api-errors no --error-exitcode 9 $T "${kernel_tests[@]}" -k "$san" \
      > "$out/racecheck.log" 2>&1 &
    pids+=($!)
  fi
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  for f in gpu_tests memcheck racecheck; do
    [ -f "$out/$f.log" ] || continue
    echo "$f: $(grep -E 'passed|failed|no tests ran|deselected|ERROR SUMMARY|RACECHECK SUMMARY' "$out/$f.log" | tail -2 | tr '\n' ' ')"
  done
  [ -f "$out/gpu_tests.log" ] && grep -hE "FAILED|^ERROR" "$out/gpu_tests.log" | head -20
fi
if [ "$part" = bench ] || [ "$part" = all ]; then
  vllm=(); [ -n "${VLLM_FP8_UTILS:-}" ] && vllm=(--vllm-fp8-utils "$VLLM_FP8_UTILS")
  # The benchmark's own checks on small layers with partial tiles first (seconds), then the run.
  TRITON_CACHE_DIR=$triton_cache/tc_f timeout 120 python3 plugins/fp8w/benchmarks/fp8w_bench.py \
    --self-check "${vllm[@]}" > "$out/selfcheck.log" 2>&1 || status=1
  echo "self-check: $(tail -1 "$out/selfcheck.log")"
  args=(--out "$out" "${vllm[@]}")
  [ "${QUICK:-0}" = 1 ] && args+=(--quick)
  [ "${MMA:-0}" = 1 ] && args+=(--mma)
  TRITON_CACHE_DIR=$triton_cache/tc_f timeout "${BENCH_LIMIT:-300}" \
    python3 plugins/fp8w/benchmarks/fp8w_bench.py "${args[@]}" > "$out/bench.log" 2>&1
  rc=$?
  echo "bench exit $rc"
  [ $rc -eq 0 ] || { status=1; tail -15 "$out/bench.log"; }
  # The per-row lines printed as rows complete are left out; the summary and table are last.
  sed -n '/^fp8w_bench on /,$p' "$out/bench.log" | tail -80
fi
if [ "$part" = moe ]; then
  pids=()
  TRITON_CACHE_DIR=$triton_cache/tc_f timeout "$limit" $T -vv -rfE -n "${WORKERS:-4}" "${K[@]}" \
    "$t/test_moe_mma.py" "$t/test_moe.py" > "$out/moe_tests.log" 2>&1 &
  pids+=($!)
  for tool in memcheck racecheck; do
    TRITON_CACHE_DIR=$triton_cache/tc_f$tool timeout "$limit" compute-sanitizer --tool $tool \
      --report-api-errors no --error-exitcode 9 $T "$t/test_moe_mma.py" -k sanitizer \
      > "$out/moe_$tool.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  for f in moe_tests moe_memcheck moe_racecheck; do
    echo "$f: $(grep -E 'passed|failed|no tests ran|deselected|ERROR SUMMARY|RACECHECK SUMMARY' "$out/$f.log" | tail -2 | tr '\n' ' ')"
  done
  grep -hE "FAILED|^ERROR" "$out/moe_tests.log" | head -20
  margs=(--out "$out")
  [ "${PTX70:-0}" = 1 ] && margs+=(--ptx70)
  [ -n "${VLLM_FUSED_MOE:-}" ] && margs+=(--vllm-fused-moe "$VLLM_FUSED_MOE")
  [ -n "${VLLM_FP8_UTILS:-}" ] && margs+=(--vllm-fp8-utils "$VLLM_FP8_UTILS")
  TRITON_CACHE_DIR=$triton_cache/tc_f timeout "${BENCH_LIMIT:-240}" \
    python3 plugins/fp8w/benchmarks/fp8w_moe_bench.py "${margs[@]}" > "$out/moe_bench.log" 2>&1
  rc=$?
  echo "moe bench exit $rc"
  [ $rc -eq 0 ] || { status=1; tail -15 "$out/moe_bench.log"; }
  sed -n '/^fp8w_moe_bench on /,$p' "$out/moe_bench.log"
fi
exit $status
