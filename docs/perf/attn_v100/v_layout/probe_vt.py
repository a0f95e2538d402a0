"""Probe (not shipped): fp8 decode/prefill with V transposed inside each 16-key page, H100."""

import importlib
import sys

import torch

from volta_attn_v100 import bench, ops

xb = importlib.import_module("volta_attn_v100x.bench")
xops = importlib.import_module("volta_attn_v100x.ops")


def to_vt(kv, head):
    out = kv.clone()
    v = kv[..., head:]
    out[..., head:] = v.transpose(-1, -2).contiguous().reshape(v.shape[0], v.shape[1], 16, head)
    return out


def check():
    torch.manual_seed(0)
    head, heads, kvh = 128, 32, 8
    lens = [1, 17, 300, 2049, 5000]
    for q_lens in ([1] * 5, [1, 5, 64, 100, 3]):
        pages = [(n + 15) // 16 for n in lens]
        nblk = sum(pages) + 7
        kv = (
            torch.randn(nblk, kvh, 16, 2 * head, device="cuda", dtype=torch.float16).view(
                torch.int16
            )
            >> 8
        ).to(torch.uint8)
        table = torch.zeros(len(lens), max(pages), dtype=torch.int32, device="cuda")
        perm = torch.randperm(nblk, device="cuda").to(torch.int32)
        i = 0
        for b, p in enumerate(pages):
            table[b, :p] = perm[i : i + p]
            i += p
        seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        ql = torch.tensor([0, *q_lens], device="cuda").cumsum(0).to(torch.int32)
        q = torch.randn(int(ql[-1]), heads, head, device="cuda", dtype=torch.float16)
        kw = dict(
            max_query_len=max(q_lens),
            max_seq_len=max(lens),
            sm_scale=head**-0.5,
            kv_cache_dtype="fp8_e5m2",
            k_scale=0.7,
            v_scale=1.3,
        )
        a = torch.full_like(q, float("nan"))
        b = torch.full_like(q, float("nan"))
        ops.paged_attention(q, kv, table, seq_lens, ql, a, **kw)
        xops.paged_attention(q, to_vt(kv, head), table, seq_lens, ql, b, **kw)
        print(
            f"check q_lens={q_lens}: max |shipped - vt| = "
            f"{(a.float() - b.float()).abs().max().item():.3e}, nan {b.isnan().sum().item()}",
            flush=True,
        )


def main():
    check()
    copy_bw = bench.copy_bandwidth()
    print(f"copy {copy_bw / 1e9:.0f} GB/s", flush=True)
    rows = []
    shapes = [
        (32, 8, s)
        for s in [
            (1, 8192),
            (8, 8192),
            (16, 8192),
            (32, 16384),
            (64, 4096),
            (64, 8192),
            (128, 2048),
            (128, 8192),
        ]
    ]
    shapes += [(64, 8, s) for s in [(16, 8192), (64, 8192), (128, 2048)]]
    for heads, kvh, (batch, ctx) in shapes:
        f16 = bench.decode_case(batch, ctx, heads, kvh, "float16", copy_bw)["ms"]
        f8 = bench.decode_case(batch, ctx, heads, kvh, "fp8_e5m2", copy_bw)["ms"]
        vt = xb.decode_case(batch, ctx, heads, kvh, "fp8_e5m2", copy_bw)["ms"]
        f8b = bench.decode_case(batch, ctx, heads, kvh, "fp8_e5m2", copy_bw)["ms"]
        vtb = xb.decode_case(batch, ctx, heads, kvh, "fp8_e5m2", copy_bw)["ms"]
        row = (
            f"{heads}/{kvh} {batch:3d}x{ctx:5d} fp16 {f16 * 1e3:8.1f} us  "
            f"fp8 {f8 * 1e3:8.1f}/{f8b * 1e3:8.1f} ({f8 / f16:.3f}x/{f8b / f16:.3f}x)  "
            f"fp8-vt {vt * 1e3:8.1f}/{vtb * 1e3:8.1f} ({vt / f16:.3f}x/{vtb / f16:.3f}x)"
        )
        print(row, flush=True)
        rows.append(row)
    for kv_dtype in ("float16", "fp8_e5m2"):
        a = bench.prefill_case(2048, kv_dtype=kv_dtype)["TFLOPs"]
        b = (
            xb.prefill_case(2048, kv_dtype=kv_dtype)["TFLOPs"]
            if kv_dtype != "float16"
            else float("nan")
        )
        row = f"prefill 8x2048 {kv_dtype}: shipped {a:.1f} TFLOP/s  vt {b:.1f}"
        print(row, flush=True)
        rows.append(row)
    print("\n".join(["", "TABLE", *rows]))


if __name__ == "__main__":
    sys.exit(main())
