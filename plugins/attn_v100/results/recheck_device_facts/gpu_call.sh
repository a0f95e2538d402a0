#!/bin/bash
# Recheck of attn_v100 on the H100 after the launcher asks its device facts once a process
# (README.md here). PART=tests: the GPU tests with
# compute-sanitizer memcheck and racecheck beside them; PART=bench: the benchmark alone.
R=$(pwd)
export PYTHONPATH=$R/core/src:$R/plugins/attn_v100/src:$R/plugins/attn_v100/tests PYTHONUNBUFFERED=1
D=$OUT/recheck_device_facts
mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/device.txt
python3 -c "import sys, torch, triton; print(torch.__version__, triton.__version__, torch.version.cuda, sys.version.split()[0])" >> $D/device.txt
cd plugins/attn_v100/tests
T="python3 -m pytest -q -m gpu -p volta_core.kernels.testing -p no:cacheprovider -W ignore::DeprecationWarning"
case "${PART:?set PART}" in
  tests)
    TRITON_CACHE_DIR=/tmp/tc1 timeout 540 $T test_kernels.py test_cache_write.py test_errors.py -n 5 > $D/gpu_tests.log 2>&1 &
    TRITON_CACHE_DIR=/tmp/tc_m timeout 540 compute-sanitizer --tool memcheck --error-exitcode 9 \
      $T test_kernels.py -k "sanitizer or past_32" > $D/memcheck.log 2>&1 &
    TRITON_CACHE_DIR=/tmp/tc_r timeout 540 compute-sanitizer --tool racecheck --error-exitcode 9 \
      $T test_kernels.py -k sanitizer > $D/racecheck.log 2>&1 &
    wait
    for f in gpu_tests memcheck racecheck; do
      echo "$f: $(grep -E 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY' $D/$f.log | tail -2 | tr '\n' ' ')"
    done
    grep -E "FAILED|Error" $D/gpu_tests.log | head -10
    ;;
  bench)
    timeout 580 python3 -m volta_attn_v100.bench --out $D --parts decode,prefill,d512,e4m3 > $D/bench.log 2>&1
    tail -70 $D/bench.log
    ;;
esac
