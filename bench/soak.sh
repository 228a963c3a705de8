#!/usr/bin/env bash
# The soak: DURATION seconds (1,800 by default) of mixed load through two sluiced on one Redis,
# with Redis killed (SIGKILL) and restarted twice and paused (SIGSTOP) once. sluice-soak
# (crates/sluice-bench/src/bin/sluice-soak.rs) offers the load, one rule per algorithm and
# failure mode, prints a table row a minute (each daemon's RSS, checks per failure mode) and
# asserts at the end: no failed check for a fail-open (or local) rule, every concurrency slot
# released, the quota (a fixed window of a day, spanning the run, its limit exceeded) counted
# exactly, each daemon's RSS flat after warm-up. Exits non-zero if any assertion fails.
# What it measured: docs/soak.md.
#
#   cargo build --release -p sluiced -p sluice-bench
#   bench/soak.sh                       # 30 minutes
#   DURATION=180 QUOTA_PCT=40 WARMUP=60 bench/soak.sh   # a short try
#
# Redis runs with appendonly yes (its own directory, no RDB snapshots), appendfsync everysec:
# every write is in the AOF file (the kernel's page cache) before its reply, so a kill -9 of
# the process and its restart keep every count a daemon was told about; that is what makes the
# count checkable (docs/soak.md). `always` also survives a host crash, at an fsync per write.
# The quota's limit is QUOTA_PCT (60) percent of the checks it is offered, so its count moves
# through every event and reaches the limit in the last third, failures and all.
#
# Env: DURATION (s, 1800), RATE (checks/s in all, 3000), KEYS (identities of the many-key
# rules, 100000), QUOTA_PCT (the quota's limit as a percentage of the checks it is offered, 60),
# APPENDFSYNC (everysec; always: an fsync before every reply, which also survives a host crash),
# WARMUP (s: the RSS sample the last one is compared with, 300), RSS_SLACK_PCT (10),
# SAMPLE_S (60), DOWN_S (how long Redis stays dead after each kill, 5), PAUSE_S (20),
# STORE_TIMEOUT_MS (the daemons' store deadline, 10; empty: the daemon's default, 3 ms).
source "$(dirname "$0")/common.sh"

DURATION="${DURATION:-1800}"
RATE="${RATE:-3000}"
KEYS="${KEYS:-100000}"
QUOTA_PCT="${QUOTA_PCT:-60}"
APPENDFSYNC="${APPENDFSYNC:-everysec}"
# The soak shares 2 cores between its load generator, two daemons and Redis, and a store call
# there waits for a core now and then: 10 ms rather than the daemon's 3 ms default keeps the
# fail-closed rules' UNAVAILABLE share to the outages (docs/soak.md). With appendfsync always a
# write waits for its fsync (3.5 ms at one client, 6.5 ms p50 at eight on this machine's
# disk): give it 25 ms.
STORE_TIMEOUT_MS="${STORE_TIMEOUT_MS-10}"
WARMUP="${WARMUP:-300}"
SAMPLE_S="${SAMPLE_S:-60}"
DOWN_S="${DOWN_S:-5}"
PAUSE_S="${PAUSE_S:-20}"
SOAK="${SOAK:-$ROOT/target/release/sluice-soak}"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="$ROOT/bench/results/soak-$STAMP.json"
for b in "$SLUICED" "$SOAK"; do
  [ -x "$b" ] || { echo "$b is missing: cargo build --release -p sluiced -p sluice-bench" >&2; exit 2; }
done
command -v redis-server >/dev/null || { echo "redis-server is missing (apt-get install redis-server)" >&2; exit 2; }

# The quota is a fixed window of one day (windows start at 00:00 UTC): the run must not cross
# midnight, or its count starts again.
now="$(date -u +%s)"
if [ $(( now / 86400 )) -ne $(( (now + DURATION + 120) / 86400 )) ]; then
  echo "the run would cross 00:00 UTC, where the quota's day window restarts; start after midnight" >&2
  exit 2
fi
# The quota gets 15% of the checks (sluice-soak's weights); its limit is QUOTA_PCT% of them.
QUOTA_LIMIT=$(( RATE * DURATION * 15 * QUOTA_PCT / 10000 ))

cat >"$WORK/rules.yaml" <<RULES
domain: soak
rules:
  - { id: tb, match: { kind: tb }, key: [user], algorithm: token_bucket, rate_per_s: 10, burst: 20, on_store_failure: open }
  - { id: gcra, match: { kind: gcra }, key: [user], algorithm: gcra, rate_per_s: 10, burst: 20, on_store_failure: local }
  - { id: fw, match: { kind: fw }, key: [user], algorithm: fixed_window, limit: 300, window: 1m, on_store_failure: closed }
  - { id: sw, match: { kind: sw }, key: [user], algorithm: sliding_window, limit: 1000, window: 1m, on_store_failure: open }
  - { id: sl, match: { kind: sl }, key: [user], algorithm: sliding_log, limit: 100, window: 10s, on_store_failure: closed }
  - { id: conc, match: { kind: conc }, key: [user], algorithm: concurrency, limit: 5, timeout: 10s, on_store_failure: open }
  - { id: quota, match: { kind: quota }, key: [user], algorithm: fixed_window, limit: $QUOTA_LIMIT, window: 1d, on_store_failure: closed }
RULES
printf 'log: warn\n' >"$WORK/sluiced.yaml"

# Redis: restarted by the event timeline below, so its pid lives in a file.
REDIS_PORT="$(free_port)"
mkdir -p "$WORK/redis"
redis_up() { # (in a subshell, so its kill -9 is not reported as a job of this shell)
  ( redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$WORK/redis" --save "" \
    --appendonly yes --appendfsync "$APPENDFSYNC" --daemonize no --loglevel warning >>"$WORK/redis.log" 2>&1 &
    echo $! >"$WORK/redis.pid" )
  wait_port "$REDIS_PORT"
  for _ in $(seq 1 100); do # until its AOF is loaded
    [ "$(redis-cli -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ] && return 0
    sleep 0.1
  done
}
soak_cleanup() {
  [ -f "$WORK/redis.pid" ] && kill -9 "$(cat "$WORK/redis.pid")" 2>/dev/null || true
  [ -n "${EVENTS_PID:-}" ] && kill "$EVENTS_PID" 2>/dev/null || true
  cleanup
}
trap soak_cleanup EXIT
redis_up

DAEMON_PIDS=(); TARGETS=(); METRICS=(); HTTP_PORTS=()
for n in 1 2; do
  grpc="$(free_port)"; http="$(free_port)"
  args=(--config "$WORK/sluiced.yaml" --rules "$WORK/rules.yaml" --grpc-addr "127.0.0.1:$grpc"
    --http-addr "127.0.0.1:$http" --redis "redis://127.0.0.1:$REDIS_PORT/" --daemon-id "soak-$n")
  [ -n "${STORE_TIMEOUT_MS:-}" ] && args+=(--store-timeout-ms "$STORE_TIMEOUT_MS")
  RUST_LOG=warn "$SLUICED" "${args[@]}" >"$WORK/sluiced-$n.log" 2>&1 &
  DAEMON_PIDS+=($!); PIDS+=($!); TARGETS+=(--target "127.0.0.1:$grpc" --pid "$!")
  METRICS+=(--metrics-url "http://127.0.0.1:$http/metrics"); HTTP_PORTS+=("$http")
  wait_port "$grpc"
done

# The event timeline, scaled to DURATION: kills at 8/30 and 18/30 of the run, the pause at 25/30.
T0="$(date +%s)"
at() { # at SECONDS: sleep until that many seconds after T0
  local d=$(( T0 + $1 - $(date +%s) )); [ "$d" -gt 0 ] && sleep "$d"; true
}
log_event() { echo "event at minute $(awk -v s=$(( $(date +%s) - T0 )) 'BEGIN{printf "%.1f", s/60}'): $*" | tee -a "$WORK/events.log" >&2; }
(
  for k in $(( DURATION * 8 / 30 )) $(( DURATION * 18 / 30 )); do
    at "$k"
    kill -9 "$(cat "$WORK/redis.pid")"; log_event "Redis killed (SIGKILL)"
    sleep "$DOWN_S"
    redis_up; log_event "Redis restarted, $(redis-cli -p "$REDIS_PORT" dbsize) keys loaded from its AOF"
  done
  at $(( DURATION * 25 / 30 ))
  kill -STOP "$(cat "$WORK/redis.pid")"; log_event "Redis paused (SIGSTOP)"
  sleep "$PAUSE_S"
  kill -CONT "$(cat "$WORK/redis.pid")"; log_event "Redis resumed (SIGCONT) after ${PAUSE_S}s"
) &
EVENTS_PID=$!

echo "soak: $DURATION s at $RATE checks/s over 2 daemons, Redis on port $REDIS_PORT (appendfsync $APPENDFSYNC), store deadline ${STORE_TIMEOUT_MS:-3 (default)} ms, quota limit $QUOTA_LIMIT" >&2
rc=0
"$SOAK" "${TARGETS[@]}" --rate "$RATE" --duration "$DURATION" --sample-s "$SAMPLE_S" \
  --warmup-s "$WARMUP" --rss-slack-pct "${RSS_SLACK_PCT:-10}" --keys "$KEYS" \
  --quota-limit "$QUOTA_LIMIT" --redis-port "$REDIS_PORT" "${METRICS[@]}" --json-out "$OUT" || rc=$?
wait "$EVENTS_PID" 2>/dev/null || true; EVENTS_PID=""
# Each daemon's /metrics at the end, beside the report: what its state held (local buckets,
# open streams, late calls) when the RSS was last sampled.
for n in 1 2; do
  curl -sf --max-time 5 "http://127.0.0.1:${HTTP_PORTS[$((n - 1))]}/metrics" >"${OUT%.json}-metrics-$n.txt" 2>/dev/null || true
done

echo
echo "Events:"; sed 's/^/- /' "$WORK/events.log" 2>/dev/null || true
for n in 1 2; do
  echo "daemon $n: $(wc -l <"$WORK/sluiced-$n.log") log lines; last: $(tail -n 1 "$WORK/sluiced-$n.log")"
  grep -E '^sluice_(local_keys|grpc_streams_open|checks_in_flight|release_failures_total|store_late_calls_total)' \
    "${OUT%.json}-metrics-$n.txt" 2>/dev/null | sed "s/^/  daemon $n: /" || true
done
echo "redis INFO: $(redis-cli -p "$REDIS_PORT" info memory | grep -E '^used_memory_human' | tr -d '\r'), $(redis-cli -p "$REDIS_PORT" dbsize) keys"
echo "raw report: $OUT" >&2
mkdir -p "$ROOT/bench/results"
cp "$WORK/sluiced-1.log" "/tmp/soak-$STAMP-sluiced-1.log"; cp "$WORK/sluiced-2.log" "/tmp/soak-$STAMP-sluiced-2.log"
exit "$rc"
