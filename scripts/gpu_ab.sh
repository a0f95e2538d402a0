#!/usr/bin/env bash
# A kernel change's speed against the code it replaces, in one device call: `vllm-volta bench`
# on the same points with this checkout's sources and with a baseline's (in .baseline/, which
# git ignores, carried to the GPU machine: `mkdir .baseline && git archive REV core/src
# core/devkit/src plugins/*/src | tar -x -C .baseline`), in alternating rounds (base, new,
# base, new...), so a drift of the GPU's clocks falls on both alike. Each call's median is the bench's own (CUDA events or graph replays);
# the table printed last gives per call the median of the rounds' medians on each side and
# new/base. From the repository root:
#   OUT=/some/dir [ROUNDS=2] [QUICK=1] [LIMIT=280] bash scripts/gpu_ab.sh [model ...]
# Models as `vllm-volta bench` takes them (default: its set). Every plugin that has a `src/`
# in both trees is loaded from there (`--plugin`), not from an installed distribution.
set -uo pipefail
out=${OUT:?set OUT}/ab
base=.baseline
[ -d "$base/core/src" ] || { echo "no baseline checkout in $base (git worktree add $base REV)"; exit 2; }
mkdir -p "$out"
export PYTHONUNBUFFERED=1
triton_cache=${XDG_CACHE_HOME:-$HOME/.cache}/vllm-volta/triton
quick=(); [ "${QUICK:-1}" = 1 ] && quick=(--quick)

tree_path() {
  local tree=$1 path=$tree/core/src:$tree/core/devkit/src p
  for p in "$tree"/plugins/*/src; do path=$path:$p; done
  echo "$path"
}
plugins=()
for src in plugins/*/src/volta_*/plugin.py; do
  module=${src#plugins/*/src/}
  [ -f "$base/$src" ] && plugins+=(--plugin "$(echo "${module%.py}" | tr / .)")
done

failed=0
for round in $(seq 1 "${ROUNDS:-2}"); do
  for side in base new; do
    tree=$PWD; [ "$side" = base ] && tree=$PWD/$base
    # Each side compiles into its own Triton cache: a kernel whose source changed is another key.
    PYTHONPATH=$(tree_path "$tree") TRITON_CACHE_DIR=$triton_cache/ab_$side \
      timeout "${LIMIT:-280}" python3 -m volta_core.cli bench "${quick[@]}" "${plugins[@]}" \
      --out "$out/${side}_$round.json" "$@" > "$out/${side}_$round.log" 2>&1 || failed=1
    echo "round $round $side: rc $? ($(tail -1 "$out/${side}_$round.log"))"
  done
done

python3 - "$out" <<'EOF'
import json, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])
sides: dict[str, dict[tuple, list[float]]] = {"base": {}, "new": {}}
for report in sorted(out.glob("*_*.json")):
    side = report.name.split("_")[0]
    for row in json.loads(report.read_text())["kernels"]:
        if row.get("timing"):
            key = (row["model"], row["module"], json.dumps(row["work"], sort_keys=True), row["kernel"])
            sides[side].setdefault(key, []).append(row["timing"]["median_ms"])
print(f"{'model':28} {'module':34} {'work':34} {'kernel':30} {'base ms':>9} {'new ms':>9} {'new/base':>8}")
for key in sorted(set(sides["base"]) | set(sides["new"])):
    b, n = (statistics.median(sides[s][key]) if key in sides[s] else None for s in ("base", "new"))
    ratio = f"{n / b:8.3f}" if b and n else "       -"
    fmt = lambda v: f"{v:9.4f}" if v is not None else "        -"
    print(f"{key[0][:28]:28} {key[1][:34]:34} {key[2][:34]:34} {str(key[3])[:30]:30} {fmt(b)} {fmt(n)} {ratio}")
EOF
exit $failed
