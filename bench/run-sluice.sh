#!/usr/bin/env bash
# Measures sluiced on the embedded default (memory store): decisions/s at saturation (closed
# loop, the best of a few concurrencies) and latency at half of that rate (open loop, from
# each request's intended send time), over each API. Results: bench/results/sluice-*.json.
#
#   cargo build --release -p sluiced -p sluice-bench
#   bench/run-sluice.sh [envoy grpc http]
#
# Env: SLUICED, BENCH (binaries), SERVER_CPU / LOAD_CPU (pinning, default 0 / 1),
# SAT_SECONDS (10), LAT_SECONDS (20), CONCURRENCY_STEPS ("8 16 32 64 128 256 512 1024"), KEYS (10000).
source "$(dirname "$0")/common.sh"

APIS=("${@:-envoy grpc http}")
read -r -a APIS <<<"${APIS[*]}"
KEYS="${KEYS:-10000}"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="$ROOT/bench/results/sluice-$STAMP.json"

cat >"$WORK/rules.yaml" <<'RULES'
domain: bench
rules:
  - { id: per-user, key: [user], algorithm: fixed_window, limit: 1000000, window: 1m }
RULES

HTTP_PORT="$(free_port)"; GRPC_PORT="$(free_port)"
pin "$SERVER_CPU" "$SLUICED" --rules "$WORK/rules.yaml" --http-addr "127.0.0.1:$HTTP_PORT" \
  --grpc-addr "127.0.0.1:$GRPC_PORT" >"$WORK/sluiced.log" 2>&1 &
SPID=$!; PIDS+=("$SPID"); SERVER_PID="$SPID"
wait_port "$HTTP_PORT"; wait_port "$GRPC_PORT"

echo "[" >"$OUT"
first=1
for api in "${APIS[@]}"; do
  port="$GRPC_PORT"; [ "$api" = http ] && port="$HTTP_PORT"
  common=(--api "$api" --addr "127.0.0.1:$port" --domain bench --dist uniform --keys "$KEYS")
  echo "$api: saturation" >&2
  sat="$(saturation "sluiced/$api" "${common[@]}")"
  rate="$(python3 -c 'import sys; print(round(float(sys.argv[1]) / 2))' "$(field "$sat" decisions_per_s)")"
  echo "$api: open loop at $rate/s (half of saturation)" >&2
  lat="$(bench "${common[@]}" --rate "$rate" --concurrency 512 --duration "${LAT_SECONDS:-20}" --warmup "${WARMUP:-2}")"
  echo "  p50 $(field "$lat" latency_us.p50) us, p99 $(field "$lat" latency_us.p99) us, p99.9 $(field "$lat" latency_us.p999) us" >&2
  [ $first = 1 ] || echo "," >>"$OUT"
  first=0
  printf '{"api":"%s","saturation":%s,"half":%s}\n' "$api" "$sat" "$lat" >>"$OUT"
done
echo "]" >>"$OUT"
echo "results: $OUT" >&2
