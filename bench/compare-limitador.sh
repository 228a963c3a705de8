#!/usr/bin/env bash
# Sluice and Limitador side by side, one after the other in one run: the same per-user fixed
# window rule, the same Redis (and each one's memory store), the same load from sluice-bench
# over Envoy RLS. For each store and server: decisions/s at saturation (closed loop, best of a
# few concurrencies) and p50/p99 at one fixed offered rate (open loop, latency from the
# intended send time), the rate being half of the slower server's saturation (at most
# OPEN_MAX) so neither is overloaded. Prints a Markdown table; raw reports go to
# bench/results/compare-*.json.
#
# Limitador is not part of this repository and is not built here: pass the path of a
# limitador-server binary you built (Kuadrant/limitador, `cargo build --release -p
# limitador-server`).
#
#   cargo build --release -p sluiced -p sluice-bench
#   bench/compare-limitador.sh /path/to/limitador-server [memory redis]
#
# Env: LIMITADOR (instead of the first argument), SLUICED, BENCH, SERVER_CPU / LOAD_CPU
# (default 0 / 1), REDIS_CPU (default LOAD_CPU; 0 = beside the server), SAT_SECONDS (10), LAT_SECONDS (20), CONCURRENCY_STEPS ("8 16 32 64 128 256 512 1024"),
# KEYS (10000 users), RATE (fixed offered rate instead of half the slower saturation),
# OPEN_MAX (4000: the open loop's rate is at most this; sluice-bench's open loop costs its
# core ~60 µs a request in context switches on a fast machine and ~2.5× that on a slow one,
# so at 10,000/s there its own queueing, not the server's, made the tail),
# HEADERS (on: both answer with the X-RateLimit-Limit/Remaining/Reset headers, Limitador with
# --rate-limit-headers DRAFT_VERSION_03 and sluiced with envoy.header_set x_ratelimit; off:
# neither does, sluiced with envoy.response_headers off).
source "$(dirname "$0")/common.sh"

LIMITADOR="${LIMITADOR:-${1:-}}"
[ $# -gt 0 ] && shift
if [ -z "$LIMITADOR" ] || [ ! -x "$LIMITADOR" ]; then
  echo "usage: $0 /path/to/limitador-server [memory] [redis]" >&2
  exit 2
fi
STORES=("$@"); [ ${#STORES[@]} -gt 0 ] || STORES=(memory redis)
KEYS="${KEYS:-10000}"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="$ROOT/bench/results/compare-$STAMP.json"

# The same rule for both: 1,000 a minute per user, a fixed window. With 10,000 users drawn
# uniformly no user reaches it at these rates, so both do the full work (a counted admit).
cat >"$WORK/sluice-rules.yaml" <<'RULES'
domain: bench
rules:
  - { id: per-user, key: [user], algorithm: fixed_window, limit: 1000, window: 1m }
RULES
cat >"$WORK/limitador-limits.yaml" <<'LIMITS'
- namespace: bench
  name: per-user
  max_value: 1000
  seconds: 60
  conditions: []
  variables:
    - descriptors[0].user
LIMITS

HEADERS="${HEADERS:-on}"
if [ "$HEADERS" = on ]; then
  # The same three headers from both: X-RateLimit-Limit, -Remaining, -Reset.
  printf 'log: warn\nenvoy: { header_set: x_ratelimit }\n' >"$WORK/sluiced.yaml"
  LIMITADOR_HEADERS=(--rate-limit-headers DRAFT_VERSION_03)
else
  printf 'log: warn\nenvoy: { response_headers: false, raw_body: false }\n' >"$WORK/sluiced.yaml"
  LIMITADOR_HEADERS=()
fi

REDIS_PORT="$(free_port)"
start_redis "$REDIS_PORT"
REDIS_URL="redis://127.0.0.1:$REDIS_PORT/"

start_server() { # start_server sluice|limitador STORE GRPC_PORT HTTP_PORT -> pid on stdout
  local who="$1" store="$2" grpc="$3" http="$4"
  if [ "$who" = sluice ]; then
    local args=(--config "$WORK/sluiced.yaml" --rules "$WORK/sluice-rules.yaml" --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http")
    # A generous store deadline: a Redis decision is not silently replaced by a local one.
    [ "$store" = redis ] && args+=(--redis "$REDIS_URL" --store-timeout-ms 200)
    RUST_LOG=warn pin "$SERVER_CPU" "$SLUICED" "${args[@]}" >"$WORK/$who-$store.log" 2>&1 &
  else
    local args=(--rls-ip 127.0.0.1 --rls-port "$grpc" --http-ip 127.0.0.1 --http-port "$http"
      "${LIMITADOR_HEADERS[@]}" "$WORK/limitador-limits.yaml")
    if [ "$store" = redis ]; then args+=(redis "$REDIS_URL"); else args+=(memory --cache $((KEYS * 4))); fi
    pin "$SERVER_CPU" "$LIMITADOR" "${args[@]}" >"$WORK/$who-$store.log" 2>&1 &
  fi
  local pid=$!
  wait_port "$grpc" >&2
  wait_port "$http" >&2
  echo "$pid"
}

store_errors() { # store_errors HTTP_PORT: sluiced's failed store calls so far
  python3 - "$1" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
print(sum(int(float(l.split()[-1])) for l in text.splitlines() if l.startswith("sluice_store_errors_total")))
PY
}

declare -A SAT LAT
echo "[" >"$OUT"; first=1
for store in "${STORES[@]}"; do
  for who in sluice limitador; do
    [ "$store" = redis ] && redis-cli -p "$REDIS_PORT" flushall >/dev/null
    grpc="$(free_port)"; http="$(free_port)"
    pid="$(start_server "$who" "$store" "$grpc" "$http")"; SERVER_PID="$pid"; PIDS+=("$pid")
    common=(--api envoy --addr "127.0.0.1:$grpc" --domain bench --key-name user --dist uniform --keys "$KEYS")
    echo "$who on $store: saturation" >&2
    SAT[$who-$store]="$(saturation "$who/$store" "${common[@]}")"
    stop "$pid"
  done
  s="$(field "${SAT[sluice-$store]}" decisions_per_s)"; l="$(field "${SAT[limitador-$store]}" decisions_per_s)"
  rate="${RATE:-$(python3 -c 'import sys; print(round(min(min(float(sys.argv[1]), float(sys.argv[2])) / 2, float(sys.argv[3]))))' "$s" "$l" "${OPEN_MAX:-4000}")}"
  for who in sluice limitador; do
    [ "$store" = redis ] && redis-cli -p "$REDIS_PORT" flushall >/dev/null
    grpc="$(free_port)"; http="$(free_port)"
    pid="$(start_server "$who" "$store" "$grpc" "$http")"; SERVER_PID="$pid"; PIDS+=("$pid")
    echo "$who on $store: open loop at $rate/s" >&2
    LAT[$who-$store]="$(bench --api envoy --addr "127.0.0.1:$grpc" --domain bench --key-name user \
      --dist uniform --keys "$KEYS" --rate "$rate" --concurrency 512 --duration "${LAT_SECONDS:-20}" --warmup "${WARMUP:-2}")"
    errs=null
    [ "$who" = sluice ] && errs="$(store_errors "$http")"
    echo "  p50 $(field "${LAT[$who-$store]}" latency_us.p50) us, p99 $(field "${LAT[$who-$store]}" latency_us.p99) us, store errors $errs" >&2
    stop "$pid"
    [ $first = 1 ] || echo "," >>"$OUT"; first=0
    printf '{"server":"%s","store":"%s","headers":"%s","saturation":%s,"fixed_rate":%s,"store_errors":%s}\n' \
      "$who" "$store" "$HEADERS" "${SAT[$who-$store]}" "${LAT[$who-$store]}" "$errs" >>"$OUT"
  done
done
echo "]" >>"$OUT"

WARMUP="${WARMUP:-2}" python3 - "$OUT" <<'PY'
import json, os, sys
rows = json.load(open(sys.argv[1]))
by = {(r["server"], r["store"]): r for r in rows}
print("| store | server | decisions/s at saturation | per server CPU-second | offered rate | p50 µs | p99 µs | server CPU µs/decision at that rate | errors |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for store in dict.fromkeys(r["store"] for r in rows):
    for who in ("sluice", "limitador"):
        r = by.get((who, store))
        if not r: continue
        s, f = r["saturation"], r["fixed_rate"]
        n = (f["allowed"] + f["denied"]) * (1 + float(os.environ.get("WARMUP", "2")) / max(f["seconds"], 1e-9))
        us = f"{1e6 * f['server_cpu_s'] / n:.1f}" if f.get("server_cpu_s") and n else "-"
        print(f"| {store} | {who} | {s['decisions_per_s']:.0f} | {s.get('decisions_per_cpu_s') or '-'} | {f['offered_rate']:.0f} | {f['latency_us']['p50']} | {f['latency_us']['p99']} | {us} | {s['errors'] + f['errors']} |")
for store in dict.fromkeys(r["store"] for r in rows):
    s, l = by.get(("sluice", store)), by.get(("limitador", store))
    if s and l:
        ratio = s["saturation"]["decisions_per_s"] / max(l["saturation"]["decisions_per_s"], 1)
        print(f"\n{store}: Sluice/Limitador decisions/s = {ratio:.2f}x; p99 at {s['fixed_rate']['offered_rate']:.0f}/s: "
              f"{s['fixed_rate']['latency_us']['p99']} vs {l['fixed_rate']['latency_us']['p99']} µs")
PY
echo "raw reports: $OUT" >&2
