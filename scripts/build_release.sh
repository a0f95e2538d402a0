#!/usr/bin/env bash
# Build every distribution's sdist and wheel into one folder and check them as a release would.
#
#   scripts/build_release.sh [OUT]     # default: dist/ (emptied first)
#
# 1. each distribution's CHANGELOG.md has the entry of its version (PYTHONPATH=scripts python -m
#    volta_release changelogs);
# 2. `python -m build` for the meta-distribution, the core, the devkit and every plugin (the sdist,
#    then the wheel from the sdist, so a file the sdist leaves out fails here), without build
#    isolation in one environment holding the build backend and the checkers
#    ($VOLTA_RELEASE_VENV, default this user's ~/.cache/vllm-volta/release, reused while it has them);
# 3. `twine check --strict`: the metadata and the long description's rendering on PyPI;
# 4. volta_release artifacts: each artifact is its distribution at the checkout's version with
#    the license file inside, each sdist holds its changelog, and every requirement on a
#    distribution built beside it (the plugins' vllm-volta-core ranges) admits the version built.
# The test-only plugins under tests/plugins are never published, so never built here.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
venv=${VOLTA_RELEASE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-volta/release}
py="$venv/bin/python"
SECONDS=0

# The build backend every pyproject.toml names (PEP 639 license-files from 1.27), the PEP 517
# front end, and twine with the Markdown renderer its long-description check needs, pinned so a
# release is built and checked by the same tools every time (raise them here, deliberately).
tools=("hatchling==1.33.0" "build==1.6.1" "twine==7.0.0" "readme-renderer[md]==46.0")
stamp="$venv/.volta-release-tools"
if [ "$(cat "$stamp" 2>/dev/null)" != "${tools[*]}" ]; then
  python3 -m venv "$venv"
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q "${tools[@]}"
  echo "${tools[*]}" > "$stamp"
fi
setup_s=$SECONDS

release() { PYTHONPATH=scripts "$py" -m volta_release "$@"; }

echo "== 1/4 changelogs"
release changelogs

echo "== 2/4 build into $out"
rm -rf "$out" && mkdir -p "$out"
log="$out/.build.log"
for folder in $(release folders); do
  if ! "$py" -m build --no-isolation --outdir "$out" "$folder" > "$log" 2>&1; then
    cat "$log" >&2
    echo "== build of $folder failed" >&2
    exit 1
  fi
done
rm -f "$log"
ls "$out"

echo "== 3/4 twine check --strict"
"$py" -m twine check --strict "$out"/*

echo "== 4/4 license files, changelogs, versions and the ranges between the distributions"
release artifacts "$out"
echo "== release artifacts in $out check out (environment ${setup_s}s, total ${SECONDS}s)"
