#!/bin/bash
# Run 15 call 7: the final code (every SM90 2-32-token dot tile adds its splits atomically):
# GPU tests (kernels, MoE, routing), memcheck and racecheck on the small launches, the benchmark.
# Carry plugins/ct_wna16/.fixtures (library-made checkpoints).
export PYTHONPATH=core/src:plugins/ct_wna16/src PYTHONUNBUFFERED=1
D=$OUT/call7
mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.version.cuda)" >> $D/device.txt
T="python3 -m pytest -p volta_core.kernels.testing -m gpu -q -p no:cacheprovider --rootdir=plugins/ct_wna16"
TRITON_CACHE_DIR=/tmp/tc1 timeout 260 $T plugins/ct_wna16/tests/test_kernels.py plugins/ct_wna16/tests/test_moe_gpu.py plugins/ct_wna16/tests/test_routing.py > $D/gpu_tests.log 2>&1 &
TRITON_CACHE_DIR=/tmp/tc2 timeout 220 compute-sanitizer --tool memcheck --error-exitcode 9 $T plugins/ct_wna16/tests/test_kernels.py -k sanitizer > $D/memcheck.log 2>&1 &
TRITON_CACHE_DIR=/tmp/tc3 timeout 220 compute-sanitizer --tool racecheck --error-exitcode 9 $T plugins/ct_wna16/tests/test_kernels.py -k sanitizer > $D/racecheck.log 2>&1 &
wait
for f in gpu_tests memcheck racecheck; do echo "$f: $(grep -E 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY' $D/$f.log | tail -2 | tr '\n' ' ')"; done
grep -E "FAILED|Error" $D/gpu_tests.log | head -10
TRITON_CACHE_DIR=/tmp/tc1 timeout 200 python3 -m volta_ct_wna16.bench --out $D > $D/bench.log 2>&1
tail -45 $D/bench.log
