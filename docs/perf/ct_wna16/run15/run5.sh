#!/bin/bash
# Run 15 call 5: the atomic split reduction's wrong sums (calls 3-4): the debug probe on the
# code whose last arriver reads the sums by atomic adds of zero, then the model-size graph test.
export PYTHONPATH=core/src:plugins/ct_wna16/src PYTHONUNBUFFERED=1
D=$OUT/call5
mkdir -p $D
timeout 200 python3 docs/perf/ct_wna16/run15/probe_atomic_debug.py > $D/probe_atomic_debug.log 2>&1
cat $D/probe_atomic_debug.log | tail -25
timeout 200 python3 -m pytest -p volta_core.kernels.testing -m gpu -q -p no:cacheprovider --rootdir=plugins/ct_wna16 \
  plugins/ct_wna16/tests/test_kernels.py -k "cuda_graph or sanitizer" > $D/gpu_tests.log 2>&1
tail -3 $D/gpu_tests.log; grep -E "^E .*Error" $D/gpu_tests.log | head -5
