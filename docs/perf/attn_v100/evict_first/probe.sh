#!/bin/bash
# Probe (see README.md here): the decode benchmark as shipped, with the KV tile loads marked
# evict_first for L2, and as shipped again, in one call. The patch is made on the device's
# copy of the tree only.
R=$(pwd)
export PYTHONPATH=$R/core/src:$R/plugins/attn_v100/src PYTHONUNBUFFERED=1
D=$OUT/evict_first
mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/device.txt
python3 -c "import sys, torch, triton; print(torch.__version__, triton.__version__, torch.version.cuda, sys.version.split()[0])" >> $D/device.txt
F=plugins/attn_v100/src/volta_attn_v100/kernels/common.py
bench() { timeout 190 python3 -m volta_attn_v100.bench --out $D/$1 --parts decode > $D/$1.log 2>&1; echo "$1 rc=$?"; }
bench shipped_1
cp $F /tmp/common.py.orig
sed -i 's/raw = tl.load(ptrs, mask=mask, other=0)$/raw = tl.load(ptrs, mask=mask, other=0, eviction_policy="evict_first")/; s/return tl.load(ptrs, mask=mask, other=0.0)$/return tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_first")/' $F
diff /tmp/common.py.orig $F > $D/patch.diff
grep -c evict_first $F
bench evict_first
cp /tmp/common.py.orig $F
bench shipped_2
python3 - "$D" <<'PY'
import json, sys
d = sys.argv[1]
runs = {n: json.load(open(f"{d}/{n}/attn_v100_bench.json"))["decode"] for n in ("shipped_1", "evict_first", "shipped_2")}
key = lambda r: (r["heads"], r["batch"], r["context"], r["kv_dtype"])
t = {n: {key(r): r["ms"] * 1e3 for r in rows} for n, rows in runs.items()}
print("== us: heads batch context kv | shipped_1 evict_first shipped_2 | evict/best shipped | fp8/fp16 shipped_best evict")
for k in t["shipped_1"]:
    a, b, c = t["shipped_1"][k], t["evict_first"][k], t["shipped_2"][k]
    line = f"{k[0]} {k[1]:>3} x {k[2]:>5} {k[3]:>9} | {a:8.2f} {b:8.2f} {c:8.2f} | {b / min(a, c):.3f}"
    if k[3] != "float16":
        f = (k[0], k[1], k[2], "float16")
        fs = min(t["shipped_1"][f], t["shipped_2"][f])
        line += f" | {min(a, c) / fs:.3f} {b / t['evict_first'][f]:.3f}"
    print(line)
PY
