#!/bin/bash
# Run 15 calls 3, 4, 6 and 7 (see README.md here): GPU tests, compute-sanitizer memcheck and
# racecheck on the small launches (side by side), the tree/atomic A/B probe where PROBE=1, then
# the benchmark. Carry plugins/ct_wna16/.fixtures (library-made checkpoints).
#   CALL=call6 PROBE=1 TESTS="test_kernels.py test_moe_gpu.py" bash .../gpu_call.sh
export PYTHONPATH=core/src:plugins/ct_wna16/src PYTHONUNBUFFERED=1
D=$OUT/${CALL:?set CALL}
mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.version.cuda)" >> $D/device.txt
T="python3 -m pytest -p volta_core.kernels.testing -m gpu -q -p no:cacheprovider --rootdir=plugins/ct_wna16"
files=$(for t in ${TESTS:-test_kernels.py}; do echo plugins/ct_wna16/tests/$t; done)
TRITON_CACHE_DIR=/tmp/tc1 timeout 260 $T $files > $D/gpu_tests.log 2>&1 &
for tool in memcheck racecheck; do
  TRITON_CACHE_DIR=/tmp/tc_$tool timeout 220 compute-sanitizer --tool $tool --error-exitcode 9 \
    $T plugins/ct_wna16/tests/test_kernels.py -k sanitizer > $D/$tool.log 2>&1 &
done
wait
for f in gpu_tests memcheck racecheck; do echo "$f: $(grep -E 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY' $D/$f.log | tail -2 | tr '\n' ' ')"; done
grep -E "FAILED|Error" $D/gpu_tests.log | head -10
if [ "${PROBE:-0}" = 1 ]; then
  TRITON_CACHE_DIR=/tmp/tc1 timeout 170 python3 docs/perf/ct_wna16/run15/probe_reduce.py > $D/probe_reduce.log 2>&1
  sed -n '/^== us/,$p' $D/probe_reduce.log
fi
TRITON_CACHE_DIR=/tmp/tc1 timeout 200 python3 -m volta_ct_wna16.bench --out $D > $D/bench.log 2>&1
tail -45 $D/bench.log
