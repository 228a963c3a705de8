#!/usr/bin/env bash
# Two sluiced builds side by side on one Redis (a token bucket over 10,000 users), sluice-bench
# alternating between them, one client and 64, two rounds of 8 s each: a change to the store
# path measured against the build before it in one run, so the machine's noise hits both.
#
#   git worktree add /tmp/before <commit> && (cd /tmp/before && CARGO_TARGET_DIR=/tmp/before-target cargo build --release -p sluiced)
#   cargo build --release -p sluiced -p sluice-bench
#   bench/ab-redis.sh /tmp/before-target/release/sluiced target/release/sluiced
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: $0 OLD_SLUICED NEW_SLUICED" >&2; exit 2; }
declare -A BIN=([old]="$1" [new]="$2")
BENCH=target/release/sluice-bench
[ -x "$BENCH" ] || { echo "$BENCH is missing: cargo build --release -p sluice-bench" >&2; exit 2; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rp=$(port); dir=$(mktemp -d)
redis-server --port "$rp" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes --dir "$dir" --logfile "$dir/redis.log"
cat > "$dir/rules.yaml" <<'YAML'
domain: bench
rules:
  - { id: bucket, key: [user], algorithm: token_bucket, rate_per_s: 1000000, burst: 1000000000 }
YAML
declare -A G H P
for v in old new; do
  bin="${BIN[$v]}"
  G[$v]=$(port); H[$v]=$(port)
  $bin --rules "$dir/rules.yaml" --redis "redis://127.0.0.1:$rp/" --store-timeout-ms 200 \
    --http-addr "127.0.0.1:${H[$v]}" --grpc-addr "127.0.0.1:${G[$v]}" > "$dir/$v.log" 2>&1 &
  P[$v]=$!
done
trap 'kill ${P[old]} ${P[new]} 2>/dev/null; redis-cli -p $rp shutdown nosave >/dev/null 2>&1; rm -rf $dir' EXIT
for v in old new; do for _ in $(seq 100); do curl -sf "127.0.0.1:${H[$v]}/healthz" >/dev/null && break; sleep 0.1; done; done
for round in 1 2; do
  for c in 1 64; do
    for v in old new; do
      r=$("$BENCH" --api grpc --addr "127.0.0.1:${G[$v]}" --domain bench --dist uniform \
        --keys 10000 --duration 8 --warmup 1 --concurrency $c --json 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); l=d["latency_us"]; print(int(d["decisions_per_s"]), l["p50"], l["p99"])')
      echo "round $round concurrency $c $v: $r"
    done
  done
done
