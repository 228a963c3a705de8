#!/usr/bin/env bash
# Instructions per Envoy check of sluiced's whole path (gRPC, engine, core, memory store),
# counted by callgrind, so two builds compare exactly whatever else the machine is doing.
#
#   cargo build --release -p sluiced -p sluice-bench
#   bench/daemon-callgrind.sh [SLUICED_BINARY ...]      # default: target/release/sluiced
#
# Each binary runs on its memory store with one worker thread under
# `valgrind --tool=callgrind`; h2load (`apt-get install nghttp2-client`) sends the hot key's
# Envoy request of bench/h2load-compare.sh (one fixed body, a rule that admits everything):
# 2,000 to warm up, then 10,000 and 30,000 with the counters zeroed before each and dumped
# after. Per check = (total of the 30,000 - total of the 10,000) / 20,000, so connection
# setup and anything per run cancel out. Prints one line per binary.
source "$(dirname "$0")/common.sh"

command -v valgrind >/dev/null || { echo "valgrind not found (apt-get install valgrind)" >&2; exit 2; }
command -v h2load >/dev/null || { echo "h2load not found (apt-get install nghttp2-client)" >&2; exit 2; }
[ "$#" -gt 0 ] || set -- "$SLUICED"

cat >"$WORK/rules.yaml" <<'RULES'
domain: bench
rules:
  - { id: per-user, key: [user], algorithm: fixed_window, limit: 1000000000, window: 1m }
RULES
printf 'log: warn\nworker_threads: 1\nenvoy: { header_set: x_ratelimit }\n' >"$WORK/sluiced.yaml"
"$BENCH" --print-request --api envoy --domain bench --key-name user --key-prefix u >"$WORK/body.bin"

# dumped_total PID OUT: dump PID's counters and print the total of the newest dump.
dumped_total() {
  callgrind_control -d "$1" >/dev/null 2>&1
  local f
  for _ in $(seq 1 100); do
    f=$(ls -t "$2".* 2>/dev/null | head -n 1 || true)
    if [ -n "$f" ] && grep -q '^totals:' "$f"; then break; fi
    sleep 0.1
  done
  grep -m1 '^totals:' "$f" | awk '{print $2}'
}

for bin in "$@"; do
  grpc=$(free_port) http=$(free_port) out="$WORK/cg.$(basename "$bin").$RANDOM"
  RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" --config "$WORK/sluiced.yaml" \
    --rules "$WORK/rules.yaml" --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" \
    >"$WORK/sluiced.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1 20); do wait_port "$grpc" 2>/dev/null && break; done
  h2=(h2load -c 4 -m 32 -t 1 --header 'content-type: application/grpc' --header 'te: trailers'
    -d "$WORK/body.bin" "http://127.0.0.1:$grpc/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
  "${h2[@]}" -n 2000 >/dev/null
  totals=()
  for n in 10000 30000; do
    callgrind_control -z "$pid" >/dev/null 2>&1
    ok=$("${h2[@]}" -n "$n" | awk '/^requests:/ {print $8}')
    [ "$ok" = "$n" ] || { echo "$bin: $ok of $n requests succeeded" >&2; exit 1; }
    totals+=("$(dumped_total "$pid" "$out")")
  done
  stop "$pid"
  python3 -c "import sys; a, b = int(sys.argv[2]), int(sys.argv[3]); print(f'{sys.argv[1]}: {(b - a) / 20000:,.0f} instructions per check')" \
    "$bin" "${totals[0]}" "${totals[1]}"
done
