#!/usr/bin/env bash
# Each distribution's own test run, as its README gives it: a fresh virtual environment with the
# distribution and its test extra (plus the repository's distributions it depends on, which are
# not on a package index), then pytest in its folder.
#
# pytest runs on ${VOLTA_TEST_WORKERS:-2} pytest-xdist workers, as the main suite does (CI has two
# cores): xdist is installed beside the test extra (a CI tool, not a test dependency), and
# `--dist loadgroup` keeps the tests sharing a module or session fixture on one worker where the
# distribution's tests load volta_devkit.testing (the others have no such marks). The Triton and
# compile-gate caches (~/.triton/cache, ~/.cache/vllm-volta/gate) are shared with the main suite
# (which CI runs after this), so a kernel compiled once for a target is not compiled again.
#
# With VOLTA_PASSED_LOG set (CI), scripts/volta_ci_once.py writes what passed there, and the
# whole suite run after it (scripts/dev.sh test) leaves those tests out: each runs once.
#
#   scripts/check_distributions.sh [FOLDER ...]     # default: the core, the devkit, every plugin
#
# Environments go under $VOLTA_DIST_ROOT/<name> (default: this user's
# ${XDG_CACHE_HOME:-~/.cache}/vllm-volta/dists, never a shared /tmp path), created afresh.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
base=${VOLTA_DIST_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-volta/dists}

if [ $# -eq 0 ]; then
  set -- core core/devkit plugins/*/
fi

# The repository's distributions FOLDER needs (its dependencies and test extra, transitively),
# dependencies first: they are installed from their folders, as a user of the sources does.
local_needs() {
  python3 - "$1" <<'PY'
import pathlib, re, sys, tomllib
folders = {}
for p in [pathlib.Path("core"), pathlib.Path("core/devkit"), *sorted(pathlib.Path("plugins").glob("*"))]:
    if (p / "pyproject.toml").is_file():
        folders[tomllib.loads((p / "pyproject.toml").read_text())["project"]["name"]] = str(p)
def needs(folder, seen):
    project = tomllib.loads((pathlib.Path(folder) / "pyproject.toml").read_text())["project"]
    reqs = [*project.get("dependencies", []), *project.get("optional-dependencies", {}).get("test", [])]
    for req in reqs:
        name = re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower()
        if name in folders and folders[name] not in seen:
            needs(folders[name], seen)
            seen.append(folders[name])
    return seen
print(" ".join(needs(sys.argv[1].rstrip("/"), [])))
PY
}

for folder in "$@"; do
  folder=${folder%/}
  name=$(basename "$folder")
  env="$base/$name"
  rm -rf "$env"
  python3 -m venv "$env"
  pip=("$env/bin/python" -m pip install -q -c "$root/scripts/constraints.txt")
  "${pip[@]}" --upgrade pip
  needs=$(local_needs "$folder")
  extra=$(grep -q '^test = ' "$folder/pyproject.toml" && echo "[test]" || true)
  start=$(date +%s)
  # shellcheck disable=SC2086
  "${pip[@]}" ${needs:+$(printf -- './%s ' $needs)} "./$folder$extra" pytest-xdist
  installed=$(date +%s)
  (cd "$folder" && PYTHONPATH="$root/scripts" "$env/bin/python" -m pytest -q -p no:cacheprovider \
    -p volta_ci_once -n "${VOLTA_TEST_WORKERS:-2}" --dist loadgroup)
  echo "check_distributions: $folder passed (install $((installed - start)) s, tests $(($(date +%s) - installed)) s)"
done
