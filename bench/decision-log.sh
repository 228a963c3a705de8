#!/usr/bin/env bash
# What the decision log costs on the hot path: decisions/s of sluiced (memory store) with the
# log off, on (the default budgets) and on with every check kept (budgets no check reaches:
# the worst case: every check builds and writes a record), side by side in one run. Rounds
# alternate the three, each round starting with the next, so that drift of the shared machine
# falls on each alike. Closed
# loop at one concurrency; results: bench/results/decision-log-*.json.
#
#   cargo build --release -p sluiced -p sluice-bench
#   bench/decision-log.sh [envoy|grpc|http]
#
# Env: SLUICED, BENCH, SERVER_CPU / LOAD_CPU (pinning, default 0 / 1), ROUNDS (3),
# SECONDS_EACH (10), CONCURRENCY (64), KEYS (10000).
source "$(dirname "$0")/common.sh"

API="${1:-envoy}"
KEYS="${KEYS:-10000}"
ROUNDS="${ROUNDS:-3}"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="$ROOT/bench/results/decision-log-$STAMP.json"

cat >"$WORK/rules.yaml" <<'RULES'
domain: bench
rules:
  - { id: per-user, key: [user], algorithm: fixed_window, limit: 1000000, window: 1m }
RULES
printf 'decision_log: { enabled: false }\n' >"$WORK/off.yaml"
printf 'decision_log: { dir: %s/on }\n' "$WORK" >"$WORK/on.yaml"
cat >"$WORK/all.yaml" <<ALL
decision_log:
  dir: $WORK/all
  sample:
    per_identity: 1000000/1s
    per_identity_burst: 1000000
    max_allowed: 1000000/1s
    max_refusals: 1000000/1s
ALL

declare -A HTTP GRPC PID
for mode in off on all; do
  HTTP[$mode]="$(free_port)"; GRPC[$mode]="$(free_port)"
  pin "$SERVER_CPU" "$SLUICED" --config "$WORK/$mode.yaml" --rules "$WORK/rules.yaml" \
    --http-addr "127.0.0.1:${HTTP[$mode]}" --grpc-addr "127.0.0.1:${GRPC[$mode]}" \
    >"$WORK/sluiced-$mode.log" 2>&1 &
  PID[$mode]=$!; PIDS+=("$!")
  wait_port "${HTTP[$mode]}"; wait_port "${GRPC[$mode]}"
done

metric() { # metric PORT NAME: one unlabelled sample of /metrics (0 when absent)
  python3 - "$1" "$2" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics").read().decode()
print(next((l.split()[1] for l in text.splitlines() if l.split(" ")[0] == sys.argv[2]), 0))
PY
}

echo "[" >"$OUT"
first=1
MODES=(off on all)
for round in $(seq 1 "$ROUNDS"); do
  # Each round starts with the next mode, so no mode always runs first (after a pause) or
  # after the busiest one.
  k=$(( (round - 1) % 3 ))
  for mode in "${MODES[@]:$k}" "${MODES[@]:0:$k}"; do
    port="${GRPC[$mode]}"; [ "$API" = http ] && port="${HTTP[$mode]}"
    SERVER_PID="${PID[$mode]}"
    r="$(bench --api "$API" --addr "127.0.0.1:$port" --domain bench --dist uniform \
      --keys "$KEYS" --concurrency "${CONCURRENCY:-64}" --duration "${SECONDS_EACH:-10}" \
      --warmup "${WARMUP:-2}")"
    written="$(metric "${HTTP[$mode]}" sluice_decision_log_written_total)"
    dropped="$(metric "${HTTP[$mode]}" sluice_decision_log_dropped_total)"
    echo "round $round, log $mode: $(field "$r" decisions_per_s) decisions/s, $(field "$r" decisions_per_cpu_s) per server CPU-s, written $written, dropped $dropped (so far), load $(cut -d' ' -f1 /proc/loadavg)" >&2
    [ $first = 1 ] || echo "," >>"$OUT"
    first=0
    printf '{"round":%s,"log":"%s","written_so_far":%s,"dropped_so_far":%s,"report":%s}\n' \
      "$round" "$mode" "$written" "$dropped" "$r" >>"$OUT"
  done
done
echo "]" >>"$OUT"
echo "results: $OUT" >&2
