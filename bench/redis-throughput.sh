#!/usr/bin/env bash
# Issue 3: decisions/s through one sluiced counting in Redis, and in the same run
# redis-benchmark executing the same bucket script by EVALSHA against the same Redis
# (-c 50 -P 1), plus one client's sequential latency. Loopback only, bounded in time.
#
#   bench/redis-throughput.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
cargo build --release -q -p sluiced -p sluice-bench
cargo build --release -q -p sluice-store --example evalsha_args
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rp=$(port); hp=$(port); gp=$(port)
dir=$(mktemp -d)
cleanup() { kill "$spid" 2>/dev/null || true; redis-cli -p "$rp" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT
redis-server --port "$rp" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes --dir "$dir" --logfile "$dir/redis.log"
cat > "$dir/rules.yaml" <<'YAML'
domain: bench
rules:
  - { id: bucket, key: [user], algorithm: token_bucket, rate_per_s: 1000000, burst: 1000000000 }
YAML
target/release/sluiced --rules "$dir/rules.yaml" --redis "redis://127.0.0.1:$rp/" --store-timeout-ms 200 \
  --http-addr "127.0.0.1:$hp" --grpc-addr "127.0.0.1:$gp" > "$dir/sluiced.log" 2>&1 &
spid=$!
for _ in $(seq 100); do curl -sf "127.0.0.1:$hp/healthz" >/dev/null && break; sleep 0.1; done
bench() { target/release/sluice-bench --api grpc --addr "127.0.0.1:$gp" --domain bench --dist uniform \
  --keys 10000 --duration "$secs" --warmup 2 --json "$@"; }
sat=$(bench --concurrency 64 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(int(d["decisions_per_s"]))')
seq=$(bench --concurrency 1 | python3 -c 'import json,sys; d=json.load(sys.stdin); l=d["latency_us"]; print(int(d["decisions_per_s"]), l["p50"], l["p99"])')
sha=$(redis-cli -p "$rp" SCRIPT LOAD "$(cat lua/check.lua)")
# shellcheck disable=SC2046
rb=$(redis-benchmark -p "$rp" -c 50 -P 1 -n $((secs * 20000)) -q EVALSHA "$sha" $(target/release/examples/evalsha_args) \
  | tr '\r' '\n' | grep -Eo '[0-9.]+ requests per second' | tail -1 | cut -d' ' -f1)
echo "sluiced (gRPC, Redis, 64 clients):       ${sat} decisions/s"
echo "redis-benchmark EVALSHA (-c 50 -P 1):    ${rb} calls/s"
python3 -c "print(f'ratio sluiced / redis-benchmark:         {${sat}/float(${rb}):.2f}')"
read -r sdps p50 p99 <<< "$seq"
echo "one client, sequential checks:           ${sdps}/s, p50 ${p50} us, p99 ${p99} us"
