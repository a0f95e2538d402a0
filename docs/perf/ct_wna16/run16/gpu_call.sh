#!/bin/bash
# Run 16 device calls (see README.md here): GPU tests, compute-sanitizer memcheck and racecheck
# on the small launches (side by side), then PROBE (a script of this folder, if set, with
# PROBE_ARGS) and the benchmark where BENCH=1. Carry plugins/ct_wna16/.fixtures (library-made
# checkpoints). TESTS=none skips the tests and the sanitizer runs.
#   CALL=call2 PROBE=probe_counts.py bash docs/perf/ct_wna16/run16/gpu_call.sh
export PYTHONPATH=core/src:plugins/ct_wna16/src PYTHONUNBUFFERED=1
D=$OUT/${CALL:?set CALL}
mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.version.cuda)" >> $D/device.txt
T="python3 -m pytest -p volta_core.kernels.testing -m gpu -q -p no:cacheprovider --rootdir=plugins/ct_wna16"
if [ "${TESTS:-}" != none ]; then
files=$(for t in ${TESTS:-test_kernels.py}; do echo plugins/ct_wna16/tests/$t; done)
TRITON_CACHE_DIR=/tmp/tc1 timeout 260 $T $files > $D/gpu_tests.log 2>&1 &
for tool in memcheck racecheck; do
  TRITON_CACHE_DIR=/tmp/tc_$tool timeout 220 compute-sanitizer --tool $tool --error-exitcode 9 \
    $T plugins/ct_wna16/tests/test_kernels.py -k sanitizer > $D/$tool.log 2>&1 &
done
wait
for f in gpu_tests memcheck racecheck; do echo "$f: $(grep -E 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY' $D/$f.log | tail -2 | tr '\n' ' ')"; done
grep -E "FAILED|Error" $D/gpu_tests.log | head -10
fi
if [ -n "${PROBE:-}" ]; then
  log=$D/${PROBE%.py}.log
  TRITON_CACHE_DIR=/tmp/tc1 timeout ${PROBE_S:-300} python3 docs/perf/ct_wna16/run16/$PROBE $PROBE_ARGS > $log 2>&1
  sed -n '/^== us/,$p' $log; tail -3 $log
fi
if [ "${BENCH:-0}" = 1 ]; then
  TRITON_CACHE_DIR=/tmp/tc1 timeout 200 python3 -m volta_ct_wna16.bench --out $D > $D/bench.log 2>&1
  tail -45 $D/bench.log
fi
