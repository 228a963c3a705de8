#!/usr/bin/env python3
"""clock-skew.toml over clock skews: a Markdown row per skew and rule (overshoot max, p99
and min over the measured windows, false rejections, units over-admitted). The figures of
docs/regions.md ("Clock skew") and docs/accuracy.md.

    cargo build --release -p sluice-sim
    python3 simulations/clock-skew.py [SKEWS_MS,..] [SEEDS,..]

The regions' clocks are spread evenly over the skew (the first region -skew/2, the last
+skew/2); the ground truth counts on the reference clock. With several seeds a cell is the
worst (max, p99, false rejections) or the lowest (min) over them.
"""
import csv
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SIM = os.environ.get('SLUICE_SIM', os.path.join(HERE, '..', 'target', 'release', 'sluice-sim'))
SC = os.path.join(HERE, 'clock-skew.toml')


def run(skew, seed):
    """The report's rules and each rule's lowest admitted/allowed over measured windows."""
    with tempfile.TemporaryDirectory() as out:
        args = [SIM, 'run', SC, '--format', 'json', '--seed', str(seed),
                '--set', f'clock_skew_ms={skew}', '--out', out]
        p = subprocess.run(args, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f'sluice-sim failed: {p.stderr.strip()[:300]}')
        with open(os.path.join(out, 'report.json')) as f:
            d = json.load(f)
        lows = {}
        with open(os.path.join(out, 'windows.csv')) as f:
            for w in csv.DictReader(f):
                # Measured windows whose demand reached the allowance (the contested ones).
                if float(w['window_start_s']) < 60 or int(w['demand']) < int(w['allowed']):
                    continue
                ratio = int(w['admitted']) / int(w['allowed'])
                lows[w['rule']] = min(lows.get(w['rule'], 9.0), ratio)
    return d['rules'], lows


skews = [float(x) for x in sys.argv[1].split(',')] if len(sys.argv) > 1 else [0, 50, 250, 1000, 5000]
seeds = [int(x) for x in sys.argv[2].split(',')] if len(sys.argv) > 2 else [53]
print('| skew | rule | overshoot max | p99 | min | false rejections (% of refusals) | over-admitted units |')
print('|---:|---|---:|---:|---:|---:|---:|')
for skew in skews:
    rows = {}
    for seed in seeds:
        rules, lows = run(skew, seed)
        for r in rules:
            m = rows.setdefault(r['id'], dict(max=0, p99=0, min=9.0, fr=0, frp=0, over=0))
            m['max'] = max(m['max'], r['overshoot_max'])
            m['p99'] = max(m['p99'], r['overshoot_p99'])
            m['min'] = min(m['min'], lows.get(r['id'], 9.0))
            m['fr'] = max(m['fr'], r['false_rejections'])
            m['frp'] = max(m['frp'], r['false_rejection_pct'])
            m['over'] = max(m['over'], r['over_admitted'])
    for rid, m in rows.items():
        print(f"| {skew:g} ms | {rid} | {m['max']:.3f} | {m['p99']:.3f} | {m['min']:.3f} | "
              f"{m['fr']:,} ({m['frp']:.1f}%) | {m['over']:,} |", flush=True)
