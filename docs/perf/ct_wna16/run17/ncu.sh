#!/usr/bin/env bash
# Nsight Compute on the shipped split-K launches of the small layers (and one large one for
# comparison). From the repository root on the GPU machine:  OUT=dir bash .../run17/ncu.sh
set -uo pipefail
export PYTHONPATH=core/src:plugins/ct_wna16/src
here=docs/perf/ct_wna16/run17
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)' >> $OUT/device.txt
ncu --version | tail -1 >> $OUT/device.txt
for c in "5120 5120 1" "5120 5120 4" "5120 5120 16" "7168 5120 16" "27648 5120 16" "27648 5120 1"; do
  set -- $c
  f=$OUT/ncu_${1}x${2}_m${3}.txt
  timeout 150 ncu -k regex:wna16 -s 2 -c 1 --section SpeedOfLight --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section SchedulerStats --page details python3 $here/ncu_case.py $1 $2 $3 > $f 2>&1
  echo "== $c: $(grep -E 'Duration|DRAM Throughput|Achieved Occupancy' $f | tr -s ' ' | tr '\n' ';')"
done
