#!/usr/bin/env python3
"""blind-spot.toml over more regions: a Markdown row per busy rule, region count, quiet
traffic shape and algorithm (overshoot max and p99, false rejections, gossip bytes per
second per region). The figures of docs/regions.md and docs/accuracy.md.

    cargo build --release -p sluice-sim
    python3 simulations/blind-spot-regions.py [BUSY_ON,..] [REGIONS,..] [SHAPES,..] [ALGORITHMS,..]

Shapes of the quiet regions' client: steady (99/min, just under 10%, all window long),
early (99 in the window's first 5 s), share (just under 10% / regions, all window long).
"""
import itertools
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SIM = os.environ.get('SLUICE_SIM', os.path.join(HERE, '..', 'target', 'release', 'sluice-sim'))
SC = os.path.join(HERE, 'blind-spot.toml')



def regions(n):
    base = ["us-east", "eu-west", "ap-south"]
    return base + [f"r{i}" for i in range(3, n)]


def traffic(n, shape, th=0.1, limit=1000):
    rs = regions(n)
    t = [f'{{name = "busy", regions = ["us-east"], rate_per_s = 18, keys = {{ kind = "one", name = "k_client" }}}}']
    for r in rs[1:]:
        if shape == 'steady':      # 99/min: just under the threshold, all window long
            extra = 'rate_per_s = 1.65, arrivals = "constant"'
        elif shape == 'early':     # 99 in the window's first 5 s, then nothing
            extra = 'rate_per_s = 0.0001, arrivals = "constant", spike = { factor = 198000, first_s = 5, period_s = 60 }'
        elif shape == 'share':     # just under threshold / regions, all window long
            per_min = int(th * limit / n)  # at, not above, the share
            per_min = per_min if th * limit / n > per_min else per_min - 1
            extra = f'rate_per_s = {per_min / 60:.6f}, arrivals = "constant"'
        t.append(f'{{name = "quiet {r}", regions = ["{r}"], {extra}, keys = {{ kind = "one", name = "k_client" }}}}')
    return '[' + ', '.join(t) + ']'


def run(mode, n, shape, algo):
    rs = '[' + ', '.join(f'"{r}"' for r in regions(n)) + ']'
    args = [SIM, 'run', SC, '--format', 'json', '--set', f'busy_on={mode}', '--set', f'regions={rs}',
            '--set', f'traffic={traffic(n, shape)}', '--set', f'rules.0.algorithm={algo}']
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        return None, out.stderr.strip()[:300]
    d = json.loads(out.stdout)
    r = d['rules'][0]
    return dict(max=r['overshoot_max'], p99=r['overshoot_p99'], fr=r['false_rejections'],
                bps=d['gossip']['bytes_per_s'] / n), None


modes = sys.argv[1].split(',') if len(sys.argv) > 1 else ['region_count', 'seen_count', 'heard', 'region_share', 'seen_share']
ns = [int(x) for x in sys.argv[2].split(',')] if len(sys.argv) > 2 else [3, 10, 30]
shapes = sys.argv[3].split(',') if len(sys.argv) > 3 else ['steady', 'early', 'share']
algos = sys.argv[4].split(',') if len(sys.argv) > 4 else ['fixed_window', 'sliding_window']
print('| algorithm | quiet traffic | regions | busy_on | overshoot max | p99 | false rej | gossip B/s per region |')
print('|---|---|---:|---|---:|---:|---:|---:|')
for algo, shape, n, mode in itertools.product(algos, shapes, ns, modes):
    m, err = run(mode, n, shape, algo)
    if err:
        print(f'| {algo} | {shape} | {n} | {mode} | error: {err} |'); continue
    print(f"| {algo} | {shape} | {n} | `{mode}` | {m['max']:.3f} | {m['p99']:.3f} | {m['fr']} | {m['bps']:.0f} |", flush=True)
