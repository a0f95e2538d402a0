#!/usr/bin/env bash
# One GPU call: AWQ and GPTQ checkpoints through ct_wna16 (AWQ, the same weights as a
# compressed-tensors checkpoint, GPTQ sym/asym/act-order) against vLLM's own Triton AWQ kernels
# and fp16 cuBLAS: every check first, then ROUNDS interleaved timed rounds per token count, the
# SM clock read around each (a line per round), the tables last. PEER is
# vllm/model_executor/layers/quantization/awq_triton.py from a vLLM wheel, e.g. the dev venv's
# (.venv/lib/python3.11/site-packages/vllm/...), carried to the device machine.
#   OUT=DIR PEER=FILE [ROUNDS=5] bash plugins/ct_wna16/scripts/gpu_awq.sh
# About 3 minutes on an H200 at 5 rounds (the timings scale with ROUNDS).
# Logs land under $OUT (default: `mktemp -d`); keep a run's in docs/perf/ct_wna16/<run>/.
set -uo pipefail
here=plugins/ct_wna16
out=${OUT:-$(mktemp -d -t ct_wna16_awq.XXXXXX)}
peer=${PEER:-$here/.fixtures/peer/awq_triton.py}
mkdir -p "$out"
echo "logs in $out"
export PYTHONPATH=core/src:core/devkit/src:$here/src:$here/tests PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$PWD/$here/.tcache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,power.limit --format=csv
timeout ${BENCH_LIMIT:-450} python3 $here/benchmarks/ct_wna16_awq_bench.py --out "$out" \
  --peer "$peer" --rounds "${ROUNDS:-5}" 2>&1 | tee "$out/awq_bench.log" | tail -62
rc=${PIPESTATUS[0]}
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv
exit "$rc"
