#!/usr/bin/env bash
# Decisions/s through one sluiced counting in Redis, and in the same run
# redis-benchmark executing the same bucket script by EVALSHA against the same Redis
# (-c 50 -P 1, the same 10,000 users), plus one client's sequential latency and Redis's own
# CPU per check in both runs (what the store's batching saves). Loopback only, bounded.
#
#   bench/redis-throughput.sh [SECONDS]        (API=http for the HTTP API instead of gRPC;
#                                              CARGO_TARGET_DIR is honoured)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
tgt=${CARGO_TARGET_DIR:-target}
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
$tgt/release/sluiced --rules "$dir/rules.yaml" --redis "redis://127.0.0.1:$rp/" --store-timeout-ms 200 \
  --http-addr "127.0.0.1:$hp" --grpc-addr "127.0.0.1:$gp" > "$dir/sluiced.log" 2>&1 &
spid=$!
for _ in $(seq 100); do curl -sf "127.0.0.1:$hp/healthz" >/dev/null && break; sleep 0.1; done
api=${API:-grpc}
bench() { $tgt/release/sluice-bench --api "$api" --addr "127.0.0.1:$( [ "$api" = http ] && echo "$hp" || echo "$gp")" --domain bench --dist uniform \
  --keys 10000 --duration "$secs" --warmup 2 --json "$@"; }
# Redis's CPU per check (user + system time of the redis-server process, not wall time,
# so a loaded machine preempting Redis does not inflate it): the part batching saves.
rpid=$(redis-cli -p "$rp" info server | tr -d '\r' | awk -F: '/^process_id/ {print $2}')
cpu_ms() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) * 1000 / hz}' "/proc/$rpid/stat"; }
evalsha_calls() { redis-cli -p "$rp" info commandstats | tr -d '\r' | grep -E '^cmdstat_evalsha?:' \
  | sed -E 's/^[^:]*:calls=([0-9]+),.*/\1/' | awk '{s += $1} END {print s + 0}'; }
c0=$(cpu_ms)
sat=$(bench --concurrency 64 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(int(d["decisions_per_s"]))')
# How many checks each script run carried (the batcher groups calls queued behind the runs
# in flight), from the daemon's own counters.
batch=$(curl -sf "127.0.0.1:$hp/metrics" | python3 -c '
import sys
m = {l.split()[0]: float(l.split()[1]) for l in sys.stdin if l.startswith("sluice_store_")}
runs, calls = m.get("sluice_store_script_runs_total", 0), m.get("sluice_store_batched_calls_total", 0)
print(f"{calls/runs:.1f} checks per script run ({int(runs)} runs)" if runs else "no script runs")')
d_ms=$(python3 -c "print($(cpu_ms) - $c0)")
d_calls=$(curl -sf "127.0.0.1:$hp/metrics" | awk '/^sluice_store_batched_calls_total/ {print $2}')
seq=$(bench --concurrency 1 | python3 -c 'import json,sys; d=json.load(sys.stdin); l=d["latency_us"]; print(int(d["decisions_per_s"]), l["p50"], l["p99"])')
sha=$(redis-cli -p "$rp" SCRIPT LOAD "$(cat lua/check.lua)")
redis-cli -p "$rp" config resetstat >/dev/null
c0=$(cpu_ms)
# The same calls the daemon makes: the daemon's encoding of one check (evalsha_args), its
# user replaced by redis-benchmark's __rand_int__ over 10,000 values, as sluice-bench spreads
# its checks over 10,000 users.
mapfile -t ev < <($tgt/release/examples/evalsha_args)
ev[1]="${ev[1]/user=u1\}/user=u__rand_int__\}}"
rb=$(redis-benchmark -p "$rp" -c 50 -P 1 -r 10000 -n $((secs * 20000)) -q EVALSHA "$sha" "${ev[@]}" \
  | tr '\r' '\n' | grep -Eo '[0-9.]+ requests per second' | tail -1 | cut -d' ' -f1)
b_ms=$(python3 -c "print($(cpu_ms) - $c0)")
b_calls=$(evalsha_calls)
echo "sluiced ($api, Redis, 64 clients):       ${sat} decisions/s, ${batch}"
echo "redis-benchmark EVALSHA (-c 50 -P 1):    ${rb} calls/s"
python3 -c "print(f'ratio sluiced / redis-benchmark:         {${sat}/float(${rb}):.2f}')"
python3 -c "print(f'Redis CPU per check:                     sluiced {${d_ms}*1000/max(${d_calls:-0},1):.1f} us, redis-benchmark {${b_ms}*1000/max(${b_calls:-0},1):.1f} us')"
read -r sdps p50 p99 <<< "$seq"
echo "one client, sequential checks:           ${sdps}/s, p50 ${p50} us, p99 ${p99} us"
