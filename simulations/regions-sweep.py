#!/usr/bin/env python3
"""Global limits against the number of regions: blind-spot, ship-interval, region-failure and
partition at the default busy rule (seen_share) over 3, 10 and 30 regions. Writes a
Markdown table (overshoot max and p99 over every measured window of every seed, false
rejections, gossip bytes per second per region, convergence after the partition's heal)
and an SVG plot of overshoot against regions. The figures of docs/accuracy.md ("More
regions").

    cargo build --release -p sluice-sim
    python3 simulations/regions-sweep.py [REGIONS,..] [SEEDS,..] [--svg PATH] [--set KEY=VALUE]..

`--set` passes a scenario setting to every run (`--set shippers=region_sender`: one sender per
region, the daemon's default, instead of the simulator's every_daemon; `--set fanout=4`
with it: forwarding between region senders). `--only a,b` runs only those scenarios;
`--duration S` shortens the runs (the forwarding comparison in docs/accuracy.md uses 600).

The added regions are r3, r4, ...; each scenario's traffic keeps its total rate (a client
spread over all regions takes less in each), its events name the same regions, and the
partition cuts us-east off from all the others. Each run is 1,800 simulated seconds.
"""
import csv
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SIM = os.environ.get('SLUICE_SIM', os.path.join(HERE, '..', 'target', 'release', 'sluice-sim'))
DURATION_S = 1800
WARMUP_S = 60
THRESHOLD = 0.1


def regions(n):
    return ["us-east", "eu-west", "ap-south"] + [f"r{i}" for i in range(3, n)]


def toml_list(xs):
    return '[' + ', '.join(f'"{x}"' for x in xs) + ']'


def blind_spot_traffic(n):
    """blind-spot.toml's: busy in us-east at 1,080/min, every other region's client at
    99/min, just under the threshold, all window long."""
    t = ['{name = "busy", regions = ["us-east"], rate_per_s = 18, keys = { kind = "one", name = "k_client" }}']
    for r in regions(n)[1:]:
        t.append(f'{{name = "quiet {r}", regions = ["{r}"], rate_per_s = 1.65, arrivals = "constant", '
                 'keys = { kind = "one", name = "k_client" }}')
    return '[' + ', '.join(t) + ']'


def partition_events(n):
    rest = toml_list(regions(n)[1:])
    return (f'[{{kind = "partition", at_s = 125, groups = [["us-east"], {rest}]}}, '
            '{kind = "heal", at_s = 335}]')


SCENARIOS = {
    'blind-spot': lambda n: ['--set', f'traffic={blind_spot_traffic(n)}'],
    'ship-interval': lambda n: [],
    'region-failure': lambda n: [],
    'partition': lambda n: ['--set', f'events={partition_events(n)}'],
}


def run(name, n, seed):
    """The report and the admitted/allowed of every measured window whose demand reached
    the allowance, per rule."""
    with tempfile.TemporaryDirectory() as out:
        args = [SIM, 'run', os.path.join(HERE, f'{name}.toml'), '--format', 'json',
                '--seed', str(seed), '--out', out,
                '--set', f'regions={toml_list(regions(n))}',
                '--set', f'duration_s={DURATION_S}', '--set', f'measure.warmup_s={WARMUP_S}',
                '--set', 'busy_on=seen_share'] + EXTRA + SCENARIOS[name](n)
        p = subprocess.run(args, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f'{name} at {n} regions: {p.stderr.strip()[:400]}')
        with open(os.path.join(out, 'report.json')) as f:
            d = json.load(f)
        ratios = {}
        with open(os.path.join(out, 'windows.csv')) as f:
            for w in csv.DictReader(f):
                if float(w['window_start_s']) < WARMUP_S or int(w['demand']) < int(w['allowed']):
                    continue
                ratios.setdefault(w['rule'], []).append(int(w['admitted']) / int(w['allowed']))
    return d, ratios


def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)]


def measure(ns, seeds):
    rows = []
    for name in SCENARIOS:
        for n in ns:
            per_rule, bps, lag = {}, [], []
            for seed in seeds:
                d, ratios = run(name, n, seed)
                bps.append(d['gossip']['bytes_per_s'] / n)
                lag += [h['converged_after_s'] for h in d['heals'] if h['converged_after_s'] is not None]
                for r in d['rules']:
                    m = per_rule.setdefault(r['id'], dict(ratios=[], fr=0, refusals=0))
                    m['ratios'] += ratios.get(r['id'], [])
                    m['fr'] += r['false_rejections']
                    m['refusals'] += r['denied']
            for rid, m in per_rule.items():
                rows.append(dict(scenario=name, rule=rid, n=n, max=max(m['ratios']), p99=p99(m['ratios']),
                                 windows=len(m['ratios']), fr=m['fr'], refusals=m['refusals'],
                                 bps=sum(bps) / len(bps), lag=max(lag) if lag else None))
                print(f'{name} {rid} {n}: done', file=sys.stderr, flush=True)
    return rows


def table(rows):
    out = ['| scenario | rule | regions | overshoot max | p99 | windows | false rejections | gossip B/s per region | converged after the heal |',
           '|---|---|---:|---:|---:|---:|---:|---:|---:|']
    for r in rows:
        lag = f"{r['lag']:.2f} s" if r['lag'] is not None else ''
        out.append(f"| {r['scenario']} | {r['rule']} | {r['n']} | {r['max']:.3f} | {r['p99']:.3f} | {r['windows']} | "
                   f"{r['fr']:,} of {r['refusals']:,} | {r['bps']:,.0f} | {lag} |")
    return '\n'.join(out)


COLOURS = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b']


def panel(o, rows, ns, x, y, w, h, title, colours, bound):
    """One plot at (x, y) of size w × h: overshoot max (solid) and p99 (dotted) per
    scenario and rule against regions (log axis); `bound` adds the blind spot's bound under
    seen_share, 1 + θ (R − 1) / R, dashed."""
    series = {}
    for r in rows:
        series.setdefault(f"{r['scenario']} / {r['rule']}", []).append(r)
    top = max([r['max'] for r in rows] + ([1 + THRESHOLD] if bound else []))
    step = 0.02 if top < 1.2 else 0.2
    y0, y1 = 1.0, math.ceil(top / step + 0.25) * step
    x0, x1 = math.log(min(ns)), math.log(max(ns))
    px = lambda n: x + (math.log(n) - x0) / ((x1 - x0) or 1) * w
    py = lambda v: y + (y1 - v) / ((y1 - y0) or 1) * h
    o.append(f'<text x="{x}" y="{y - 10}" font-size="12">{title}</text>')
    for i in range(int(round((y1 - y0) / step)) + 1):
        v = y0 + i * step
        o.append(f'<line x1="{x}" x2="{x + w}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{x - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    for n in ns:
        o.append(f'<line x1="{px(n):.1f}" x2="{px(n):.1f}" y1="{y}" y2="{y + h}" stroke="#ddd"/>')
        o.append(f'<text x="{px(n):.1f}" y="{y + h + 16}" text-anchor="middle">{n}</text>')
    o.append(f'<text x="{x + w / 2:.0f}" y="{y + h + 34}" text-anchor="middle">regions</text>')
    if bound:
        pts = ' '.join(f'{px(n):.1f},{py(1 + THRESHOLD * (n - 1) / n):.1f}' for n in ns)
        o.append(f'<polyline points="{pts}" fill="none" stroke="black" stroke-dasharray="6,4"/>')
    legend = []
    for label, rs in series.items():
        c = colours[label]
        for key, dash in (('max', ''), ('p99', ' stroke-dasharray="2,3"')):
            pts = ' '.join(f"{px(r['n']):.1f},{py(r[key]):.1f}" for r in rs)
            o.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="2"{dash}/>')
        for r in rs:
            o.append(f'<circle cx="{px(r["n"]):.1f}" cy="{py(r["max"]):.1f}" r="3" fill="{c}"/>')
        legend.append((label, c))
    return legend


def svg(rows, ns):
    """Two panels, the partition apart (its overshoot is a multiple of the limit), and a
    legend."""
    W, H = 900, 430
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         '<text x="50" y="20" font-size="13">Overshoot (admitted ÷ limit per window) against regions, '
         f'busy_on = seen_share, 1 s interval, {DURATION_S} s per run'
         + ''.join(f', {x}' for x in EXTRA[1::2]) + '</text>']
    labels = list(dict.fromkeys(f"{r['scenario']} / {r['rule']}" for r in rows))
    colours = {l: COLOURS[i % len(COLOURS)] for i, l in enumerate(labels)}
    steady = [r for r in rows if r['scenario'] != 'partition']
    cut = [r for r in rows if r['scenario'] == 'partition']
    legend = []
    if steady:
        legend += panel(o, steady, ns, 60, 60, 330, 300, 'blind spot, sync delay, region failure', colours, True)
    if cut:
        legend += panel(o, cut, ns, 450, 60, 180, 300, 'us-east cut off for 210 s', colours, False)
    ly = 70
    lx = 660
    o.append(f'<line x1="{lx}" x2="{lx + 24}" y1="{ly}" y2="{ly}" stroke="black" stroke-dasharray="6,4"/>')
    o.append(f'<text x="{lx + 28}" y="{ly + 4}">blind-spot bound</text>')
    for label, c in legend:
        ly += 18
        o.append(f'<line x1="{lx}" x2="{lx + 24}" y1="{ly}" y2="{ly}" stroke="{c}" stroke-width="2"/>')
        o.append(f'<text x="{lx + 28}" y="{ly + 4}">{label}</text>')
    o.append(f'<text x="{lx}" y="{ly + 26}">solid: max, dotted: p99</text>')
    o.append('</svg>')
    return '\n'.join(o) + '\n'


EXTRA = []


def main():
    args = [a for a in sys.argv[1:]]
    path = os.path.join(HERE, '..', 'docs', 'img', 'overshoot-vs-regions.svg')
    global DURATION_S
    if '--only' in args:
        i = args.index('--only')
        keep = args[i + 1].split(',')
        for name in list(SCENARIOS):
            if name not in keep:
                del SCENARIOS[name]
        del args[i:i + 2]
    if '--duration' in args:
        i = args.index('--duration')
        DURATION_S = int(args[i + 1])
        del args[i:i + 2]
    while '--set' in args:
        i = args.index('--set')
        EXTRA.extend(['--set', args[i + 1]])
        del args[i:i + 2]
    if '--svg' in args:
        i = args.index('--svg')
        path = args[i + 1]
        del args[i:i + 2]
    ns = [int(x) for x in args[0].split(',')] if len(args) > 0 else [3, 10, 30]
    seeds = [int(x) for x in args[1].split(',')] if len(args) > 1 else [1, 2, 3]
    rows = measure(ns, seeds)
    print(table(rows))
    with open(path, 'w') as f:
        f.write(svg(rows, ns))
    print(f'\nwrote {os.path.relpath(path)}', file=sys.stderr)


main()
