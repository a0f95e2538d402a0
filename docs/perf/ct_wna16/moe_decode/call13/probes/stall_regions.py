"""Warp-stall samples of one-launch profiles (ncu --page source --csv), per code region."""
import csv, sys
def summary(path):
    rows = list(csv.reader(open(path)))
    hdr, data = rows[1], rows[2:]
    b = int(data[0][0], 16)
    reasons = [h for h in hdr if h.startswith('stall_') and 'Not' not in h]
    loops = []
    for r in data:
        if 'BRA' in r[1]:
            tgt = int(r[1].split('BRA')[1].strip().split()[0].rstrip(';'), 16) - b
            a = int(r[0], 16) - b
            if tgt < a:
                loops.append((tgt, a))
    names = ['gate/up loop', 'down loop', 'last arriver']
    def region(a):
        for i, (x, y) in enumerate(loops[:3]):
            if x <= a <= y:
                return names[i]
        return 'outside loops'
    agg = {}
    for r in data:
        d = agg.setdefault(region(int(r[0], 16) - b), {})
        for h in reasons:
            v = r[hdr.index(h)]
            if v.isdigit() and int(v):
                d[h[6:]] = d.get(h[6:], 0) + int(v)
    out = [f'{path.split("/")[-1]}: {sum(sum(d.values()) for d in agg.values())} samples']
    for reg in ['outside loops', *names]:
        d = agg.get(reg, {})
        top = ', '.join(f'{k} {v}' for k, v in sorted(d.items(), key=lambda x: -x[1])[:5])
        out.append(f'  {reg:14s} {sum(d.values()):5d}  ({top})')
    return '\n'.join(out)
for p in sys.argv[1:]:
    print(summary(p)); print()
