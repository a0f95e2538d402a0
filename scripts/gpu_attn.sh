#!/usr/bin/env bash
# The attention plugin alone in one device call: its GPU tests, compute-sanitizer memcheck and
# racecheck on the small launches (side by side), then the decode and prefill benchmarks alone on
# the GPU.   OUT=/some/dir bash scripts/gpu_attn.sh
set -uo pipefail
out=${OUT:?set OUT}; mkdir -p $out/attn_v100; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $out/device.txt
python3 -c 'import torch, triton, sys; print("torch", torch.__version__, "triton", triton.__version__, "python", sys.version.split()[0])' >> $out/device.txt
P=core/src:plugins/attn_v100/src:plugins/attn_v100/tests
T="python3 -m pytest -q -m gpu -p volta_core.kernels.testing -p no:cacheprovider -W ignore::DeprecationWarning"
PYTHONPATH=$P TRITON_CACHE_DIR=/tmp/tc1 timeout 230 $T plugins/attn_v100/tests/test_kernels.py plugins/attn_v100/tests/test_cache_write.py plugins/attn_v100/tests/test_errors.py > $out/attn_v100/gpu_tests.log 2>&1 &
PYTHONPATH=$P TRITON_CACHE_DIR=/tmp/tc2 timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $T plugins/attn_v100/tests/test_kernels.py -k sanitizer > $out/attn_v100/memcheck.log 2>&1 &
PYTHONPATH=$P TRITON_CACHE_DIR=/tmp/tc3 timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 $T plugins/attn_v100/tests/test_kernels.py -k sanitizer > $out/attn_v100/racecheck.log 2>&1 &
wait
for f in gpu_tests memcheck racecheck; do echo "$f: $(grep -E 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY' $out/attn_v100/$f.log | tail -2 | tr '\n' ' ')"; done
PYTHONPATH=$P TRITON_CACHE_DIR=/tmp/tc1 timeout 300 python3 -m volta_attn_v100.bench --out $out/attn_v100 --parts decode,prefill,d512 > $out/attn_v100/bench.log 2>&1
tar -C $out -czf $out/logs.tar.gz attn_v100 device.txt
grep -v "^case" $out/attn_v100/bench.log | tail -70
