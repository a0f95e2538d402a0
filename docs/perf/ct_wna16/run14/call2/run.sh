#!/bin/bash
# Run 14 call 2: GPU tests (fused MoE, routing; one-program routing), the MoE benchmark on this commit and
# on ba3057c's package (bench-results/scratch/volta_ct_wna16_old) in the same call.
export PYTHONPATH=core/src:plugins/ct_wna16/src:plugins/ct_wna16/tests
D=$OUT/call2
mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/device.txt
timeout 300 python3 -m pytest -p volta_core.kernels.testing -m gpu \
  plugins/ct_wna16/tests/test_moe_gpu.py \
  plugins/ct_wna16/tests/test_routing.py -q -p no:cacheprovider --rootdir=plugins/ct_wna16 \
  > $D/gpu_tests.log 2>&1
tail -3 $D/gpu_tests.log
grep -E "FAILED|Error" $D/gpu_tests.log | head -20
timeout 120 python3 -m volta_ct_wna16.bench_moe --out $D > $D/bench_moe.log 2>&1
PYTHONPATH=core/src:bench-results/scratch timeout 120 python3 -m volta_ct_wna16_old.bench_moe \
  --out $D/old > $D/bench_moe_old.log 2>&1
echo "== old (ba3057c: routing in two launches)"; tail -26 $D/bench_moe_old.log
echo "== new"; tail -26 $D/bench_moe.log
