#!/usr/bin/env bash
# One GPU call: AWQ checkpoints through ct_wna16 against vLLM's own Triton AWQ kernels (table
# last). PEER is vllm/model_executor/layers/quantization/awq_triton.py from a vLLM wheel, e.g.
# copied to plugins/ct_wna16/.fixtures/peer/ and carried to the device machine.
#   OUT=DIR PEER=FILE bash plugins/ct_wna16/scripts/gpu_awq.sh
# Logs land under $OUT (default: `mktemp -d`); keep a run's in docs/perf/ct_wna16/<run>/.
set -uo pipefail
here=plugins/ct_wna16
out=${OUT:-$(mktemp -d -t ct_wna16_awq.XXXXXX)}
peer=${PEER:-$here/.fixtures/peer/awq_triton.py}
mkdir -p "$out"
echo "logs in $out"
export PYTHONPATH=core/src:core/devkit/src:$here/src:$here/tests PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$PWD/$here/.tcache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout ${BENCH_LIMIT:-400} python3 $here/benchmarks/ct_wna16_awq_bench.py --out "$out" \
  --peer "$peer" 2>&1 | tee "$out/awq_bench.log" | tail -40
