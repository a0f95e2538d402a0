#!/usr/bin/env bash
# fp8w's dot tiles (the 16-token target of issue 47) on the GPU machine in one call, from the
# repository root:
#   OUT=/some/dir [PARTS="tests bench sweep"] [WORKERS=4] [TEST_LIMIT=100] [BENCH_LIMIT=100] \
#     [TOTAL_LIMIT=345 | SWEEP_LIMIT=s] [VLLM_FP8_UTILS=path/fp8_utils.py] bash scripts/gpu_fp8w_m16.sh
# tests: fp8w's kernel GPU tests (plugins/fp8w/tests/test_kernels.py -m gpu: every finite code
# exact through every table launch and every form of the sweep, codes read as int32 words and
# as bytes; every M from 1 to 300 against float64; the table's launches at every block).
# bench: plugins/fp8w/benchmarks/fp8w_bench.py on 27648x5120, 5120x27648 and 5120x5120 at
# M = 1, 16, 64 and 2048 (ours, fp16 cuBLAS on the dequantized weights, dequantize-then-cuBLAS,
# torch._scaled_mm, the read floor and the 1 GiB copy's bandwidth; vLLM's Triton block-FP8 GEMM
# too where VLLM_FP8_UTILS names its file, as in scripts/gpu_fp8w.sh).
# sweep: plugins/fp8w/benchmarks/fp8w_m16_sweep.py at 16 tokens on the same layers (words or
# bytes, dot width, operand order, tiles, warps, stages, split counts) for what is left of
# TOTAL_LIMIT seconds since the script started (at least 60; SWEEP_LIMIT overrides), starting
# no variant in its last 30 s; its last lines name the launch to adopt.
# Each part alone on the GPU, in that order, each under its limit (the whole under 6 minutes
# by default); logs, JSON and markdown land under $OUT/fp8w_m16/. Exits 1 if a part failed.
set -uo pipefail
# Triton's cache in this user's own cache folder (never a fixed /tmp path another user could
# fill first); one for the three parts, which run one after another.
export TRITON_CACHE_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/vllm-volta/triton/tc_fm16
out=${OUT:?set OUT}/fp8w_m16
parts=${PARTS:-tests bench sweep}
has() { [[ " $parts " == *" $1 "* ]]; }
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH=core/src:core/devkit/src:plugins/fp8w/src:plugins/fp8w/tests:plugins/fp8w/benchmarks
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/device.txt"
python3 -c 'import sys, torch, triton; print(torch.__version__, triton.__version__, torch.version.cuda, sys.version.split()[0])' | tee -a "$out/device.txt"
shapes="27648,5120;5120,27648;5120,5120"
status=0
if has tests; then
  timeout "${TEST_LIMIT:-100}" python3 -m pytest -q -m gpu -p volta_devkit.testing \
    -p no:cacheprovider -W ignore::DeprecationWarning --rootdir=plugins/fp8w -vv -rfE \
    -n "${WORKERS:-4}" plugins/fp8w/tests/test_kernels.py > "$out/gpu_tests.log" 2>&1 || status=1
  echo "gpu_tests: $(grep -E 'passed|failed|skipped|no tests ran' "$out/gpu_tests.log" | tail -1)"
  grep -hE "FAILED|^ERROR" "$out/gpu_tests.log" | head -20
fi
if has bench; then
  vllm=(); [ -n "${VLLM_FP8_UTILS:-}" ] && vllm=(--vllm-fp8-utils "$VLLM_FP8_UTILS")
  timeout "${BENCH_LIMIT:-100}" python3 plugins/fp8w/benchmarks/fp8w_bench.py --out "$out" \
    --shapes "$shapes" --ms 1,16,64,2048 "${vllm[@]}" > "$out/bench.log" 2>&1
  rc=$?
  echo "bench exit $rc"
  [ $rc -eq 0 ] || { status=1; tail -15 "$out/bench.log"; }
  # The per-row lines printed as rows complete are left out; the summary and table are last.
  sed -n '/^fp8w_bench on /,$p' "$out/bench.log" | tail -40
fi
if has sweep; then
  # What the call has left of TOTAL_LIMIT seconds (at least 60), unless SWEEP_LIMIT is set.
  left=$(( ${TOTAL_LIMIT:-345} - SECONDS )); [ $left -ge 60 ] || left=60
  limit=${SWEEP_LIMIT:-$left}
  timeout "$limit" python3 plugins/fp8w/benchmarks/fp8w_m16_sweep.py --out "$out" \
    --shapes "$shapes" --budget-s $((limit - 30)) > "$out/sweep.log" 2>&1
  rc=$?
  echo "sweep exit $rc"
  [ $rc -eq 0 ] || { status=1; tail -15 "$out/sweep.log"; }
  grep -E "^[0-9]+x[0-9]+ M=|^  errors|^best across|^to adopt|^cut short" "$out/sweep.log" | tail -20
fi
exit $status
