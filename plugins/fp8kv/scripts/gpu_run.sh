#!/usr/bin/env bash
# One GPU session for vllm-volta-fp8kv: GPU tests, memcheck over them, benchmarks; table last.
# Run from the repository root on a CUDA machine: bash plugins/fp8kv/scripts/gpu_run.sh OUTDIR
# (a run worth keeping goes to docs/perf/fp8kv/<topic>/, never under plugins/).
set -uo pipefail
out=${1:?usage: gpu_run.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=core/src:core/devkit/src:plugins/fp8kv/src${PYTHONPATH:+:$PYTHONPATH}
tests=(plugins/fp8kv/tests/test_gpu.py -p volta_devkit.testing -m gpu -q -W ignore -p no:cacheprovider)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
python3 -m pytest "${tests[@]}" 2>&1 | tee "$out/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}
compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest "${tests[@]}" \
  > "$out/memcheck.log" 2>&1
memcheck_rc=$?
tail -n 4 "$out/memcheck.log"
python3 plugins/fp8kv/benchmarks/bench.py --out "$out" 2>&1 | tee "$out/bench.log"
bench_rc=${PIPESTATUS[0]}
echo "gpu tests rc=$tests_rc  memcheck rc=$memcheck_rc  bench rc=$bench_rc"
