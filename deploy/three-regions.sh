#!/usr/bin/env bash
# Three Sluice regions on one machine: a redis-server and a sluiced per region, gossiping on
# loopback, for trying global limits by hand (docs/regions.md).
#
#   deploy/three-regions.sh            # start eu, us, ap; Ctrl-C stops everything
#
# Region i (0, 1, 2 = eu, us, ap) uses ports BASE+10i+{0: redis, 1: HTTP, 2: gRPC, 3: gossip}
# (BASE=7100 by default: eu HTTP on 7101, us on 7111, ap on 7121). A fresh random gossip key
# authenticates the run's gossip. Logs and data go to RUN_DIR.
#
# Environment:
#   BASE=7100                 first port
#   RULES=deploy/regions/rules.yaml
#   SLUICED=path/to/sluiced   default: target/release/sluiced, else target/debug/sluiced
#   SHIP_INTERVAL_MS=1000     how often regions ship busy counts
#   RUN_DIR=${TMPDIR:-/tmp}/sluice-three-regions
set -euo pipefail

cd "$(dirname "$0")/.."
BASE=${BASE:-7100}
RULES=${RULES:-deploy/regions/rules.yaml}
SHIP_INTERVAL_MS=${SHIP_INTERVAL_MS:-1000}
RUN_DIR=${RUN_DIR:-${TMPDIR:-/tmp}/sluice-three-regions}
REGIONS=(eu us ap)

die() { echo "three-regions: $*" >&2; exit 1; }

command -v redis-server >/dev/null || die "redis-server not found (apt-get install redis-server)"
command -v redis-cli >/dev/null || die "redis-cli not found (apt-get install redis-tools)"
if [[ -z ${SLUICED:-} ]]; then
  if [[ -x target/release/sluiced ]]; then SLUICED=target/release/sluiced
  elif [[ -x target/debug/sluiced ]]; then SLUICED=target/debug/sluiced
  else die "no sluiced binary: run 'cargo build --release -p sluiced' (or set SLUICED)"
  fi
fi
[[ -f $RULES ]] || die "rules file $RULES not found"

port() { echo $((BASE + 10 * $1 + $2)); }
for i in 0 1 2; do
  for k in 0 1 2 3; do
    p=$(port "$i" "$k")
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      die "port $p is in use (set BASE to another range)"
    fi
  done
done

mkdir -p "$RUN_DIR"
KEY=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
PIDS=()

stop() {
  trap - INT TERM EXIT
  echo
  echo "stopping..."
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "stopped (logs in $RUN_DIR)"
}
trap stop INT TERM EXIT

seeds_for() {
  local me=$1 out=()
  for j in 0 1 2; do
    [[ $j == "$me" ]] || out+=(--gossip-seed "127.0.0.1:$(port "$j" 3)")
  done
  echo "${out[@]}"
}

for i in 0 1 2; do
  r=${REGIONS[$i]}
  mkdir -p "$RUN_DIR/$r"
  redis-server --port "$(port "$i" 0)" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$RUN_DIR/$r" >"$RUN_DIR/$r/redis.log" 2>&1 &
  PIDS+=($!)
done
for i in 0 1 2; do
  for _ in $(seq 50); do
    redis-cli -p "$(port "$i" 0)" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  redis-cli -p "$(port "$i" 0)" ping >/dev/null || die "redis of ${REGIONS[$i]} did not start"
done

for i in 0 1 2; do
  r=${REGIONS[$i]}
  # shellcheck disable=SC2046
  SLUICE_GOSSIP_KEY=$KEY "$SLUICED" \
    --region "$r" --daemon-id "$r-1" \
    --rules "$RULES" \
    --redis "redis://127.0.0.1:$(port "$i" 0)/" \
    --http-addr "127.0.0.1:$(port "$i" 1)" \
    --grpc-addr "127.0.0.1:$(port "$i" 2)" \
    --gossip-addr "127.0.0.1:$(port "$i" 3)" \
    $(seeds_for "$i") \
    --cluster-id three-regions \
    --ship-interval-ms "$SHIP_INTERVAL_MS" \
    >"$RUN_DIR/$r/sluiced.log" 2>&1 &
  PIDS+=($!)
done

for i in 0 1 2; do
  ok=
  for _ in $(seq 100); do
    if curl -sf "http://127.0.0.1:$(port "$i" 1)/healthz" >/dev/null 2>&1; then ok=1; break; fi
    sleep 0.1
  done
  [[ -n $ok ]] || { tail -20 "$RUN_DIR/${REGIONS[$i]}/sluiced.log" >&2; die "sluiced of ${REGIONS[$i]} did not become healthy"; }
done

cat <<EOF
three regions up (cluster three-regions, gossip authenticated with a fresh key):

  region  redis  http   grpc   gossip
EOF
for i in 0 1 2; do
  printf '  %-6s  %-5s  %-5s  %-5s  %s\n' "${REGIONS[$i]}" "$(port "$i" 0)" "$(port "$i" 1)" "$(port "$i" 2)" "$(port "$i" 3)"
done
cat <<EOF

try (the global rule allows 1,000 a minute per api_key over all regions together):

  for p in $(port 0 1) $(port 1 1) $(port 2 1); do
    for n in \$(seq 400); do
      curl -s -XPOST localhost:\$p/v1/limits:check \\
        -d '{"domain":"public-api","descriptors":{"api_key":"k1"}}' | grep -o '"code":"[A-Z_]*"'
    done | sort | uniq -c
  done

  curl -s localhost:$(port 1 1)/metrics | grep sluice_gossip_

logs: $RUN_DIR/<region>/sluiced.log; Ctrl-C stops all.
EOF

wait -n "${PIDS[@]}" || true
echo "a process exited; see $RUN_DIR" >&2
