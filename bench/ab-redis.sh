#!/usr/bin/env bash
# Two sluiced builds side by side on one Redis (a token bucket over 10,000 users), sluice-bench
# alternating between them, one client and 64, two rounds of 8 s each: a change to the store
# path measured against the build before it in one run, so the machine's noise hits both.
# Both daemons are pinned to SERVER_CPU (only one is loaded at a time), the load and Redis to
# LOAD_CPU (common.sh).
#
#   git worktree add /tmp/before <commit> && (cd /tmp/before && CARGO_TARGET_DIR=/tmp/before-target cargo build --release -p sluiced)
#   cargo build --release -p sluiced -p sluice-bench
#   bench/ab-redis.sh /tmp/before-target/release/sluiced target/release/sluiced
source "$(dirname "$0")/common.sh"
[ $# -eq 2 ] || { echo "usage: $0 OLD_SLUICED NEW_SLUICED" >&2; exit 2; }
declare -A BIN=([old]="$1" [new]="$2")
[ -x "$BENCH" ] || { echo "$BENCH is missing: cargo build --release -p sluice-bench" >&2; exit 2; }

REDIS_PORT="$(free_port)"
start_redis "$REDIS_PORT"
cat >"$WORK/rules.yaml" <<'YAML'
domain: bench
rules:
  - { id: bucket, key: [user], algorithm: token_bucket, rate_per_s: 1000000, burst: 1000000000 }
YAML
declare -A GRPC
for v in old new; do
  GRPC[$v]="$(free_port)"; http="$(free_port)"
  pin "$SERVER_CPU" "${BIN[$v]}" --rules "$WORK/rules.yaml" --redis "redis://127.0.0.1:$REDIS_PORT/" \
    --store-timeout-ms 200 --http-addr "127.0.0.1:$http" --grpc-addr "127.0.0.1:${GRPC[$v]}" \
    >"$WORK/$v.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do curl -sf "127.0.0.1:$http/healthz" >/dev/null && break; sleep 0.1; done
done
for round in 1 2; do
  for c in 1 64; do
    for v in old new; do
      r="$(bench --api grpc --addr "127.0.0.1:${GRPC[$v]}" --domain bench --dist uniform \
        --keys 10000 --duration 8 --warmup 1 --concurrency "$c")"
      echo "round $round concurrency $c $v: $(field "$r" decisions_per_s) checks/s, p50 $(field "$r" latency_us.p50) us, p99 $(field "$r" latency_us.p99) us"
    done
  done
done
