#!/bin/bash
# Run 15 call 2: the ct_wna16 GPU kernel tests on the uint8 zero points of the 1-token GEMV,
# then the benchmark (table last). Carry plugins/ct_wna16/.fixtures (library-made checkpoints).
export PYTHONPATH=core/src:plugins/ct_wna16/src PYTHONUNBUFFERED=1
D=$OUT/call2
mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.version.cuda)" >> $D/device.txt
timeout 200 python3 -m pytest -p volta_core.kernels.testing -m gpu plugins/ct_wna16/tests/test_kernels.py \
  -q -p no:cacheprovider --rootdir=plugins/ct_wna16 > $D/gpu_tests.log 2>&1
tail -3 $D/gpu_tests.log
grep -E "FAILED|Error" $D/gpu_tests.log | head -20
timeout 300 python3 -m volta_ct_wna16.bench --out $D > $D/bench.log 2>&1
tail -40 $D/bench.log
