#!/usr/bin/env bash
# The hot-key layer with and without, side by side in one run on one Redis: six sluiced
# (deny cache on / off, a leased hot key / the same key without a lease, the sync gate /
# the plain store path), sluice-bench alternating between them so the machine's noise hits
# both sides of each pair. Every run loads one key: for the deny cache a token bucket at each
# of DENY_LIMITS, offered 10x its limit (open loop) and then as fast as it is answered
# (closed loop, 64 in flight); for the lease one bucket of LEASE_RATE, closed loop; for the
# sync gate (sync_interval: 500ms, half the bucket's fill time; deny cache off on both sides) a bucket of GATE_LIMIT, 10x
# open loop and closed loop. Per run: decisions/s, latency, Redis CPU per
# decision (INFO cpu used_cpu_user + used_cpu_sys, delta over the run, divided by the
# decisions), Redis script runs per decision (INFO commandstats), the daemon's CPU per
# decision and the layer's counters. Results: bench/results/hot-keys-<timestamp>.json; a
# summary (medians over the rounds) on stderr. The figures are in docs/hot-keys.md,
# "Measured".
#
#   cargo build --release -p sluiced -p sluice-bench
#   bench/hot-keys.sh
#
# Env: SECONDS_EACH (10), ROUNDS (2), DENY_LIMITS ("100 500": the open loop offers 10x each,
# keep it below what one daemon core serves), LEASE_RATE (50000/s: a closed loop here stays
# under it, so every request is admitted and what differs is only who counts), GATE_LIMIT
# (500/s: offered 10x open loop),
# SERVER_CPU / LOAD_CPU / REDIS_CPU (pinning, common.sh; the four daemons share SERVER_CPU,
# one loaded at a time). SECTIONS ("deny lease gate"): which pairs run.
source "$(dirname "$0")/common.sh"
[ -x "$SLUICED" ] || { echo "$SLUICED is missing: cargo build --release -p sluiced" >&2; exit 2; }
[ -x "$BENCH" ] || { echo "$BENCH is missing: cargo build --release -p sluice-bench" >&2; exit 2; }

SECS="${SECONDS_EACH:-10}"
WARMUP="${WARMUP:-1}"
ROUNDS="${ROUNDS:-2}"
DENY_LIMITS="${DENY_LIMITS:-100 500}"
LEASE_RATE="${LEASE_RATE:-50000}"
GATE_LIMIT="${GATE_LIMIT:-500}"
SECTIONS="${SECTIONS:-deny lease gate}"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="$ROOT/bench/results/hot-keys-$STAMP.json"
LOAD_BEFORE="$(cut -d' ' -f1 /proc/loadavg)"

REDIS_PORT="$(free_port)"
start_redis "$REDIS_PORT"

# One daemon per variant; a variant's rules are one per limit, picked by the route descriptor.
deny_rules() { # deny_rules true|false
  printf 'domain: bench\nrules:\n'
  for l in $DENY_LIMITS; do
    printf '  - { id: l%s, match: { route: l%s }, key: [user], algorithm: token_bucket, rate_per_s: %s, burst: %s, hot_keys: { deny_cache: %s } }\n' \
      "$l" "$l" "$l" "$l" "$1"
  done
}
lease_rules() { # lease_rules auto|off
  printf 'domain: bench\nrules:\n  - { id: hot, match: { route: hot }, key: [user], algorithm: token_bucket, rate_per_s: %s, burst: %s, hot_keys: { lease: %s } }\n' \
    "$LEASE_RATE" "$LEASE_RATE" "$1"
}
gate_rules() { # gate_rules 'HOT_KEYS': the sync gate's bucket with that hot_keys block
  printf 'domain: bench\nrules:\n  - { id: gate, match: { route: gate }, key: [user], algorithm: token_bucket, rate_per_s: %s, burst: %s, hot_keys: { %s } }\n' \
    "$GATE_LIMIT" "$GATE_LIMIT" "$1"
}
deny_rules true >"$WORK/deny-on.yaml"
deny_rules false >"$WORK/deny-off.yaml"
lease_rules auto >"$WORK/lease-auto.yaml"
lease_rules off >"$WORK/lease-off.yaml"
gate_rules 'sync_interval: 500ms, deny_cache: false' >"$WORK/gate-500ms.yaml"
gate_rules 'deny_cache: false' >"$WORK/gate-off.yaml"

declare -A GRPC HTTP PID
for v in deny-on deny-off lease-auto lease-off gate-500ms gate-off; do
  GRPC[$v]="$(free_port)"; HTTP[$v]="$(free_port)"
  pin "$SERVER_CPU" "$SLUICED" --rules "$WORK/$v.yaml" --redis "redis://127.0.0.1:$REDIS_PORT/" \
    --store-timeout-ms 200 --http-addr "127.0.0.1:${HTTP[$v]}" --grpc-addr "127.0.0.1:${GRPC[$v]}" \
    >"$WORK/$v.log" 2>&1 &
  PID[$v]=$!; PIDS+=($!)
  for _ in $(seq 100); do curl -sf "127.0.0.1:${HTTP[$v]}/healthz" >/dev/null && break; sleep 0.1; done
  curl -sf "127.0.0.1:${HTTP[$v]}/healthz" >/dev/null || { cat "$WORK/$v.log" >&2; exit 1; }
done

# redis_counters: "cpu_seconds script_runs" of the Redis (user + sys; EVAL* calls).
redis_counters() {
  { redis-cli -p "$REDIS_PORT" info cpu; redis-cli -p "$REDIS_PORT" info commandstats; } | tr -d '\r' |
    python3 -c '
import sys
cpu = runs = 0.0
for l in sys.stdin:
    if l.startswith(("used_cpu_user:", "used_cpu_sys:")):
        cpu += float(l.split(":")[1])
    elif l.startswith("cmdstat_eval"):
        runs += int(l.split("calls=")[1].split(",")[0])
print(cpu, int(runs))'
}

# daemon_counters HTTP_PORT: the layer's and the store's counters, as JSON.
daemon_counters() {
  curl -sf "127.0.0.1:$1/metrics" | python3 -c '
import json, sys
want = ("sluice_store_batched_calls_total", "sluice_store_script_runs_total",
        "sluice_deny_cache_hits_total", "sluice_lease_calls_total", "sluice_lease_spent_total",
        "sluice_lease_blocked_total", "sluice_leased_units_total", "sluice_lease_returned_units_total",
        "sluice_gate_admitted_total", "sluice_gate_refused_total", "sluice_gate_to_store_total",
        "sluice_sync_calls_total", "sluice_synced_units_total", "sluice_sync_failures_total")
m = {}
for l in sys.stdin:
    p = l.split()
    if len(p) == 2 and p[0] in want:
        m[p[0]] = float(p[1])
print(json.dumps(m))'
}

RESULTS="$WORK/results.jsonl"
: >"$RESULTS"

# Redis's own CPU with nothing loaded (its timers, the daemons' idle connections): per
# second, so each run's figure can be given net of it too; at 1,000 decisions/s it is a
# sizeable share of the raw figure.
read -r -a i0 <<<"$(redis_counters)"; t0="$(date +%s.%N)"
sleep "${IDLE_SECONDS:-5}"
read -r -a i1 <<<"$(redis_counters)"; t1="$(date +%s.%N)"
IDLE_CPU_PER_S="$(python3 -c 'import sys; a,b,c,d=map(float,sys.argv[1:]); print((b-a)/(d-c))' "${i0[0]}" "${i1[0]}" "$t0" "$t1")"
echo "Redis idle: $IDLE_CPU_PER_S CPU-s per second" >&2

# run ROUND LABEL VARIANT ROUTE ARGS...: one sluice-bench run on VARIANT's daemon, one hot
# key (a fresh one per run: each starts on a full bucket) on the rule of ROUTE.
run() {
  local round="$1" label="$2" v="$3" route="$4"; shift 4
  local r0 d0 r1 d1 r t0 t1
  read -r -a r0 <<<"$(redis_counters)"; t0="$(date +%s.%N)"
  d0="$(daemon_counters "${HTTP[$v]}")"
  SERVER_PID="${PID[$v]}"
  r="$(bench --api grpc --addr "127.0.0.1:${GRPC[$v]}" --domain bench --key-name user \
    --key-prefix "$v-$route-$round-$RANDOM-" --descriptor "route=$route" --dist hot \
    --duration "$SECS" --warmup "${WARMUP:-1}" "$@")"
  read -r -a r1 <<<"$(redis_counters)"; t1="$(date +%s.%N)"
  d1="$(daemon_counters "${HTTP[$v]}")"
  python3 - "$round" "$label" "$v" "$r" "${r0[0]}" "${r0[1]}" "${r1[0]}" "${r1[1]}" "$d0" "$d1" \
    "${WARMUP:-1}" "$t0" "$t1" "$IDLE_CPU_PER_S" >>"$RESULTS" <<'PY'
import json, sys
round_, label, variant, r, c0, s0, c1, s1, d0, d1, warmup, t0, t1, idle = sys.argv[1:]
r = json.loads(r); d0 = json.loads(d0); d1 = json.loads(d1)
# Warm-up requests are served too: count them by the measured share of the run.
decisions = (r["allowed"] + r["denied"]) * (1 + float(warmup) / max(r["seconds"], 1e-9))
cpu = float(c1) - float(c0); runs = int(s1) - int(s0)
net = max(cpu - float(idle) * (float(t1) - float(t0)), 0.0)
daemon = {k.removeprefix("sluice_"): d1.get(k, 0) - d0.get(k, 0) for k in d1}
out = {
    "round": int(round_), "label": label, "variant": variant,
    "decisions_per_s": r["decisions_per_s"], "allowed": r["allowed"], "denied": r["denied"],
    "errors": r["errors"], "unsent": r["unsent"], "latency_us": r["latency_us"],
    "redis_cpu_s": round(cpu, 3),
    "redis_cpu_us_per_decision": round(cpu * 1e6 / decisions, 3) if decisions else None,
    "redis_cpu_net_us_per_decision": round(net * 1e6 / decisions, 3) if decisions else None,
    "script_runs": runs, "script_runs_per_decision": round(runs / decisions, 4) if decisions else None,
    "server_cpu_s": r.get("server_cpu_s"), "decisions_per_server_cpu_s": r.get("decisions_per_cpu_s"),
    "client_cpu_share": r.get("client_cpu_share"), "load1": r.get("load1"), "daemon": daemon,
    "bench": r,
}
print(json.dumps(out))
PY
  tail -1 "$RESULTS" | python3 -c '
import json, sys
x = json.loads(sys.stdin.read())
lat = x["latency_us"]
print("  round %d %-28s %-10s %8.0f decisions/s, allowed %d, p50 %s us, p99 %s us, Redis %s us CPU (%s net of idle) and %s script runs per decision, load %s"
      % (x["round"], x["label"], x["variant"], x["decisions_per_s"], x["allowed"], lat["p50"], lat["p99"],
         x["redis_cpu_us_per_decision"], x["redis_cpu_net_us_per_decision"], x["script_runs_per_decision"], x["load1"]))' >&2
}

has() { [[ " $SECTIONS " == *" $1 "* ]]; }
for round in $(seq 1 "$ROUNDS"); do
  has deny && for l in $DENY_LIMITS; do
    for v in deny-on deny-off; do
      run "$round" "limit $l/s, 10x, open loop" "$v" "l$l" --rate "$((10 * l))" --concurrency 512
    done
    for v in deny-on deny-off; do
      run "$round" "limit $l/s, closed loop" "$v" "l$l" --concurrency 64
    done
  done
  has lease && for v in lease-auto lease-off; do
    run "$round" "hot key, closed loop" "$v" hot --concurrency 64
  done
  if has gate; then
    for v in gate-500ms gate-off; do
      run "$round" "gate $GATE_LIMIT/s, 10x, open loop" "$v" gate --rate "$((10 * GATE_LIMIT))" --concurrency 512
    done
    for v in gate-500ms gate-off; do
      run "$round" "gate $GATE_LIMIT/s, closed loop" "$v" gate --concurrency 64
    done
  fi
done

python3 - "$RESULTS" "$OUT" "$STAMP" "$LOAD_BEFORE" "$DENY_LIMITS" "$LEASE_RATE" "$SECS" "$IDLE_CPU_PER_S" "$GATE_LIMIT" "$SECTIONS" <<'PY'
import json, os, statistics, sys
src, out, stamp, load, limits, lease_rate, secs, idle, gate_limit, sections = sys.argv[1:]
runs = [json.loads(l) for l in open(src)]
doc = {
    "stamp": stamp, "cpus": os.cpu_count(), "load1_before": float(load),
    "deny_limits_per_s": [int(x) for x in limits.split()],
    "lease": {"rate_per_s": int(lease_rate)}, "seconds_each": float(secs),
    "gate": {"rate_per_s": int(gate_limit), "sync_interval": "500ms"}, "sections": sections.split(),
    "redis_idle_cpu_per_s": float(idle), "runs": runs,
}
json.dump(doc, open(out, "w"), indent=1)
print(f"summary (median of {max(r['round'] for r in runs)} rounds):", file=sys.stderr)
keys = list(dict.fromkeys((r["label"], r["variant"]) for r in runs))
for label, variant in keys:
    xs = [r for r in runs if r["label"] == label and r["variant"] == variant]
    med = lambda f: statistics.median(f(x) for x in xs)
    print(f"  {label:<28} {variant:<10} {med(lambda x: x['decisions_per_s']):>8.0f} decisions/s, "
          f"Redis {med(lambda x: x['redis_cpu_us_per_decision']):.2f} us CPU "
          f"({med(lambda x: x['redis_cpu_net_us_per_decision']):.2f} net of idle) and "
          f"{med(lambda x: x['script_runs_per_decision']):.4f} script runs per decision, "
          f"p99 {med(lambda x: x['latency_us']['p99']):.0f} us, "
          f"{med(lambda x: x['decisions_per_server_cpu_s'] or 0):.0f} per daemon CPU-s, "
          f"client CPU {med(lambda x: x['client_cpu_share'] or 0):.2f} cores", file=sys.stderr)
print(f"results: {out}", file=sys.stderr)
PY
