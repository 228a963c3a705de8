#!/usr/bin/env bash
# What sluice-gateway adds, and what its edge guard saves, with real processes on loopback.
#
# 1. Added latency. The same plain GET (sluice-bench --api get, open loop: RATE req/s, at
#    most CONCURRENCY in flight over as many keep-alive connections, latency from each
#    request's intended send time) to the upstream directly, through a gateway whose sluiced
#    counts on its memory store, and through one whose sluiced counts on Redis. A rule
#    matches every request with a limit nothing reaches, so every request is decided, counted
#    in the store and forwarded. Each round runs the three once, the order turning each round,
#    so noise on the shared machine hits all of them; added = gateway - direct per round and
#    percentile. The gateway's own /metrics give each run's outcomes and the mean check time
#    it saw (sluice_gateway_check_duration_seconds); two more targets in the same rounds send
#    the gateway's daemon call alone (sluice.v1 Check on tonic) straight to each sluiced, so
#    the share of the check in what the gateway adds is measured too. With h2load installed (nghttp2-client),
#    each round also runs h2load --h1 at the same rate against the three, a cross-check (it
#    reports mean and sd, not percentiles).
# 2. The edge guard. One API key offered EDGE_RATE req/s for EDGE_SECONDS against a token
#    bucket of EDGE_LIMIT/s (burst EDGE_LIMIT), through four gateways on one sluiced (memory
#    store), one after the other each round: the guard off, on (the default: refusals
#    remembered), the flood bucket alone (FLOOD_FACTOR x the rule's rate and burst) and both.
#    sluiced's sluice_checks_total over the run, divided by the gateway's requests, is the
#    daemon calls one gateway request costs.
#
#   bench/gateway-latency.sh            # builds release binaries first (NO_BUILD=1 skips)
#
# Env: ROUNDS (3); RATE (2000), CONCURRENCY (8), RUN_SECONDS (6), WARMUP (1); H2LOAD (on if
# installed; off), H2_CLIENTS (4); EDGE_RATE (1000), EDGE_SECONDS (4), EDGE_LIMIT (20),
# FLOOD_FACTOR (10); EDGE (on; off skips part 2); PIN (off: the scheduler places every process;
# on: servers on SERVER_CPU, load and Redis on LOAD_CPU, as in common.sh). Prints a progress
# line per run and Markdown tables; raw rows go to bench/results/gateway-<UTC time>.json.
source "$(dirname "$0")/common.sh"

ROUNDS="${ROUNDS:-3}"
RATE="${RATE:-2000}" CONCURRENCY="${CONCURRENCY:-8}" RUN_SECONDS="${RUN_SECONDS:-6}"
WARMUP="${WARMUP:-1}"
H2_CLIENTS="${H2_CLIENTS:-4}"
EDGE_RATE="${EDGE_RATE:-1000}" EDGE_SECONDS="${EDGE_SECONDS:-4}" EDGE_LIMIT="${EDGE_LIMIT:-20}"
FLOOD_FACTOR="${FLOOD_FACTOR:-10}" EDGE="${EDGE:-on}"
if [ "${PIN:-off}" = off ]; then SERVER_CPU="" LOAD_CPU="" REDIS_CPU=""; fi
H2LOAD="${H2LOAD:-$(command -v h2load >/dev/null && echo on || echo off)}"
GATEWAY="${GATEWAY:-$ROOT/target/release/sluice-gateway}"
UPSTREAM="${UPSTREAM:-$ROOT/target/release/sluice-upstream}"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="$ROOT/bench/results/gateway-$STAMP.json"
PATH_GET=/v1/items

if [ -z "${NO_BUILD:-}" ]; then
  (cd "$ROOT" && nice -n 19 cargo build --release -q -p sluiced -p sluice-gateway -p sluice-bench)
fi
for b in "$SLUICED" "$GATEWAY" "$UPSTREAM" "$BENCH"; do
  [ -x "$b" ] || { echo "$b is missing (cargo build --release -p sluiced -p sluice-gateway -p sluice-bench)" >&2; exit 2; }
done

# Two domains in one file: "lat" admits everything (a counted decision per request), "edge"
# is the one key's token bucket.
cat >"$WORK/rules.yaml" <<RULES
domain: lat
rules:
  - { id: all, key: [ip], algorithm: fixed_window, limit: 1000000000, window: 1m }
---
domain: edge
rules:
  - { id: per-key, key: [api_key], algorithm: token_bucket, rate_per_s: $EDGE_LIMIT, burst: $EDGE_LIMIT }
RULES

start_sluiced() { # start_sluiced NAME STORE_YAML -> "pid grpc http" on stdout
  local grpc http
  grpc="$(free_port)"; http="$(free_port)"
  printf 'log: warn\nstore: %s\n' "$2" >"$WORK/$1.yaml"
  RUST_LOG=warn pin "$SERVER_CPU" "$SLUICED" --config "$WORK/$1.yaml" --rules "$WORK/rules.yaml" \
    --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" >"$WORK/$1.log" 2>&1 &
  local pid=$!
  wait_port "$grpc" >&2; wait_port "$http" >&2
  echo "$pid $grpc $http"
}

start_gateway() { # start_gateway NAME SLUICED_GRPC CONFIG_YAML -> "pid port metrics_port"
  local port metrics
  port="$(free_port)"; metrics="$(free_port)"
  printf '%s\n' "$3" >"$WORK/$1.yaml"
  RUST_LOG=warn pin "$SERVER_CPU" "$GATEWAY" --listen "127.0.0.1:$port" --upstream "http://127.0.0.1:$UP_PORT" \
    --sluiced "127.0.0.1:$2" --metrics-addr "127.0.0.1:$metrics" --config "$WORK/$1.yaml" >"$WORK/$1.log" 2>&1 &
  local pid=$!
  wait_port "$port" >&2; wait_port "$metrics" >&2
  echo "$pid $port $metrics"
}

# scrape PORT...: one JSON object of every sample on those /metrics ports, labels included.
scrape() {
  python3 - "$@" <<'PY'
import json, sys, urllib.request
out = {}
for port in sys.argv[1:]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[f"{port}/{name}"] = out.get(f"{port}/{name}", 0) + float(value)
print(json.dumps(out))
PY
}

UP_PORT="$(free_port)"
pin "$SERVER_CPU" "$UPSTREAM" --listen "127.0.0.1:$UP_PORT" >"$WORK/upstream.log" 2>&1 &
PIDS+=($!); wait_port "$UP_PORT"
REDIS_PORT="$(free_port)"; start_redis "$REDIS_PORT"

read -r SM_PID SM_GRPC SM_HTTP <<<"$(start_sluiced sluiced-memory '{ kind: memory }')"; PIDS+=("$SM_PID")
read -r SR_PID SR_GRPC SR_HTTP <<<"$(start_sluiced sluiced-redis "{ kind: redis, url: \"redis://127.0.0.1:$REDIS_PORT/\" }")"; PIDS+=("$SR_PID")
LAT_CONFIG='domain: lat'
read -r GM_PID GM_PORT GM_METRICS <<<"$(start_gateway gw-memory "$SM_GRPC" "$LAT_CONFIG")"; PIDS+=("$GM_PID")
read -r GR_PID GR_PORT GR_METRICS <<<"$(start_gateway gw-redis "$SR_GRPC" "$LAT_CONFIG")"; PIDS+=("$GR_PID")

declare -A PORT=([direct]="$UP_PORT" [gateway-memory]="$GM_PORT" [gateway-redis]="$GR_PORT"
  [check-memory]="$SM_GRPC" [check-redis]="$SR_GRPC")
declare -A METRICS=([direct]="" [gateway-memory]="$GM_METRICS" [gateway-redis]="$GR_METRICS"
  [check-memory]="" [check-redis]="")
GET_TARGETS=(direct gateway-memory gateway-redis)
TARGETS=("${GET_TARGETS[@]}" check-memory check-redis)
# load TARGET ARGS...: one sluice-bench run against a target. The check-* targets are the
# gateway's own daemon call alone: sluice.v1 Check on tonic, as the gateway sends it, at the
# same rate, straight to that sluiced.
load() {
  local t="$1"; shift
  case "$t" in
    check-*) bench --api grpc --addr "127.0.0.1:${PORT[$t]}" --domain lat --key-name ip --dist hot \
      --connections 1 "$@" ;;
    *) bench --api get --addr "127.0.0.1:${PORT[$t]}" --path "$PATH_GET" "$@" ;;
  esac
}

if [ "$EDGE" = on ]; then
  FLOOD="{ rate_per_s: $((EDGE_LIMIT * FLOOD_FACTOR)), burst: $((EDGE_LIMIT * FLOOD_FACTOR)) }"
  declare -A EDGE_CONFIG=(
    [off]="edge: { remember_refusals: false }"
    [on]="edge: { remember_refusals: true }"
    [flood]="edge: { remember_refusals: false, flood: $FLOOD }"
    [on+flood]="edge: { remember_refusals: true, flood: $FLOOD }"
  )
  EDGE_MODES=(off on flood on+flood)
  declare -A EDGE_PORT EDGE_METRICS
  for m in "${EDGE_MODES[@]}"; do
    read -r pid port metrics <<<"$(start_gateway "gw-edge-$m" "$SM_GRPC" "$(printf 'domain: edge\napi_key_header: x-api-key\n%s' "${EDGE_CONFIG[$m]}")")"
    PIDS+=("$pid"); EDGE_PORT[$m]="$port"; EDGE_METRICS[$m]="$metrics"
  done
fi

# One request through each path first: every answer a 200 from the upstream.
for t in "${GET_TARGETS[@]}"; do
  r="$("$BENCH" --json --quiet --api get --addr "127.0.0.1:${PORT[$t]}" --path "$PATH_GET" \
    --requests 200 --concurrency 2 --warmup 0 --duration 30)"
  [ "$(field "$r" allowed)" = 200 ] || { echo "$t: not every request was a 2xx: $r" >&2; exit 1; }
done

# A warm-up pass at the measured rate, not recorded: the first seconds at full rate after a
# start (connection pools growing, the daemons' first store calls) were up to 100x slower.
for t in "${TARGETS[@]}"; do
  load "$t" --rate "$RATE" --concurrency "$CONCURRENCY" --duration 2 --warmup 0 --timeout-ms 2000 >/dev/null
done

echo "load $(cut -d' ' -f1-3 /proc/loadavg) at start; $(nproc) CPUs" >&2
echo "[" >"$OUT"; first=1
row() { # row JSON: appends one raw row
  [ $first = 1 ] || echo "," >>"$OUT"; first=0
  echo "$1" >>"$OUT"
}

h2load_run() { # h2load_run PORT: a JSON object of h2load's figures at RATE req/s
  local per=$(((RATE + H2_CLIENTS - 1) / H2_CLIENTS)) n=$((RATE * RUN_SECONDS))
  python3 - h2load --h1 -n "$n" -c "$H2_CLIENTS" -m 1 -t 1 --rps "$per" "http://127.0.0.1:$1$PATH_GET" <<'PY'
import json, re, subprocess, sys
out = subprocess.run(sys.argv[1:], capture_output=True, text=True)
t = out.stdout
def us(v, unit):
    return round(float(v) * {"us": 1, "ms": 1e3, "s": 1e6}[unit], 1)
m = re.search(r"time for request:\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)", t)
row = {"exit": out.returncode,
       "succeeded": int(re.search(r"(\d+) succeeded", t).group(1)) if "succeeded" in t else None,
       "status_2xx": int(re.search(r"status codes: (\d+) 2xx", t).group(1)) if "status codes" in t else None}
if m:
    row.update(min_us=us(m[1], m[2]), max_us=us(m[3], m[4]), mean_us=us(m[5], m[6]), sd_us=us(m[7], m[8]))
else:
    sys.stderr.write(t[-1500:] + out.stderr[-1500:])
print(json.dumps(row))
PY
}

for round in $(seq 1 "$ROUNDS"); do
  k=$(((round - 1) % ${#TARGETS[@]}))
  order=("${TARGETS[@]:$k}" "${TARGETS[@]:0:$k}")
  for t in "${order[@]}"; do
    before="{}"; [ -n "${METRICS[$t]}" ] && before="$(scrape "${METRICS[$t]}")"
    r="$(load "$t" --rate "$RATE" --concurrency "$CONCURRENCY" --duration "$RUN_SECONDS" \
      --warmup "$WARMUP" --timeout-ms 2000)"
    after="{}"; [ -n "${METRICS[$t]}" ] && after="$(scrape "${METRICS[$t]}")"
    load="$(cut -d' ' -f1 /proc/loadavg)"
    row="$(python3 - "$round" "$t" "$r" "$before" "$after" "$load" <<'PY'
import json, sys
rnd, t, r, b, a, load = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4]), json.loads(sys.argv[5]), float(sys.argv[6])
d = {k.split("/", 1)[1]: a[k] - b.get(k, 0) for k in a}
g = {}
if d:
    for o in ("forwarded", "over_limit", "unavailable", "failed_open", "failed_closed"):
        g[o] = int(d.get(f'sluice_gateway_requests_total{{outcome="{o}"}}', 0))
    n = d.get("sluice_gateway_check_duration_seconds_count", 0)
    g["check_mean_us"] = round(d.get("sluice_gateway_check_duration_seconds_sum", 0) / n * 1e6, 1) if n else None
    g["checks_over_1ms"] = int(n - d.get('sluice_gateway_check_duration_seconds_bucket{le="0.001"}', 0))
print(json.dumps({"part": "latency", "round": int(rnd), "target": t, "load1": load, "report": r, "gateway": g}))
PY
)"
    row "$row"
    echo "round $round, $t: p50 $(field "$r" latency_us.p50) us, p90 $(field "$r" latency_us.p90) us, p99 $(field "$r" latency_us.p99) us, $(field "$r" allowed) ok, $(field "$r" errors) errors, unsent $(field "$r" unsent), load $load" >&2
  done
  if [ "$H2LOAD" = on ]; then
    for t in "${order[@]}"; do
      [[ "$t" == check-* ]] && continue
      h="$(h2load_run "${PORT[$t]}")"
      row "{\"part\":\"h2load\",\"round\":$round,\"target\":\"$t\",\"load1\":$(cut -d' ' -f1 /proc/loadavg),\"h2load\":$h}"
      echo "round $round, h2load, $t: mean $(field "$h" mean_us) us, sd $(field "$h" sd_us) us, $(field "$h" status_2xx) 2xx" >&2
    done
  fi
  if [ "$EDGE" = on ]; then
    for m in "${EDGE_MODES[@]}"; do
      before="$(scrape "$SM_HTTP" "${EDGE_METRICS[$m]}")"
      # A key of its own per run: no run starts with another's bucket or remembered refusal.
      r="$(bench --api get --addr "127.0.0.1:${EDGE_PORT[$m]}" --path "$PATH_GET" --key-header x-api-key \
        --dist hot --key-prefix "r${round}-$m-" --rate "$EDGE_RATE" --concurrency 32 \
        --duration "$EDGE_SECONDS" --warmup 0 --timeout-ms 2000)"
      after="$(scrape "$SM_HTTP" "${EDGE_METRICS[$m]}")"
      load="$(cut -d' ' -f1 /proc/loadavg)"
      row="$(python3 - "$round" "$m" "$r" "$before" "$after" "$load" "$SM_HTTP" "${EDGE_METRICS[$m]}" <<'PY'
import json, sys
rnd, m, r, b, a, load, sp, gp = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4]), json.loads(sys.argv[5]), float(sys.argv[6]), sys.argv[7], sys.argv[8]
d = {k: a[k] - b.get(k, 0) for k in a}
checks = int(sum(v for k, v in d.items() if k.startswith(f"{sp}/sluice_checks_total")))
decided = {o: int(sum(v for k, v in d.items() if k.startswith(f"{sp}/sluice_decisions_total") and 'domain="edge"' in k and f'outcome="{o}"' in k)) for o in ("allowed", "denied")}
g = {o: int(d.get(f'{gp}/sluice_gateway_requests_total{{outcome="{o}"}}', 0)) for o in ("forwarded", "over_limit", "unavailable", "failed_open", "failed_closed")}
n = sum(g.values())
print(json.dumps({"part": "edge", "round": int(rnd), "mode": m, "load1": load, "report": r, "gateway": g,
                  "gateway_requests": n, "sluiced_checks": checks, "sluiced_decisions": decided,
                  "checks_per_request": round(checks / n, 4) if n else None}))
PY
)"
      row "$row"
      echo "round $round, edge $m: $(field "$row" gateway_requests) gateway requests, $(field "$row" gateway.forwarded) forwarded, $(field "$row" sluiced_checks) sluiced checks ($(field "$row" checks_per_request) per request), load $load" >&2
    done
  fi
done
echo "]" >>"$OUT"

python3 - "$OUT" "$RATE" "$CONCURRENCY" <<'PY'
import json, statistics, sys
rows = json.load(open(sys.argv[1]))
lat = [r for r in rows if r["part"] == "latency"]
rounds = sorted({r["round"] for r in lat})
def get(t, rnd):
    return next(r for r in lat if r["target"] == t and r["round"] == rnd)
print(f"\nOpen loop, {sys.argv[2]} req/s, at most {sys.argv[3]} in flight; latency in us (per round).\n")
print("| target | p50 | p90 | p99 | p99.9 | added p50 | added p99 | check mean (gateway's view) | failed open | load |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
for t in ("direct", "gateway-memory", "gateway-redis", "check-memory", "check-redis"):
    def cells(f):
        return ", ".join(f(rnd) for rnd in rounds)
    def q(rnd, name, minus=None):
        v = get(t, rnd)["report"]["latency_us"][name]
        return v - get(minus, rnd)["report"]["latency_us"][name] if minus else v
    g = lambda rnd: get(t, rnd)["gateway"]
    added = ["-", "-"] if not t.startswith("gateway") else [cells(lambda rnd, n=n: "%.0f" % q(rnd, n, "direct")) for n in ("p50", "p99")]
    print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        t, cells(lambda rnd: "%.0f" % q(rnd, "p50")), cells(lambda rnd: "%.0f" % q(rnd, "p90")),
        cells(lambda rnd: "%.0f" % q(rnd, "p99")),
        cells(lambda rnd: "%.0f" % q(rnd, "p999")), added[0], added[1],
        cells(lambda rnd: str(g(rnd).get("check_mean_us", "-"))),
        cells(lambda rnd: str(g(rnd).get("failed_open", "-"))),
        cells(lambda rnd: str(get(t, rnd)["load1"]))))
h2 = [r for r in rows if r["part"] == "h2load"]
if h2:
    print("\nh2load --h1 at the same rate (mean / sd of time for request, us, per round):\n")
    print("| target | mean | sd |\n| --- | ---: | ---: |")
    for t in ("direct", "gateway-memory", "gateway-redis"):
        rs = [r["h2load"] for r in h2 if r["target"] == t]
        print(f"| {t} | {', '.join(str(r.get('mean_us')) for r in rs)} | {', '.join(str(r.get('sd_us')) for r in rs)} |")
edge = [r for r in rows if r["part"] == "edge"]
if edge:
    print("\nOne key at 50x its limit: per mode, per round.\n")
    print("| edge guard | gateway requests | forwarded | 429 | sluiced checks | checks per request |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for m in dict.fromkeys(r["mode"] for r in edge):
        rs = [r for r in edge if r["mode"] == m]
        c = lambda f: ", ".join(str(f(r)) for r in rs)
        print(f"| {m} | {c(lambda r: r['gateway_requests'])} | {c(lambda r: r['gateway']['forwarded'])} | {c(lambda r: r['gateway']['over_limit'])} "
              f"| {c(lambda r: r['sluiced_checks'])} | {c(lambda r: r['checks_per_request'])} |")
PY
echo "raw rows: $OUT" >&2
